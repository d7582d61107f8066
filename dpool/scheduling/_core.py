"""The state every part of the local scheduler shares, declared once for the type checker.

``LocalScheduler`` (``_scheduler``) is assembled from parts that each own one
responsibility -- ``_workers.WorkerPool`` (dispatch, worker processes, deaths) and
``_handlers.WorkerMessages`` (what workers and attached drivers send) -- over the records
and the lock that ``LocalScheduler.__init__`` creates. This base names that shared state
and the methods the parts call on one another, so each part type-checks on its own; it
has no behaviour.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Optional

from dpool.objects._host import HostStore
from dpool.protocol._ioloop import IOLoop
from dpool.scheduling._policy import BatchPolicy
from dpool.scheduling._records import Group, Obj, Task, WorkerHandle


class SchedulerCore:
    _lock: threading.Lock
    _ctl: Any
    _groups: dict[int, Group]
    _objects: dict[int, Obj]
    _functions: dict[int, bytes]
    _worker_ids: Any
    _batch: BatchPolicy
    _releases: deque
    _closed: bool
    _out: list
    _exited: threading.Condition
    _refill: list[Group]
    _handlers: dict[int, Callable[[WorkerHandle, Any], None]]
    _io: IOLoop
    store: HostStore
    sessions: Any
    spiller: Any
    cpu_limit: Optional[int]
    id_prefix: Optional[Callable[[], int]]
    leases: dict
    recall_leases: Callable[[], None]

    # -- implemented by LocalScheduler ---------------------------------------------------
    def _admit(self, t: Task) -> None: raise NotImplementedError
    def _finish(self, t: Task, ok: bool, payload: bytes, counted: bool = True) -> None:
        raise NotImplementedError
    def _skip_cancelled(self, t: Task) -> None: raise NotImplementedError
    def _decref(self, oid: int, n: int = 1) -> None: raise NotImplementedError
    def _drain_releases(self) -> None: raise NotImplementedError
    def _send_object(self, w: WorkerHandle, oid: int, obj: Obj) -> None:
        raise NotImplementedError
    def _take_out(self) -> list: raise NotImplementedError
    def _deliver(self, out: list) -> None: raise NotImplementedError

    # -- implemented by WorkerPool -------------------------------------------------------
    def _dispatch(self, g: Group, idle_only: bool = False) -> None: raise NotImplementedError
    def _send(self, w: WorkerHandle, msgs: list) -> None: raise NotImplementedError
    def _fail_group(self, g: Group, reason: str) -> None: raise NotImplementedError
    def _retire_group(self, g: Group) -> None: raise NotImplementedError
    def _requeue(self, w: WorkerHandle, task_ids: tuple) -> None: raise NotImplementedError
    def busy_cpus(self) -> int: raise NotImplementedError
    def _spawn(self, g: Group, gpus: Optional[tuple] = None,
               lease: Any = None) -> WorkerHandle:
        raise NotImplementedError

    # -- implemented by ResourceDispatch -------------------------------------------------
    def resources(self) -> Any: raise NotImplementedError
    def spawn_env(self) -> tuple: raise NotImplementedError
    def _route_res(self, g: Group, t: Task) -> None: raise NotImplementedError
    def _dispatch_res(self, g: Group) -> None: raise NotImplementedError
    def _release_res(self, t: Task, w: Optional[WorkerHandle]) -> None:
        raise NotImplementedError
    def _fence(self, w: WorkerHandle, on: bool) -> None: raise NotImplementedError
    def _retire_worker(self, w: WorkerHandle) -> None: raise NotImplementedError
    def slots_used(self, g: Group) -> int: raise NotImplementedError
    def _fail_waiting_res(self, g: Group, err: bytes) -> None: raise NotImplementedError
    def _on_blocked_res(self, w: WorkerHandle) -> None: raise NotImplementedError
    def _on_unblocked_res(self, w: WorkerHandle) -> None: raise NotImplementedError
