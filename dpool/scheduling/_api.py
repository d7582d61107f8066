"""What plugs into the local scheduler, and what it offers them: typed interfaces.

A node daemon builds its cluster services around one ``LocalScheduler``: the attached
drivers (``node._attach``), worker leases (``node._leases``), spilling to other nodes
(``node._spillback``), running what other nodes spilled (``node._remote``), placement-group
bundles (``node._placement_groups``). The services hold it as ``SchedulerAPI``, so each can
be unit-tested with a fake scheduler (tests/node/_fake_scheduler.py); the scheduler sees
them only through ``DriverService``, ``SpillbackService`` and ``LeaseService`` (registered
with ``attach_services``) and the message handlers they add to its dispatch table
(``register_handler``). Outside ``SchedulerAPI``: the daemon and its agent hold the
``LocalScheduler`` itself, and ``node._placement_groups`` calls its bundle methods
(``hold_bundle_locked``, ``free_bundles_locked``).

Lock rule, here as everywhere in ``scheduling/`` and ``node/``: a method whose name ends
in ``_locked`` expects the scheduler's ``lock`` held by its caller; any other method
takes the lock itself if it needs it, and must not be called with it held. Message
handlers run with the lock held, on the IO thread (or a leader thread:
``LocalScheduler.lead``). Completions gathered under the lock (``take_out_locked``) are
delivered after it is released (``deliver``): a future's done-callbacks may submit again.

Only the node's modules and type checkers import this module: it needs ``typing``, which
the embedded runtime does not load.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, ValuesView
from typing import Any, Callable, Optional, Protocol, runtime_checkable

from dpool.control import ControlStore
from dpool.objects import HostStore
from dpool.protocol import IOLoop
from dpool.protocol import messages as m
from dpool.scheduling._lock import SchedulerLock
from dpool.scheduling._policy import BatchPolicy
from dpool.scheduling._records import ObjectEntry, Task, WorkerGroup, WorkerHandle
from dpool.scheduling._resources import Ledger, Request

# A message handler: (the connection it came on, the message), called on the IO thread
# with the lock held. The connection is a ``WorkerHandle`` or the subclass a service's
# messages come on (an attached driver's ``DriverHandle``, a peer's ``PeerHandle``).
Handler = Callable[[Any, Any], None]


@runtime_checkable
class DriverService(Protocol):
    """The drivers attached to a node (``node._attach.DriverSessions``)."""

    def local_drivers_locked(self) -> Iterable[WorkerHandle]:
        """The live drivers on this host (they map the store's segments too)."""
        ...

    def value_message(self, w: WorkerHandle, oid: int, ok: bool,
                      payload: bytes) -> m.ObjectValue:
        """A value for a connection whose ``remote_values`` is true (a driver, a peer)."""
        ...

    def forward_output_locked(self, src: WorkerHandle, msg: m.Output) -> None:
        """What a worker printed, on its way to the driver that owns its group."""
        ...

    def handle_closed_locked(self, h: WorkerHandle) -> None:
        """A connection without a worker process (a driver, a peer) closed."""
        ...


@runtime_checkable
class SpillbackService(Protocol):
    """Sends tasks this node should not run to other nodes (``node._spillback.Spillback``)."""

    def consider_locked(self, g: WorkerGroup) -> None:
        """``g``'s queue grew: spill the tasks that would wait too long here."""
        ...

    def unmet_locked(self, g: WorkerGroup, t: Task, reason: str) -> bool:
        """``t`` asks for resources this node never has; False: fail it here."""
        ...

    def fail_group_locked(self, g: WorkerGroup, err: bytes) -> None:
        """``g`` broke: its tasks away fail with ``err``."""
        ...

    def forward_locked(self, g: WorkerGroup, calls: list, node: str) -> None:
        """Send ``calls`` (taken off ``g``'s queue, in order) to the node that hosts
        ``g``'s actor; their outcomes come back as a spilled task's do."""
        ...

    def tick_locked(self) -> None:
        """Periodic work (the IO thread's tick)."""
        ...

    def wants_tick(self) -> bool:
        """Whether ``tick_locked`` has work now beyond the queued tasks it looks at (any
        thread, no lock: a hint)."""
        ...


@runtime_checkable
class ActorService(Protocol):
    """A node's part of the actor directory (``node._actor_calls.ActorCalls``)."""

    def ended_locked(self, g: WorkerGroup) -> None:
        """Actor group ``g`` ended (or a proxy of one): its name is free, and an actor
        it stood for on another node ends too."""
        ...

    def saved_locked(self, g: WorkerGroup, state: bytes, through: int) -> None:
        """Actor group ``g``'s worker sent a checkpoint that holds its calls up to task
        ``through``: the node whose driver's actor this is (a placed one) keeps it."""
        ...


@runtime_checkable
class LeaseService(Protocol):
    """Workers lent to drivers of this host (``node._leases.LeaseDesk``)."""

    @property
    def lent(self) -> dict[int, WorkerHandle]:
        """Worker id -> the worker lent now (counted busy; not the node's to send to)."""
        ...

    def recall_locked(self) -> None:
        """Tasks wait for a CPU: ask the lent workers back."""
        ...

    def lost_locked(self, w: WorkerHandle) -> None:
        """The lent worker ``w`` exited."""
        ...


@runtime_checkable
class SchedulerAPI(Protocol):
    """The local scheduler as the node's services and daemons use it (``LocalScheduler``).

    Records (``WorkerGroup``, ``Task``, ``ObjectEntry``, ``WorkerHandle``) are plain data, read and
    written under ``lock``; what changes more than one record, or the tables, is a
    method here.
    """

    # -- shared state ------------------------------------------------------------------
    @property
    def lock(self) -> SchedulerLock:
        """Guards every record and table of the scheduler, and the services' own; what
        a region sends (``send_locked``) is written as the region releases it (``_lock``)."""
        ...

    @property
    def io(self) -> IOLoop:
        """The IO thread: ``add`` a connection (driver, peer) to serve its messages."""
        ...

    @property
    def store(self) -> HostStore:
        """The host's object store (use it with the lock held)."""
        ...

    @property
    def batch(self) -> BatchPolicy:
        """Run-time estimates per function (``estimate``, ``known``, ``observe``)."""
        ...

    @property
    def control(self) -> ControlStore:
        """The control store the scheduler records tasks, objects and events in."""
        ...

    @property
    def cpu_limit(self) -> Optional[int]:
        """A node's CPUs (at most this many tasks run at once); None: no node limit."""
        ...

    @property
    def closed(self) -> bool:
        """The scheduler is shut down (or shutting down)."""
        ...

    # -- plugging in (any thread; take the lock) ---------------------------------------
    def register_handler(self, code: int, handler: Handler) -> Optional[Handler]:
        """Handle messages of type ``code`` with ``handler``; returns the handler it
        replaces (None if none), for a service that wraps a built-in one."""
        ...

    def attach_services(self, *, sessions: Optional[DriverService] = None,
                        spillback: Optional[SpillbackService] = None,
                        leases: Optional[LeaseService] = None,
                        actors: Optional[ActorService] = None) -> None:
        """Plug in the node's services (those given; the others stay as they were)."""
        ...

    def set_control(self, control: ControlStore) -> None:
        """Record in ``control`` from now on (a node that joined a cluster)."""
        ...

    # -- any thread ----------------------------------------------------------------------
    def group(self, group_id: int) -> Optional[WorkerGroup]:
        """The group with this id, if it exists (a dict read: no lock needed)."""
        ...

    def function_payload(self, fn_id: int) -> bytes:
        """The pickled function registered under ``fn_id`` (KeyError if none)."""
        ...

    def ended_actor(self, group_id: int) -> Optional[bytes]:
        """The error a call of the actor of ``group_id`` fails with if it ended here and
        left the groups (None: no such actor ended here)."""
        ...

    def deliver(self, out: list) -> None:
        """Complete what ``take_out_locked`` returned. Call *without* the lock."""
        ...

    def release(self, object_id: int) -> None:
        """Drop one handle's reference to an object (no lock; applied later)."""
        ...

    def terminate_group(self, group: WorkerGroup, reason: str) -> None:
        """Stop a group's workers now; its unfinished tasks fail with ``reason``."""
        ...

    def wait_group_exited(self, group: WorkerGroup, timeout: float = 30.0) -> None:
        """Block until the closed ``group`` is idle and its workers exited."""
        ...

    # -- lock held: groups ---------------------------------------------------------------
    def groups_locked(self) -> ValuesView[WorkerGroup]:
        """Every group (a live view: copy it before changing groups while iterating)."""
        ...

    def find_actor(self, name: str) -> Optional[tuple]:
        """The record of the live actor named ``name`` here, or None (takes the lock)."""
        ...

    def name_actor(self, name: str, record: tuple) -> bool:
        """Register ``name`` for an actor of this scheduler's (takes the lock)."""
        ...

    def insert_group_locked(self, g: WorkerGroup) -> None:
        """Add a group built by a service (an attached driver's, a mirror group)."""
        ...

    def close_group_locked(self, g: WorkerGroup) -> None:
        """No more submissions to ``g``; its workers stop once its work is done."""
        ...

    def fail_group_locked(self, g: WorkerGroup, reason: str) -> None:
        """Fail every queued, waiting and running task of ``g`` with ``reason``."""
        ...

    def kill_actor_locked(self, g: WorkerGroup, reason: str) -> bool:
        """End actor group ``g`` now: later calls fail at once, its worker is stopped on
        a thread; False if it had ended already."""
        ...

    def actor_ran_locked(self, t: Task) -> None:
        """Call ``t`` of an actor's proxy came back from the actor's node: into the
        proxy's log (its arguments and inputs kept for a rebuild)."""
        ...

    def actor_saved_locked(self, g: WorkerGroup, state: bytes, calls: int) -> None:
        """A checkpoint of ``g``'s actor replaces the first ``calls`` calls of its log."""
        ...

    def actor_boot_locked(self, g: WorkerGroup, inline: bool) -> bytes:
        """The initializer that rebuilds ``g``'s actor from its checkpoint and log
        (``inline``: stored values by value, for another host)."""
        ...

    def break_group_locked(self, g: WorkerGroup, reason: str) -> None:
        """``g`` can run nothing any more: fail what it has and is given, tell its
        driver."""
        ...

    # -- lock held: tasks ----------------------------------------------------------------
    def admit_locked(self, t: Task) -> None:
        """Accept a new task: record it, queue it once its inputs are ready, dispatch."""
        ...

    def finish_locked(self, t: Task, ok: bool, payload: bytes,
                      counted: bool = True) -> None:
        """Record a task's outcome and wake whatever waits on its result."""
        ...

    def skip_cancelled_locked(self, t: Task) -> None:
        """``t``'s future was cancelled before it started: finish it as cancelled."""
        ...

    def fail_unmet_locked(self, t: Task, reason: str) -> None:
        """``t`` cannot get the resources it asks for: it fails with ``ResourceError``."""
        ...

    def inputs_locked(self, t: Task) -> tuple:
        """``t``'s inputs as ``(oid, ok, payload)`` (pinned for it, or the table's)."""
        ...

    def away_locked(self, t: Task) -> None:
        """``t``, taken off its queue, was sent to another node (spillback)."""
        ...

    def back_locked(self, t: Task) -> None:
        """``t`` came back from another node, to wait in the caller's hands (parked)."""
        ...

    def return_task_locked(self, t: Task) -> None:
        """``t`` came back (from another node): first in its group's queue, dispatched."""
        ...

    def hold_bundle_locked(self, pg_id: int, index: int, req: Request,
                           host_cpus: int = 0) -> Optional[str]:
        """Reserve ``req`` for bundle ``index`` of placement group ``pg_id``: None when
        held, else why not now."""
        ...

    def bundles_held_locked(self) -> list:
        """``(pg_id, index)`` of the placement-group bundles held here."""
        ...

    def free_bundles_locked(self, pg_id: int, index: Optional[int] = None) -> int:
        """Give up the bundles of ``pg_id`` held here (``index``: that one only); tasks
        waiting to run in one that is gone fail. How many were freed."""
        ...

    def cpu_freed_locked(self) -> None:
        """A CPU no worker of the scheduler counted came free (a lease ended): groups
        with queued tasks are dispatched once the current read is handled."""
        ...

    def busy_cpus_locked(self) -> int:
        """Workers running tasks now (lent ones included), over every group."""
        ...

    def resources_locked(self) -> Ledger:
        """This node's GPUs, memory and custom resources (detected on first use)."""
        ...

    def set_function_locked(self, fn_id: int, payload: bytes) -> None:
        """Register a function under a local id (no control-store record)."""
        ...

    # -- lock held: workers and connections ----------------------------------------------
    def spawn_locked(self, g: WorkerGroup, gpus: Optional[tuple] = None,
                     lease: Optional[socket.socket] = None) -> WorkerHandle:
        """Start a worker of ``g`` (``lease``: a driver's connection it is lent to)."""
        ...

    def send_locked(self, w: WorkerHandle, msgs: list) -> None:
        """Send ``msgs`` to a worker, driver or peer: written, in order, as this region
        releases the lock (never blocks)."""
        ...

    def take_out_locked(self) -> list:
        """The completions gathered in this locked region, for ``deliver``."""
        ...

    def drop_handles_locked(self, w: WorkerHandle) -> None:
        """``w`` (a worker, or a driver) is gone: the objects it held a handle to lose
        that reference."""
        ...

    # -- lock held: objects --------------------------------------------------------------
    def object_locked(self, oid: int) -> Optional[ObjectEntry]:
        """The object table's entry for ``oid``, if any."""
        ...

    def pending_object_locked(self, oid: int) -> ObjectEntry:
        """A new entry for a value computed elsewhere (a lent worker's task): not
        ready, one reference (its owner's handle); ``resolve_object_locked`` sets it."""
        ...

    def resolve_object_locked(self, oid: int, ok: bool, payload: bytes) -> None:
        """The value of a pending entry arrived: adopt it, wake its waiters (a value
        for an entry released meanwhile is discarded)."""
        ...

    def take_object_locked(self, oid: int) -> Optional[ObjectEntry]:
        """Remove ``oid``'s entry from the table and return it (nothing is freed)."""
        ...

    def decref_locked(self, oid: int, n: int = 1) -> None:
        """Drop ``n`` references to ``oid``; at zero a ready object is freed."""
        ...


__all__ = ["DriverService", "Handler", "LeaseService", "SchedulerAPI", "SpillbackService"]
