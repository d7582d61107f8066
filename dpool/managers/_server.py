"""The manager's server: one actor holding every object its manager made.

As the stdlib's manager process does, one ``ManagerServer`` holds the objects (a
``dict``, a ``Lock``, a registered class's instance...) under ids, and runs the methods
its proxies call on them. It is an actor with many threads (``max_concurrency``): a
call that blocks (``Queue.get``, ``Lock.acquire``, ``Event.wait``) holds one thread while
the others go on, as a manager's thread per connection does. A lock is owned by its
*caller* (process and thread of the proxy's user), not by the server thread that runs
the call (``CallerRLock``, ``CallerCondition``), so ``acquire`` and ``release`` may run
on different server threads.
"""

from __future__ import annotations

import array
import itertools
import threading
from collections import deque

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

_calling = threading.local()  # the caller of the call this server thread runs


def _caller() -> tuple:
    return getattr(_calling, "id", None) or ("server", threading.get_ident())


def public_methods(obj: Any) -> tuple:
    """What a proxy of ``obj`` exposes by default: its public callable attributes."""
    return tuple(name for name in dir(obj) if name[:1] != "_" and callable(getattr(obj, name)))


class ManagerServer:
    """The objects of one manager (see the module docstring)."""

    def __init__(self, registry: dict, initializer: Optional[Callable[..., Any]] = None,
                 initargs: tuple = ()) -> None:
        if initializer is not None:  # (``BaseManager.start(initializer, initargs)``)
            initializer(*initargs)
        # typeid -> (callable, exposed or None, method_to_typeid or None)
        self.registry = registry
        self.objects: dict[int, tuple[Any, tuple, dict]] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()

    def create(self, typeid: str, args: tuple, kwargs: dict) -> tuple[int, tuple]:
        """A new object of ``typeid``: its id and the methods its proxy exposes."""
        fn, exposed, to_typeid = self.registry[typeid]
        if fn is None:
            raise TypeError(f"typeid {typeid!r} has no callable: it is made by methods only")
        args = tuple(self._resolve(a) for a in args)
        kwargs = {k: self._resolve(v) for k, v in kwargs.items()}
        return self._hold(fn(*args, **kwargs), exposed, to_typeid)

    def _hold(self, obj: Any, exposed: Optional[tuple], to_typeid: Optional[dict]
              ) -> tuple[int, tuple]:
        exposed = tuple(exposed) if exposed is not None else public_methods(obj)
        with self.lock:
            oid = next(self.ids)
            self.objects[oid] = (obj, exposed, dict(to_typeid or {}))
        return oid, exposed

    def _resolve(self, value: Any) -> Any:
        """A proxy of this manager's passed as an argument: its object."""
        from dpool.managers._proxies import BaseProxy
        from dpool.runtime import current

        if isinstance(value, BaseProxy) and value._server._group_id == current.group_id():
            return self.objects[value._id][0]
        return value

    def call(self, oid: int, method: str, args: tuple, kwargs: dict, caller: tuple) -> Any:
        """``method(*args, **kwargs)`` of object ``oid`` for ``caller`` (pid, thread). A
        method whose typeid is in its ``method_to_typeid`` returns a new object's
        ``NewObject`` (its proxy is made where it lands) instead of the value."""
        try:
            obj, exposed, to_typeid = self.objects[oid]
        except KeyError:
            raise ReferenceError(f"manager object {oid} is gone") from None
        if method not in exposed and method not in ("__repr__", "__str__"):
            from multiprocessing.managers import RemoteError  # (the stdlib's, as its raises)

            raise RemoteError(f"AttributeError: method {method!r} of {type(obj)!r} object "
                              f"is not in exposed={exposed!r}")
        _calling.id = caller
        try:
            value = getattr(obj, method)(*args, **kwargs)
        finally:
            _calling.id = None
        typeid = to_typeid.get(method)
        if typeid is not None:
            from dpool.managers._proxies import NewObject

            _fn, sub_exposed, sub_to_typeid = self.registry[typeid]
            sid, sexp = self._hold(value, sub_exposed, sub_to_typeid)
            return NewObject(typeid, sid, sexp)
        if isinstance(value, (type({}.keys()), type({}.values()), type({}.items()))):
            return list(value)  # (as the stdlib's manager sends dict views)
        return value

    def get_value(self, oid: int) -> Any:
        """A copy of the object itself (``proxy._getvalue()``)."""
        return self.objects[oid][0]

    def release(self, oid: int) -> None:
        with self.lock:
            self.objects.pop(oid, None)

    def count(self) -> int:
        return len(self.objects)

    def close(self) -> None:
        """The manager shuts down: its pools stop their workers first (a pool made here
        is an embedded runtime of this process, whose store is this process's)."""
        with self.lock:
            objs = [obj for obj, _e, _t in self.objects.values()]
            self.objects.clear()
        pool = _pool_class()
        for obj in objs:
            if isinstance(obj, pool):
                try:
                    obj.terminate()
                except Exception:  # noqa: BLE001, S110 - the others still close
                    pass


