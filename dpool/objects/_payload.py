"""Payloads: how arguments, results, errors and functions become bytes, and back.

Everything is pickle protocol 5. Plain top-level values (ints, floats, strings, bytes,
bools, None, and calls whose positional arguments are all such) go to ``pickle.dumps``
directly, with no pickler to set up. Anything else goes through ``_serialization`` (the
stdlib's pickler, cloudpickle where it cannot), so lambdas and closures travel by value,
functions and classes of the main script by reference with a by-value fallback
(``_mainref``), and values with large buffers go through the store (``_values``).

An error travels as ``(exception, traceback text)``; the receiver attaches the text as
``__cause__`` (a ``RemoteTraceback``), as ``concurrent.futures`` does, so the user sees
where their code failed on the other side.
"""

from __future__ import annotations

import pickle

from dpool import errors
from dpool._task_future import TracebackText, stdlib_cause
from dpool.errors import SerializationError
from dpool.objects import _serialization, _values

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Optional

_PLAIN = frozenset((int, float, str, bytes, bool, type(None)))
_dumps = pickle.dumps
_cp_dumps = _serialization.dumps  # cloudpickle, main-namespace aware, buffers in-band


def dumps(obj: Any) -> bytes:
    """Serialize a small value inline (errors, control values); read it with ``loads``."""
    if type(obj) in _PLAIN:
        return _dumps(obj, protocol=5)
    return _cp_dumps(obj)


def dumps_value(obj: Any, object_id: int, owner_pid: int) -> bytes:
    """Serialize a result or put value; large buffers go to shared memory as ``object_id``.

    Errors keep the type pickle gave them (what the stdlib reports).
    """
    if type(obj) in _PLAIN:
        return _dumps(obj, protocol=5)
    try:
        return _values.encode(obj, object_id, owner_pid)[0]
    except SerializationError as exc:
        raise (exc.__cause__ or exc) from None


def dumps_call(args: tuple, kwargs: dict, new_id: Any, owner_pid: int) -> Optional[bytes]:
    """Serialize a call's arguments; None for a call without any."""
    if not kwargs:
        if not args:
            return None
        for a in args:
            if type(a) not in _PLAIN:
                break
        else:
            return _dumps((args, kwargs), protocol=5)
    return dumps_value((args, kwargs), new_id(), owner_pid)


loads = _values.decode


def dumps_function(fn: Any) -> bytes:
    try:
        return _cp_dumps(fn)
    except Exception as exc:
        raise SerializationError(
            f"cannot serialize the function {fn!r} ({type(fn).__name__}): {exc}"
        ) from exc


def dumps_initializer(fn: Any, initargs: tuple) -> tuple[bytes, Optional[tuple]]:
    """An executor's ``(initializer, initargs)`` for its workers: ``(payload, None)``, or
    ``(payload of (fn, None), initargs)`` when ``initargs`` hold objects that only process
    creation may hand over (a multiprocessing ``Lock``, ``Queue``, ``Value``, ``RawArray``...):
    those go to each worker as an argument of its ``Process``, as the stdlib passes them,
    so they work with every start method. Anything else that cannot be pickled raises
    ``SerializationError`` here, at the constructor."""
    try:
        return dumps_function((fn, initargs)), None
    except SerializationError as exc:
        if not _inherited_only(exc.__cause__, initargs):
            raise
    return dumps_function((fn, None)), initargs


def _inherited_only(exc: Optional[BaseException], initargs: tuple) -> bool:
    """Whether pickling ``initargs`` failed because they hold objects multiprocessing
    shares only by inheritance (its ``RuntimeError`` says so; shared ctypes fail earlier,
    on their mmap, so they are recognised by their heap wrapper)."""
    if isinstance(exc, RuntimeError) and "through inheritance" in str(exc):
        return True
    from multiprocessing.heap import BufferWrapper

    def shared_ctype(x: Any) -> bool:
        if isinstance(x, (list, tuple)):
            return any(shared_ctype(y) for y in x)
        if isinstance(x, dict):
            return any(shared_ctype(y) for y in x.values())
        return isinstance(getattr(x, "_wrapper", None), BufferWrapper)

    return shared_ctype(initargs)


