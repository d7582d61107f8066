"""Large array arguments go through the object store once, not once per submit.

``ex.submit(f, big)`` eight times with the same array must not copy it eight times: the
first submit puts the array in the store and later submits pass the same stored object,
as if the user had written ``ref = dpool.put(big)`` and submitted ``ref``.

Identity alone is not enough -- drop-in code may fill the same buffer with new data
between submits -- so a hit is taken only when the array's bytes still equal the stored
copy (a full compare costs a fraction of a new put: bench/NOTES.md). Only
C-contiguous numpy arrays of at least the store threshold take part; anything else is
serialized with its call as usual.
"""

from __future__ import annotations

import sys
import threading
import weakref

from dpool.objects import values as _values

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional


def _same_bytes(a: Any, b: Any) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    np = sys.modules["numpy"]
    n = a.nbytes
    word = np.uint64 if n % 8 == 0 else np.uint8  # bitwise: NaNs compare equal to themselves
    return bool(np.array_equal(a.reshape(-1).view(word), b.reshape(-1).view(word)))


class ArgumentCache:
    def __init__(self, put: Callable[[Any], tuple[Any, bytes]]) -> None:
        self._put = put  # value -> (ObjectRef, payload)
        self._entries: dict[int, tuple[Any, Any, Any]] = {}  # id -> (weakref, ref, stored)
        self._lock = threading.Lock()

    def substitute(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Replace large array arguments by refs to stored copies (unchanged otherwise)."""
        np = sys.modules.get("numpy")
        if np is None:
            return args, kwargs
        ndarray = np.ndarray
        threshold = _values.store_threshold_bytes()
        new_args = None
        for i, a in enumerate(args):
            if type(a) is ndarray and a.nbytes >= threshold:
                ref = self._ref_for(a)
                if ref is not None:
                    if new_args is None:
                        new_args = list(args)
                    new_args[i] = ref
        new_kwargs = None
        for k, a in kwargs.items():
            if type(a) is ndarray and a.nbytes >= threshold:
                ref = self._ref_for(a)
                if ref is not None:
                    if new_kwargs is None:
                        new_kwargs = dict(kwargs)
                    new_kwargs[k] = ref
        return (tuple(new_args) if new_args is not None else args,
                new_kwargs if new_kwargs is not None else kwargs)

    def _ref_for(self, arr: Any) -> Optional[Any]:
        if not arr.flags.c_contiguous or arr.dtype.hasobject:
            return None
        key = id(arr)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is arr and _same_bytes(arr, entry[2]):
            return entry[1]
        ref, payload = self._put(arr)
        stored = _values.decode(payload)  # a zero-copy view of the stored bytes
        try:
            wref = weakref.ref(arr, self._forgetter(key))
        except TypeError:
            return ref
        with self._lock:
            self._entries[key] = (wref, ref, stored)
        return ref

    def _forgetter(self, key: int) -> Callable[[Any], None]:
        return lambda _ref: self._forget(key)

    def _forget(self, key: int) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
