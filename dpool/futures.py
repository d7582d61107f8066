"""Future and ObjectRef: the types of dpool's results (a leaf: it imports no dpool module).

``Future`` *is* a ``concurrent.futures.Future``: the stdlib's ``wait`` and
``as_completed`` work on it unchanged. It also names the object the task produces, so it
can be passed to another task as an argument (a dataflow dependency: the task runs when
its inputs are ready and receives the value, not the future).

What a future asks of the client that made it is ``FutureClient``; the runtime's clients
(``dpool.runtime._client.Client``) implement it. The functions that need this process's
runtime -- ``dpool.wait``, ``get`` and ``put`` -- are in ``dpool.runtime._api``.
"""

from __future__ import annotations

import collections
import concurrent.futures as _cf
import threading

__all__ = ["Future", "ObjectRef"]

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:  # (the client protocol is for type checkers only)
    from typing import Any, Callable, Optional, Protocol, TypeVar

    T = TypeVar("T")

    class FutureClient(Protocol):
        """What a ``Future`` or ``ObjectRef`` calls on the client that made it."""

        gives_back_slot: bool  # a worker's client: waiting hands the worker's slot back

        def blocking(self, fn: Callable[..., T], *args: Any) -> T:
            """``fn(*args)`` (a wait), with the worker's slot given back meanwhile."""

        def lead(self, future: Future, timeout: Optional[float]) -> Optional[float]:
            """Wait a while for ``future`` by reading its result on this thread; what is
            left of ``timeout``."""

        def release(self, object_id: int) -> None:
            """Drop one handle of the object (from ``__del__``: takes no lock)."""


# While a task's arguments are pickled on a thread, the handles pickled inside them
# (``collect_refs``): the submitting client keeps them until the task ends.
_pickling = threading.local()


def collect_refs(fn: Callable[..., T], *args: Any) -> tuple[T, list]:
    """``(fn(*args), handles)``: ``fn``'s result, and the ``ObjectRef``s and ``Future``s
    with a client of their own (not borrowed copies) that it pickled on this thread."""
    refs: list = []
    _pickling.refs = refs
    try:
        return fn(*args), refs
    finally:
        _pickling.refs = None


def _pickled(handle: Any) -> None:
    refs = getattr(_pickling, "refs", None)
    if refs is not None and handle._client is not None:
        refs.append(handle)


class ObjectRef:
    """A reference to an immutable object in the runtime (from ``put`` or a task).

    Passing it to ``submit`` gives the task the value. The ref that ``put`` returned holds
    the object alive, and so does a task it was passed to, inside another argument too
    (``submit(f, [ref])``), until the task ends; copies unpickled in other processes
    borrow it.
    """

    __slots__ = ("id", "_client", "__weakref__")

    def __init__(self, object_id: int, _client: Optional[FutureClient] = None) -> None:
        self.id = object_id
        self._client = _client

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"ObjectRef({self.id:#x})"

    def __reduce__(self) -> tuple:
        _pickled(self)
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

    def __init__(self, _object_id: int = 0, _client: Optional[FutureClient] = None) -> None:
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
            timeout = client.lead(self, timeout)  # a driver may read the result itself
        return _cf.Future.result(self, timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        client = self._client
        if client is not None and not self.done():
            if client.gives_back_slot:
                return client.blocking(_cf.Future.exception, self, timeout)
            timeout = client.lead(self, timeout)
        return _cf.Future.exception(self, timeout)

    def __reduce__(self) -> tuple:
        _pickled(self)
        return (ObjectRef, (self._oid,))

    def __del__(self) -> None:
        client = self._client
        if client is not None:
            client.release(self._oid)