def format_remote(exc: BaseException) -> str:
    import traceback  # (here: with linecache, tokenize and textwrap it is ~10 M
    # instructions that a program whose tasks never fail does not spend)

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f'\n"""\n{tb}"""'


def dumps_error(exc: BaseException) -> bytes:
    """Serialize an exception raised by user code, with its traceback text.

    If the exception itself cannot be pickled, send a ``SerializationError`` that says
    so and carries the original's type, message and traceback.
    """
    tb = format_remote(exc)
    exc.__traceback__ = None  # tracebacks do not pickle; the text above carries them
    try:
        return _cp_dumps((exc, tb))
    except Exception as pickling_exc:
        replacement = SerializationError(
            f"the task raised {type(exc).__qualname__}: {exc!s:.500} -- and that "
            f"exception could not be pickled to send back ({pickling_exc})"
        )
        return _dumps((replacement, tb), protocol=5)


def error_text(payload: bytes, limit: int = 16 << 10) -> Optional[str]:
    """The traceback text of a ``dumps_error`` payload, read from the pickle's opcodes
    without unpickling it (a node daemon cannot import the user's exception classes, and
    unpickling runs code); its last ``limit`` characters. None when it is not an inline
    error payload (a value in the store, or not a pickle this can read)."""
    if not payload or _values.stored(payload) is not None or len(payload) > (4 << 20):
        return None
    text = _last_traceback(payload, 0)
    if text is None:
        return None
    return text.strip().strip('"').strip()[-limit:]


def _last_traceback(data: bytes, depth: int) -> Optional[str]:
    """The last ``format_remote`` text in the pickles in ``data``: one after another (a
    payload of a script's main namespace starts with its own, ``_mainref``), or nested in
    one as bytes."""
    import pickletools

    text = None
    start = data.find(b"\x80")  # (after the value tag and header)
    while start >= 0:
        end = -1
        try:
            for op, arg, pos in pickletools.genops(data[start:]):
                if isinstance(arg, str) and arg.startswith('\n"""\n'):
                    text = arg  # the last one: the (exception, text) tuple's second item
                elif isinstance(arg, (bytes, bytearray)) and arg[:1] == b"\x80" \
                        and depth < 2:
                    text = _last_traceback(bytes(arg), depth + 1) or text
                elif op.name == "STOP" and pos is not None:
                    end = start + pos + 1
        except Exception:  # noqa: BLE001 - not a pickle this can read
            return text
        start = data.find(b"\x80", end) if end > 0 else -1
    return text


def loads_error(payload: bytes) -> BaseException:
    """The exception a failed task's future raises, with the remote traceback attached."""
    try:
        exc, tb = _values.decode(payload)
    except BaseException as unpickling_exc:  # noqa: BLE001 - SystemExit too (BrokenProcessPool)
        return errors.DeserializationError.wrap("the exception a task raised", unpickling_exc)
    if tb:  # (the stdlib's class replaces it where the user gets the exception)
        exc.__cause__ = TracebackText(tb)
    return exc


def resolve_inputs(args: tuple, kwargs: dict, deps: tuple) -> tuple[tuple, dict]:
    """A task's arguments with each top-level ``ObjectRef`` among its inputs ``deps``
    (``(object id, ok, payload)``, as ``ExecuteTask`` carries them) replaced by its
    value; an input that failed raises its error (as the stdlib's class, where it has one)."""
    from dpool.futures import ObjectRef

    values = {}
    for oid, ok, payload in deps:
        if not ok:
            raise stdlib_cause(loads_error(payload))
        values[oid] = payload

    def resolve(a: Any) -> Any:
        if isinstance(a, ObjectRef) and a.id in values:
            return loads(values[a.id])
        return a

    return tuple(resolve(a) for a in args), {k: resolve(v) for k, v in kwargs.items()}
