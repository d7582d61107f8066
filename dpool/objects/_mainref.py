"""Objects of the main script travel by reference, with a by-value fallback.

The stdlib pickles a function or class of ``__main__`` by name, and the worker looks the
name up in its own main module (the parent's under ``fork``; under ``spawn`` and
``forkserver`` the script re-imported as ``__mp_main__``), so the script's functions
share the module's globals in the worker. dpool does the same, and falls back to
pickling by value where the stdlib fails:

- A function or class of the main namespace found there under its ``__qualname__`` is
  pickled as a *reference*: an index into a table that travels in front of the pickle
  stream (:func:`frame`). Each entry holds the name, a signature (kind; for functions the
  first line and a CRC of the bytecode; under ``fork`` also the object's ``id``) and a
  by-value pickle of the object as fallback (or the error that pickling it raised). The
  receiver uses the object of its own main namespace when one with that name and
  signature is there, else it unpickles the fallback and binds the name to it.
- A function of the main namespace that cannot be found by name (a lambda, a closure, a
  function defined after the worker started) is pickled by value with the receiver's
  main namespace as its ``__globals__``. The globals it refers to travel with it and
  replace the namespace's values, except a name the worker assigned itself since it
  started (or since the driver's value arrived), or for which it holds a newer value from
  the driver. So an initializer's ``MODEL`` is never overwritten, and a lambda submitted
  after the driver changed a global sees the new value.

The *main namespace* is the driver's ``__main__`` module's dict; in a worker it is set at
start-up by :func:`set_worker_namespace` (under ``spawn``, the re-imported script's).
"""

from __future__ import annotations

import builtins
import os
import pickle
import struct
import sys
import threading
import time
import types
import weakref

from dpool.objects._byvalue import NeedsCloudpickle, _global_names, function_state

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any

TAG = 0x03
"""First byte of a payload that carries a table of main-namespace references."""

_HEAD = struct.Struct("!BI")  # tag, table length
_MAIN_MODULES = ("__main__", "__mp_main__")
_TOKEN = os.urandom(8)  # equal in a fork child, which has the same objects at the same ids
_MISSING = object()
_PENDING = object()  # an entry whose fallback is being unpickled (a cycle); never stored

_worker_ns: dict | None = None
# In a driver whose workers come from a fork server (``scheduling._zygote``): the id of
# each value of the main namespace when the server was forked (``mark_fork_point``)
_at_fork: dict[str, int] | None = None
_at_fork_ns = 0  # and when (``time.monotonic_ns()``)
# In the fork server and the workers it forks: the driver's values are as of this time
_image_as_of: int | None = None
_shipped: dict = {}  # name -> (the driver's value of it as last received, when pickled)
_tls = threading.local()


# ==================================================================== the main namespace
def namespace() -> dict:
    """This process's main namespace (see the module docstring)."""
    ns = _worker_ns
    if ns is not None:
        return ns
    main = sys.modules.get("__main__")
    return main.__dict__ if main is not None else {}


def set_worker_namespace() -> None:
    """Called at worker start-up: find the namespace the script's functions live in."""
    main = sys.modules.get("__main__")
    if main is None:
        adopt({"__name__": "__main__", "__builtins__": builtins})
        return
    ns = main.__dict__
    as_of = _image_as_of  # a fork of the fork server: the driver's values as of then
    if as_of is None:
        as_of = time.monotonic_ns()  # a fork of the driver: its values as of now
    if main.__name__ == "__mp_main__":
        as_of = 0
        # multiprocessing re-ran the script with runpy, which keeps the script's globals
        # in a dict of its own and puts a copy into the module: the functions' dict is
        # the live one (an initializer's ``global`` assignment lands there).
        for value in list(ns.values()):
            g = _globals_of(value)
            if g is not None and g.get("__name__") == "__mp_main__":
                ns = g
                break
    adopt(ns, as_of)


def mark_fork_point() -> None:
    """The driver forks its fork server now: its workers' main namespace will be this
    one as it is now. A function of it that reads a global rebound after this moment
    goes by value (its globals with it), as if the worker had no such function: the
    worker's own copy would read the value of then, where the stdlib's worker, forked
    later, sees the new one (``_stale``)."""
    global _at_fork, _at_fork_ns
    _at_fork = {k: id(v) for k, v in list(namespace().items())}
    _at_fork_ns = time.monotonic_ns()


