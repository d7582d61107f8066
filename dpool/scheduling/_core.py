"""The state every part of the local scheduler shares, declared once for the type checker.

``LocalScheduler`` (``_scheduler``) is assembled from parts that each own one
responsibility -- ``_workers.WorkerPool`` (dispatch, worker processes, deaths),
``_handlers.WorkerMessages`` (what workers and attached drivers send),
``_group_calls.GroupCalls`` (cancel, close, wait for, terminate a group),
``_resource_dispatch.ResourceDispatch`` (tasks with resource requests) and
``_object_table.ObjectTable`` (the object table, over ``_lineage.Lineage``) -- over the
records and the lock that ``LocalScheduler.__init__`` creates. ``SchedulerCore`` names that
shared state and the methods the parts call on one another, so that each part
type-checks on its own. It has no behaviour: its methods raise ``NotImplementedError``,
each is defined by exactly one part, and it comes last in ``LocalScheduler``'s method
resolution order. The lock rule is the scheduler's (``_api``): a ``_locked`` method
expects ``lock`` held. What the node's services may use is ``_api.SchedulerAPI``, a
narrower view.
"""

from __future__ import annotations

import itertools
import socket
import threading
from collections import deque

from dpool.objects import HostStore
from dpool.protocol import IOLoop
from dpool.scheduling._lock import SchedulerLock
from dpool.scheduling._policy import BatchPolicy
from dpool.scheduling._records import ObjectEntry, Task, WorkerGroup, WorkerHandle
from dpool.scheduling._resources import Ledger

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from dpool.control import ControlStore
    from dpool.scheduling._api import DriverService, Handler, LeaseService, SpillbackService


class SchedulerCore:
    lock: SchedulerLock
    _outbox: dict  # sends recorded under the lock (``_lock``)
    control: ControlStore
    batch: BatchPolicy
    closed: bool
    io: IOLoop
    store: HostStore
    cpu_limit: Optional[int]
    zygote: Any  # the fork server (``_zygote.Zygote``) or None
    id_prefix: Optional[Callable[[], int]]
    ledger: Optional[Ledger]
    ledger_spec: Optional[dict]
    _groups: dict[int, WorkerGroup]
    _room_waiters: dict[int, None]  # inputs tasks wait on for room (``_object_table``)
    _objects: dict[int, ObjectEntry]
    _functions: dict[int, bytes]
    _worker_ids: itertools.count
    _releases: deque
    _out: list
    _exited: threading.Condition
    _closing: deque  # groups of collected executors, closed by the IO thread
    _refill: list[WorkerGroup]
    _handlers: dict[int, Handler]
    _sessions: Optional[DriverService]
    _spillback: Optional[SpillbackService]
    _leases: Optional[LeaseService]

    # -- LocalScheduler --------------------------------------------------------------------
    def finish_locked(self, t: Task, ok: bool, payload: bytes, counted: bool = True) -> None:
        raise NotImplementedError
    def admit_locked(self, t: Task) -> None: raise NotImplementedError
    def skip_cancelled_locked(self, t: Task) -> None: raise NotImplementedError
    def pin_inputs_locked(self, t: Task) -> bool: raise NotImplementedError
    def unpin_inputs_locked(self, t: Task) -> None: raise NotImplementedError
    def _build_deps_locked(self, t: Task) -> bool: raise NotImplementedError
    def only_to_idle_locked(self, t: Task) -> bool: raise NotImplementedError
    def inputs_locked(self, t: Task) -> tuple: raise NotImplementedError
    def _wake_waiters_locked(self, obj: ObjectEntry, oid: int) -> None: raise NotImplementedError
    def take_out_locked(self) -> list: raise NotImplementedError
    def close_group_locked(self, g: WorkerGroup) -> None: raise NotImplementedError
    def deliver(self, out: list) -> None: raise NotImplementedError

    # -- ObjectTable -----------------------------------------------------------------------
    def decref_locked(self, oid: int, n: int = 1) -> None: raise NotImplementedError
    def _drain_releases_locked(self) -> None: raise NotImplementedError
    def _send_object_locked(self, w: WorkerHandle, oid: int, obj: ObjectEntry) -> None:
        raise NotImplementedError
    def rebuilding_locked(self, t: Task) -> bool: raise NotImplementedError
    def wait_for_room_locked(self, t: Task, oid: int) -> bool: raise NotImplementedError
    def room_freed_locked(self) -> None: raise NotImplementedError
    def fail_stuck_room_waiters_locked(self) -> None: raise NotImplementedError

    # -- WorkerPool ------------------------------------------------------------------------
    def _dispatch_locked(self, g: WorkerGroup, idle_only: bool = False) -> None:
        raise NotImplementedError
    def send_locked(self, w: WorkerHandle, msgs: list) -> None: raise NotImplementedError
    def flush_locked(self, outbox: dict) -> None: raise NotImplementedError
    def fail_group_locked(self, g: WorkerGroup, reason: str) -> None: raise NotImplementedError
    def break_group_locked(self, g: WorkerGroup, reason: str) -> None: raise NotImplementedError
    def _requeue_locked(self, w: WorkerHandle, task_ids: tuple) -> None:
        raise NotImplementedError
    def busy_cpus_locked(self) -> int: raise NotImplementedError
    def _try_spawn_locked(self, g: WorkerGroup) -> bool: raise NotImplementedError
    def spawn_locked(self, g: WorkerGroup, gpus: Optional[tuple] = None,
                     lease: Optional[socket.socket] = None) -> WorkerHandle:
        raise NotImplementedError

    # -- WorkerMessages --------------------------------------------------------------------
    def _adopt_result_locked(self, ok: bool, payload: bytes,
                             rebuilt: bool = False) -> tuple[bool, bytes]:
        raise NotImplementedError

    # -- ResourceDispatch ------------------------------------------------------------------
    def resources_locked(self) -> Ledger: raise NotImplementedError
    def spawn_env_locked(self) -> tuple[Optional[dict], Optional[frozenset]]:
        raise NotImplementedError
    def _route_with_request_locked(self, g: WorkerGroup, t: Task) -> None: raise NotImplementedError
    def _dispatch_requests_locked(self, g: WorkerGroup) -> None: raise NotImplementedError
    def _release_allocation_locked(self, t: Task, w: Optional[WorkerHandle]) -> None:
        raise NotImplementedError
    def _fence_locked(self, w: WorkerHandle, on: bool) -> None: raise NotImplementedError
    def _retire_worker_locked(self, w: WorkerHandle) -> None: raise NotImplementedError
    def slots_used_locked(self, g: WorkerGroup) -> int: raise NotImplementedError
    def _fail_waiting_for_resources_locked(self, g: WorkerGroup, err: bytes) -> None:
        raise NotImplementedError
    def _on_blocked_with_resources_locked(self, w: WorkerHandle) -> None: raise NotImplementedError
    def _on_unblocked_with_resources_locked(self, w: WorkerHandle) -> None:
        raise NotImplementedError
