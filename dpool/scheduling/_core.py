"""The state every part of the local scheduler shares, declared once for the type checker.

``LocalScheduler`` (``_scheduler``) is assembled from parts that each own one
responsibility -- ``_workers.WorkerPool`` (dispatch, worker processes, deaths),
``_handlers.WorkerMessages`` (what workers and attached drivers send),
``_group_calls.GroupCalls`` (cancel, close, wait for, terminate a group),
``_resource_dispatch.ResourceDispatch`` (tasks with resource requests) and
``_object_table.ObjectTable`` (the object table, over ``_lineage.Lineage``) -- over the
records and the lock that ``LocalScheduler.__init__`` creates. ``SchedulerCore`` names that
shared state and the methods the parts call on one another, so that each part
type-checks on its own. At run time it is an empty class; for the type checker it is a
``Protocol`` every part subclasses, whose methods ``LocalScheduler`` must define in full
(``mypy`` refuses to instantiate it otherwise), each in exactly one part. The lock rule
is the scheduler's (``_api``): a ``_locked`` method expects ``lock`` held, and sends
through ``send_locked``, which the lock writes as the region ends (``_lock``). What the
node's services may use is ``_api.SchedulerAPI``, a narrower view.
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
    from typing import Any, Callable, Optional, Protocol

    from dpool.control import ControlStore
    from dpool.scheduling._bundle_ledger import BundleLedger
    from dpool.scheduling._limits import LimitWatch
    from dpool.scheduling._api import (
        ActorService,
        DriverService,
        Handler,
        LeaseService,
        SpillbackService,
    )

    class SchedulerCore(Protocol):
        lock: SchedulerLock
        _outbox: list  # sends recorded under the lock (``_lock``)
        control: ControlStore
        batch: BatchPolicy
        closed: bool
        io: IOLoop
        store: HostStore
        cpu_limit: Optional[int]
        zygote: Any  # the fork server (``_zygote.Zygote``) or None
        id_prefix: Optional[Callable[[], int]]
        actor_names: dict[str, tuple]
        kv: dict[str, tuple[bytes, float]]
        ended_actors: dict[int, tuple]
        limits: LimitWatch  # timeouts and memory limits (``_limits``)
        _actor_service: Optional[ActorService]
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
        _bundles: Optional[BundleLedger]

        # -- LocalScheduler --------------------------------------------------------------------
        def finish_locked(self, t: Task, ok: bool, payload: bytes, counted: bool = True) -> None:
            ...
        def admit_locked(self, t: Task) -> None: ...
        def skip_cancelled_locked(self, t: Task) -> None: ...
        def pin_inputs_locked(self, t: Task) -> bool: ...
        def unpin_inputs_locked(self, t: Task) -> None: ...
        def _build_deps_locked(self, t: Task) -> bool: ...
        def only_to_idle_locked(self, t: Task) -> bool: ...
        def inputs_locked(self, t: Task) -> tuple: ...
        def _wake_waiters_locked(self, obj: ObjectEntry, oid: int) -> None: ...
        def take_out_locked(self) -> list: ...
        def close_group_locked(self, g: WorkerGroup) -> None: ...
        def deliver(self, out: list) -> None: ...

        # -- ObjectTable -----------------------------------------------------------------------
        def decref_locked(self, oid: int, n: int = 1) -> None: ...
        def _drain_releases_locked(self) -> None: ...
        def _send_object_locked(self, w: WorkerHandle, oid: int, obj: ObjectEntry) -> None:
            ...
        def rebuilding_locked(self, t: Task) -> bool: ...
        def wait_for_room_locked(self, t: Task, oid: int) -> bool: ...
        def room_freed_locked(self) -> None: ...
        def fail_stuck_room_waiters_locked(self) -> None: ...

        # -- WorkerPool ------------------------------------------------------------------------
        def _dispatch_locked(self, g: WorkerGroup, idle_only: bool = False) -> None:
            ...
        def send_locked(self, w: WorkerHandle, msgs: list) -> None: ...
        def flush_locked(self, outbox: list) -> None: ...
        def fail_group_locked(self, g: WorkerGroup, reason: str) -> None: ...
        def break_group_locked(self, g: WorkerGroup, reason: str) -> None: ...
        def _requeue_locked(self, w: WorkerHandle, task_ids: tuple) -> None:
            ...
        def busy_cpus_locked(self) -> int: ...
        def _try_spawn_locked(self, g: WorkerGroup, gpus: Optional[tuple] = None) -> bool:
            ...
        def spawn_locked(self, g: WorkerGroup, gpus: Optional[tuple] = None,
                         lease: Optional[socket.socket] = None) -> WorkerHandle:
            ...

        # -- WorkerMessages --------------------------------------------------------------------
        def _adopt_result_locked(self, ok: bool, payload: bytes,
                                 rebuilt: bool = False) -> tuple[bool, bytes]:
            ...

        # -- GroupCalls ------------------------------------------------------------------------
        def terminate_group(self, group: WorkerGroup, reason: str) -> None: ...
        def kill_actor_locked(self, g: WorkerGroup, reason: str) -> bool: ...

        # -- ResourceDispatch ------------------------------------------------------------------
        def resources_locked(self) -> Ledger: ...
        def spawn_env_locked(self) -> tuple[Optional[dict], Optional[frozenset]]:
            ...
        def _route_with_request_locked(self, g: WorkerGroup, t: Task) -> None: ...
        def _dispatch_requests_locked(self, g: WorkerGroup) -> None: ...
        def _release_allocation_locked(self, t: Task, w: Optional[WorkerHandle]) -> None:
            ...
        def _fence_locked(self, w: WorkerHandle, on: bool) -> None: ...
        def _refence_all_locked(self) -> None: ...
        def offer_locked(self, g: Optional[WorkerGroup] = None) -> str: ...
        def _free_alloc_locked(self, a: object) -> None: ...
        def _bundle_cpus_moved_locked(self, idle_before: int) -> None: ...
        def _retire_worker_locked(self, w: WorkerHandle) -> None: ...
        def slots_used_locked(self, g: WorkerGroup) -> int: ...
        def _fail_waiting_for_resources_locked(self, g: WorkerGroup, err: bytes) -> None:
            ...
        def _on_blocked_with_resources_locked(self, w: WorkerHandle) -> None: ...
        def _on_unblocked_with_resources_locked(self, w: WorkerHandle) -> None:
            ...
else:
    class SchedulerCore:
        """At run time, nothing: every part defines what it declares above."""
