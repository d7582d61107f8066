"""Plain functions by value with the stdlib's pickler, without importing cloudpickle.

A function of the main script travels by reference with a by-value fallback
(``_mainref``). cloudpickle can make that fallback for any function, but importing it
(with ``inspect``, ``ast``, ``dis``, ``platform``, ``typing``, ``uuid``...) costs a short
program more than starting its workers does. Most functions of a script are plain: no
closure, globals that are values, functions, classes and modules. This module reduces
those with the C pickler, into the state that cloudpickle's reduction of a function
has (``_mainref._function_setstate`` reads both); anything else raises
:class:`NeedsCloudpickle`, and the caller pickles the whole object again with
cloudpickle.

The receiver needs only this module to rebuild such a function: code objects travel as
``marshal`` data (the interpreter's own format for them; the receiver runs the same
Python, as with cloudpickle's code reduction) and modules by name.
"""

from __future__ import annotations

import marshal
import sys
import types

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["NeedsCloudpickle", "function_state", "reduce_code", "reduce_module"]

_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL"})


class NeedsCloudpickle(Exception):
    """The stdlib's pickler cannot take this object as cloudpickle would: use cloudpickle."""


def function_state(fn: types.FunctionType) -> tuple[dict, dict]:
    """``(fn.__dict__, slots)`` as cloudpickle lays out a function's state: the
    attributes to set, the values of the globals its code reads or writes, and the
    imported submodules it reaches through them. Raises :class:`NeedsCloudpickle` for a
    function with a closure (its cells need cloudpickle)."""
    if fn.__closure__ is not None:
        raise NeedsCloudpickle(f"{fn.__qualname__} has a closure")
    code = fn.__code__
    g = fn.__globals__
    f_globals = {k: g[k] for k in _global_names(code) if k in g}
    slots = {
        "__name__": fn.__name__,
        "__qualname__": fn.__qualname__,
        "__annotations__": fn.__annotations__,
        "__kwdefaults__": fn.__kwdefaults__,
        "__defaults__": fn.__defaults__,
        "__module__": fn.__module__,
        "__doc__": fn.__doc__,
        "__closure__": None,
        "_cloudpickle_submodules": _submodules(code, f_globals.values()),
        "__globals__": f_globals,
    }
    return dict(fn.__dict__), slots


def _global_names(code: types.CodeType) -> dict[str, None]:
    """The global names ``code`` and the code nested in it use, in order of use: the
    arguments of its LOAD_GLOBAL, STORE_GLOBAL and DELETE_GLOBAL instructions."""
    names: dict[str, None] = {}
    _scan_globals(code, names)
    return names


def _scan_globals(code: types.CodeType, names: dict[str, None]) -> None:
    # The bytecode read directly (what ``dis.get_instructions`` would give, without
    # importing ``dis``): 2-byte units of (opcode, argument), EXTENDED_ARG prefixes giving
    # an argument's higher bytes; 3.11's inline caches are units of their own (CACHE),
    # and LOAD_GLOBAL's argument there is the name's index shifted left by one.
    ops = _global_opcodes()
    if ops is None:  # a Python whose bytecode this does not know
        import dis

        names.update((ins.argval, None) for ins in dis.get_instructions(code)
                     if ins.opname in _GLOBAL_OPS)
    else:
        load_global, other_globals, extended_arg, shift = ops
        co_names = code.co_names
        raw = code.co_code
        ext = 0
        for i in range(0, len(raw), 2):
            op = raw[i]
            arg = raw[i + 1] | ext
            if op == extended_arg:
                ext = arg << 8
                continue
            ext = 0
            if op == load_global:
                names[co_names[arg >> shift]] = None
            elif op in other_globals:
                names[co_names[arg]] = None
    for const in code.co_consts:
        if type(const) is types.CodeType:
            if ops is None:
                names.update(_global_names(const))
            else:
                _scan_globals(const, names)


_OPS: Any = ()

# LOAD_GLOBAL, STORE_GLOBAL, DELETE_GLOBAL, EXTENDED_ARG: the same numbers in 3.10-3.12
# (tests/objects check them against ``opcode.opmap``), which saves importing ``opcode``
_KNOWN_OPCODES = dict.fromkeys([(3, 10), (3, 11), (3, 12)], (116, 97, 98, 144))


def _global_opcodes() -> Any:
    """``(LOAD_GLOBAL, {STORE_GLOBAL, DELETE_GLOBAL}, EXTENDED_ARG, LOAD_GLOBAL's
    argument shift)`` for this Python's bytecode, or None where its layout is unknown."""
    global _OPS
    if _OPS == ():
        version = sys.version_info[:2]
        if (3, 10) <= version <= (3, 13):
            known = _KNOWN_OPCODES.get(version)
            if known is None:
                import opcode

                op = opcode.opmap
                known = (op["LOAD_GLOBAL"], op["STORE_GLOBAL"], op["DELETE_GLOBAL"],
                         op["EXTENDED_ARG"])
            load, store, delete, extended = known
            _OPS = (load, frozenset((store, delete)), extended, 0 if version < (3, 11) else 1)
        else:
            _OPS = None
    return _OPS


def _all_names(code: types.CodeType, into: set[str]) -> set[str]:
    into.update(code.co_names)
    for const in code.co_consts:
        if type(const) is types.CodeType:
            _all_names(const, into)
    return into


def _submodules(code: types.CodeType, values: Any) -> list[types.ModuleType]:
    """Imported submodules of the packages among ``values`` that ``code`` names each
    part of (``os.path`` through the global ``os``): imported again by the receiver."""
    names: set[str] | None = None
    found = []
    for value in values:
        if type(value) is not types.ModuleType or not getattr(value, "__package__", None):
            continue
        if names is None:
            names = _all_names(code, set())
        prefix = value.__name__ + "."
        for name, module in list(sys.modules.items()):
            if (module is not None and name.startswith(prefix)
                    and names.issuperset(name[len(prefix):].split("."))):
                found.append(module)
    return found


def reduce_module(module: types.ModuleType) -> tuple:
    """A module by name, as cloudpickle pickles an importable one."""
    name = module.__name__
    if sys.modules.get(name) is not module:
        raise NeedsCloudpickle(f"module {name!r} is not importable by name")
    return (import_module, (name,))


def import_module(name: str) -> types.ModuleType:
    __import__(name)
    return sys.modules[name]


def reduce_code(code: types.CodeType) -> tuple:
    return (load_code, (marshal.dumps(code),))


def load_code(data: bytes) -> types.CodeType:
    code = marshal.loads(data)
    if type(code) is not types.CodeType:
        raise TypeError(f"expected a code object, got {type(code).__name__}")
    return code
