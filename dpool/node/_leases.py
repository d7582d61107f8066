"""Worker leases: a node lends a worker to a driver on its own host (cluster mode).

    driver ──LeaseRequest (new unix connection)──▶ node: starts a worker of the driver's
           │                                         group with that connection as its
           │                                         lease channel; counts it busy
           ◀════════ ExecuteTask / TaskDone over the lease, no node hop ════════▶ worker
           ──LeasedResult (main connection)──▶ node: the value joins its object table

A hop through the node costs a round trip of its own (~50 us here); with a lease, the
driver's round trip is the embedded runtime's. The node stays in charge of its CPUs: a
lent worker counts as busy, a lease is granted only while the group and the node have
room and nothing is queued, and when tasks queue up behind a lent worker's CPU the node
asks for it back (``LeaseRecall``); the driver closes the lease once its task is done, and
the worker tells the node (``LeaseEnded``) and serves it as any other worker.

Handlers run on the IO thread with the scheduler's lock held; ``grant`` runs on the
accept thread that authenticated the connection and takes the lock.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any, Optional

from dpool.objects import _segment
from dpool.protocol import Channel, ChannelClosed, encode_batch
from dpool.protocol import _messages as m
from dpool.scheduling._records import Group, Obj, WorkerHandle

log = logging.getLogger("dpool.node")

_GROUP_WAIT_S = 1.0


class LeaseDesk:
    def __init__(self, scheduler: Any) -> None:
        self._s = scheduler
        self.lent: dict[int, WorkerHandle] = scheduler.leases  # worker id -> lent worker
        self._recalled: set[int] = set()
        self.resubmitted: dict[int, Obj] = {}  # leased tasks the driver sends here again
        h = scheduler._handlers
        h[m.LeasedResult.CODE] = self._on_leased_result
        h[m.LeasedTask.CODE] = self._on_leased_task
        h[m.LeasedLost.CODE] = self._on_leased_lost
        h[m.LeaseEnded.CODE] = self._on_lease_ended
        scheduler.recall_leases = self.recall

    # -- the accept thread ---------------------------------------------------------------
    def grant(self, sock: socket.socket, req: m.LeaseRequest) -> None:
        """Lend a new worker of the group on this connection, or say why not."""
        s = self._s
        deadline = time.monotonic() + _GROUP_WAIT_S
        while req.group_id not in s._groups and time.monotonic() < deadline:
            time.sleep(0.005)  # its CreateGroup, sent first, comes on another connection
        with s._lock:
            g = s._groups.get(req.group_id)
            reason, idle = self._refusal(g)
            if reason is None:
                if idle is not None:  # the group is full: an idle worker makes room
                    idle.alive = False
                    s._send(idle, [m.Shutdown()])
                try:
                    w = s._spawn(g, lease=sock)
                except Exception as exc:  # noqa: BLE001 - the driver hears why, at once
                    reason = f"cannot start a worker process: {exc}"
                else:
                    w.leased = g.owner  # type: ignore[union-attr]
                    # the lent worker's tasks are the group's work too: a closed group
                    # waits for the lease to end before it stops its workers (shutdown
                    # waits for running tasks, however long)
                    g.outstanding += 1  # type: ignore[union-attr]
                    self.lent[w.worker_id] = w
                    # closed under the lock: a worker forked after this must not hold
                    # the lease's end, or the driver would not see this worker die
                    sock.close()
                    log.debug("lent worker %d to driver session %d (group %d)",
                              w.worker_id, g.owner.session_id, g.group_id)  # type: ignore
                    return
        try:
            Channel(sock, blocking=True).send(encode_batch([m.LeaseDenied(reason)]))
        except ChannelClosed:
            pass
        sock.close()

    def _refusal(self, g: Optional[Group]) -> tuple[Optional[str], Optional[WorkerHandle]]:
        """Why ``g`` gets no lease now (or None), and the idle worker to stop for it
        when the group has all its workers already (a lent worker is a new process: its
        lease connection is passed when it starts)."""
        s = self._s
        if s._closed:
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
        if g.rq:
            return "tasks of the group wait for resources", None
        if s.cpu_limit is not None and s.busy_cpus() >= s.cpu_limit:
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
    def recall(self) -> None:
        """Tasks wait for a CPU: ask every lent worker back (once each)."""
        for wid, w in self.lent.items():
            d = w.leased
            if wid in self._recalled or d is None or not d.alive:
                continue
            self._recalled.add(wid)
            self._s._send(d, [m.LeaseRecall(w.group.group_id)])

    def _on_lease_ended(self, w: WorkerHandle, msg: m.LeaseEnded) -> None:
        self.forget(w)
        s = self._s
        for g in s._groups.values():  # its CPU is free for whatever waits
            if g.queue and g not in s._refill:
                s._refill.append(g)

    def lost(self, w: WorkerHandle) -> None:
        """A lent worker exited: tell its driver, which may be waiting on its task."""
        d = w.leased
        self.forget(w)
        if d is not None and d.alive:
            self._s._send(d, [m.LeaseLost(w.group.group_id, w.worker_id)])

    def forget(self, w: WorkerHandle) -> None:
        """``w`` is no longer lent (the lease ended, or the worker is gone)."""
        w.leased = None
        if self.lent.pop(w.worker_id, None) is None:
            return
        s = self._s
        self._recalled.discard(w.worker_id)
        g = w.group
        g.outstanding -= 1
        if g.outstanding == 0 and g.closed:
            s._retire_group(g)

    def _on_leased_task(self, d: WorkerHandle, msg: m.LeasedTask) -> None:
        """A task of the driver's runs on its lease: its result is an object the driver
        owns (as it owns what it puts), pending until ``LeasedResult``."""
        obj = Obj()
        obj.refs = 1  # the driver's handle
        self._s._objects[msg.object_id] = obj
        d.owned.add(msg.object_id)

    def _on_leased_result(self, d: WorkerHandle, msg: m.LeasedResult) -> None:
        s = self._s
        oid = msg.object_id
        obj = s._objects.get(oid)
        if obj is None or obj.ready:  # released meanwhile: nobody can use it
            s.store.discard(msg.payload if msg.ok else None)
            return
        ok, payload = s._adopt_result(msg.ok, msg.payload)
        obj.ready, obj.ok, obj.payload = True, ok, payload
        s._ctl.add_object(oid, len(payload), "host")
        if obj.waiters:
            s._wake_waiters(obj, oid)
        if obj.refs <= 0:
            s._drop_object(oid)

    def _on_leased_lost(self, d: WorkerHandle, msg: m.LeasedLost) -> None:
        """The lent worker died running this task; the driver sends it here next, under
        the same id: a result segment the dead worker began must not be in the way."""
        s = self._s
        s.store.unlink_unadopted(_segment.segment_name(s.store.owner_pid, msg.object_id))
        obj = s._objects.pop(msg.object_id, None)
        if obj is not None and not obj.ready:
            self.resubmitted[msg.object_id] = obj  # its waiters wait for the rerun

    def rerun(self, oid: int) -> None:
        """The task of a dead lent worker was submitted here (``SubmitTask`` handled):
        what waited for its pending object waits for the task's now."""
        old = self.resubmitted.pop(oid)
        new = self._s._objects.get(oid)
        if new is None:
            return
        new.refs = old.refs  # the driver's handle (counted in both) and the waiters'
        for waiter in old.waiters or ():
            new.add_waiter(waiter)
