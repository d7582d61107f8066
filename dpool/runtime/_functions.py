"""The driver-side half of the function table: each function is pickled once, by id.

Functions are cached by identity. A function that can be weak-referenced (plain
functions, lambdas, classes) is cached for as long as it lives; one that cannot (bound
methods, most builtins) is serialized per submit, since its identity says nothing about
its state, and deduplicated by its pickle so a hot loop over ``obj.method`` registers
one entry, not one per task. Because the pickle is taken once, a closure's captured
values are those at its first submit -- listed in compat/DIFFERENCES.md.

Except for a function of the main script where workers come from a fork server
(``scheduling._zygote``): each new executor (``new_generation``) pickles it again on its
first use, since whether it goes by reference or by value depends on whether the globals
it reads were rebound since the server was forked (``objects._mainref``); the same
pickle keeps its id.
"""

from __future__ import annotations

import threading
import weakref

from dpool.objects import payload as _payload

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable


class FunctionTable:
    def __init__(self, new_id: Callable[[], int],
                 register: Callable[[int, str, bytes], None]) -> None:
        self._new_id = new_id
        self._register = register
        self._by_fn: dict[int, tuple[Any, int, int]] = {}  # id(fn) -> (weakref, fn_id,
        # the generation it was pickled in, or -1: for good)
        self._payloads: dict[int, bytes] = {}  # fn_id -> pickle, of those pickled again
        self.generation = 0
        self._by_payload: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def new_generation(self) -> None:
        """A new executor: functions of the main script are pickled again on first use."""
        self.generation += 1

    def fn_id(self, fn: Callable[..., Any]) -> int:
        entry = self._by_fn.get(id(fn))
        if entry is not None and entry[0]() is fn and (
                entry[2] < 0 or entry[2] == self.generation):
            return entry[1]
        payload = _payload.dumps_function(fn)
        try:
            weakref.ref(fn)
        except TypeError:
            return self._by_value(fn, payload)
        key = id(fn)
        main = getattr(fn, "__module__", None) in ("__main__", "__mp_main__")
        if entry is not None and entry[0]() is fn and self._payloads.get(entry[1]) == payload:
            fid = entry[1]  # pickled the same again: the workers have it under this id
        else:
            fid = self._new_id()
            name = getattr(fn, "__qualname__", type(fn).__name__)
            self._register(fid, name, payload)
        ref = weakref.ref(fn, self._forgetter(key))
        with self._lock:
            if main:
                if entry is not None and entry[1] != fid:
                    self._payloads.pop(entry[1], None)
                self._payloads[fid] = payload
            self._by_fn[key] = (ref, fid, self.generation if main else -1)
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
            entry = self._by_fn.pop(key, None)
            if entry is not None:
                self._payloads.pop(entry[1], None)
