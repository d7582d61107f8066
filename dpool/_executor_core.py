"""The executor itself, without ``concurrent.futures``: ``ExecutorCore``.

``dpool.ProcessPoolExecutor`` (``dpool.executor``) is this class plus
``concurrent.futures.Executor`` as a base, and returns ``dpool.futures.Future``s;
``dpool.Pool`` runs on this class alone, with the plain ``TaskFuture`` (see
``dpool._task_future``), so a ``multiprocessing.Pool`` program that swaps its import
loads neither ``concurrent.futures`` nor the ``logging`` it brings.

Every call goes through the runtime's client (``dpool.runtime._client``): the executor is
a *view* onto the driver's runtime -- one worker group with its own ``max_workers``,
initializer and limits -- so futures from one executor can be arguments to tasks of
another. Inside a task, ``get_executor()`` is a view onto the group running the task,
through the worker's client.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import threading
import time
import weakref

from dpool import errors
from dpool._task_future import TaskFuture
from dpool.objects import payload as _payload
from dpool.runtime import DriverRuntime  # noqa: F401 - its import cost at import time, as the stdlib
from dpool.runtime import current as _current
from dpool.scheduling import WorkerGroupConfig
from dpool.scheduling import limits as _limits
from dpool.scheduling import resources as _resources

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Optional

    from dpool.actors import ActorHandle
    from dpool.runtime import Client, Driver

__all__ = ["ExecutorCore", "ResourceOptions"]


class _ChunkRunner:
    """Runs ``fn`` over one chunk of ``map`` arguments in a worker (one task per chunk)."""

    __slots__ = ("fn", "__weakref__")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, chunk: list) -> list:
        fn = self.fn
        return [fn(*args) for args in chunk]

    def __reduce__(self) -> tuple:
        return (_ChunkRunner, (self.fn,))

    @property
    def __dpool_resources__(self) -> Any:  # the wrapped function's @dpool.resources
        return getattr(self.fn, "__dpool_resources__", None)


def _chunks(iterable: Iterable[tuple], size: int) -> Iterator[list]:
    it = iter(iterable)
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield chunk


def _chain_from_lists(lists: Iterator[list]) -> Iterator[Any]:
    """The items of each list in turn, popping each so that none stays referenced here."""
    for chunk in lists:
        chunk.reverse()
        while chunk:
            yield chunk.pop()


def _result_or_cancel(fut: TaskFuture, timeout: Optional[float] = None) -> Any:
    """``fut``'s result (for ``map``, whose futures nobody else sees), and forget it.

    The future lets go of the result as well: the runtime may still hold the future for
    a moment after completing it, and the result must be freed as soon as the consumer
    drops it (bpo-14406).
    """
    try:
        try:
            value = fut.result(timeout)
            fut._result = None  # type: ignore[attr-defined]
            return value
        finally:
            fut.cancel()
    finally:
        del fut  # break the reference cycle through the traceback (as the stdlib does)


class ExecutorCore:
    """``dpool.ProcessPoolExecutor`` without ``concurrent.futures.Executor`` as a base;
    its futures are of its ``_future_type`` (see the module docstring)."""

    _future_type: type[TaskFuture] = TaskFuture  # the executor's: dpool.futures.Future

    def __init__(
        self,
        max_workers: Optional[int] = None,
        mp_context: Any = None,
        initializer: Optional[Callable[..., Any]] = None,
        initargs: tuple = (),
        *,
        max_tasks_per_child: Optional[int] = None,
        max_attempts: int = 3,
        object_store_memory: Optional[int] = None,
        working_dir: Optional[str] = None,
        resources: Optional[Mapping[str, float]] = None,
        runtime_resources: Optional[Mapping[str, float]] = None,
        scheduling: Any = None,
        task_timeout: Optional[float] = None,
        retry_on_timeout: bool = False,
        max_memory_per_worker: Optional[int] = None,
        retry_on_oom: bool = False,
    ) -> None:
        limits = _limits.group_limits(task_timeout, retry_on_timeout, max_memory_per_worker,
                                      retry_on_oom)
        if max_workers is None:
            max_workers = _current.cluster_cpus()
        elif max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if max_tasks_per_child is not None:
            if not isinstance(max_tasks_per_child, int):
                raise TypeError("max_tasks_per_child must be an integer")
            if max_tasks_per_child <= 0:
                raise ValueError("max_tasks_per_child must be >= 1")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        self._max_workers = max_workers
        if mp_context is None:  # as the stdlib: a worker that retires is replaced by a
            # fresh interpreter, so max_tasks_per_child gets the spawn start method
            mp_context = mp.get_context("spawn" if max_tasks_per_child is not None else None)
        self._mp_context = mp_context
        init_payload = inherited = None
        if initializer is not None:
            init_payload, inherited = _payload.dumps_initializer(initializer, tuple(initargs))
        if object_store_memory is not None and (
                not isinstance(object_store_memory, int) or object_store_memory <= 0):
            raise ValueError(
                f"object_store_memory must be a positive number of bytes, got "
                f"{object_store_memory!r}")
        self._spec = _resources.spec(resources=resources) if resources is not None else None
        if scheduling is not None:
            self._spec = _resources.with_strategy(self._spec, scheduling)
        self._req = _resources.build(self._spec)
        offer = None
        if runtime_resources is not None:
            offer = _resources.spec(resources=runtime_resources)
        driver = _current.driver()
        self._runtime: Client = driver  # where tasks go
        self._driver: Optional[Driver] = driver  # where the group is (None in a task)
        if object_store_memory is not None:
            driver.set_store_capacity(object_store_memory)
        if offer is not None:
            driver.set_resource_offer(offer)
        self._group: Any = driver.add_group(
            WorkerGroupConfig(max_workers, self._mp_context, init_payload, max_tasks_per_child,
                              max_attempts, working_dir, inherited,
                              limits=limits if any(limits) else None),
            self,
        )
        self._shutdown_thread = False
        self._shutdown_lock = threading.Lock()
        self._actor_groups: list = []  # the groups of its actors (``actor``): shut down with it
        self._process_views: Any = None  # ``_process_views.ProcessViews``, when first read
        self._n_stdlib = 0  # how many workers the stdlib would have started (_processes)
        # An executor dropped without shutdown() stops its workers once they are idle,
        # as the stdlib's does (its manager thread watches a weakref to the executor).
        self._finalizer = weakref.finalize(self, driver.close_group_soon, self._group)
        self._finalizer.atexit = False

    @classmethod
    def _worker_view(cls, client: Client, group_id: int) -> Any:
        """An executor inside a task: submits to the group that runs the task."""
        self = cls.__new__(cls)
        self._max_workers = 0
        self._mp_context = None
        self._runtime = client
        self._driver = None
        self._group = group_id
        self._shutdown_thread = False
        self._shutdown_lock = threading.Lock()
        self._actor_groups = []
        self._process_views = None
        self._n_stdlib = 0
        self._spec = None
        self._req = None
        return self

    # -- the stdlib's private attributes that programs read (compatibility shims) ----------
    @property
    def _processes(self) -> Optional[dict[Any, Any]]:
        """``{pid: process}`` of the worker processes, as the stdlib's attribute.

        As many as the stdlib would have by now: all ``max_workers`` from the first
        submit with the ``fork`` start method, else one more for each submit that finds
        no idle worker, up to ``max_workers``. dpool starts workers when work needs them,
        so reading this starts those the stdlib would have started and dpool has not yet:
        every entry is a running process. ``None`` once ``shutdown()`` has been called (as
        in the stdlib). A snapshot: it does not change as workers come and go. In a
        cluster, where the nodes run the workers, it is empty. See compat/DIFFERENCES.md,
        "Private attributes".
        """
        if self._shutdown_thread:
            return None
        return self._worker_processes(self._n_stdlib)

    def _count_as_stdlib(self) -> None:
        """A submit, counted as the stdlib counts its processes (until ``max_workers``):
        it starts them all at the first submit under ``fork``, else one whenever a submit
        finds no worker idle."""
        if self._driver is None:
            return
        if self._mp_context.get_start_method() == "fork":
            self._n_stdlib = self._max_workers
        elif not any(w.alive and not w.inflight for w in list(self._group.workers)):
            self._n_stdlib += 1

    def _worker_processes(self, wanted: int = 0) -> dict[Any, Any]:
        """``{pid: process}`` of the group's worker processes (also after shutdown),
        having started first those of the ``wanted`` that do not run yet."""
        if self._driver is None:  # a task's view
            return {}
        if wanted:
            self._driver.start_workers(self._group, wanted)
        views = self._process_views
        if views is None:
            from dpool._process_views import ProcessViews

            views = self._process_views = ProcessViews()
        return views.read(self._group.workers)

    @property
    def _broken(self) -> Any:
        """False, or why the executor cannot run tasks (a string), as the stdlib's."""
        if self._driver is None:
            return False
        return self._group.broken or False

    # -- the concurrent.futures API ------------------------------------------------------
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> TaskFuture:
        """Schedule ``fn(*args, **kwargs)`` to run in a worker process; returns a future
        of its outcome."""
        req = None if self._req is None and not _resources.decorated else self._request(fn)
        return self._submit_request(fn, args, kwargs, req)  # (None: the default, no request)

    def _request(self, fn: Any, extra: Optional[dict] = None) -> Optional[_resources.Request]:
        """What a call of ``fn`` needs: this executor's, refined by the function's
        ``@dpool.resources``, refined by ``options()`` (``extra``)."""
        fs = _resources.of_function(fn) if _resources.decorated else None
        if fs is None and extra is None:
            return self._req
        return _resources.build(self._spec, fs, extra)

    def _submit_request(self, fn: Callable[..., Any], args: tuple, kwargs: dict,
                        req: Optional[_resources.Request]) -> TaskFuture:
        group = self._group
        if self._driver is not None and group.broken is not None:
            raise errors.broken_pool(group.broken)
        if self._shutdown_thread:
            raise RuntimeError("cannot schedule new futures after shutdown")
        if self._n_stdlib < self._max_workers:
            self._count_as_stdlib()
        return self._runtime.submit(group, fn, args, kwargs, req, self._future_type)

    def actor(self, cls: type, /, *args: Any, **kwargs: Any) -> ActorHandle:
        """Start an actor: ``cls(*args, **kwargs)`` in a worker process of its own, whose
        methods are called through the handle returned (``handle.step.submit(x)``: a
        future; ``handle.step(x)``: its result). Calls through handles run in the order
        they were made, one at a time, on the actor's state. The actor holds no CPU of
        ``max_workers`` and ends with the executor's ``shutdown()`` (after its pending
        calls), or at ``dpool.kill(handle)``. Options (``name``, ``lifetime="detached"``,
        ``max_restarts``, ``checkpoint_every``, ``max_concurrency``) through
        ``options(...).actor(...)``."""
        from dpool.actors import create

        return create(self, cls, args, kwargs)

    def options(self, *, num_cpus: Optional[int] = None, num_gpus: Optional[float] = None,
                memory: Optional[int] = None,
                resources: Optional[Mapping[str, float]] = None,
                scheduling: Any = None, placement_group: Any = None,
                bundle: Optional[int] = None, timeout: Optional[float] = None,
                retry_on_timeout: Optional[bool] = None,
                **actor_options: Any) -> "ResourceOptions":
        """A view of this executor whose ``submit`` and ``map`` ask for these resources
        (``num_gpus=0.5``: half of one GPU; ``memory``: bytes; ``resources``: custom
        ones, ``{"TPU": 1}``) and this placement (``scheduling="spread"``,
        ``dpool.NodeAffinity(node, soft=...)``, ``"default"``), or run in bundle
        ``bundle`` of ``placement_group`` (a ``dpool.PlacementGroup``; ``bundle=None``:
        any of its bundles), taking what they ask from what the bundle reserved; a
        submit waits until the group is ready. What is not given comes
        from the function's ``@dpool.resources``, then from the executor's
        ``resources=``/``scheduling=``. The view shares the executor: its workers, its
        ``max_workers`` (the CPU budget) and its shutdown. The options of ``actor()``
        only: ``name``, ``lifetime``, ``max_restarts``, ``checkpoint_every``,
        ``max_concurrency`` (see ``dpool.actors``). ``timeout``: seconds each task may run
        from its start before it is stopped (its worker killed and replaced) and its future
        raises ``dpool.TaskTimeoutError``; run again if ``retry_on_timeout``."""
        return ResourceOptions(self, _options_spec(num_cpus, num_gpus, memory, resources,
                                                   scheduling, placement_group, bundle,
                                                   timeout, retry_on_timeout),
                               placement_group, _actor_options(actor_options))

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any],
            timeout: Optional[float] = None, chunksize: int = 1) -> Iterator[Any]:
        """Like the builtin ``map``, run in the pool; results are yielded in order.

        All calls are submitted at once; ``timeout`` counts from this call, and a result
        not ready by then raises ``TimeoutError`` (the remaining calls are cancelled).
        ``chunksize`` > 1 sends that many calls per task.
        """
        if self._req is None and not _resources.decorated:
            return self._map(fn, iterables, timeout, chunksize, None, False)
        return self._map(fn, iterables, timeout, chunksize, self._request(fn), True)

    def _map(self, fn: Callable[..., Any], iterables: tuple, timeout: Optional[float],
             chunksize: int, req: Optional[_resources.Request],
             with_req: bool) -> Iterator[Any]:
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        end_time = None if timeout is None else timeout + time.monotonic()
        if chunksize == 1:
            if with_req:
                fs = [self._submit_request(fn, args, {}, req)
                      for args in zip(*iterables, strict=False)]
            else:
                fs = [self.submit(fn, *args) for args in zip(*iterables, strict=False)]
        else:
            runner = _ChunkRunner(fn)
            rows = zip(*iterables, strict=False)  # shortest iterable wins, as in the stdlib
            if with_req:
                fs = [self._submit_request(runner, (chunk,), {}, req)
                      for chunk in _chunks(rows, chunksize)]
            else:
                fs = [self.submit(runner, chunk) for chunk in _chunks(rows, chunksize)]

        def result_iterator() -> Iterator[Any]:
            # Holds no reference to a result once it is yielded (bpo-14406): neither in a
            # local variable nor through its future, so a consumer that drops each result
            # frees it at once.
            try:
                fs.reverse()
                while fs:
                    if end_time is None:
                        yield _result_or_cancel(fs.pop())
                    else:
                        yield _result_or_cancel(fs.pop(), end_time - time.monotonic())
            finally:
                for future in fs:
                    future.cancel()

        if chunksize == 1:
            return result_iterator()
        return _chain_from_lists(result_iterator())

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Literal[False]:
        self.shutdown(wait=True)
        return False

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False,
                 cancel_running: bool = False) -> None:
        """Stop accepting work; with ``wait``, return once every worker has exited.

        ``cancel_futures=True`` cancels the calls not yet started. Tasks already running
        finish either way (as in the stdlib), unless ``cancel_running=True`` (dpool's):
        those are stopped too, their workers killed, their futures cancelled.
        """
        driver = self._driver
        if cancel_running and driver is not None and not driver.stops_running_tasks:
            raise errors.Error("shutdown(cancel_running=True) stops running tasks of the "
                               "embedded runtime only; on a cluster, give tasks a timeout "
                               "(task_timeout=, options(timeout=...))")
        with self._shutdown_lock:
            first = not self._shutdown_thread
            self._shutdown_thread = True
        if driver is None:
            return  # inside a task: the group belongs to the driver's executor
        groups = [self._group, *self._actor_groups]
        if cancel_futures or cancel_running:
            for group in groups:
                driver.cancel_queued(group)
        if cancel_running:
            from dpool._cancel import cancel_group_running

            cancel_group_running(driver, self._group)
        if first:
            for group in groups:
                driver.close_group(group)
        if wait and not driver.is_io_thread():
            # (from a done-callback, which runs on the runtime's IO thread, waiting for
            # the workers to exit would wait on ourselves: they stop once idle instead)
            for group in groups:
                driver.wait_group_exited(group)

    def _estimate(self, fn: Callable[..., Any], default: Any = ...) -> Any:
        """Measured run time of one call of ``fn`` (``default`` if never measured)."""
        fn_id = self._runtime.functions.fn_id(fn)
        assert self._driver is not None, "a task's view has no measurements"
        return self._driver.estimate(fn_id, default)

    def _terminate(self, reason: str = "the pool was terminated") -> None:
        """Kill the workers now; unfinished futures fail with ``BrokenProcessPool``."""
        with self._shutdown_lock:
            self._shutdown_thread = True
        if self._driver is not None:
            for group in [self._group, *self._actor_groups]:
                self._driver.terminate_group(group, reason)


