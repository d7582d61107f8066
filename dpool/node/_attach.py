"""Drivers attached to a node's local scheduler (cluster mode): ``DriverSessions``.

    driver ──Attach/CreateGroup/SubmitTask/PutObject/GetObjects/Release──▶ DriverSessions
           ◀──────────ObjectValue/GroupExited/GroupBroken───────────────── (this module)

To the scheduler an attached driver (``DriverHandle``) is a worker that never runs tasks:
it submits, puts, gets and releases with the worker's messages, and gets its results as
``ObjectValue``. It also creates and closes worker groups (one per executor or Pool) and
cancels queued tasks. When its connection closes, its groups fail and their workers are
stopped, its handles are dropped and what it pushed but never named is removed.

A driver on this host (unix socket) shares the store: it writes large values into
segments the scheduler adopts and maps stored results in place. A driver over TCP moves
large values on transfer connections of its own:

    TCP driver                                              this node
    PushSegment + the segment's bytes ── transfer conn ──▶ a NodeServer thread writes a
                                                            segment (``transfer._push``),
                                                            noted in ``_pushed``
    PutObject/SubmitTask naming it ──── control conn ───▶ claimed from ``_pushed``,
                                                            adopted like a local value
    ◀── ObjectValue: a reference (address, segment, size) to a stored result
    FetchSegment ranges ──────────────── transfer conns ──▶ sendfile (``transfer._pull``)

A segment named by a TCP driver's message is used only if that driver pushed it (its id
carries the driver's id prefix, and the size matches): nothing else in ``/dev/shm`` is
named from the wire. A stored result it holds a handle to stays in the store (spilled to
disk, it is brought back when asked for again); small values travel inline.

Handlers run on the IO thread with the scheduler's lock held (``scheduling._api``);
``attach`` runs on the thread that authenticated the connection, ``receive_push`` on a
transfer connection's thread; ``_pushed`` has its own lock, never held for I/O.
"""

from __future__ import annotations

import itertools
import json
import logging
import multiprocessing as mp
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any, Callable, Optional

from dpool.errors import ObjectStoreFullError, ProtocolError
from dpool.node._ids import IdPrefixes
from dpool.node._leases import LeaseDesk
from dpool.node._workdirs import WorkdirCache
from dpool.objects import inline as _inline
from dpool.objects import payload as _payload
from dpool.objects import segment as _segment
from dpool.objects import values as _values
from dpool.protocol import Channel, map_path
from dpool.protocol import messages as m
from dpool.scheduling import Handler, SchedulerAPI, WorkerGroup, WorkerHandle
from dpool.scheduling import limits as _limits
from dpool.transfer import pull as _pull
from dpool.transfer import push as _push

log = logging.getLogger("dpool.node")


class DriverHandle(WorkerHandle):
    """The scheduler's view of an attached driver: a worker handle without a process."""

    __slots__ = ("groups", "hostname", "cwd", "sys_path", "session_id", "local", "workdirs",
                 "prefix")
    remote_values = True  # values sent to it must not refer to this host's store

    def __init__(self, session_id: int, chan: Channel, attach: m.Attach) -> None:
        super().__init__(-session_id, None, None, chan)  # type: ignore[arg-type]
        self.session_id = session_id
        self.pid = attach.pid
        self.hostname = attach.hostname
        self.cwd = attach.cwd
        self.sys_path = list(attach.sys_path)
        self.groups: set[int] = set()
        # over the node's unix socket: on this host, its directories are ours to use
        self.local = chan.sock.family == socket.AF_UNIX
        self.workdirs: dict[str, str] = {}  # digest -> where its code is on this node
        self.prefix = 0  # its ids' prefix (id >> 40): the objects it may push


class PeerHandle(WorkerHandle):
    """A connection with another cluster process: a node or a global scheduler.

    ``outgoing``: this process connected (to send); else the peer did (to send to us).
    ``tasks_out``/``tasks_in``: the spilled tasks a global scheduler placed over this
    link, and those a node got over it -- the two ends of one count, so a load report
    says which placements it already shows (``m.Load.received``)."""

    __slots__ = ("peer_id", "address", "outgoing", "tasks_out", "tasks_in")
    remote_values = True

    def __init__(self, chan: Channel, peer_id: str, address: str, outgoing: bool) -> None:
        super().__init__(0, None, None, chan)  # type: ignore[arg-type]
        self.peer_id = peer_id
        self.address = address
        self.outgoing = outgoing
        self.tasks_out = 0
        self.tasks_in = 0


