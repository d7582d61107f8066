"""The driver-side half of the function table: each function is pickled once, by id.

Functions are cached by identity. A function that can be weak-referenced (plain
functions, lambdas, classes) is cached for as long as it lives; one that cannot (bound
methods, most builtins) is serialized per submit, since its identity says nothing about
its state, and deduplicated by its pickle so a hot loop over ``obj.method`` registers
one entry, not one per task. Because the pickle is taken once, a closure's captured
values are those at its first submit -- listed in compat/DIFFERENCES.md.
"""

from __future__ import annotations

import threading
import weakref

from dpool.objects import _payload

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable


class FunctionTable:
    def __init__(self, new_id: Callable[[], int],
                 register: Callable[[int, str, bytes], None]) -> None:
        self._new_id = new_id
        self._register = register
        self._by_fn: dict[int, tuple[Any, int]] = {}  # id(fn) -> (weakref, fn_id)
        self._by_payload: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def fn_id(self, fn: Callable[..., Any]) -> int:
        entry = self._by_fn.get(id(fn))
        if entry is not None and entry[0]() is fn:
            return entry[1]
        payload = _payload.dumps_function(fn)
        try:
            weakref.ref(fn)
        except TypeError:
            return self._by_value(fn, payload)
        fid = self._new_id()
        name = getattr(fn, "__qualname__", type(fn).__name__)
        self._register(fid, name, payload)
        key = id(fn)
        ref = weakref.ref(fn, self._forgetter(key))
        with self._lock:
            self._by_fn[key] = (ref, fid)
        return fid

    def _by_value(self, fn: Any, payload: bytes) -> int:
        fid = self._by_payload.get(payload)
        if fid is None:
            fid = self._new_id()
            self._register(fid, getattr(fn, "__qualname__", type(fn).__name__), payload)
            with self._lock:
                if len(self._by_payload) >= 4096:
                    self._by_payload.clear()
                self._by_payload[payload] = fid
        return fid

    def _forgetter(self, key: int) -> Callable[[Any], None]:
        return lambda _ref: self._forget(key)

    def _forget(self, key: int) -> None:
        with self._lock:
            self._by_fn.pop(key, None)
