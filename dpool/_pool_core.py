"""What ``dpool.Pool`` runs on: one executor, one result-handler thread, the pool's state.

    Pool.apply_async / map_async ──submit──▶ ExecutorCore (own worker group)
    IMapIterator feeder thread ───submit──▶        │ futures complete on any thread
                                                   ▼
                     done-callback: queue.put((job, index, kind, future))
                                                   │
                     result-handler thread ◀───────┘  job._set(...) -> user callbacks

Tasks go straight to the executor from the thread that submits them. Outcomes come back
through one ``SimpleQueue`` to one result-handler thread per pool, which applies them to
their job (``ApplyResult``/``MapResult``/imap iterator). This hop is what the stdlib's
``_handle_results`` thread is for: user callbacks run on that single thread, in the order
outcomes are handled, never on a thread of the caller or of the runtime (where a
callback taking the caller's lock could deadlock).

``PoolCore`` holds no reference to its ``Pool``, so an unreferenced pool is collected
(and terminated) as the stdlib's is, even while its threads run.

Lock rule: ``self._cond`` guards ``state``, ``_accepting``, ``_pending`` and ``_feeders``.
It is never held while calling the executor or user code.
"""

from __future__ import annotations

import atexit
import itertools
import threading
import weakref
from collections import OrderedDict
from functools import partial

try:  # the C queue itself: the ``queue`` module (and ``heapq``) is not needed for it
    from _queue import SimpleQueue
except ImportError:  # pragma: no cover - an interpreter without the accelerator
    from queue import SimpleQueue  # type: ignore[assignment]

from dpool import _log
from dpool._executor_core import ExecutorCore, _ChunkRunner
from dpool._pool_results import APPLY, BATCH, CHUNK, SINGLE, IMapIterator, Outcomes
from dpool._task_future import TaskFuture, TracebackText, cancelled_error
from dpool.objects import payload as _payload

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Optional

log = _log.getLogger("dpool.pool")

RUN, CLOSE, TERMINATE = "RUN", "CLOSE", "TERMINATE"  # the stdlib's state names

_RUNNER_CACHE = 32  # chunk runners kept per pool, so repeated maps reuse their function id
_INFLIGHT_PER_PROCESS = 64  # imap: chunks running or queued per worker process (tiny
# tasks need many in flight so the scheduler can batch them; still a bound for generators)
_MIN_INFLIGHT = 128
_BUFFER_FACTOR = 4  # imap: results waiting for the consumer, in units of max_inflight
_BATCH_TARGET_S = 200e-6  # imap(chunksize=1): group calls shorter than this into one task
_MAX_BATCH = 64


class _BatchRunner:
    """Runs ``fn(x)`` for each ``x`` of an automatic batch; each item fails on its own.

    Returns ``[(True, value) | (False, exception, traceback text), ...]`` so that the
    batch behaves like separate ``chunksize=1`` tasks: one item's exception does not
    cost the others their results.
    """

    __slots__ = ("fn", "__weakref__")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, chunk: list) -> list:
        fn = self.fn
        out: list = []
        for x in chunk:
            try:
                out.append((True, fn(x)))
            except BaseException as exc:  # noqa: BLE001 - reported per item, as the stdlib does
                tb = _payload.format_remote(exc)
                exc.__traceback__ = None
                out.append((False, exc, tb))
        return out

    def __reduce__(self) -> tuple:
        return (_BatchRunner, (self.fn,))

    @property
    def __dpool_resources__(self) -> Any:  # the wrapped function's @dpool.resources
        return getattr(self.fn, "__dpool_resources__", None)


class _MapChunk:
    """Runs ``fn(x)`` for each ``x`` of one chunk of ``map``/``imap`` input, in a worker."""

    __slots__ = ("fn", "__weakref__")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, chunk: list) -> list:
        fn = self.fn
        return [fn(x) for x in chunk]

    def __reduce__(self) -> tuple:
        return (_MapChunk, (self.fn,))

    @property
    def __dpool_resources__(self) -> Any:  # the wrapped function's @dpool.resources
        return getattr(self.fn, "__dpool_resources__", None)


