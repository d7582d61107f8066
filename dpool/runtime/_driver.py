"""The driver's runtime: local scheduler + control store, in this process.

Started on first use (``_current.driver()``); one per driver process. Executors and Pools
are views onto it (a worker group each), so futures and refs pass between them. It is a
``Driver`` (``_client``): the executor-facing calls go to its ``LocalScheduler``.
"""

from __future__ import annotations

import atexit
import itertools
import os
import sys
import threading
import time
import weakref

from dpool import _log
from dpool._task_future import ObjectRef, TaskFuture
from dpool.control import InProcessControlStore
from dpool.objects import owners as _owners
from dpool.objects import payload as _payload
from dpool.runtime import _calls
from dpool.runtime._functions import FunctionTable
from dpool.scheduling import LocalScheduler, WorkerGroupConfig

log = _log.getLogger("dpool.runtime")

_REAP_EVERY_S = 1.0  # new executors look for dead drivers' segments at most this often

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, TypeVar

    from dpool.scheduling import resources

    T = TypeVar("T")


class DriverRuntime:
    """The ``Driver`` of a process that runs its own workers (see ``_client``)."""

    gives_back_slot = False  # the driver is not a worker: waiting blocks nobody's slot
    stops_running_tasks = True  # ``dpool.cancel(force=True)``, ``cancel_running=True``

    def __init__(self) -> None:
        self.pid = self.owner_pid = os.getpid()
        _owners.reap_orphans()  # segments of drivers that died without cleaning up
        self._reaped_at = time.monotonic()
        self.control = InProcessControlStore()
        self.scheduler = LocalScheduler(self.control)
        self._ids = itertools.count(1)
        self.functions = FunctionTable(self.new_id, self.scheduler.register_function)
        self._arg_cache: Any = None  # ``_argcache.ArgumentCache``, once numpy is loaded
        self._arg_cache_lock = threading.Lock()
        self._executors: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._closed = False
        # placement groups (``_placement_groups_local.LocalPlacementGroups``), on first use
        self._placement_groups: Any = None
        atexit.register(self.close)

    def new_id(self) -> int:
        return next(self._ids)

    # -- groups ------------------------------------------------------------------------------
    def add_group(self, cfg: WorkerGroupConfig, executor: Any) -> Any:
        now = time.monotonic()
        if now - self._reaped_at >= _REAP_EVERY_S:  # a long-running driver reaps too
            self._reaped_at = now
            _owners.reap_orphans()
        self._executors.add(executor)
        if self.scheduler.zygote is not None:  # its workers may see what others did not
            self.functions.new_generation()
        return self.scheduler.add_group(cfg)

    def group_of(self, group_id: int) -> Any:
        return self.scheduler.group(group_id)

    def start_workers(self, group: Any, n: int) -> None:
        self.scheduler.start_workers(group, n)

    def fork_point(self) -> None:
        self.scheduler.fork_point()

    def close_group_soon(self, group: Any) -> None:
        self.scheduler.close_group_soon(group)

    def close_group(self, group: Any) -> None:
        self.scheduler.close_group(group)

    def cancel_queued(self, group: Any) -> None:
        self.scheduler.cancel_queued(group)

    def cancel_running(self, task_id: int, recursive: bool) -> bool:
        return self.scheduler.cancel_running(task_id, recursive)

    def cancel_group_running(self, group: Any) -> list:
        return self.scheduler.cancel_group_running(group)

    def wait_group_exited(self, group: Any) -> None:
        self.scheduler.wait_group_exited(group)

    def terminate_group(self, group: Any, reason: str) -> None:
        self.scheduler.terminate_group(group, reason)

    def is_io_thread(self) -> bool:
        return self.scheduler.is_io_thread()

    # -- the runtime's settings ----------------------------------------------------------------
    def estimate(self, fn_id: int, default: Any = ...) -> Any:
        return self.scheduler.estimate(fn_id, default)

    def set_store_capacity(self, capacity: int) -> None:
        self.scheduler.set_store_capacity(capacity)

    def set_resource_offer(self, spec: Optional[dict]) -> None:
        self.scheduler.set_resource_offer(spec)

    # -- placement groups (``_placement_groups_local``) --------------------------------------
    def reserve_placement_group(self, pg_id: int, bundles: list, strategy: str,
                                on_state: Callable[[str, tuple, str], None]) -> None:
        groups = self._placement_groups
        if groups is None:
            from dpool.runtime._current import cluster_cpus
            from dpool.runtime._placement_groups_local import LocalPlacementGroups

            groups = self._placement_groups = LocalPlacementGroups(self.scheduler, cluster_cpus())
        groups.reserve(pg_id, bundles, strategy, on_state)

    def remove_placement_group(self, pg_id: int) -> None:
        if self._placement_groups is not None:
            self._placement_groups.remove(pg_id)

    # -- the task API --------------------------------------------------------------------------
    def submit(self, group: Any, fn: Callable[..., Any], args: tuple, kwargs: dict,
               req: Optional[resources.Request], future_type: type[TaskFuture]) -> TaskFuture:
        oid = next(self._ids)
        fut = future_type(oid, self)
        try:
            if (args or kwargs) and "numpy" in sys.modules:  # (only arrays are cached)
                args, kwargs = self._arguments().substitute(args, kwargs)
            fn_id, payload, deps = _calls.submit_prepared(self, fn, args, kwargs, fut)
        except Exception as exc:  # noqa: BLE001 - reported on the future, as the stdlib does
            fut._client = None
            return _calls.failed_future(fut, exc)
        self.scheduler.submit(group, oid, fn_id, payload, deps, fut, req)
        return fut

    def _arguments(self) -> Any:
        """The cache of large array arguments (``_argcache``), made when first needed."""
        cache = self._arg_cache
        if cache is None:
            from dpool.runtime._argcache import ArgumentCache

            with self._arg_cache_lock:
                if self._arg_cache is None:
                    self._arg_cache = ArgumentCache(self._put)
                cache = self._arg_cache
        return cache

    def actor_route(self, group_id: int, node: str, name: str) -> None:
        pass  # (no cluster here: a handle from one does not unpickle in this driver)

    def foreign_actor(self, group_id: int, label: str, node: str) -> Any:
        return self.group_of(group_id)  # (one runtime: every actor is this driver's)

    def name_actor(self, name: str, record: tuple) -> None:
        if not self.scheduler.name_actor(name, record):
            raise ValueError(f"an actor named {name!r} exists already")

    def find_actor(self, name: str) -> Optional[tuple]:
        return self.scheduler.find_actor(name)

    def kill_actor(self, group_id: int, node: str, reason: str) -> None:
        g = self.scheduler.group(group_id)
        if g is not None and g.actor is not None:
            self.scheduler.terminate_group(g, reason)

    def lead(self, future: TaskFuture, timeout: Any) -> Any:
        """Wait a while for ``future`` by reading its worker's socket on this thread
        (see ``LocalScheduler.lead``); returns what is left of ``timeout``."""
        return self.scheduler.lead(future, timeout)

    def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)  # a driver holds no worker's slot

    def put(self, value: Any) -> ObjectRef:
        return self._put(value)[0]

    def _put(self, value: Any) -> tuple[ObjectRef, bytes]:
        oid = next(self._ids)
        self.scheduler.collect_releases()  # freed objects first: their pages can be reused
        payload = _payload.dumps_value(value, oid, self.pid)
        self.scheduler.put(oid, payload)
        return ObjectRef(oid, self), payload

    def future_for(self, ref: ObjectRef) -> TaskFuture:
        from dpool.futures import Future  # (dpool.get/wait: concurrent.futures is loaded)

        fut = Future()

        def deliver(ok: bool, payload: bytes) -> None:
            if not ok:
                fut.set_exception(_payload.loads_error(payload))
                return
            try:
                value = _payload.loads(payload)
            except Exception as exc:  # noqa: BLE001 - an unpicklable value fails this get
                fut.set_exception(exc)
                return
            fut.set_result(value)

        fut.set_running_or_notify_cancel()
        self.scheduler.subscribe(ref.id, deliver)
        return fut

    def release(self, object_id: int) -> None:
        self.scheduler.release(object_id)

    # -- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        """End of the driver: finish executors' work (as the stdlib does at exit), stop."""
        if self._closed or os.getpid() != self.pid:
            return
        self._closed = True
        for ex in list(self._executors):
            try:
                ex.shutdown(wait=True)
            except Exception:  # noqa: BLE001 - keep closing the others
                log.exception("dpool: error shutting down %r at exit", ex)
        if self._arg_cache is not None:
            self._arg_cache.clear()
        self.scheduler.shutdown()
        self.control.flush()
