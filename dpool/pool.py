"""``dpool.Pool``: the ``multiprocessing.Pool`` surface, on dpool's runtime.

    from dpool import Pool   # instead of: from multiprocessing import Pool

A Pool is one executor (``dpool._executor_core.ExecutorCore``: ``ProcessPoolExecutor``
without ``concurrent.futures``; its own group of worker processes) plus the stdlib's
result objects and callbacks (``dpool._pool_core``, ``dpool._pool_results``).
Arguments and results travel the runtime's way -- cloudpickle, so lambdas and closures
work, and large buffers through the shared-memory object store where the runtime has one.

Deliberate differences from the stdlib are listed, with their reasons, in
``compat/DIFFERENCES.md``.
"""

from __future__ import annotations

import multiprocessing as mp
import operator
import os
import types
import warnings

from dpool._executor_core import ExecutorCore
from dpool._pool_core import CLOSE, RUN, TERMINATE, PoolCore
from dpool._pool_results import (
    APPLY,
    ApplyResult,
    AsyncResult,
    IMapIterator,
    IMapUnorderedIterator,
    MapResult,
)
from dpool.runtime import current as _current

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Mapping, Optional

__all__ = ["Pool", "cpu_count", "ApplyResult", "AsyncResult", "MapResult", "IMapIterator",
           "IMapUnorderedIterator"]

_NO_KWDS: Mapping[str, Any] = types.MappingProxyType({})


def cpu_count() -> int:
    """The number of CPUs of this machine (as ``multiprocessing.cpu_count()``), or of the
    cluster when ``DPOOL_ADDRESS`` is set.

    Raises ``NotImplementedError`` when it cannot be determined, as the stdlib does.
    """
    if os.environ.get("DPOOL_ADDRESS"):
        return _current.cluster_cpus()
    n = os.cpu_count()
    if n is None:
        raise NotImplementedError("cannot determine number of cpus")
    return n


