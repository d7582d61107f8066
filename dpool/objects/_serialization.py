"""Serialization of task functions, arguments, results and stored objects.

Pickle protocol 5: buffers that support out-of-band pickling (numpy arrays,
``pickle.PickleBuffer``) of at least ``oob_threshold`` bytes are not copied into the
pickle stream; :func:`serialize` hands them back as raw memoryviews onto the original
memory, so the caller can place them (in a segment, ``_segment``) and give them to
:func:`deserialize` without another copy. Smaller buffers stay in-band.

- The stdlib's C pickler goes first; cloudpickle (with ``inspect``, ``ast``, ``typing``
  ... that it imports) loads only for an object the stdlib's pickler cannot take. Where
  the stdlib's pickler succeeds, the result is what cloudpickle would make: importable
  functions and classes by reference, the main script's as ``_mainref`` says, their
  by-value fallback from ``_byvalue``. Once any module is registered with
  ``cloudpickle.register_pickle_by_value``, cloudpickle pickles everything.
- Plain data (scalars, and tuples, lists and dicts of them up to ``_FAST_MAX_ITEMS``
  items) goes to ``pickle.dumps`` directly: the same bytes, no pickler to set up.
- A large non-contiguous numpy array is made contiguous once so that it too goes out of
  band; value, dtype and shape round-trip, the strides do not (as with pickle).
- A payload that carries ``_mainref``'s reference table starts with ``_mainref.TAG``
  instead of pickle's 0x80; :func:`deserialize` reads both.

``bytes``, ``bytearray`` and ``str`` are always pickled in-band; wrap a large bytes-like
object in ``pickle.PickleBuffer`` to keep it out of band. A ``Serialized``'s buffers
alias the caller's objects: keep them unchanged until the buffers are written out.
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from collections.abc import Iterable

from dpool.errors import SerializationError
from dpool.objects import _byvalue, _mainref

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Optional

__all__ = ["DEFAULT_OOB_THRESHOLD", "Serialized", "deserialize", "dumps", "serialize"]

DEFAULT_OOB_THRESHOLD = 64 * 1024
"""Buffers of at least this many bytes are kept out-of-band."""

_PROTOCOL = 5

# Exact types the C pickler saves natively, identically to cloudpickle.
_SCALARS: frozenset[type] = frozenset(
    {type(None), bool, int, float, complex, str, bytes}
)
_FAST_MAX_ITEMS = 64  # plain containers with up to this many items in all: fast path


class Serialized:
    """A serialized object: the pickle stream plus its out-of-band buffers.

    ``buffers`` are one-dimensional, contiguous, unsigned-byte memoryviews onto the
    original objects' memory (no copy was made): keep the original object unchanged until
    the buffers have been written out.

    (A plain class, not a ``@dataclass``: no ``dataclasses`` on the start-up path;
    docs/architecture.md, "Import cost".)
    """

    __slots__ = ("meta", "buffers")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, meta: bytes, buffers: Optional[list[memoryview]] = None) -> None:
        self.meta = meta
        self.buffers: list[memoryview] = [] if buffers is None else buffers

    def __repr__(self) -> str:
        return f"Serialized(meta={self.meta!r}, buffers={self.buffers!r})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.meta, self.buffers) == (other.meta, other.buffers)  # type: ignore[attr-defined]

    @property
    def nbytes(self) -> int:
        """Total size: the pickle stream plus every out-of-band buffer."""
        return len(self.meta) + sum(b.nbytes for b in self.buffers)


def _is_plain(obj: Any) -> bool:
    """True for plain data the C pickler can take directly (the fast path).

    Scalars, and tuples/lists/dicts (scalar keys) nesting them, with at most
    ``_FAST_MAX_ITEMS`` items in all; anything else goes through cloudpickle.
    """
    t = type(obj)
    if t in _SCALARS:
        return True
    if t is not tuple and t is not list and t is not dict:
        return False
    budget = _FAST_MAX_ITEMS
    stack = [obj]
    while stack:
        item = stack.pop()
        t = type(item)
        if t is dict:
            budget -= len(item)
            if budget < 0:
                return False
            for key, value in item.items():
                if type(key) not in _SCALARS:
                    return False
                if type(value) not in _SCALARS:
                    stack.append(value)
        elif t is tuple or t is list:
            budget -= len(item)
            if budget < 0:
                return False
            for value in item:
                if type(value) not in _SCALARS:
                    stack.append(value)
        else:
            return False
    return True


class _State:
    """What the picklers below read, set on each instance by :func:`serialize`:
    ``oob_threshold``, ``ndarray`` (numpy's array type, or None while numpy has not been
    imported: then no array can exist), ``ns`` (this process's main namespace), ``main``
    (the reference table, made on the first reference), ``root``/``root_index`` (the
    table entry whose fallback this pickler writes, if any)."""

    cloud = False
    oob_threshold: int = DEFAULT_OOB_THRESHOLD
    ndarray: type | None = None
    ns: Optional[dict] = None
    main: Optional[_mainref.Collector] = None
    root: Any = None
    root_index: int = -1

    @staticmethod
    def fallback() -> Any:
        return _cloud_pickler()


def _reduce(self: Any, obj: Any) -> Any:
    """Out-of-band pickling of large non-contiguous arrays, and references to the main
    namespace's functions and classes (``_mainref``); NotImplemented for the rest."""
    t = type(obj)
    if t is _FunctionType:
        if obj.__globals__ is self.ns:
            return _mainref.reduce_main(self, obj, "f")
    elif t is _MethodType:
        fn = obj.__func__
        if type(fn) is _FunctionType and fn.__globals__ is self.ns:
            return _mainref.reduce_main(self, obj, "m")
    elif t is self.ndarray:
        arr: Any = obj
        if (
            arr.nbytes >= self.oob_threshold
            and not (arr.flags.c_contiguous or arr.flags.f_contiguous)
            and not arr.dtype.hasobject
        ):
            numpy = sys.modules["numpy"]
            return numpy.ascontiguousarray(arr).__reduce_ex__(_PROTOCOL)
    elif issubclass(t, type) and obj.__dict__.get("__module__") in _MAIN_MODULES:
        return _mainref.reduce_main(self, obj, "c")
    return NotImplemented


class _Pickler(_State, pickle.Pickler):
    """The stdlib's C pickler plus :func:`_reduce`, modules by name and code objects
    (``_byvalue``); raises (:class:`_byvalue.NeedsCloudpickle`, or what pickle raises)
    where cloudpickle's pickler is needed."""

    def reducer_override(self, obj: Any) -> Any:
        red = _reduce(self, obj)
        if red is NotImplemented:
            t = type(obj)
            if t is _ModuleType:
                return _byvalue.reduce_module(obj)
            if t is _CodeType:
                return _byvalue.reduce_code(obj)
        return red


_cloud_class: Any = None


def _cloud_pickler() -> Any:
    """cloudpickle's pickler plus :func:`_reduce` (made, and cloudpickle imported, on
    first use)."""
    global _cloud_class
    if _cloud_class is None:
        import cloudpickle

        class _CloudPickler(_State, cloudpickle.Pickler):  # type: ignore[misc]
            cloud = True

            def reducer_override(self, obj: Any) -> Any:
                red = _reduce(self, obj)
                return super().reducer_override(obj) if red is NotImplemented else red

        _cloud_class = _CloudPickler
    return _cloud_class


def _first_pickler() -> Any:
    """The stdlib's pickler, unless a module was registered with cloudpickle to be
    pickled by value: the stdlib's pickler would pickle its functions by name."""
    cp = sys.modules.get("cloudpickle.cloudpickle")
    if cp is not None and getattr(cp, "_PICKLE_BY_VALUE_MODULES", None):
        return _cloud_pickler()
    return _Pickler


_FunctionType = types.FunctionType
_MethodType = types.MethodType
_ModuleType = types.ModuleType
_CodeType = types.CodeType
_MAIN_MODULES = ("__main__", "__mp_main__")


def _dump(obj: Any, buffers: Optional[list[memoryview]] = None,
          oob_threshold: int = DEFAULT_OOB_THRESHOLD) -> bytes:
    """The pickle stream of ``obj``: the stdlib's pickler first, cloudpickle's if that
    fails. ``buffers``: out-of-band buffers of ``oob_threshold`` bytes or more go there
    (emptied, and released, before the second try). Raises what the last try raised."""
    buffer_callback = None
    if buffers is not None:
        def buffer_callback(pb: pickle.PickleBuffer) -> bool:
            raw = pb.raw()
            if raw.nbytes < oob_threshold:
                raw.release()
                return True
            buffers.append(raw)
            return False

    cls = _first_pickler()
    while True:
        try:
            return _dump_with(cls, obj, buffer_callback, oob_threshold)
        except Exception:
            if cls.cloud:
                raise
            if buffers:
                for raw in buffers:
                    raw.release()
                buffers.clear()
            cls = _cloud_pickler()


def _dump_with(cls: Any, obj: Any, buffer_callback: Any, oob_threshold: int) -> bytes:
    file = io.BytesIO()
    pickler = cls(file, protocol=_PROTOCOL, buffer_callback=buffer_callback)
    pickler.ns = _mainref.namespace()
    if buffer_callback is not None:
        pickler.oob_threshold = oob_threshold
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            pickler.ndarray = numpy.ndarray
    pickler.dump(obj)
    if pickler.main is not None:
        return _mainref.finish(cls, pickler.main, pickler.ns, file.getvalue())
    return file.getvalue()


def dumps(obj: Any) -> bytes:
    """Pickle ``obj`` with every buffer in-band (functions, errors, small values).

    Raises what pickling raised. Read it back with :func:`deserialize`.
    """
    return _dump(obj)


def _type_name(obj: object) -> str:
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def serialize(obj: object, *, oob_threshold: int = DEFAULT_OOB_THRESHOLD) -> Serialized:
    """Pickle ``obj``; buffers of at least ``oob_threshold`` bytes are returned out-of-band.

    Raises :class:`SerializationError` (the original exception chained) when ``obj`` or
    something it contains cannot be pickled.
    """
    if _is_plain(obj):
        return Serialized(pickle.dumps(obj, protocol=_PROTOCOL), [])

    buffers: list[memoryview] = []
    try:
        return Serialized(_dump(obj, buffers, oob_threshold), buffers)
    except Exception as exc:  # pickle raises many types: PicklingError, TypeError, ...
        for raw in buffers:
            raw.release()
        raise SerializationError(
            f"cannot serialize object of type {_type_name(obj)}: {type(exc).__name__}: {exc}"
        ) from exc


def deserialize(meta: bytes | memoryview, buffers: Iterable[Any] = ()) -> object:
    """Rebuild an object from its pickle stream and its out-of-band buffers (in order).

    numpy arrays come back as views onto the given buffers (no copy); they are writable
    when the buffers are. Raises :class:`SerializationError` when unpickling fails (a
    missing module in this process, a corrupt stream, too few buffers, ...).
    """
    try:
        if meta[0] == _mainref.TAG:
            return _mainref.load(meta, buffers)
        return pickle.loads(meta, buffers=buffers)
    except Exception as exc:
        raise SerializationError(
            f"cannot deserialize object ({len(meta)} bytes of pickle): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