class PoolCore:
    """The executor, the state and the threads of one ``Pool`` (see the module docstring)."""

    def __init__(self, executor: ExecutorCore, processes: int) -> None:
        self.executor = executor
        self.processes = processes
        self.max_inflight = max(_INFLIGHT_PER_PROCESS * processes, _MIN_INFLIGHT)
        self.max_buffered = _BUFFER_FACTOR * self.max_inflight
        self.state = RUN
        self._cond = threading.Condition(threading.Lock())
        self._accepting = True  # False once terminated or joined: nothing more is submitted
        self._terminated = False
        self._joined = False
        self._pending = 0  # outcomes submitted and not yet applied by the handler
        self._feeders: set[IMapIterator] = set()
        self._stop_requested = False
        self._queue: SimpleQueue = SimpleQueue()
        self._runners: OrderedDict[tuple[int, Any], Any] = OrderedDict()
        self._runners_lock = threading.Lock()
        # The handler thread starts with the first outcome it has to apply (a callback,
        # an error): a pool whose results go straight to their waiters starts no thread,
        # and none before its first worker is forked (``scheduling.fork_point``).
        self._handler = threading.Thread(target=self._handle_results,
                                         name="dpool-pool-results", daemon=True)
        self._handler_started = False
        self._handler_lock = threading.Lock()
        _track(self)

    # -- submitting ----------------------------------------------------------------------
    def submit(self, job: Any, index: int, kind: int, fn: Callable[..., Any], args: Iterable[Any],
               kwargs: Optional[dict] = None) -> bool:
        """Run ``fn(*args, **kwargs)`` for ``job``'s ``index``; False once not accepting.

        ``kind`` says how the task's value maps to the job: APPLY (the value), SINGLE (one
        item of a map) or CHUNK (a list of items).
        """
        with self._cond:
            if not self._accepting:
                return False
            self._pending += 1
        try:
            fut = self.executor.submit(fn, *args, **(kwargs or {}))
        except BaseException as exc:  # noqa: BLE001 - broken pool, bad *args: fail this task
            self._put((job, index, kind, None, exc))
            return True
        if getattr(job, "_callback", None) is None and \
                getattr(job, "_error_callback", None) is None:
            # No user callback to order: apply the outcome right where the future
            # completes, saving a thread hop per task (apply round trip, imap) -- on the
            # thread waiting for it, when that one reads the result itself (``lead``).
            apply = partial(self._apply_direct, job, index, kind)
            apply.any_thread = True  # type: ignore[attr-defined]  # (completes_anywhere)
            fut.add_done_callback(apply)
            if kind == APPLY:
                job._fut = fut  # its get() or wait() may lead
        else:
            fut.add_done_callback(partial(self._on_done, job, index, kind))
        return True

    def post_error(self, job: Any, index: int, error: BaseException) -> bool:
        """Fail ``job``'s ``index`` with ``error`` (via the handler thread, like any outcome)."""
        with self._cond:
            if not self._accepting:
                return False
            self._pending += 1
        self._put((job, index, APPLY, None, error))
        return True

    def submit_map(self, job: Any, fn: Callable[..., Any], items: Iterable[Any], chunksize: int,
                   star: bool) -> bool:
        """Submit every chunk of a ``map``/``starmap`` job; False if refused on the way."""
        if chunksize == 1:
            for index, item in enumerate(items):
                if star:
                    try:
                        args = tuple(item)
                    except TypeError as exc:  # the stdlib fails this item in the worker
                        if not self.post_error(job, index, exc):
                            return False
                        continue
                else:
                    args = (item,)
                if not self.submit(job, index, SINGLE, fn, args):
                    return False
            return True
        runner = self.runner(fn, star)
        it = iter(items)
        index = 0
        while True:
            # islice builds each chunk at C speed (a Python loop over a large map's items
            # costs as much as the map's whole remaining work: bench/NOTES.md)
            chunk = list(itertools.islice(it, chunksize))
            if not chunk:
                return True
            if not self.submit(job, index, CHUNK, runner, (chunk,)):
                return False
            index += 1

    def batch_runner(self, fn: Callable[[Any], Any]) -> Callable[[list], list]:
        key = (id(fn), "batch")
        with self._runners_lock:
            runner = self._runners.get(key)
            if runner is None or runner.fn is not fn:
                runner = _BatchRunner(fn)
                self._runners[key] = runner
                if len(self._runners) > _RUNNER_CACHE:
                    self._runners.popitem(last=False)
            return runner

    def auto_batch(self, fn: Callable[[Any], Any]) -> int:
        """How many ``chunksize=1`` calls of ``fn`` to send as one task.

        From the measured run time per call: calls far shorter than a task's fixed cost
        are grouped (results still come one by one); anything slower, or not yet
        measured, goes one call per task.
        """
        per_call = self.executor._estimate(fn)
        runner = self._runners.get((id(fn), "batch"))
        if runner is not None and runner.fn is fn:
            measured = self.executor._estimate(runner, default=None)
            if measured is not None:
                per_call = measured / _MAX_BATCH
        if per_call <= 0:
            return _MAX_BATCH
        return max(1, min(_MAX_BATCH, int(_BATCH_TARGET_S / per_call)))

    def runner(self, fn: Callable[..., Any], star: bool) -> Callable[[list], list]:
        """A chunk runner for ``fn``, reused while recently used (its function id stays)."""
        key = (id(fn), star)
        with self._runners_lock:
            runner = self._runners.get(key)
            if runner is not None and runner.fn is fn:
                self._runners.move_to_end(key)
                return runner
            runner = _ChunkRunner(fn) if star else _MapChunk(fn)
            self._runners[key] = runner
            if len(self._runners) > _RUNNER_CACHE:
                self._runners.popitem(last=False)
            return runner

    def add_feeder(self, it: IMapIterator) -> bool:
        with self._cond:
            if not self._accepting or self.state != RUN:
                return False
            self._feeders.add(it)
        it._start_feeder()
        return True

    def feeder_finished(self, it: IMapIterator) -> None:
        with self._cond:
            self._feeders.discard(it)
            last_after_close = not self._feeders and self.state == CLOSE
            self._cond.notify_all()
        if last_after_close:
            self.executor.shutdown(wait=False)

    # -- outcomes ------------------------------------------------------------------------
    def _put(self, item: Optional[tuple]) -> None:
        """Hand ``item`` to the handler thread, started now if it is not yet."""
        if not self._handler_started:
            with self._handler_lock:
                if not self._handler_started:
                    self._handler_started = True
                    self._handler.start()
        self._queue.put(item)

    def _on_done(self, job: Any, index: int, kind: int, fut: TaskFuture) -> None:
        self._put((job, index, kind, fut, None))

    def _apply_direct(self, job: Any, index: int, kind: int, fut: TaskFuture) -> None:
        if self._apply_outcome(job, index, kind, fut, None) and self._handler_started:
            self._queue.put(None)  # the handler may be waiting to stop: let it look

    def _apply_outcome(self, job: Any, index: int, kind: int, fut: Optional[TaskFuture],
                       exc: Optional[BaseException]) -> bool:
        """Deliver one task's outcome to its job; True if the handler should stop now."""
        value: Any = None
        if fut is not None:
            if fut.cancelled():
                exc = cancelled_error()()
            else:
                exc = fut._exception  # (done: read as it came, with its traceback's text)
                if exc is not None and type(exc.__cause__) is TracebackText:
                    exc.__cause__ = _pool_traceback(exc.__cause__.tb)
                if exc is None:
                    value = fut.result()
                    # The pool's own future: let go of the result, which the runtime
                    # may hold a moment longer, so that a consumer frees it at once.
                    fut._result = None  # type: ignore[attr-defined]
            fut = None
        if exc is None:
            if kind == SINGLE:
                value = [value]
            elif kind == BATCH:
                value = Outcomes(_batch_outcomes(value))
            ok = True
        else:
            value, exc, ok = exc, None, False
        try:
            job._set(index, ok, value, not self._terminated)
        except Exception:  # keep handling the pool's other results
            log.exception("dpool.Pool: internal error while delivering a result")
        job = value = None
        with self._cond:
            self._pending -= 1
            if self._pending == 0:
                self._cond.notify_all()
                return self._stop_requested
        return False

    def _handle_results(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is None:
                with self._cond:
                    if self._pending == 0:
                        return
                continue
            job, index, kind, fut, exc = item
            item = None
            if self._apply_outcome(job, index, kind, fut, exc):
                return
            job = fut = None

    def _in_handler(self) -> bool:
        return threading.current_thread() is self._handler

    def _wait_outcomes_and_stop_handler(self) -> None:
        """Once every outcome is applied (callbacks run), end the handler thread."""
        with self._cond:
            self._accepting = False
            self._stop_requested = True
            idle = self._pending == 0
        with self._handler_lock:
            if idle and not self._handler_started:
                return  # it never had to start, and nothing is left for it
        self._put(None)
        if not self._in_handler():
            self._handler.join()

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        with self._cond:
            if self.state != RUN:
                return
            self.state = CLOSE
            idle = not self._feeders
        if idle:
            self.executor.shutdown(wait=False)

    def join(self) -> None:
        """Wait for all the work to finish, the workers to exit and the callbacks to run."""
        if self._in_handler():
            raise RuntimeError("cannot join a dpool.Pool from its own callback (the "
                               "callbacks' thread would wait for itself)")
        with self._cond:
            feeders = list(self._feeders)
        for it in feeders:
            it._start_draining()  # join() means all the submitted input is processed
        with self._cond:
            while self._feeders and not self._terminated:
                self._cond.wait()
        self.executor.shutdown(wait=True)
        self._wait_outcomes_and_stop_handler()
        self._joined = True

    def terminate(self, reason: str = "the pool was terminated") -> None:
        """Stop now: kill the workers, fail what has not finished, without callbacks."""
        with self._cond:
            first = not self._terminated
            self._terminated = True
            self.state = TERMINATE
            feeders = list(self._feeders)
        if not first:
            return
        for it in feeders:
            it._stop()  # a feeder blocked in the user's generator is left behind (daemon)
        self.executor._terminate(reason)
        self.executor.shutdown(wait=True)
        self._wait_outcomes_and_stop_handler()

    def terminate_soon(self) -> None:
        """Terminate from a finalizer: on another thread, since the collector may run
        anywhere, including a thread that holds a lock ``terminate`` needs."""
        if not self._terminated and not self._joined:
            threading.Thread(target=self.terminate, name="dpool-pool-finalize",
                             daemon=True).start()


# -- interpreter exit: terminate the pools still alive, as the stdlib's finalizers do --------
_live: "weakref.WeakSet[PoolCore]" = weakref.WeakSet()
_exit_hook_installed = False
_exit_lock = threading.Lock()


def _batch_outcomes(items: list) -> list:
    out = []
    for item in items:
        if item[0]:
            out.append((True, item[1]))
        else:
            exc = item[1]
            exc.__cause__ = _pool_traceback(item[2])
            out.append((False, exc))
    return out


def _pool_traceback(tb: str) -> BaseException:
    """The worker's traceback as ``multiprocessing.pool`` attaches it (its own class)."""
    from multiprocessing import pool

    return pool.RemoteTraceback(tb)  # type: ignore[attr-defined]  # (not in typeshed)


def _track(core: PoolCore) -> None:
    global _exit_hook_installed
    with _exit_lock:
        _live.add(core)
        if not _exit_hook_installed:
            # Registered after the runtime's own exit hook (the executor started it), so it
            # runs first: pools are terminated before the runtime waits for executors.
            atexit.register(_terminate_all_at_exit)
            _exit_hook_installed = True


def _terminate_all_at_exit() -> None:
    for core in list(_live):
        if not core._joined:
            try:
                core.terminate("the interpreter is exiting")
            except Exception:  # keep terminating the others
                log.exception("dpool.Pool: error terminating a pool at exit")
