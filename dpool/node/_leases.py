"""Worker leases: a node lends a worker to a driver on its own host (cluster mode).

    driver ──LeaseRequest (new unix connection)──▶ node: starts a worker of the driver's
           │                                         group with that connection as its
           │                                         lease channel; counts it busy
           ◀════════ ExecuteTask / TaskDone over the lease, no node hop ════════▶ worker
           ──LeasedResult (main connection)──▶ node: the value joins its object table

A hop through the node costs a round trip of its own; with a lease, the driver's round
trip is the embedded runtime's. The node stays in charge of its CPUs: a
lent worker counts as busy, a lease is granted only while the group and the node have
room and nothing is queued, and when tasks queue up behind a lent worker's CPU the node
asks for it back (``LeaseRecall``); the driver closes the lease once its task is done, and
the worker tells the node (``LeaseEnded``) and serves it as any other worker.

Handlers run on the IO thread with the scheduler's lock held (``_locked``: see
``scheduling._api``); ``grant`` runs on the accept thread that authenticated the
connection and takes the lock.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Optional

from dpool.objects import segment as _segment
from dpool.protocol import Channel, ChannelClosed, encode_batch
from dpool.protocol import messages as m
from dpool.scheduling import ObjectEntry, SchedulerAPI, WorkerGroup, WorkerHandle

log = logging.getLogger("dpool.node")

_GROUP_WAIT_S = 1.0


class LeaseDesk:
    """The node's ``LeaseService``: lends workers, takes them back, keeps their results."""

    def __init__(self, scheduler: SchedulerAPI) -> None:
        self._s = scheduler
        self.lent: dict[int, WorkerHandle] = {}  # worker id -> lent worker
        self._recalled: set[int] = set()
        self.resubmitted: dict[int, ObjectEntry] = {}  # leased tasks the driver sends here again
        scheduler.register_handler(m.LeasedResult.CODE, self._on_leased_result_locked)
        scheduler.register_handler(m.LeasedTask.CODE, self._on_leased_task_locked)
        scheduler.register_handler(m.LeasedLost.CODE, self._on_leased_lost_locked)
        scheduler.register_handler(m.LeaseEnded.CODE, self._on_lease_ended_locked)
        scheduler.attach_services(leases=self)

    # -- the accept thread ---------------------------------------------------------------
    def grant(self, sock: socket.socket, req: m.LeaseRequest) -> None:
        """Lend a new worker of the group on this connection, or say why not."""
        s = self._s
        deadline = time.monotonic() + _GROUP_WAIT_S
        while s.group(req.group_id) is None and time.monotonic() < deadline:
            time.sleep(0.005)  # its CreateGroup, sent first, comes on another connection
        with s.lock:
            g = s.group(req.group_id)
            reason, idle = self._refusal_locked(g)
            if reason is None:
                assert g is not None  # (no reason to refuse: the group exists)
                if idle is not None:  # the group is full: an idle worker makes room
                    idle.mark_stopping()
                    s.send_locked(idle, [m.Shutdown()])
                try:
                    w = s.spawn_locked(g, lease=sock)
                except Exception as exc:  # noqa: BLE001 - the driver hears why, at once
                    reason = f"cannot start a worker process: {exc}"
                else:
                    w.leased = g.owner
                    # the lent worker's tasks are the group's work too: a closed group
                    # waits for the lease to end before it stops its workers (shutdown
                    # waits for running tasks, however long)
                    g.outstanding += 1
                    self.lent[w.worker_id] = w
                    # closed under the lock: a worker forked after this must not hold
                    # the lease's end, or the driver would not see this worker die
                    sock.close()
                    log.debug("lent worker %d to driver session %d (group %d)",
                              w.worker_id, g.owner.session_id, g.group_id)
                    return
        try:
            Channel(sock, blocking=True).send(encode_batch([m.LeaseDenied(reason)]))
        except ChannelClosed:
            pass
        sock.close()

    def _refusal_locked(self, g: Optional[WorkerGroup]
                        ) -> tuple[Optional[str], Optional[WorkerHandle]]:
        """Why ``g`` gets no lease now (or None), and the idle worker to stop for it
        when the group has all its workers already (a lent worker is a new process: its
        lease connection is passed when it starts)."""
        s = self._s
        if s.closed:
            return "the node is stopping", None
        owner = getattr(g, "owner", None)
        if g is None or owner is None or not getattr(owner, "local", False) \
                or not owner.alive:
            return "no such group of a driver on this host", None
        if g.closed or g.broken is not None:
            return "the group is closed", None
        if g.max_tasks is not None:
            return "workers of this group exit after max_tasks_per_child tasks", None
        if g.queue:
            return "tasks of the group are queued", None
        if g.by_request:
            return "tasks of the group wait for resources", None
        if s.cpu_limit is not None and s.busy_cpus_locked() >= s.cpu_limit:
            return "the node's CPUs are all in use", None
        live = [w for w in g.workers if w.alive and not w.retiring]
        if any(w.leased is not None for w in live):
            return "a worker of the group is lent already", None
        if len(live) < g.max_workers:
            return None, None
        if g.initializer is not None:  # a new process would run it again: keep theirs
            return "the group's workers are all started", None
        for w in live:
            if not w.inflight and not w.blocked:
                return None, w
        return "the group's workers are all busy", None

    # -- the IO thread (lock held) -------------------------------------------------------
    def recall_locked(self) -> None:
        """Tasks wait for a CPU: ask every lent worker back (once each)."""
        for wid, w in self.lent.items():
            d = w.leased
            if wid in self._recalled or d is None or not d.alive:
                continue
            self._recalled.add(wid)
            self._s.send_locked(d, [m.LeaseRecall(w.group.group_id)])

    def _on_lease_ended_locked(self, w: WorkerHandle, msg: m.LeaseEnded) -> None:
        self.forget_locked(w)
        self._s.cpu_freed_locked()  # its CPU is free for whatever waits

    def lost_locked(self, w: WorkerHandle) -> None:
        """A lent worker exited: tell its driver, which may be waiting on its task."""
        d = w.leased
        self.forget_locked(w)
        if d is not None and d.alive:
            self._s.send_locked(d, [m.LeaseLost(w.group.group_id, w.worker_id)])

    def forget_locked(self, w: WorkerHandle) -> None:
        """``w`` is no longer lent (the lease ended, or the worker is gone)."""
        w.leased = None
        if self.lent.pop(w.worker_id, None) is None:
            return
        self._recalled.discard(w.worker_id)
        g = w.group
        g.outstanding -= 1  # (the lease's share of the group's work: see ``grant``)
        if g.closed:
            self._s.close_group_locked(g)  # its work may be done now

    def _on_leased_task_locked(self, d: WorkerHandle, msg: m.LeasedTask) -> None:
        """A task of the driver's runs on its lease: its result is an object the driver
        owns (as it owns what it puts), pending until ``LeasedResult``."""
        self._s.pending_object_locked(msg.object_id)
        d.owned.add(msg.object_id)

    def _on_leased_result_locked(self, d: WorkerHandle, msg: m.LeasedResult) -> None:
        self._s.resolve_object_locked(msg.object_id, msg.ok, msg.payload)

    def _on_leased_lost_locked(self, d: WorkerHandle, msg: m.LeasedLost) -> None:
        """The lent worker died running this task; the driver sends it here next, under
        the same id: a result segment the dead worker began must not be in the way."""
        s = self._s
        s.store.unlink_unadopted(_segment.segment_name(s.store.owner_pid, msg.object_id))
        obj = s.take_object_locked(msg.object_id)
        if obj is not None and not obj.ready:
            self.resubmitted[msg.object_id] = obj  # its waiters wait for the rerun

    def rerun_locked(self, oid: int) -> None:
        """The task of a dead lent worker was submitted here (``SubmitTask`` handled):
        what waited for its pending object waits for the task's now."""
        old = self.resubmitted.pop(oid)
        new = self._s.object_locked(oid)
        if new is None:
            return
        new.refs = old.refs  # the driver's handle (counted in both) and the waiters'
        for waiter in old.waiters or ():
            new.add_waiter(waiter)
