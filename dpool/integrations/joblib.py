"""joblib's ``"dpool"`` backend: ``Parallel`` and scikit-learn's ``n_jobs`` on dpool.

    Parallel ──submit(batch)──▶ DpoolBackend ──▶ executor.submit(run_batch, batch', *refs)
       ▲  (batch_size="auto",      │  large array arguments: dpool.put once per call
       │   pre_dispatch, timeout)  │  (_joblib_batch: the batch keeps a Slot for each)
       └──── done-callback ◀───────┘  on the runtime's thread: the result is retrieved
                                       there and the next batch dispatched (as loky's)

Importing this module registers the backend (``register_parallel_backend``);
``dpool.register_joblib()`` imports it. It follows joblib's ``LokyBackend`` wherever
dpool allows:

- **Executor.** A driver's ``Parallel(n_jobs=k)`` runs on a reusable
  ``dpool.ProcessPoolExecutor(max_workers=k)``, kept warm between calls, replaced when
  ``k`` or the thread caps change, closed after ``idle_worker_timeout`` seconds unused
  (300, as loky's) or at exit. Its workers cap native thread pools at ``cpu_count // k``
  threads (``inner_max_num_threads``), as loky's do.
- **Nesting.** A ``Parallel`` inside a task submits to the task's own worker group
  (``dpool.get_executor()``) and gives its CPU slot back while it waits
  (``retrieval_context``), so nested loops neither oversubscribe nor deadlock (loky runs
  them on threads instead).
- **n_jobs=-1** is the runtime's CPUs: ``dpool.cpu_count()``, the cluster's with
  ``DPOOL_ADDRESS``.
- **Abort** (an exception, a ``timeout``, a dropped generator): the call's tasks that
  have not started are cancelled; if some still run, the executor's workers are killed
  and the next call gets a fresh executor (loky kills its workers too).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import weakref
from typing import Any, Iterator, Optional

from joblib.parallel import (
    AutoBatchingMixin,
    FallbackToBackend,
    ParallelBackendBase,
    SequentialBackend,
    register_parallel_backend,
)

from dpool.executor import ProcessPoolExecutor, get_executor
from dpool.integrations._joblib_batch import (
    limit_threads,
    pickle_batch,
    run_batch,
    run_callable,
    run_pickled,
    split_batch,
)
from dpool.objects import values as _values
from dpool.runtime import current as _current
from dpool.runtime import get, put

__all__ = ["DpoolBackend", "register", "close_executor"]

log = logging.getLogger("dpool.joblib")

NAME = "dpool"
_DEFAULT_IDLE_TIMEOUT = 300.0  # seconds, as loky's idle_worker_timeout
_CONSTRUCTOR_KWARGS = frozenset({"idle_worker_timeout"})


class _ReusableExecutor:
    """The driver's warm executor for joblib calls (loky's reusable executor).

    One executor is current; a call that needs other settings (``n_jobs``, thread caps)
    replaces it, and the one replaced shuts down once the calls still using it end.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: Optional[ProcessPoolExecutor] = None
        self._key: Any = None
        self._users: dict[ProcessPoolExecutor, int] = {}  # calls using each executor
        self._generation = 0
        self._idle_timeout: Optional[float] = _DEFAULT_IDLE_TIMEOUT
        self._timer: Optional[threading.Timer] = None

    def acquire(self, n_jobs: int, env: dict, idle_timeout: Optional[float],
                ) -> ProcessPoolExecutor:
        key = (n_jobs, tuple(sorted(env.items())), _current.driver())
        with self._lock:
            self._generation += 1
            self._cancel_timer_locked()
            ex = self._executor
            if ex is None or self._key != key or ex._shutdown_thread or ex._broken:
                if ex is not None and not self._users.get(ex):
                    ex.shutdown(wait=False)  # its idle workers exit
                ex = self._executor = ProcessPoolExecutor(
                    max_workers=n_jobs, initializer=limit_threads, initargs=(env,))
                self._key = key
            self._users[ex] = self._users.get(ex, 0) + 1
            self._idle_timeout = idle_timeout
            return ex

    def release(self, ex: ProcessPoolExecutor) -> None:
        """A call is done with ``ex``: start the idle clock when nobody uses it."""
        with self._lock:
            left = self._users.get(ex, 1) - 1
            if left > 0:
                self._users[ex] = left
                return
            self._users.pop(ex, None)
            if ex is not self._executor:
                ex.shutdown(wait=False)  # replaced meanwhile: its last call is over
                return
            if self._idle_timeout is None:
                return
            self._timer = threading.Timer(self._idle_timeout, self._expire,
                                          (self._generation,))
            self._timer.daemon = True
            self._timer.start()

    def kill(self, ex: ProcessPoolExecutor) -> None:
        """Kill ``ex``'s workers (an abort); the next call gets a new executor."""
        with self._lock:
            self._users.pop(ex, None)
            if ex is self._executor:
                self._executor = None
                self._cancel_timer_locked()
        ex._terminate("the joblib call was aborted")
        ex.shutdown(wait=False)

    def close(self, wait: bool = True) -> None:
        with self._lock:
            ex, self._executor = self._executor, None
            others = [e for e in self._users if e is not ex]
            self._users.clear()
            self._cancel_timer_locked()
        for e in [*others, *([ex] if ex is not None else [])]:
            e.shutdown(wait=wait)

    def _expire(self, generation: int) -> None:
        with self._lock:
            ex = self._executor
            if generation != self._generation or ex is None or self._users.get(ex):
                return
            self._executor = None
            self._timer = None
        log.debug("closing the idle joblib executor")
        ex.shutdown(wait=False)

    def _cancel_timer_locked(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


_executors = _ReusableExecutor()


def close_executor(wait: bool = True) -> None:
    """Shut down the warm executor that joblib calls reuse (the next call starts one)."""
    _executors.close(wait)


class DpoolBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's ``"dpool"`` backend (see the module docstring).

    ``parallel_config(backend="dpool", idle_worker_timeout=300)``: seconds the warm
    executor waits unused before its workers exit. An array argument of at least
    dpool's store threshold (256 KiB) is stored once per call rather than sent with
    each batch; joblib's ``max_nbytes=None`` sends every array with its batch, and
    other values of it change nothing (see ``_threshold``); ``mmap_mode`` and
    ``temp_folder`` have no use here (dpool's store maps arrays copy-on-write, in
    shared memory).
    """

    supports_retrieve_callback = True
    # ``batch_size="auto"`` grows a batch until it runs this long (joblib's 0.2 s, tuned to
    # hide loky's dispatch cost). A batch costs dpool ~0.1-0.3 ms to send and collect, so
    # shorter batches hide it as well, and leave less work on one worker while the other
    # waits at the end of a call (GridSearchCV, short tasks: bench/JOBLIB.md).
    MIN_IDEAL_BATCH_DURATION = 0.08
    supports_inner_max_num_threads = True
    supports_sharedmem = False
    uses_threads = False
    default_n_jobs = 1

    def __init__(self, nesting_level: Optional[int] = None,
                 inner_max_num_threads: Optional[int] = None, **backend_kwargs: Any) -> None:
        unknown = set(backend_kwargs) - _CONSTRUCTOR_KWARGS
        if unknown:
            raise TypeError(f"the dpool joblib backend takes no argument(s) "
                            f"{sorted(unknown)}; it takes {sorted(_CONSTRUCTOR_KWARGS)}")
        super().__init__(nesting_level=nesting_level,
                         inner_max_num_threads=inner_max_num_threads, **backend_kwargs)
        self._executor: Optional[ProcessPoolExecutor] = None
        self._shared = False  # whether _executor is the driver's reusable one
        self._lock = threading.Lock()
        self._running: set = set()  # this call's futures not yet done
        self._stored: dict[int, tuple] = {}  # id(array) -> (weakref, ref, stored view)
        self._threshold: Optional[int] = None
        # in a cluster, batches travel pickled by value (see _joblib_batch.pickle_batch)
        self._by_value = bool(os.environ.get("DPOOL_ADDRESS") or os.environ.get("DPOOL_NODE_ID"))

    # joblib pickles the nested backend with every batch: only the settings travel.
    def __reduce__(self) -> tuple:
        return (_rebuild, (type(self), self.nesting_level, self.inner_max_num_threads,
                           dict(self.backend_kwargs)))

    # -- sizing ------------------------------------------------------------------------------
    def effective_n_jobs(self, n_jobs: Optional[int]) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        if n_jobs < 0:
            return max(_current.cluster_cpus() + 1 + n_jobs, 1)
        return int(n_jobs)

    def configure(self, n_jobs: int = 1, parallel: Any = None, prefer: Any = None,
                  require: Any = None, idle_worker_timeout: Optional[float] = None,
                  max_nbytes: Any = "1M", **joblib_kwargs: Any) -> int:
        """Get the executor for a call; the number of workers (joblib's ``configure``)."""
        n_jobs = self.effective_n_jobs(n_jobs)
        if n_jobs == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        self.parallel = parallel
        self._threshold = _threshold(max_nbytes)
        if _current.in_worker():
            self._executor, self._shared = get_executor(), False
        elif self._executor is None or not self._shared:
            if idle_worker_timeout is None:
                idle_worker_timeout = self.backend_kwargs.get(
                    "idle_worker_timeout", _DEFAULT_IDLE_TIMEOUT)
            self._executor = _executors.acquire(
                n_jobs, self._prepare_worker_env(n_jobs), idle_worker_timeout)
            self._shared = True
        return n_jobs

    # -- tasks -------------------------------------------------------------------------------
    def submit(self, func: Any, callback: Any = None) -> Any:
        ex = self._executor
        if ex is None:
            raise RuntimeError("the dpool joblib backend was used before configure()")
        if hasattr(func, "items"):
            batch, values = func, ()
            if self._threshold is not None:
                batch, values = split_batch(func, self._store_once())
            if self._by_value:
                future = ex.submit(run_pickled, pickle_batch(batch), *values)
            else:
                future = ex.submit(run_batch, batch, *values)
        else:
            future = ex.submit(run_callable, func)
        with self._lock:
            self._running.add(future)
        future.add_done_callback(self._finished)
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def _finished(self, future: Any) -> None:
        with self._lock:
            self._running.discard(future)

    def retrieve_result_callback(self, future: Any) -> Any:
        return future.result()

    def _store_once(self) -> Any:
        """``_store`` for one batch: an array that several calls of the batch take (the
        ``X`` of every fit) is looked up, and its bytes compared, once."""
        seen: dict[int, Any] = {}

        def store(value: Any) -> Any:
            key = id(value)  # (the batch holds every value: no id is reused meanwhile)
            if key not in seen:
                seen[key] = self._store(value)
            return seen[key]

        return store

    def _store(self, value: Any) -> Any:
        """The stored object for a large array argument (stored on first use in this
        call, again if its bytes changed since); None to send ``value`` inline."""
        np = sys.modules.get("numpy")
        if np is None or type(value) is not np.ndarray or self._threshold is None \
                or value.nbytes < self._threshold or value.dtype.hasobject:
            return None
        if not (value.flags.c_contiguous or value.flags.f_contiguous) \
                and value.dtype.itemsize not in _WORDS:
            return None  # (no cheap bitwise compare: it travels with its batch, copied)
        # A strided view (load_digits' X is a column slice) is stored as a contiguous
        # copy, once per call, as the serializer would copy it for every batch.
        key = id(value)
        with self._lock:
            entry = self._stored.get(key)
        if entry is not None and entry[0]() is value and _same_bytes(value, entry[2], np):
            return entry[1]
        ref = put(value)
        stored = get(ref)  # a zero-copy view of what the tasks get, to check a hit against
        try:
            wref = weakref.ref(value)
        except TypeError:
            return ref
        with self._lock:
            self._stored[key] = (wref, ref, stored)
        return ref

    # -- nested calls ------------------------------------------------------------------------
    def get_nested_backend(self) -> tuple[Any, None]:
        """A ``Parallel`` inside a task runs on dpool too: on the task's worker group."""
        level = (self.nesting_level or 0) + 1
        return DpoolBackend(nesting_level=level,
                            inner_max_num_threads=self.inner_max_num_threads,
                            **self.backend_kwargs), None

    @contextlib.contextmanager
    def retrieval_context(self) -> Iterator[None]:
        """Inside a task, waiting for the nested calls gives the worker's slot back
        (joblib waits by polling, not through a dpool future, so say so explicitly)."""
        if not _current.in_worker():
            yield
            return
        done = threading.Event()
        waiter = threading.Thread(target=_current.client().blocking, args=(done.wait,),
                                  name="dpool-joblib-nested-wait", daemon=True)
        waiter.start()
        try:
            yield
        finally:
            done.set()
            waiter.join()

    # -- the end of a call -------------------------------------------------------------------
    def stop_call(self) -> None:
        with self._lock:
            self._stored.clear()

    def terminate(self) -> None:
        """End of a call (or of a ``with Parallel(...)`` block): forget this call's
        stored arrays; the executor stays warm for the next call."""
        with self._lock:
            self._stored.clear()
        ex, self._executor = self._executor, None
        if ex is not None and self._shared:
            _executors.release(ex)
        self._shared = False
        self.reset_batch_stats()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """Cancel the call's tasks not started; kill the workers if some are running."""
        with self._lock:
            running = list(self._running)
            self._running.clear()
            self._stored.clear()
        still = [f for f in running if not f.cancel() and not f.done()]
        ex = self._executor
        if still and ex is not None and self._shared:
            self._executor = None
            self._shared = False
            _executors.kill(ex)
            if ensure_ready:
                self.configure(n_jobs=self.parallel.n_jobs, parallel=self.parallel,
                               **self.parallel._backend_kwargs)


def _rebuild(cls: type, nesting_level: Any, inner: Any, kwargs: dict) -> DpoolBackend:
    return cls(nesting_level=nesting_level, inner_max_num_threads=inner, **kwargs)  # type: ignore[no-any-return]


def _threshold(max_nbytes: Any) -> Optional[int]:
    """Bytes from which an array argument is stored once per call (None: never).

    dpool's store threshold (256 KiB), for any ``max_nbytes`` but ``None``: an array
    that large goes through shared memory anyway, and sent with each batch it takes a
    segment of its own per batch (created, written on the runtime's IO thread -- the
    done-callback dispatches the next batch there --, mapped by the worker, freed). A
    grid search on digits (X of 300-900 KB, below joblib's "1M") paid that for every
    batch (bench/JOBLIB.md). A smaller array travels inline with its batch, which
    costs less than a put.
    """
    if max_nbytes is None:
        return None
    if isinstance(max_nbytes, str):
        from joblib.disk import memstr_to_bytes

        memstr_to_bytes(max_nbytes)  # raises ValueError on a bad string, as with loky
    return _values.store_threshold_bytes()


_WORDS = {1: "u1", 2: "u2", 4: "u4", 8: "u8"}  # itemsize -> unsigned type of that size


def _same_bytes(a: Any, b: Any, np: Any) -> bool:
    """Whether arrays ``a`` and ``b`` (the stored copy) hold the same values, bitwise (a
    NaN equals itself, -0.0 differs from 0.0); a full compare costs a fraction of
    storing ``a`` again. ``b`` is contiguous; ``a`` may be a strided view."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.strides == b.strides:  # both contiguous, the same order: compare the bytes
        word = np.uint64 if a.nbytes % 8 == 0 else np.uint8
        return bool(np.array_equal(np.ravel(a, order="K").view(word),
                                   np.ravel(b, order="K").view(word)))
    word = _WORDS.get(a.dtype.itemsize)
    if word is None:
        return False
    return bool(np.array_equal(a.view(word), b.view(word)))  # element by element


def register(make_default: bool = False) -> None:
    """Register the ``"dpool"`` backend with joblib (``dpool.register_joblib``)."""
    register_parallel_backend(NAME, DpoolBackend, make_default=make_default)


register()