def _actor_options(given: dict) -> Optional[dict]:
    """``options()``'s keywords that only ``actor()`` takes (a TypeError for others)."""
    if not given:
        return None
    from dpool.actors import ACTOR_OPTIONS

    unknown = sorted(set(given) - set(ACTOR_OPTIONS))
    if unknown:
        raise TypeError(f"options() got unexpected keyword argument(s) {unknown}")
    return given


def _options_spec(num_cpus: Any, num_gpus: Any, memory: Any, resources: Any,
                  scheduling: Any, pg: Any = None, bundle: Any = None, timeout: Any = None,
                  retry_on_timeout: Any = None) -> dict:
    s = _resources.spec(num_cpus, num_gpus, memory, resources)
    t = _limits.check_timeout("timeout", timeout)
    if t is not None:
        s[_resources.LIMITS] = (t, bool(retry_on_timeout))
    elif retry_on_timeout is not None:
        raise TypeError("options(retry_on_timeout=...) goes with timeout=...; for the "
                        "executor's task_timeout=, give the executor retry_on_timeout=")
    if pg is not None or bundle is not None:
        if scheduling is not None:
            raise ValueError("options() takes scheduling= or placement_group=, not both "
                             "(a task in a placement group runs where its bundle is)")
        return _resources.in_bundle(s, _bundle_strategy(pg, bundle))
    return s if scheduling is None else _resources.with_strategy(s, scheduling)


