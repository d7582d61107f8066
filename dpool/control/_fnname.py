"""A function's name from its pickled payload, without unpickling it.

The function table keeps each function's payload; the name beside it is empty for the
functions an attached driver registers through its node. Unpickling the payload would
run its code (pickles are code), so the name is read from the pickle's opcodes instead
(``pickletools.genops`` only parses): a function pickled by value (cloudpickle: lambdas,
closures, functions of ``__main__``) carries ``__module__`` and ``__qualname__`` strings
in its state; one pickled by reference is a ``GLOBAL``/``STACK_GLOBAL`` of its module
and name. dpool's main-namespace payloads nest the function's pickle as bytes: those
are read the same way.
"""

from __future__ import annotations

import pickletools

MAX_PARSE = 1 << 20  # larger payloads (a closure over big data) are not parsed
_PROTO = b"\x80"


def function_name(payload: bytes, _depth: int = 0) -> str | None:
    """``module.qualname`` of the pickled function in ``payload``, or None."""
    if not payload or len(payload) > MAX_PARSE:
        return None
    start = payload.find(_PROTO)  # (after dpool's own header, if any)
    if start < 0:
        return None
    strings: list[str] = []  # every string pushed, in order (memo gets included)
    memo: list = []  # what MEMOIZE stored: a string, or None for anything else
    nested: list[bytes] = []
    first_global = None
    last = None  # the string the previous opcode pushed, if it pushed one
    try:
        for op, arg, _pos in pickletools.genops(payload[start:]):
            pushed = None
            if op.name == "MEMOIZE":
                memo.append(last)
            elif op.name in ("BINGET", "LONG_BINGET", "GET"):
                pushed = memo[arg] if isinstance(arg, int) and arg < len(memo) else None
            elif op.name == "GLOBAL" and isinstance(arg, str):
                first_global = first_global or arg.replace(" ", ".", 1)  # "module name"
            elif isinstance(arg, str):
                pushed = arg
            elif isinstance(arg, (bytes, bytearray)) and arg[:1] == _PROTO and _depth < 2:
                nested.append(bytes(arg))
            elif op.name == "STACK_GLOBAL" and first_global is None and len(strings) >= 2:
                first_global = f"{strings[-2]}.{strings[-1]}"
            if pushed is not None:
                strings.append(pushed)
            if op.name != "MEMOIZE":
                last = pushed
    except Exception:  # noqa: BLE001 - not a pickle we can read: no name
        return None
    qualname = _after(strings, "__qualname__")
    if qualname:
        module = _after(strings, "__module__")
        return f"{module}.{qualname}" if module else qualname
    for inner in nested:
        name = function_name(inner, _depth + 1)
        if name:
            return name
    if first_global and not first_global.startswith(("cloudpickle.", "dpool.", "copyreg.")):
        return first_global
    return None


def _after(strings: list[str], key: str) -> str | None:
    try:
        i = strings.index(key)
    except ValueError:
        return None
    return strings[i + 1] if i + 1 < len(strings) else None