def actor_state(actor: tuple, initializer: Optional[bytes]) -> Any:
    """The scheduler's state of an actor (``CreateGroup.actor``): its boot function and
    constructor are in its initializer, ``(boot, (ctor, ...))`` -- the boot function is
    dpool's, by reference, and the constructor stays a pickle (the user's class is
    loaded only in the actor's worker)."""
    from dpool.scheduling import ActorConfig, ActorState
    from dpool.scheduling import resources as _resources

    boot, boot_args = _payload.loads(initializer or b"")
    name, max_restarts, every, concurrency, detached, req = actor
    state = ActorState(ActorConfig(name, boot, boot_args[0], max_restarts, every,
                                   concurrency, detached, _resources.from_wire(req)))
    # (rebuilt from another node's copy: a restart here starts from it too)
    state.checkpoint, state.base = boot_args[1], list(boot_args[2])
    return state


class DriverSessions:
    """Serves the drivers attached to one local scheduler (its ``DriverService``)."""

    def __init__(self, scheduler: SchedulerAPI, node_id: str, num_cpus: int) -> None:
        self._s = scheduler
        self.node_id = node_id
        self.num_cpus = num_cpus
        self._next_session = 1
        self._lock = threading.Lock()
        self.drivers: dict[int, DriverHandle] = {}
        self.cluster_cpus = num_cpus  # the cluster's CPUs (the node agent keeps it fresh)
        # (this node's status) -> the cluster's, if any
        self.cluster_status: Optional[Callable[[dict], dict]] = None
        # mirror group -> (origin node, its group id), None for the node's own groups
        self.remote_origin: Optional[Callable[[WorkerGroup], Optional[tuple]]] = None
        self.send_to_node: Optional[Callable[[str, list], None]] = None  # a peer link's send
        # keeps what this node's workers print (worker id, pid, stream, data): dpool logs
        self.output_log: Optional[Callable[[int, int, int, bytes], None]] = None
        self.prefixes: Optional[IdPrefixes] = None  # each driver's ids' prefix
        self.workdir_cache: Optional[WorkdirCache] = None
        # (digest, archive): for other nodes (called on a thread of its own)
        self.publish_workdir: Optional[Callable[[str, bytes], None]] = None
        self.published: set[str] = set()  # digests other nodes can fetch
        # called with a peer's handle (a PeerHandle) that closed, lock held
        self.peer_closed_hooks: list[Callable[[Any], None]] = []
        # (a group, its CreateGroup) of an actor: placed on another node if this one
        # lacks what it asks (``_actor_calls``)
        self.place_actor: Optional[Callable[[WorkerGroup, m.CreateGroup], bool]] = None
        # called with a driver's handle that detached, lock held (its placement groups)
        self.driver_closed_hooks: list[Callable[[Any], None]] = []
        scheduler.register_handler(m.CreateGroup.CODE, self._on_create_group_locked)
        scheduler.register_handler(m.GroupOp.CODE, self._on_group_op_locked)
        scheduler.register_handler(m.CancelTask.CODE, self._on_cancel_task_locked)
        scheduler.register_handler(m.StatusRequest.CODE, self._on_status_locked)
        scheduler.register_handler(m.WorkingDir.CODE, self._on_workdir_locked)
        # a driver's submissions and puts: the scheduler's own handlers, after this
        # service moved the values of drivers over TCP into the store
        self._base_submit: Handler = _wrapped(
            scheduler.register_handler(m.SubmitTask.CODE, self._on_submit_locked))
        self._base_put: Handler = _wrapped(
            scheduler.register_handler(m.PutObject.CODE, self._on_put_locked))
        self._store_ids: Any = None  # ids of values put in the store for TCP drivers
        # Values TCP drivers pushed (``transfer._push``, transfer threads) and have not
        # named in a message yet: segment name -> size. Its own lock, never held for I/O.
        self._push_lock = threading.Lock()
        self._pushers: set[int] = set()  # id prefixes of the attached TCP drivers
        self._pushed: dict[str, int] = {}
        self._receiver: Optional[_push.Receiver] = None
        self.leases = LeaseDesk(scheduler)  # workers lent to drivers of this host
        scheduler.attach_services(sessions=self)

    # -- from the accept thread -----------------------------------------------------------
    def attach(self, chan: Channel, hello: m.Attach, cluster_cpus: int) -> DriverHandle:
        """Register an authenticated driver; it is served by the IO loop from now on."""
        with self._lock:
            sid = self._next_session
            self._next_session += 1
        d = DriverHandle(sid, chan, hello)
        from dpool.protocol import encode_batch

        # without the control store's prefixes: above every worker's ids (wid << 32)
        prefix = self.prefixes.take() if self.prefixes is not None else (1 << 23) + sid
        owner = self._s.store.owner_pid if d.local else 0
        d.prefix = prefix
        if not d.local:
            with self._push_lock:
                self._pushers.add(prefix)
        chan.send(encode_batch([m.Attached(self.node_id, prefix, self.num_cpus, cluster_cpus,
                                           owner)]))
        chan.set_blocking(False)  # from here on, only the IO loop reads and writes it
        with self._s.lock:
            self.drivers[sid] = d
        self._s.io.add(d)
        log.info("driver pid %d on %s attached (session %d)", hello.pid, hello.hostname, sid)
        return d

    # -- handlers (IO thread, scheduler lock held) ----------------------------------------
    # -- values from drivers over TCP go into this node's store ----------------------------
    def _on_submit_locked(self, w: WorkerHandle, msg: m.SubmitTask) -> None:
        if isinstance(w, DriverHandle) and not w.local and msg.args:
            if self._claim_pushed_locked(w, msg.args):  # pushed: adopted with the task
                if self._s.group(msg.group_id) is None:  # (no task: nobody adopts it)
                    self._s.store.unlink_unadopted(
                        _values.stored(msg.args)[1])  # type: ignore[index]
            else:
                if self._store_ids is None:  # a cluster-unique range of this node's
                    base = (self.prefixes.take() << 40) if self.prefixes is not None \
                        else (3 << 61)
                    self._store_ids = itertools.count(base)
                msg.args = self._into_store_locked(msg.args, next(self._store_ids))
        self._base_submit(w, msg)
        if self.leases.resubmitted and msg.task_id in self.leases.resubmitted:
            self.leases.rerun_locked(msg.task_id)

    def _on_put_locked(self, w: WorkerHandle, msg: m.PutObject) -> None:
        if isinstance(w, DriverHandle) and not w.local \
                and not self._claim_pushed_locked(w, msg.payload):
            msg.payload = self._into_store_locked(msg.payload, msg.object_id)
        self._base_put(w, msg)

    # -- large values TCP drivers push (``transfer._push``) -------------------------------
    def receive_push(self, sock: socket.socket, req: m.PushSegment) -> None:
        """Receive (a range of) a pushed value into this store (a transfer connection's
        thread)."""
        if self._receiver is None:
            with self._push_lock:
                if self._receiver is None:
                    self._receiver = _push.Receiver(self._s.store.owner_pid,
                                                    self._may_push, self._keep_pushed,
                                                    unkeep=self._unkeep_pushed)
        self._receiver.serve(sock, req.object_id, req.size, req.offset, req.length)

    def _may_push(self, oid: int, size: int) -> None:
        with self._push_lock:
            pusher = (oid >> 40) in self._pushers
        if not pusher:
            raise ProtocolError(f"object id {oid:#x} is not one of an attached driver's")
        capacity = self._s.store.capacity  # (an int read: no lock needed)
        if size > capacity:
            raise ObjectStoreFullError(
                f"object of {size} bytes is larger than the object store's capacity of "
                f"{capacity} bytes (start the node with a larger --object-store-memory)")

    def _keep_pushed(self, name: str, size: int) -> bool:
        oid = int(name.rsplit("_", 1)[1], 16)
        with self._push_lock:
            if (oid >> 40) not in self._pushers:
                return False  # its driver detached meanwhile
            self._pushed[name] = size
        return True

    def _unkeep_pushed(self, name: str) -> bool:
        with self._push_lock:
            return self._pushed.pop(name, None) is not None

    def _claim_pushed_locked(self, d: DriverHandle, payload: Optional[bytes]) -> bool:
        """Whether ``payload`` names a value ``d`` pushed (then the scheduler adopts it);
        ``ProtocolError`` if it names any other segment."""
        ref = _values.stored(payload)
        if ref is None:
            return False
        oid, name, size = ref
        with self._push_lock:
            pushed = self._pushed.pop(name, None) if oid >> 40 == d.prefix else None
        if pushed != size or name != _segment.segment_name(self._s.store.owner_pid, oid):
            if pushed is not None:
                _segment.unlink(name)  # its own upload, misnamed: not kept for anyone
            raise ProtocolError(f"driver pid {d.pid} named segment {name!r}, which it did "
                                "not upload")
        return True

    def _drop_pushed_locked(self, d: DriverHandle) -> None:
        """``d`` detached: what it pushed and never named is removed."""
        with self._push_lock:
            self._pushers.discard(d.prefix)
            names = [n for n in self._pushed if int(n.rsplit("_", 1)[1], 16) >> 40
                     == d.prefix]
            for n in names:
                del self._pushed[n]
        for n in names:
            self._s.store.unlink_unadopted(n)

    def _into_store_locked(self, payload: bytes, oid: int) -> bytes:
        """A large value a remote driver sent inline, as a value of this node's store
        (workers map it; other nodes pull it), like a local driver's."""
        try:
            return _inline.into_store(
                payload, _segment.segment_name(self._s.store.owner_pid, oid)) or payload
        except Exception as exc:  # noqa: BLE001 - e.g. the store is full: keep it inline
            log.warning("keeping a value of %d bytes inline: %s", len(payload), exc)
            return payload

    def _on_workdir_locked(self, d: DriverHandle, msg: m.WorkingDir) -> None:
        """A driver's packed code: unpacked here unless the driver is on this host, and
        published for the nodes its tasks may spill to."""
        if d.local or self.workdir_cache is None:
            d.workdirs[msg.digest] = msg.root
        else:
            d.workdirs[msg.digest] = self.workdir_cache.add(msg.digest, msg.archive)
        if self.publish_workdir is not None and msg.digest not in self.published:
            threading.Thread(target=self._publish, args=(msg.digest, msg.archive),
                             daemon=True, name="dpool-publish-workdir").start()

    def _publish(self, digest: str, archive: bytes) -> None:
        """Store the code where other nodes find it; until then this node keeps the
        tasks that need it (``allows_spillback``), so no node looks for it before it is there."""
        try:
            if self.publish_workdir is not None:
                self.publish_workdir(digest, archive)
        except Exception as exc:  # noqa: BLE001 - its tasks then run here only
            log.warning("could not publish working directory %s (%d bytes) for other "
                        "nodes: %s; its tasks run on this node only", digest, len(archive),
                        exc)
            return
        self.published.add(digest)

    def allows_spillback(self, g: WorkerGroup) -> bool:
        """Whether other nodes can have ``g``'s code (its working directory published)."""
        return not g.workdir or g.workdir[0] in self.published

    def _on_create_group_locked(self, d: DriverHandle, msg: m.CreateGroup) -> None:
        try:
            ctx = mp.get_context(msg.start_method or None)
        except ValueError:
            ctx = mp.get_context()
        g = WorkerGroup(msg.group_id, msg.max_workers, ctx, msg.initializer, msg.max_tasks,
                  msg.max_attempts)
        g.cwd = d.cwd
        g.sys_path = d.sys_path
        if msg.workdir:
            digest, root = msg.workdir
            here = d.workdirs.get(digest, root)
            g.workdir = (digest, here)  # the root as the group's paths name it
            if here != root:  # the unpacked copy stands in for the driver's directory
                g.cwd = map_path(d.cwd, root, here)
                g.sys_path = [here, *(map_path(p, root, here) for p in d.sys_path)]
        if msg.actor:
            g.actor = actor_state(msg.actor, msg.initializer)
        if msg.limits:  # task_timeout=, max_memory_per_worker= (``scheduling._limits``)
            g.limits = _limits.GroupLimits(*msg.limits)
        g.owner = d
        self._s.insert_group_locked(g)
        d.groups.add(g.group_id)
        if msg.actor and self.place_actor is not None:
            self.place_actor(g, msg)  # (on another node, if this one lacks what it asks)

    def _group_locked(self, d: DriverHandle, group_id: int) -> Optional[WorkerGroup]:
        if group_id not in d.groups:
            return None
        return self._s.group(group_id)

    def _on_group_op_locked(self, d: DriverHandle, msg: m.GroupOp) -> None:
        s = self._s
        g = self._group_locked(d, msg.group_id)
        if g is None:
            if msg.op == "close_notify":
                s.send_locked(d, [m.GroupExited(msg.group_id)])
            elif msg.op == "cancel_queued":
                s.send_locked(d, [m.GroupOp(msg.group_id, "cancelled", "")])
            return
        if msg.op == "close":
            s.close_group_locked(g)
        elif msg.op == "close_notify":
            s.close_group_locked(g)
            threading.Thread(target=self._notify_exited, args=(d, g), daemon=True,
                             name="dpool-group-exit").start()
        elif msg.op == "cancel_queued":
            dropped = self._cancel_locked(d, [t.task_id for t in g.queue if not t.started])
            # the driver cancels exactly these, then stops waiting for this group
            s.send_locked(d, [m.CancelTask(tuple(dropped)),
                              m.GroupOp(g.group_id, "cancelled", "")])
        elif msg.op == "terminate":
            # terminate_group takes the lock and reaps workers: not on the IO thread
            threading.Thread(target=s.terminate_group, args=(g, msg.arg), daemon=True,
                             name="dpool-group-terminate").start()
        else:
            raise ValueError(f"unknown group operation {msg.op!r}")

    def _notify_exited(self, d: DriverHandle, g: WorkerGroup) -> None:
        s = self._s
        s.wait_group_exited(g)
        with s.lock:
            if d.alive:
                s.send_locked(d, [m.GroupExited(g.group_id)])
            d.groups.discard(g.group_id)

    def _on_cancel_task_locked(self, d: DriverHandle, msg: m.CancelTask) -> None:
        self._cancel_locked(d, msg.task_ids)

    def _cancel_locked(self, d: DriverHandle, task_ids: Any) -> list:
        """Drop queued, unstarted tasks of ``d``; returns their ids. The driver cancels
        (or has cancelled) their futures itself, so no value is sent for them."""
        from concurrent.futures import CancelledError

        wanted = set(task_ids)
        dropped: list = []
        if not wanted:
            return dropped
        s = self._s
        err = _payload.dumps_error(CancelledError())
        for gid in d.groups:
            g = s.group(gid)
            if g is None or not g.queue:
                continue
            gone = [t for t in g.queue if t.task_id in wanted and not t.started]
            if not gone:
                continue
            keep = [t for t in g.queue if t.task_id not in wanted or t.started]
            g.queue.clear()
            g.queue.extend(keep)
            for t in gone:
                t.started = True
                t.owner = None  # nothing to send: the driver's future is cancelled
                s.finish_locked(t, False, err)
                dropped.append(t.task_id)
        return dropped

    def _on_status_locked(self, d: DriverHandle, msg: m.StatusRequest) -> None:
        # the cluster's status reads the control store: not on the IO thread
        threading.Thread(target=self._answer_status, args=(d,), daemon=True,
                         name="dpool-status").start()

    def _answer_status(self, d: DriverHandle) -> None:
        s = self._s
        with s.lock:
            here = self.status_locked()
        if self.cluster_status is not None:
            answer = self.cluster_status(here)
        else:
            answer = {"nodes": [here], "global_schedulers": [], "shards": []}
        with s.lock:
            if d.alive:
                s.send_locked(d, [m.StatusReply(json.dumps(answer))])

    def status_locked(self) -> dict:
        """This node's state: what ``dpool status`` and heartbeats report."""
        s = self._s
        groups = list(s.groups_locked())
        busy = sum(1 for g in groups for w in g.workers
                   if w.alive and w.inflight and not w.blocked)
        # a worker lent to a driver holds its CPU: the driver sends it tasks directly
        busy += sum(1 for w in self.leases.lent.values()
                    if w.alive and not (w.inflight and not w.blocked))
        # CPUs placement-group bundles reserve and no task uses count as used: the
        # scheduler's cpu_limit leaves them out (``scheduling._bundle_ledger``)
        if s.cpu_limit is not None and s.cpu_limit < self.num_cpus:
            busy += self.num_cpus - s.cpu_limit
        return {
            "node_id": self.node_id,
            "alive": True,
            "cpus_total": self.num_cpus,
            "resources": s.resources_locked().offer(self.num_cpus),
            "cpus_used": busy,
            "workers": sum(len(g.workers) for g in groups),
            "queued": sum(len(g.queue) for g in groups),
            "drivers": len(self.drivers),
            "store_used": s.store.store.used,
            "store_capacity": s.store.capacity,
        }

    # -- output ------------------------------------------------------------------------
    def forward_output_locked(self, src: WorkerHandle, msg: m.Output) -> None:
        """What a worker printed, on its way to its driver: straight to the driver that
        owns the worker's group, or to the origin node of a mirror group; from a peer
        node (``src`` is a PeerHandle), to the driver of ``msg.group_id``."""
        s = self._s
        if isinstance(src, PeerHandle):
            g = s.group(msg.group_id)
        else:
            if self.output_log is not None:
                self.output_log(src.worker_id, msg.pid, msg.stream, msg.data)
            g = src.group
            if g is not None and self.remote_origin is not None:
                origin = self.remote_origin(g)
                if origin is not None and self.send_to_node is not None:
                    address, gid = origin  # a task spilled here: back to its node
                    self.send_to_node(address, [m.Output(gid, msg.pid, self.node_id,
                                                         msg.stream, msg.data)])
                    return
            msg = m.Output(0 if g is None else g.group_id, msg.pid, "", msg.stream, msg.data)
        owner = None if g is None else g.owner
        if owner is not None and owner.alive:
            s.send_locked(owner, [msg])

    # -- the driver went away ----------------------------------------------------------
    def handle_closed_locked(self, h: WorkerHandle) -> None:
        """A connection without a worker process closed."""
        if isinstance(h, DriverHandle):
            self._driver_closed_locked(h)
        else:  # a peer node or global scheduler
            h.mark_closed()
            for hook in self.peer_closed_hooks:
                hook(h)

    def _driver_closed_locked(self, d: DriverHandle) -> None:
        """The driver's connection closed: stop its groups, drop its objects."""
        s = self._s
        d.mark_closed()
        self.drivers.pop(d.session_id, None)
        for hook in self.driver_closed_hooks:
            hook(d)
        if not d.local:
            self._drop_pushed_locked(d)
        log.info("driver pid %d on %s detached (session %d)", d.pid, d.hostname, d.session_id)
        victims = []
        for gid in list(d.groups):
            g = s.group(gid)
            if g is None:
                continue
            if g.actor is not None and g.actor.cfg.detached and g.broken is None:
                g.owner = None  # it outlives its driver (until dpool.kill)
                continue
            g.closed = True
            g.broken = g.broken or "the driver that owned this pool disconnected"
            victims += g.workers  # (failing the group may already retire them)
            if g.actor is not None:  # (its end: its name freed, its placed actor killed)
                s.break_group_locked(g, g.broken)
            else:
                s.fail_group_locked(g, g.broken)
            for w in g.workers:
                if w.mark_stopping():
                    s.send_locked(w, [m.Shutdown()])  # the IO loop reaps them as they exit
        if victims:  # they may be busy with its tasks: kill what has not exited soon
            threading.Thread(target=_kill_later, args=(victims, 1.0), daemon=True,
                             name="dpool-reap-orphaned-workers").start()
        s.drop_handles_locked(d)

    def local_drivers_locked(self) -> Iterable[WorkerHandle]:
        """The live drivers on this host: they map the store's segments too."""
        return [d for d in self.drivers.values() if d.local and d.alive]

    # -- values to a driver --------------------------------------------------------------
    def value_message(self, w: WorkerHandle, oid: int, ok: bool,
                      payload: bytes) -> m.ObjectValue:
        """A value for a driver or node: a stored value as is for a driver on this host
        (it maps the segment, zero-copy); for one over TCP, a reference it pulls the
        segment's bytes with (``transfer._pull``), off this connection; its bytes
        inline for anyone else. Other values as they are."""
        if ok and not getattr(w, "local", False):
            if isinstance(w, DriverHandle):
                payload = _pull.remote_ref(payload, self.node_id)
            else:
                payload = _inline.inline_payload(payload)
        return m.ObjectValue(oid, ok, payload)


def _wrapped(handler: Optional[Handler]) -> Handler:
    """The scheduler's own handler that a service's handler wraps (it has one)."""
    if handler is None:
        raise RuntimeError("the scheduler has no handler to wrap")
    return handler


def _kill_later(workers: list, grace: float) -> None:
    deadline = time.monotonic() + grace
    for w in workers:
        proc = w.process
        try:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.kill()
        except (AssertionError, ValueError, OSError, AttributeError):
            pass  # already reaped by the IO loop


__all__ = ["DriverHandle", "DriverSessions", "PeerHandle"]