class Pool:
    """A drop-in ``multiprocessing.Pool``: same signature, methods and semantics.

    ``processes`` defaults to ``os.cpu_count()`` and may exceed it. Worker processes start
    on demand (the stdlib starts them all at once). A worker that dies mid-task has the
    task retried, and only that task fails if it keeps dying; an initializer that raises
    breaks the pool with ``BrokenProcessPool`` instead of hanging it.

    ``resources`` (keyword-only, dpool's): what every task of the pool needs, e.g.
    ``{"GPU": 1}``; ``processes`` is then the pool's CPU budget (README, "Resources").
    ``max_attempts`` (keyword-only, dpool's, default 3): how many times a task runs when
    its worker process dies running it, as the executor's keyword.
    ``task_timeout``, ``retry_on_timeout``, ``max_memory_per_worker``, ``retry_on_oom``
    (keyword-only, dpool's): as the executor's. A task stopped at its timeout fails with
    ``dpool.TaskTimeoutError``, also a ``multiprocessing.TimeoutError``; ``get(timeout)``
    and ``wait(timeout)`` keep the stdlib's meaning (how long to wait).
    """

    @staticmethod
    def Process(ctx: Any, *args: Any, **kwds: Any) -> Any:  # the stdlib's name
        """Make a process of context ``ctx`` (the stdlib's hook; dpool's workers are its own)."""
        return ctx.Process(*args, **kwds)

    def __init__(
        self,
        processes: Optional[int] = None,
        initializer: Optional[Callable[..., object]] = None,
        initargs: Iterable[Any] = (),
        maxtasksperchild: Optional[int] = None,
        context: Any = None,
        *,
        resources: Optional[Mapping[str, float]] = None,
        max_attempts: int = 3,
        task_timeout: Optional[float] = None,
        retry_on_timeout: bool = False,
        max_memory_per_worker: Optional[int] = None,
        retry_on_oom: bool = False,
    ) -> None:
        self._core: Optional[PoolCore] = None  # exists for __del__ if the checks below raise
        self._state_shown: Optional[str] = None  # a value assigned to _state (see there)
        if processes is None:
            processes = _current.cluster_cpus()
        processes = operator.index(processes)
        if processes < 1:
            raise ValueError("Number of processes must be at least 1")
        if maxtasksperchild is not None and (
                not isinstance(maxtasksperchild, int) or maxtasksperchild <= 0):
            raise ValueError("maxtasksperchild must be a positive int or None")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        self._processes = processes  # the stdlib's attribute; some programs read it
        # (the context given, else the default: an executor would pick spawn for
        # maxtasksperchild, as the stdlib's does; multiprocessing.Pool does not)
        executor = ExecutorCore(processes, mp_context=context or mp.get_context(),
                                initializer=initializer,
                                initargs=tuple(initargs),
                                max_tasks_per_child=maxtasksperchild,
                                resources=resources, max_attempts=max_attempts,
                                task_timeout=task_timeout, retry_on_timeout=retry_on_timeout,
                                max_memory_per_worker=max_memory_per_worker,
                                retry_on_oom=retry_on_oom)
        self._ctx = executor._mp_context
        self._core = PoolCore(executor, processes)

    # -- the stdlib's private attributes that programs read (compatibility shims) ----------
    @property
    def _state(self) -> str:
        """``"RUN"``, ``"CLOSE"`` or ``"TERMINATE"``, as the stdlib's attribute.

        Setting it does what the matching method does: ``CLOSE`` closes the pool,
        ``TERMINATE`` terminates it. Any other value is stored and read back, as the
        stdlib stores it, and changes nothing else: a closed or terminated pool is not
        reopened (its only effect, as with the stdlib, is the ``ResourceWarning`` of an
        unclosed pool when it is collected while it reads ``RUN``). See
        compat/DIFFERENCES.md, "Private attributes".
        """
        if self._state_shown is not None:
            return self._state_shown
        return self._core.state if self._core is not None else "INIT"

    @_state.setter
    def _state(self, value: str) -> None:
        current = self._core.state if self._core is not None else "INIT"
        self._state_shown = None
        if value == current:
            return
        if value == CLOSE and current == RUN:
            self.close()
        elif value == TERMINATE and current in (RUN, CLOSE):
            self.terminate()
        else:
            self._state_shown = value

    @property
    def _pool(self) -> list:
        """The pool's worker processes, as the stdlib's list (a snapshot; read-only).

        Each has ``pid``, ``is_alive()``, ``exitcode``, ``join()``, ``terminate()`` and
        ``kill()``; a worker killed through it has its task retried. It holds
        ``processes`` running workers, as the stdlib's: dpool starts workers on demand,
        so reading it starts those that do not run yet (while the pool is open).
        """
        if self._core is None:
            return []
        return list(self._core.executor._worker_processes(self._core.processes).values())

    def __repr__(self) -> str:
        cls = type(self)
        return (f"<{cls.__module__}.{cls.__qualname__} state={self._state} "
                f"pool_size={self._core.processes if self._core is not None else 0}>")

    def __reduce__(self) -> Any:
        raise NotImplementedError("pool objects cannot be passed between processes or pickled")

    def _check_running(self) -> PoolCore:
        core = self._core
        if core is None or core.state != RUN:
            raise ValueError("Pool not running")
        return core

    # -- one call --------------------------------------------------------------------------
    def apply(self, func: Callable[..., Any], args: Iterable[Any] = (),
              kwds: Mapping[str, Any] = _NO_KWDS) -> Any:
        """``func(*args, **kwds)`` in a worker; blocks until the result is ready."""
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable[..., Any], args: Iterable[Any] = (),
                    kwds: Mapping[str, Any] = _NO_KWDS,
                    callback: Optional[Callable[[Any], object]] = None,
                    error_callback: Optional[Callable[[BaseException], object]] = None,
                    ) -> ApplyResult:
        """Start ``func(*args, **kwds)``; returns an ``AsyncResult``.

        ``callback(result)`` or ``error_callback(exception)`` runs on the pool's result
        thread when the call completes, before ``get()`` returns.
        """
        core = self._check_running()
        result: ApplyResult = ApplyResult(self, callback, error_callback)
        try:
            call_args = tuple(args)
            call_kwds = dict(kwds)
        except TypeError as exc:  # the stdlib fails the call (in the worker), not apply_async
            if not core.post_error(result, 0, exc):
                raise ValueError("Pool not running") from None
            return result
        if not core.submit(result, 0, APPLY, func, call_args, call_kwds):
            raise ValueError("Pool not running")
        return result

    # -- map -------------------------------------------------------------------------------
    def map(self, func: Callable[[Any], Any], iterable: Iterable[Any],
            chunksize: Optional[int] = None) -> list:
        """``list(map(func, iterable))`` in the pool: blocks, keeps the order.

        Raises the first exception any call raised, once every call has finished.
        """
        return self._map_async(func, iterable, False, chunksize).get()

    def starmap(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                chunksize: Optional[int] = None) -> list:
        """Like ``map``, but each item is unpacked as the arguments: ``func(*item)``."""
        return self._map_async(func, iterable, True, chunksize).get()

    def map_async(self, func: Callable[[Any], Any], iterable: Iterable[Any],
                  chunksize: Optional[int] = None,
                  callback: Optional[Callable[[list], object]] = None,
                  error_callback: Optional[Callable[[BaseException], object]] = None,
                  ) -> MapResult:
        """Start a ``map``; returns a ``MapResult`` whose ``get()`` is the list."""
        return self._map_async(func, iterable, False, chunksize, callback, error_callback)

    def starmap_async(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                      chunksize: Optional[int] = None,
                      callback: Optional[Callable[[list], object]] = None,
                      error_callback: Optional[Callable[[BaseException], object]] = None,
                      ) -> MapResult:
        """Start a ``starmap``; returns a ``MapResult``."""
        return self._map_async(func, iterable, True, chunksize, callback, error_callback)

    def _map_async(self, func: Callable[..., Any], iterable: Iterable[Any], star: bool,
                   chunksize: Optional[int] = None,
                   callback: Optional[Callable[[list], object]] = None,
                   error_callback: Optional[Callable[[BaseException], object]] = None,
                   ) -> MapResult:
        core = self._check_running()
        if not hasattr(iterable, "__len__"):
            iterable = list(iterable)
        length = len(iterable)  # type: ignore[arg-type]
        if chunksize is None:
            # The stdlib's default: about four chunks per worker process.
            chunksize, extra = divmod(length, core.processes * 4)
            if extra:
                chunksize += 1
        else:
            chunksize = operator.index(chunksize)
            if chunksize < 1 and length:
                # The stdlib silently returns [None] * len(iterable) here.
                raise ValueError(f"Chunksize must be 1+, not {chunksize!r}")
        if length == 0:
            return MapResult(None, 0, 0, callback, error_callback)
        result: MapResult = MapResult(self, chunksize, length, callback, error_callback)
        if not core.submit_map(result, func, iterable, chunksize, star):
            raise ValueError("Pool not running")
        return result

    # -- imap ------------------------------------------------------------------------------
    def imap(self, func: Callable[[Any], Any], iterable: Iterable[Any],
             chunksize: int = 1) -> IMapIterator:
        """An iterator of ``func(item)`` in input order; ``next(timeout)`` is supported.

        The input is read lazily, a bounded number of chunks ahead of the consumer, so a
        generator (even an endless one) works.
        """
        core = self._check_running()
        chunksize = operator.index(chunksize)
        if chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize:n}")
        return self._start_imap(core, IMapIterator, func, iterable, chunksize)

    def imap_unordered(self, func: Callable[[Any], Any], iterable: Iterable[Any],
                       chunksize: int = 1) -> IMapUnorderedIterator:
        """Like ``imap``, but results come in the order they complete."""
        core = self._check_running()
        chunksize = operator.index(chunksize)
        if chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize!r}")
        it = self._start_imap(core, IMapUnorderedIterator, func, iterable, chunksize)
        return it  # type: ignore[return-value]

    def _start_imap(self, core: PoolCore, cls: type, func: Callable[[Any], Any],
                    iterable: Iterable[Any], chunksize: int) -> IMapIterator:
        runner = core.runner(func, False)
        it = cls(core, self, func, iterable, chunksize, runner)
        if not core.add_feeder(it):
            raise ValueError("Pool not running")
        return it

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """No more tasks: the workers exit once the submitted work is done."""
        self._state_shown = None
        if self._core is not None:
            self._core.close()

    def terminate(self) -> None:
        """Stop the workers now. Unfinished results fail with ``BrokenProcessPool``."""
        self._state_shown = None
        if self._core is not None:
            self._core.terminate()

    def join(self) -> None:
        """Wait for the workers to exit; call ``close()`` or ``terminate()`` first."""
        state = self._state
        if state == RUN:
            raise ValueError("Pool is still running")
        if state not in ("CLOSE", "TERMINATE"):
            raise ValueError("In unknown state")
        self._core.join()  # type: ignore[union-attr]

    def __enter__(self) -> "Pool":
        self._check_running()
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]],
                 exc_val: Optional[BaseException],
                 exc_tb: Optional[types.TracebackType]) -> None:
        self.terminate()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        core = getattr(self, "_core", None)
        if core is None:
            return
        if (getattr(self, "_state_shown", None) or core.state) == RUN:  # as _state reads
            _warn(f"unclosed running multiprocessing pool {self!r}", ResourceWarning,
                  source=self)
        core.terminate_soon()