def forked_server() -> None:
    """In the fork server, first thing: its memory is the driver's as of the fork."""
    global _image_as_of
    _image_as_of = _at_fork_ns


def _names(code: types.CodeType) -> tuple:
    names = _code_names.get(code)
    if names is None:
        if len(_code_names) >= 4096:
            _code_names.clear()
        names = _code_names[code] = tuple(_global_names(code))
    return names


_code_names: dict[types.CodeType, tuple] = {}


def _stale(objs: list, ns: dict) -> tuple:
    """The globals rebound since ``mark_fork_point`` that the functions among ``objs``
    read, or the functions of the main namespace they call, and so on: a table made
    before is good while this says the same."""
    at_fork = _at_fork
    if at_fork is None:
        return ()
    changed: set[str] = set()
    seen: set[int] = set()
    todo = [o for o in objs if type(o) is types.FunctionType]
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        for name in _names(fn.__code__):
            value = ns.get(name, _MISSING)
            if value is _MISSING:
                continue
            if at_fork.get(name) != id(value):
                changed.add(name)
            if type(value) is types.FunctionType and value.__module__ in _MAIN_MODULES:
                todo.append(value)
    return tuple(sorted(changed))


def adopt(ns: dict, as_of: int = 0) -> None:
    """Make ``ns`` this process's main namespace. The values it holds now came from the
    driver (fork: as of ``as_of``, a ``time.monotonic_ns()``) or its script (re-import:
    older than anything the driver sends): the driver's newer values may replace them,
    until this process assigns the name itself."""
    global _worker_ns
    _worker_ns = ns
    _shipped.clear()
    _shipped.update((k, (v, as_of)) for k, v in ns.items() if not k.startswith("__"))


def _globals_of(value: Any) -> dict | None:
    if type(value) is types.FunctionType:
        return value.__globals__
    if isinstance(value, type):
        for attr in list(vars(value).values()):
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            if type(attr) is types.FunctionType:
                return attr.__globals__
    return None


def _lookup(ns: dict, qualname: str) -> Any:
    first, _, rest = qualname.partition(".")
    obj = ns.get(first, _MISSING)
    if rest and obj is not _MISSING:
        for part in rest.split("."):
            try:
                obj = getattr(obj, part)
            except Exception:  # noqa: BLE001 - a property may raise anything
                return _MISSING
    return obj


_DIGEST_MOD = (1 << 61) - 1  # a prime: the bytecode read as a number, modulo it


def _signature(obj: Any) -> tuple:
    """What tells the receiver's function of the same name apart from another: its first
    line and a digest of its bytecode, equal in every process (``hash`` of bytes is
    salted per interpreter; ``zlib.crc32`` costs an extension module's load)."""
    if type(obj) is types.FunctionType:
        code = obj.__code__
        return ("f", code.co_firstlineno, len(code.co_code),
                int.from_bytes(code.co_code, "little") % _DIGEST_MOD)
    return ("c",)


# =========================================================================== pickling
class Collector:
    """The table of one payload: main-namespace objects referenced while pickling it."""

    __slots__ = ("index", "objs")

    def __init__(self) -> None:
        self.objs: list = []
        self.index: dict[int, int] = {}

    def ref(self, obj: Any) -> tuple:
        i = self.index.get(id(obj))
        if i is None:
            i = len(self.objs)
            self.objs.append(obj)
            self.index[id(obj)] = i
        return (_main_ref, (i,))


def reduce_main(pickler: Any, obj: Any, kind: str) -> Any:
    """The reduction of a function (kind "f"), class ("c") or bound method ("m") of the
    main namespace, or NotImplemented to leave it to cloudpickle.

    ``pickler`` has ``ns`` (the main namespace), ``main`` (a Collector or None),
    ``root`` (the object whose by-value fallback it is pickling, or None) and ``cloud``
    (False for the stdlib's pickler: what it would leave to cloudpickle raises
    NeedsCloudpickle instead).
    """
    if kind == "m":
        # A method bound to a main class or instance: as the stdlib, getattr(self, name).
        name = obj.__func__.__name__
        try:
            if getattr(obj.__self__, name) != obj:
                return _to_cloudpickle(pickler, obj)
        except Exception:  # noqa: BLE001
            return _to_cloudpickle(pickler, obj)
        return (getattr, (obj.__self__, name))
    if obj is pickler.root:
        return by_value(pickler, obj, pickler.root_index)
    qualname = obj.__qualname__
    if "<" not in qualname and _lookup(pickler.ns, qualname) is obj:
        if pickler.main is None:
            pickler.main = Collector()
        return pickler.main.ref(obj)
    if kind == "f":
        return by_value(pickler, obj, -1)
    return _to_cloudpickle(pickler, obj)  # a class not found under its name: by value


