"""The future of a task, without importing ``concurrent.futures`` (a leaf of types).

``TaskFuture`` behaves as a ``concurrent.futures.Future`` does, attribute for attribute:
the same states (the same strings), ``_condition``, ``_waiters`` and ``_done_callbacks``,
so the stdlib's ``wait`` and ``as_completed`` work on it. ``dpool.futures.Future`` is
this class *and* a ``concurrent.futures.Future`` (what an executor returns); ``Pool``
uses this one directly, so a ``multiprocessing.Pool`` program that swaps its import
loads neither ``concurrent.futures`` nor the ``logging`` it imports. The stdlib's
exceptions -- ``CancelledError``, ``InvalidStateError`` and (before 3.11)
``TimeoutError`` -- are imported when one is raised.

A future also names the object its task produces (``object_ref``): it can be passed to
another task as an argument (a dataflow dependency). What it asks of the client that made
it is ``FutureClient``; the runtime's clients (``dpool.runtime._client.Client``)
implement it.
"""

from __future__ import annotations

import collections
import sys
import threading
import types

from dpool import _log

__all__ = ["TaskFuture", "ObjectRef", "collect_refs", "completes_anywhere"]

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:  # (the client protocol is for type checkers only)
    from typing import Any, Callable, Optional, Protocol, TypeVar

    T = TypeVar("T")

    class FutureClient(Protocol):
        """What a ``Future`` or ``ObjectRef`` calls on the client that made it."""

        gives_back_slot: bool  # a worker's client: waiting hands the worker's slot back

        def blocking(self, fn: Callable[..., T], *args: Any) -> T:
            """``fn(*args)`` (a wait), with the worker's slot given back meanwhile."""

        def lead(self, future: TaskFuture, timeout: Optional[float]) -> Optional[float]:
            """Wait a while for ``future`` by reading its result on this thread; what is
            left of ``timeout``."""

        def release(self, object_id: int) -> None:
            """Drop one handle of the object (from ``__del__``: takes no lock)."""


# ``concurrent.futures._base``'s state names (its module compares these strings)
PENDING = "PENDING"
RUNNING = "RUNNING"
CANCELLED = "CANCELLED"
CANCELLED_AND_NOTIFIED = "CANCELLED_AND_NOTIFIED"
FINISHED = "FINISHED"
_DONE = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))
_SHOWN = {PENDING: "pending", RUNNING: "running", CANCELLED: "cancelled",
          CANCELLED_AND_NOTIFIED: "cancelled", FINISHED: "finished"}

# the stdlib's own logger for a failing done-callback
_cb_log = _log.getLogger("concurrent.futures")


def completes_anywhere(future: Any) -> bool:
    """Whether ``future`` may be completed on any thread -- a thread waiting for it
    included (the runtime's "leading" read, which saves a hop between threads): it has no
    done-callbacks, or only ones marked ``any_thread`` (``Pool``'s own, which run no user
    code and take no lock a waiting thread could hold). Anything else is completed on
    the runtime's IO thread, where callbacks always run."""
    callbacks = getattr(future, "_done_callbacks", None)
    return callbacks is not None and all(getattr(cb, "any_thread", False) for cb in callbacks)


def cancelled_error() -> type:
    """``concurrent.futures.CancelledError`` (imported on first use)."""
    from concurrent.futures import CancelledError

    return CancelledError


def _timeout_error() -> type:
    if sys.version_info >= (3, 11):
        return TimeoutError  # the builtin *is* concurrent.futures.TimeoutError
    from concurrent.futures import TimeoutError as FuturesTimeout

    return FuturesTimeout