def _bundle_strategy(pg: Any, bundle: Any) -> Any:
    from dpool.placement import InBundle
    from dpool.runtime import PlacementGroup

    if not isinstance(pg, PlacementGroup):
        raise TypeError(f"placement_group must be a dpool.PlacementGroup (from "
                        f"dpool.placement_group(...)), got {type(pg).__name__} {pg!r}")
    if bundle is None:
        bundle = -1
    if isinstance(bundle, bool) or not isinstance(bundle, int):
        raise TypeError(f"bundle must be an int (the bundle's index) or None, got {bundle!r}")
    if not -1 <= bundle < pg.bundle_count:
        raise ValueError(f"bundle={bundle}: placement group {pg.id:#x} has bundles 0.."
                         f"{pg.bundle_count - 1} (None or -1: any of them)")
    return InBundle(pg.id, bundle)


class ResourceOptions:
    """``executor.options(...)``: the executor's ``submit`` and ``map`` with a resource
    request and placement strategy (see ``ProcessPoolExecutor.options``). Chain
    ``options()`` to refine it."""

    __slots__ = ("_executor", "_pg", "_spec", "_actor", "_built")

    def __init__(self, executor: ExecutorCore, spec: dict, pg: Any = None,
                 actor: Optional[dict] = None) -> None:
        self._executor = executor
        self._spec = spec
        self._pg = pg  # the placement group its tasks run in (None: none)
        self._actor = actor  # options for ``actor()`` only (None: none)
        self._built: Any = ...  # its request, for functions without @dpool.resources

    def _request(self, fn: Any) -> Optional[_resources.Request]:
        if _resources.decorated:  # (the function's own may refine it)
            return self._executor._request(fn, self._spec)
        built = self._built
        if built is ...:
            built = self._built = self._executor._request(fn, self._spec)
        return built

    def _tasks_only(self) -> None:
        if self._actor:
            raise TypeError(f"options {sorted(self._actor)} apply to actor() only, not to "
                            "submit() or map()")

    def actor(self, cls: type, /, *args: Any, **kwargs: Any) -> ActorHandle:
        """``executor.actor(cls, *args, **kwargs)`` with this view's actor options and
        resources, which the actor holds for its lifetime (CPUs only those given); with
        ``placement_group=``, a share of its bundle (waits until the group is ready)."""
        if _resources.LIMITS in self._spec:
            raise TypeError("options(timeout=...) applies to submit() and map(), not to "
                            "actor()")
        if self._pg is not None:
            self._pg._usable()  # (raises if it never will be)
        req = None
        if self._spec:  # (CPUs only those given; ``build`` says None for one CPU alone)
            req = _resources.build({"CPU": 0}, self._spec) or _resources.Request(cpus=1)
        from dpool.actors import create

        return create(self._executor, cls, args, kwargs, self._actor, req)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> TaskFuture:
        """``executor.submit(fn, *args, **kwargs)`` with this view's resource request."""
        self._tasks_only()
        ex = self._executor
        if self._pg is not None:
            self._pg._usable()  # (waits until it is ready; raises if it never will be)
        return ex._submit_request(fn, args, kwargs, self._request(fn))

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any],
            timeout: Optional[float] = None, chunksize: int = 1) -> Iterator[Any]:
        """``executor.map(...)`` with this view's resource request for every call."""
        self._tasks_only()
        ex = self._executor
        if self._pg is not None:
            self._pg._usable(timeout)
        return ex._map(fn, iterables, timeout, chunksize, ex._request(fn, self._spec), True)

    def options(self, *, num_cpus: Optional[int] = None, num_gpus: Optional[float] = None,
                memory: Optional[int] = None,
                resources: Optional[Mapping[str, float]] = None,
                scheduling: Any = None, placement_group: Any = None,
                bundle: Optional[int] = None, timeout: Optional[float] = None,
                retry_on_timeout: Optional[bool] = None,
                **actor_options: Any) -> "ResourceOptions":
        spec = {**self._spec, **_options_spec(num_cpus, num_gpus, memory, resources,
                                              scheduling, placement_group, bundle,
                                              timeout, retry_on_timeout)}
        pg = placement_group if placement_group is not None or bundle is not None else (
            None if scheduling is not None else self._pg)
        more = _actor_options(actor_options)
        actor = {**(self._actor or {}), **(more or {})} or None
        return ResourceOptions(self._executor, spec, pg, actor)

    def __repr__(self) -> str:
        return f"<ResourceOptions {_resources.build(self._spec) or '{CPU: 1}'} of " \
               f"{self._executor!r}>"