def _to_cloudpickle(pickler: Any, obj: Any) -> Any:
    if pickler.cloud:
        return NotImplemented
    raise NeedsCloudpickle(f"{type(obj).__name__} {obj!r}")


def by_value(pickler: Any, obj: Any, index: int) -> Any:
    """``obj`` by value; a function gets the receiver's main namespace as its globals."""
    if type(obj) is types.FunctionType:
        if pickler.cloud:
            _, (code, _, _, _, closure), state, *_ = pickler._dynamic_function_reduce(obj)
        else:
            code, closure, state = obj.__code__, None, function_state(obj)
        # When its globals were read: its first pickling (a function's payload is made
        # once anyway), which also keeps a re-pickled function's bytes the same.
        as_of = _first_pickled.get(obj)
        if as_of is None:
            as_of = _first_pickled[obj] = time.monotonic_ns()
        state[1]["_dpool_as_of"] = as_of
        return (_make_function, (code, _NS, closure, index), state, None, None,
                _function_setstate)
    if not pickler.cloud:
        raise NeedsCloudpickle(f"class {obj.__qualname__} by value")
    red = sys.modules["cloudpickle"].Pickler.reducer_override(pickler, obj)  # its own
    if red is NotImplemented or index < 0:
        return red
    return (_construct, (index, red[0], red[1]), *red[2:])


def finish(pickler_class: Any, collector: Collector, ns: dict, stream: bytes) -> bytes:
    """The payload: the reference table, then the stream.

    The table of a set of objects is made once and reused while those objects live (an
    argument that is an instance of a class of the script costs a table lookup, not a
    by-value pickle of the class per call): a fallback shows the object as it was when
    first sent, as a function's pickle does (``runtime._functions``).
    """
    key = (tuple(map(id, collector.objs)), id(ns))
    hit = _tables.get(key)
    stale = _stale(collector.objs, ns)
    if hit is not None and hit[2] == stale and all(
            r() is o for r, o in zip(hit[0], collector.objs)):
        table = hit[1]
    else:
        refs = [weakref.ref(o) for o in collector.objs]  # functions and classes
        table = _table(pickler_class, collector, ns)
        if len(_tables) >= 1024:
            _tables.clear()
        _tables[key] = (refs, table, stale)
    return b"".join((_HEAD.pack(TAG, len(table)), table, stream))


_tables: dict[tuple, tuple[list, bytes, tuple]] = {}


def _table(pickler_class: Any, collector: Collector, ns: dict) -> bytes:
    """Each entry's fallback pickled; they may reference more main objects, which join
    the same table. What the stdlib's pickler (``pickler_class.cloud`` false) cannot
    take, ``pickler_class.fallback()`` (cloudpickle's) pickles."""
    import io

    entries = []
    i = 0
    while i < len(collector.objs):
        obj = collector.objs[i]
        stale = bool(_stale([obj], ns))
        if stale:  # its globals are read again, now (``by_value``'s as_of)
            _first_pickled.pop(obj, None)
        cls = pickler_class
        while True:
            file = io.BytesIO()
            p = cls(file, protocol=5)
            p.ns, p.main, p.root, p.root_index = ns, collector, obj, i
            fallback: bytes | None
            try:
                p.dump(obj)
                fallback, error = file.getvalue(), ""
            except Exception as exc:  # noqa: BLE001 - the reference may be enough
                if not cls.cloud:  # the stdlib's pickler: try again with cloudpickle
                    cls = cls.fallback()
                    continue
                fallback, error = None, f"{type(exc).__name__}: {exc}"
            break
        # (id 0: no object of the receiver's matches -- it takes the fallback -- where
        # the receiver shares our memory image but, forked earlier, not this function's
        # globals: ``mark_fork_point``)
        entries.append((obj.__qualname__, _signature(obj), 0 if stale else id(obj),
                        fallback, error))
        i += 1
    return pickle.dumps((_TOKEN, time.monotonic_ns(), entries), protocol=5)


