"""Future, ObjectRef and the waiting/getting functions of the paper's API.

``Future`` *is* a ``concurrent.futures.Future``: the stdlib's ``wait`` and
``as_completed`` work on it unchanged. It also names the object the task produces, so it
can be passed to another task as an argument (a dataflow dependency: the task runs when
its inputs are ready and receives the value, not the future).
"""

from __future__ import annotations

import collections
import concurrent.futures as _cf
import threading
import time
from typing import Any, Iterable, Optional, Sequence, TypeVar, Union

__all__ = ["Future", "ObjectRef", "wait", "get", "put"]

T = TypeVar("T")


class ObjectRef:
    """A reference to an immutable object in the runtime (from ``put`` or a task).

    Passing it to ``submit`` gives the task the value. The ref that ``put`` returned holds
    the object alive; copies unpickled in other processes borrow it.
    """

    __slots__ = ("id", "_client", "__weakref__")

    def __init__(self, object_id: int, _client: Any = None) -> None:
        self.id = object_id
        self._client = _client

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"ObjectRef({self.id:#x})"

    def __reduce__(self) -> tuple:
        return (ObjectRef, (self.id,))

    def __del__(self) -> None:
        client = self._client
        if client is not None:
            client.release(self.id)


class _Condition(threading.Condition):
    """``threading.Condition()`` (over an ``RLock``) without its per-instance bound methods.

    The stdlib's binds five of the lock's methods to every instance: five more objects
    the garbage collector tracks per future. A burst of 10,000 submits holds 10,000
    futures, and collecting them was a third of the driver's time (throughput ~60k/s with
    the collector on, ~93k/s with it off). These delegate through the class instead.
    """

    def __init__(self) -> None:  # no super().__init__(): the bindings are what it saves
        self._lock = threading.RLock()
        self._waiters: collections.deque = collections.deque()

    def acquire(self, *args: Any) -> bool:
        return self._lock.acquire(*args)

    def release(self) -> None:
        self._lock.release()

    def _release_save(self) -> Any:
        return self._lock._release_save()  # type: ignore[attr-defined]

    def _acquire_restore(self, state: Any) -> None:
        self._lock._acquire_restore(state)  # type: ignore[attr-defined]

    def _is_owned(self) -> bool:
        return self._lock._is_owned()  # type: ignore[attr-defined, no-any-return]


# The attributes ``concurrent.futures.Future.__init__`` sets; where a Python version sets
# others, Future falls back to calling it (and gets the stdlib's Condition).
_FAST_INIT = set(vars(_cf.Future())) == {
    "_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks"}


class Future(_cf.Future):
    """The future of a dpool task; a ``concurrent.futures.Future`` in every respect."""

    def __init__(self, _object_id: int = 0, _client: Any = None) -> None:
        if _FAST_INIT:  # _cf.Future.__init__ with a lighter condition (see _Condition)
            self._condition = _Condition()
            self._state = _cf._base.PENDING
            self._result = None
            self._exception = None
            self._waiters: list = []
            self._done_callbacks: list = []
        else:
            super().__init__()
        self._oid = _object_id
        self._client = _client

    @property
    def object_ref(self) -> ObjectRef:
        """A reference to this task's result, usable as an argument to other tasks."""
        return ObjectRef(self._oid)

    def result(self, timeout: Optional[float] = None) -> Any:
        client = self._client
        if client is not None and not self.done():
            if client.gives_back_slot:
                return client.blocking(_cf.Future.result, self, timeout)
            lead = getattr(client, "lead", None)  # a driver reads the result itself
            if lead is not None:
                timeout = lead(self, timeout)
        return _cf.Future.result(self, timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        client = self._client
        if client is not None and not self.done():
            if client.gives_back_slot:
                return client.blocking(_cf.Future.exception, self, timeout)
            lead = getattr(client, "lead", None)
            if lead is not None:
                timeout = lead(self, timeout)
        return _cf.Future.exception(self, timeout)

    def __reduce__(self) -> tuple:
        return (ObjectRef, (self._oid,))

    def __del__(self) -> None:
        client = self._client
        if client is not None:
            client.release(self._oid)


Waitable = Union[Future, ObjectRef, _cf.Future]


def _as_future(x: Any) -> _cf.Future:
    if isinstance(x, _cf.Future):
        return x
    if isinstance(x, ObjectRef):
        from dpool.runtime._current import client

        return client().future_for(x)
    raise TypeError(f"expected a Future or ObjectRef, got {type(x).__name__}")


def wait(
    futures: Sequence[Waitable], num_returns: int = 1, timeout: Optional[float] = None
) -> tuple[list, list]:
    """Wait until ``num_returns`` of ``futures`` are done or ``timeout`` seconds pass.

    Returns ``(done, not_done)``: at most ``num_returns`` done items in input order, and
    the others in input order (the paper's ``ray.wait``). ``timeout=None`` waits forever;
    a timeout is not an error, you get what is done by then.
    """
    items = list(futures)
    if num_returns < 0 or num_returns > len(items):
        raise ValueError(
            f"num_returns must be between 0 and len(futures) ({len(items)}), got {num_returns}")
    fs = [_as_future(x) for x in items]

    def _wait() -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pending = [f for f in fs if not f.done()]
            if len(fs) - len(pending) >= num_returns or not pending:
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            _cf.wait(pending, timeout=remaining, return_when=_cf.FIRST_COMPLETED)

    from dpool.runtime._current import client

    c = client()
    if c.gives_back_slot:
        c.blocking(_wait)
    else:
        _wait()
    done: list = []
    not_done: list = []
    for x, f in zip(items, fs, strict=True):
        (done if f.done() and len(done) < num_returns else not_done).append(x)
    return done, not_done


def get(refs: Union[Waitable, Iterable[Waitable]], timeout: Optional[float] = None) -> Any:
    """The value of a Future/ObjectRef, or a list of values for a list of them.

    Raises the task's exception, or ``TimeoutError`` after ``timeout`` seconds (measured
    from the call, for the whole list).
    """
    single = isinstance(refs, (ObjectRef, _cf.Future))
    items = [refs] if single else list(refs)  # type: ignore[arg-type]
    fs = [_as_future(x) for x in items]
    deadline = None if timeout is None else time.monotonic() + timeout
    out = []
    for f in fs:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        out.append(f.result(remaining))
    return out[0] if single else out


def put(value: Any) -> ObjectRef:
    """Store ``value`` once in the runtime; pass the ref to any number of tasks."""
    from dpool.runtime._current import client

    return client().put(value)