def _pool_class() -> Any:
    from dpool.pool import Pool

    return Pool


def ServerPool(processes: Optional[int] = None, initializer: Optional[Callable] = None,  # noqa: N802
               initargs: tuple = (), maxtasksperchild: Optional[int] = None,
               context: Any = None) -> Any:
    """``manager.Pool(...)``: a ``dpool.Pool`` in the manager's process (the stdlib's is
    a ``multiprocessing.Pool`` in its server process)."""
    return _pool_class()(processes, initializer, initargs, maxtasksperchild)


class Namespace:
    """``manager.Namespace()``: attributes only."""

    def __init__(self, **kwds: Any) -> None:
        self.__dict__.update(kwds)

    def __repr__(self) -> str:
        items = [f"{k}={v!r}" for k, v in self.__dict__.items() if not k.startswith("_")]
        return f"Namespace({', '.join(sorted(items))})"


class Value:
    """``manager.Value(typecode, value)``: one value behind ``get``/``set``."""

    def __init__(self, typecode: str, value: Any, lock: bool = True) -> None:
        self._typecode = typecode
        self._value = value

    def get(self) -> Any:
        return self._value

    def set(self, value: Any) -> None:
        self._value = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._typecode!r}, {self._value!r})"


def Array(typecode: str, sequence: Any, lock: bool = True) -> array.array:  # noqa: N802
    return array.array(typecode, sequence)


class CallerRLock:
    """A reentrant lock owned by the caller that acquired it (``_caller``). ``Lock()``
    is the same, not reentrant (as a ``threading.Lock``, any caller may release it)."""

    def __init__(self, reentrant: bool = True) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: Optional[tuple] = None
        self._count = 0
        self._reentrant = reentrant

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = _caller()
        with self._cond:
            if self._reentrant and self._owner == me:
                self._count += 1
                return True
            if self._count:
                if not blocking:
                    return False
                if not self._cond.wait_for(lambda: self._count == 0,
                                           None if timeout is None or timeout < 0 else timeout):
                    return False
            self._owner, self._count = me, 1
            return True

    def release(self) -> None:
        with self._cond:
            if self._count == 0 or (self._reentrant and self._owner != _caller()):
                raise RuntimeError("cannot release un-acquired lock")
            self._count -= 1
            if self._count == 0:
                self._owner = None
                self._cond.notify()

    def locked(self) -> bool:
        return self._count > 0

    def _owned(self) -> bool:
        return self._count > 0 and (not self._reentrant or self._owner == _caller())

    def _release_all(self) -> int:
        with self._cond:
            n, self._count, self._owner = self._count, 0, None
            self._cond.notify()
            return n

    def _take_back(self, n: int) -> None:
        self.acquire()
        with self._cond:
            self._count = n


def Lock() -> CallerRLock:  # noqa: N802
    return CallerRLock(reentrant=False)


class CallerCondition:
    """``threading.Condition`` whose lock is a ``CallerRLock``: a caller waits and
    notifies as the owner of the lock it acquired in an earlier call."""

    def __init__(self, lock: Optional[CallerRLock] = None) -> None:
        self._lock = lock if lock is not None else CallerRLock()
        self._waiters: deque = deque()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def wait(self, timeout: Optional[float] = None) -> bool:
        if not self._lock._owned():
            raise RuntimeError("cannot wait on un-acquired lock")
        waiter = threading.Lock()
        waiter.acquire()
        self._waiters.append(waiter)
        held = self._lock._release_all()
        try:
            got = waiter.acquire(True, -1 if timeout is None else max(timeout, 0))
            if not got:
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            return got
        finally:
            self._lock._take_back(held)

    def notify(self, n: int = 1) -> None:
        if not self._lock._owned():
            raise RuntimeError("cannot notify on un-acquired lock")
        while n > 0 and self._waiters:
            self._waiters.popleft().release()
            n -= 1

    def notify_all(self) -> None:
        self.notify(len(self._waiters))