class TracebackText(Exception):
    """A failed task's traceback as it arrives: ``_payload.loads_error`` attaches it as
    the exception's ``__cause__``, and the exception gets the stdlib's class in its place
    (``stdlib_cause``) before code of the user's sees it: a future's ``result()`` and
    ``exception()`` give the executor's (``concurrent.futures.process._RemoteTraceback``),
    a ``Pool`` its own (``multiprocessing.pool.RemoteTraceback``). Each class loads with
    the first failure that needs it: the executor's module brings most of
    ``multiprocessing`` with it, which a ``Pool`` never needs."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def stdlib_cause(exc: BaseException, cls: Optional[type] = None) -> BaseException:
    """``exc`` with the stdlib's remote-traceback class (``cls``, else the executor's) as
    its ``__cause__`` where ``loads_error`` attached the text; returns ``exc``."""
    cause = exc.__cause__
    if type(cause) is TracebackText:
        if cls is None:
            cls = remote_traceback_type()
        exc.__cause__ = cls(cause.tb)
    return exc


def remote_traceback_type() -> type:
    """The class of a failed executor task's ``__cause__``: the stdlib's own, as
    ``concurrent.futures`` attaches (code and CPython's tests check
    ``type(exc.__cause__)``); a ``Pool`` gives ``multiprocessing.pool.RemoteTraceback``.
    Imported when first needed: its module, ``concurrent.futures.process``, brings most
    of ``multiprocessing`` with it. (At interpreter exit, where that import fails, the
    text's own class, ``TracebackText``, stays.)"""
    global _remote_traceback
    if _remote_traceback is None:
        try:
            from concurrent.futures.process import _RemoteTraceback

            _remote_traceback = _RemoteTraceback
        except RuntimeError:  # "can't register atexit after shutdown"
            _remote_traceback = TracebackText
    return _remote_traceback


_remote_traceback: Optional[type] = None


def _invalid_state(future: TaskFuture) -> Exception:
    from concurrent.futures import InvalidStateError

    return InvalidStateError(f"{future._state}: {future!r}")


# While a task's arguments are pickled on a thread, the handles pickled inside them
# (``collect_refs``): the submitting client keeps them until the task ends.
_pickling = threading.local()


def collect_refs(fn: Callable[..., T], *args: Any) -> tuple[T, list]:
    """``(fn(*args), handles)``: ``fn``'s result, and the ``ObjectRef``s and futures
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


class TaskFuture:
    """The future of a dpool task: a ``concurrent.futures.Future`` in behaviour."""

    __class_getitem__: Any = classmethod(types.GenericAlias)

    def __init__(self, _object_id: int = 0, _client: Optional[FutureClient] = None) -> None:
        self._condition: threading.Condition = _Condition()
        self._state = PENDING
        self._result: Any = None
        self._exception: Optional[BaseException] = None
        self._waiters: list = []
        self._done_callbacks: list = []
        self._oid = _object_id
        self._client = _client

    def __repr__(self) -> str:
        state = self._state
        name = self.__class__.__name__
        if state == FINISHED:
            if self._exception is not None:
                return f"<{name} at {id(self):#x} state=finished raised " \
                       f"{self._exception.__class__.__name__}>"
            return f"<{name} at {id(self):#x} state=finished returned " \
                   f"{self._result.__class__.__name__}>"
        return f"<{name} at {id(self):#x} state={_SHOWN[state]}>"

    @property
    def object_ref(self) -> ObjectRef:
        """A reference to this task's result, usable as an argument to other tasks."""
        return ObjectRef(self._oid)

    # -- the caller's side -----------------------------------------------------------------
    def cancel(self) -> bool:
        """Cancel the call if it has not started; True if it is (now) cancelled."""
        with self._condition:
            if self._state in (RUNNING, FINISHED):
                return False
            if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                return True
            self._state = CANCELLED
            self._condition.notify_all()
        self._invoke_callbacks()
        return True

    def cancelled(self) -> bool:
        return self._state in (CANCELLED, CANCELLED_AND_NOTIFIED)

    def running(self) -> bool:
        return self._state == RUNNING

    def done(self) -> bool:
        return self._state in _DONE

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        """Call ``fn(future)`` when the future is done (now, if it is)."""
        with self._condition:
            if self._state not in _DONE:
                self._done_callbacks.append(fn)
                return
        try:
            fn(self)
        except Exception:
            _cb_log.exception("exception calling callback for %r", self)

    def result(self, timeout: Optional[float] = None) -> Any:
        client = self._client
        if client is not None and self._state not in _DONE:
            if client.gives_back_slot:
                return client.blocking(self._wait_result, timeout)
            timeout = client.lead(self, timeout)  # a driver may read the result itself
        return self._wait_result(timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        client = self._client
        if client is not None and self._state not in _DONE:
            if client.gives_back_slot:
                return client.blocking(self._wait_exception, timeout)
            timeout = client.lead(self, timeout)
        return self._wait_exception(timeout)

    def _wait_result(self, timeout: Optional[float]) -> Any:
        try:
            with self._condition:
                if self._state not in _DONE:
                    self._condition.wait(timeout)
                state = self._state
                if state == FINISHED:
                    exc = self._exception
                    if exc is None:
                        return self._result
                    try:
                        raise stdlib_cause(exc)
                    finally:
                        exc = None  # no cycle through this frame's traceback
                if state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                    raise cancelled_error()()
                raise _timeout_error()()
        finally:
            self = None  # type: ignore[assignment]  # (as the stdlib: no frame cycle)

    def _wait_exception(self, timeout: Optional[float]) -> Optional[BaseException]:
        with self._condition:
            if self._state not in _DONE:
                self._condition.wait(timeout)
            state = self._state
            if state == FINISHED:
                exc = self._exception
                return exc if exc is None else stdlib_cause(exc)
            if state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                raise cancelled_error()()
            raise _timeout_error()()

    # -- the runtime's side ----------------------------------------------------------------
    def set_running_or_notify_cancel(self) -> bool:
        """Mark the call as started (True), or, if it was cancelled, tell its waiters so
        and return False."""
        with self._condition:
            if self._state == CANCELLED:
                self._state = CANCELLED_AND_NOTIFIED
                for waiter in self._waiters:
                    waiter.add_cancelled(self)
                return False
            if self._state == PENDING:
                self._state = RUNNING
                return True
            _cb_log.critical("Future %s in unexpected state: %s", id(self), self._state)
            raise RuntimeError("Future in unexpected state")

    def set_result(self, result: Any) -> None:
        with self._condition:
            if self._state in _DONE:
                raise _invalid_state(self)
            self._result = result
            self._state = FINISHED
            for waiter in self._waiters:
                waiter.add_result(self)
            self._condition.notify_all()
        self._invoke_callbacks()

    def set_exception(self, exception: Optional[BaseException]) -> None:
        with self._condition:
            if self._state in _DONE:
                raise _invalid_state(self)
            self._exception = exception
            self._state = FINISHED
            for waiter in self._waiters:
                waiter.add_exception(self)
            self._condition.notify_all()
        self._invoke_callbacks()

    def _invoke_callbacks(self) -> None:
        for callback in self._done_callbacks:
            try:
                callback(self)
            except Exception:
                _cb_log.exception("exception calling callback for %r", self)

    # -- as a handle -----------------------------------------------------------------------
    def __reduce__(self) -> tuple:
        _pickled(self)
        return (ObjectRef, (self._oid,))

    def __del__(self) -> None:
        client = self._client
        if client is not None:
            client.release(self._oid)