_first_pickled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Namespace:
    """Stands for the receiver's main namespace in a pickle."""

    def __reduce__(self) -> tuple:
        return (namespace, ())


_NS = _Namespace()


# ========================================================================= unpickling
class _Context:
    __slots__ = ("as_of", "done", "entries", "partial", "token")

    def __init__(self, token: bytes, as_of: int, entries: list) -> None:
        self.token = token
        self.as_of = as_of
        self.entries = entries
        self.done: dict[int, Any] = {}
        self.partial: dict[int, Any] = {}

    def resolve(self, i: int) -> Any:
        obj = self.done.get(i, _MISSING)
        if obj is not _MISSING:
            return obj
        obj = self.partial.get(i, _MISSING)
        if obj is not _MISSING:  # a cycle back to an object being built: the object
            return obj
        qualname, sig, oid, fallback, error = self.entries[i]
        ns = namespace()
        obj = _lookup(ns, qualname)
        if obj is not _MISSING and not self._matches(obj, sig, oid):
            obj = _MISSING
        if obj is _MISSING:
            if fallback is None:
                raise AttributeError(
                    f"cannot find {qualname!r} in this process's __main__, and it could "
                    f"not be sent by value either ({error})")
            self.partial[i] = _PENDING
            try:
                obj = pickle.loads(fallback)
            finally:
                del self.partial[i]
            if "." not in qualname:
                ns[qualname] = obj
                _shipped[qualname] = (obj, self.as_of)
        self.done[i] = obj
        return obj

    def _matches(self, obj: Any, sig: tuple, oid: int) -> bool:
        if self.token == _TOKEN and id(obj) != oid:
            return False  # same memory image: only the very same object will do
        if sig[0] == "c":
            return isinstance(obj, type) and getattr(obj, "__module__", None) in _MAIN_MODULES
        return (type(obj) is types.FunctionType and obj.__module__ in _MAIN_MODULES
                and _signature(obj) == sig)


def load(meta: Any, buffers: Any) -> Any:
    """Unpickle a payload that starts with a reference table."""
    _, n = _HEAD.unpack_from(meta, 0)
    start = _HEAD.size
    token, as_of, entries = pickle.loads(meta[start:start + n])
    prev = getattr(_tls, "ctx", None)
    _tls.ctx = _Context(token, as_of, entries)
    try:
        return pickle.loads(meta[start + n:], buffers=buffers)
    finally:
        _tls.ctx = prev


def _context() -> _Context:
    ctx = getattr(_tls, "ctx", None)
    if ctx is None:
        raise pickle.UnpicklingError("a reference to __main__ outside of a dpool payload")
    return ctx


def _main_ref(i: int) -> Any:
    obj = _context().resolve(i)
    if obj is _PENDING:
        raise pickle.UnpicklingError("a __main__ object refers to itself while being built")
    return obj


def _construct(i: int, make: Any, args: tuple) -> Any:
    obj = make(*args)
    _context().partial[i] = obj
    return obj


def _make_function(code: types.CodeType, ns: dict, closure: Any, index: int) -> Any:
    fn = types.FunctionType(code, ns, code.co_name, None, closure)
    if index >= 0:
        _context().partial[index] = fn
    return fn


def _function_setstate(fn: Any, state: tuple) -> None:
    """cloudpickle's function state, with the globals merged into the shared namespace."""
    state, slotstate = state
    fn.__dict__.update(state)
    values = slotstate.pop("__globals__")
    closure = slotstate.pop("__closure__")
    slotstate.pop("_cloudpickle_submodules", None)
    as_of = slotstate.pop("_dpool_as_of", 0)
    ns = fn.__globals__
    shipped = _shipped
    for name, value in values.items():
        if value is _PENDING:
            continue
        current = ns.get(name, _MISSING)
        if current is not _MISSING:
            # Keep what this process assigned itself, and the driver's newer values.
            last = shipped.get(name)
            if last is None or last[0] is not current or last[1] > as_of or current is value:
                continue
        ns[name] = value
        shipped[name] = (value, as_of)
    if "__builtins__" not in ns:
        ns["__builtins__"] = builtins
    if closure is not None:
        for i, cell in enumerate(closure):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            fn.__closure__[i].cell_contents = value
    for k, v in slotstate.items():
        setattr(fn, k, v)
