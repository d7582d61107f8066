"""The driver's runtime in cluster mode: attached to a node daemon (``DPOOL_ADDRESS``).

    user threads ──submit/put/get──▶ ClusterRuntime ──SubmitTask/PutObject/...──▶ node
    Futures ◀── set_result ── reader thread ◀────── ObjectValue/GroupExited ────── node

It is a ``Driver`` (``_client``), as the embedded runtime is, so executors and Pools work
unchanged; no worker runs in this process. What it shares with a worker's client (ids,
gets, releases) is in ``_channel_client``. It connects over the node's unix socket when
the node is on this host (``dpool start``'s record says so), else over TCP; both start
with the token handshake. On the node's host, large values go through the node's store,
zero-copy both ways; over TCP, through ``_tcp_objects``. A TCP driver whose node dies
moves to a live node (``_move``); an attached driver fails its unfinished futures with
``NodeLostError``.

Messages go out under ``_send_lock``, in the order they were queued or sent, from any
thread. Releases and the closing of collected executors are queued without a lock (they
may come from ``__del__`` during garbage collection) and sent by the flusher thread, or
with the next message.

Cancelling: ``Future.cancel()`` succeeds while the driver has no result, and tells the
node to drop the task if it has not started (compat/DIFFERENCES.md). ``shutdown(
cancel_futures=True)`` asks the node which queued tasks it dropped and cancels exactly
those, as the stdlib does.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import weakref
from collections import deque
from typing import Any, Callable, Optional

from dpool import _log, errors
from dpool._task_future import ObjectRef, TaskFuture
from dpool.errors import NodeLostError, SerializationError
from dpool.futures import Future
from dpool.objects import mapping as _mapping
from dpool.objects import payload as _payload
from dpool.objects import values as _values
from dpool.protocol import Channel, ChannelClosed, decode_batch, encode_batch
from dpool.protocol import messages as m
from dpool.protocol import workdir as _workdir
from dpool.runtime import _calls
from dpool.runtime._address import Target
from dpool.runtime._channel_client import ChannelClient
from dpool.runtime._connect import CONNECT_TIMEOUT, connect
from dpool.runtime._lease import DriverLeases
from dpool.runtime._move import Mover, TaskRecord
from dpool.runtime._output import OutputPrinter
from dpool.runtime._remote_group import RemoteGroup
from dpool.runtime._tcp_objects import TcpValues
from dpool.scheduling import resources as _resources
from dpool.transfer import pull as _pull

log = _log.getLogger("dpool.runtime")

_FLUSH_S = 0.02


class _ClusterFuture(Future):
    """A future whose task runs on the node: ``cancel()`` also tells the node."""

    _client: Optional[ClusterRuntime]

    def cancel(self) -> bool:
        if not super().cancel():
            return False
        client = self._client
        if client is not None:
            client.cancel_task(self._oid)
        return True


class ClusterRuntime(ChannelClient):
    """The ``Driver`` of a process attached to a node (see ``_client``)."""

    stops_running_tasks = False  # (``cancel_running``: a clear error)

    def __init__(self, target: Target) -> None:
        self.pid = os.getpid()
        self.target = target
        self._chan, hello = connect(target)
        self.node_id = hello.node_id
        self.cluster_cpus = hello.cluster_cpus
        # A driver on its node's host writes large values straight into the node's store
        # (segments named for it, adopted by it) and maps results in place: zero-copy
        # both ways, as on the embedded runtime. Elsewhere values travel inline.
        self.store_owner = hello.store_owner
        super().__init__((hello.id_prefix << 40) + 1, self.store_owner or self.pid)
        self._tcp_values = TcpValues(self)  # (used only when there is no shared store)
        self._groups: dict[int, RemoteGroup] = {}
        self._pg_states: dict[int, Callable[[str, tuple, str], None]] = {}  # placement groups
        self.output = OutputPrinter()  # what its tasks print (``_output``)
        self._send_lock = threading.Lock()
        self._shipped: set[str] = set()  # digests of working directories sent
        self._pending: deque = deque()  # messages queued lock-free (finalizers)
        self._executors: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._lost: Optional[str] = None
        self._closed = False
        # On the node's host, a worker lent to each executor takes tasks without a hop
        # through the node (``_lease``); values are in the shared store either way.
        self._fn_payloads: dict[int, bytes] = {}
        self.leases: Optional[DriverLeases] = DriverLeases(self) \
            if self.store_owner and target.unix_path else None
        self._ending: deque = deque()  # groups whose lease ends (queued by finalizers)
        self._wake = threading.Event()
        # over TCP: the records to resubmit from when the node dies (``_move``)
        self.mover: Optional[Mover] = None if self.store_owner else Mover(self, connect)
        self._start_reader()
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                         name="dpool-cluster-flusher")
        self._flusher.start()
        atexit.register(self.close)
        log.debug("attached to node %s (%d CPUs in the cluster)", self.node_id,
                  self.cluster_cpus)

    def _start_reader(self) -> None:
        self._reader = threading.Thread(target=self._read_loop, args=(self._chan,),
                                        daemon=True, name="dpool-cluster-reader")
        self._reader.start()

    # -- sending ---------------------------------------------------------------------------
    def _send(self, msgs: list, keep: Optional[tuple] = None) -> None:
        """``keep``: (records, key, record) to note under the send lock (``_move``: a
        move replays what was noted, so a message lost with the node is not lost)."""
        chan = None
        try:
            # taken and sent under one lock: messages go out in the order they were
            # queued or sent, from any thread (a leased task's note before a task that
            # takes its future; its result before the release of its object)
            with self._send_lock:
                if self._releases or self._pending:
                    msgs = [*self._take_queued(), *msgs]
                if self._lost is not None:
                    raise NodeLostError(self._lost)
                if keep is not None:
                    keep[0][keep[1]] = keep[2]
                chan = self._chan
                chan.send(encode_batch(msgs))
        except ChannelClosed as exc:
            if self._closed:
                # this driver is detaching and shut the connection itself (``close``):
                # the flusher or a late release met it (seen: "Broken pipe" printed after
                # a program's traceback). The node frees what the driver held anyway.
                raise NodeLostError(f"the driver is closed ({exc})") from exc
            if self._connection_lost(f"lost the connection to node {self.node_id}: {exc}",
                                     chan):
                return  # moved to a live node, which was told all of it again
            raise NodeLostError(self._lost or str(exc)) from exc

    def _take_queued(self) -> list:
        out = []
        while self._pending:
            out.append(self._pending.popleft())
        rel = self.take_releases()
        if rel and self.mover is not None and self.mover.puts:
            self.mover.forget(rel[0].object_ids)
        return out + rel

    def _flush_loop(self) -> None:
        while not self._closed and self._lost is None:
            self._wake.wait(_FLUSH_S)
            self._wake.clear()
            while self._ending:
                self.leases.end(self._ending.popleft(), closed=True)  # type: ignore
            if self.mover is not None:
                self.mover.tick()
            if self._releases or self._pending:
                try:
                    self._send([])
                except (NodeLostError, OSError):
                    return

    def _register_function(self, fn_id: int, name: str, payload: bytes) -> None:
        if self.leases is not None or self.mover is not None:
            self._fn_payloads[fn_id] = payload  # for leased workers, or a move
        super()._register_function(fn_id, name, payload)

    def function_payload(self, fn_id: int) -> bytes:
        return self._fn_payloads[fn_id]

    def actor_route(self, group_id: int, node: str, name: str) -> None:
        """Before the first call of another driver's actor (``dpool.get_actor``): tell
        this driver's node where its calls go (sent with that call)."""
        self.note(m.ActorRoute(group_id, node, name))

    def name_actor(self, name: str, record: tuple) -> None:
        self.ask(lambda rid: m.ActorName(rid, name, record), f"naming actor {name!r}")

    def note(self, msg: Any) -> None:
        """Send ``msg`` with the next message or flush (no wake-up: it can wait)."""
        self._pending.append(msg)

    # -- groups ----------------------------------------------------------------------------
    def add_group(self, cfg: Any, executor: Any) -> RemoteGroup:
        if getattr(cfg, "inherited", None) is not None:
            kinds = ", ".join(sorted({type(a).__name__ for a in cfg.inherited}))
            raise SerializationError(
                f"initargs hold objects that only process creation on this host can hand "
                f"over ({kinds}: multiprocessing shares locks, queues and shared values by "
                f"inheritance), but on a cluster the node daemons start the workers. Pass "
                f"a dpool.Manager() proxy instead (m = dpool.Manager(); m.Lock(), "
                f"m.Queue(), m.Value(...): they work on every node), or run without "
                f"DPOOL_ADDRESS")
        workdir: tuple = ()
        msgs: list = []
        root = _workdir.chosen(getattr(cfg, "working_dir", None))  # raises a clear Error
        if root is not None:
            digest, archive = _workdir.package(root)
            workdir = (digest, root)
            if digest not in self._shipped:  # once per content
                msgs.append(m.WorkingDir(digest, root, archive))
                self._shipped.add(digest)
                if self.mover is not None:
                    self.mover.workdirs[digest] = root
        gid = self.new_id()
        g = RemoteGroup(gid, cfg.max_workers, cfg.max_tasks, cfg.max_attempts)
        actor: tuple = ()
        if cfg.actor is not None:  # its calls go through the node, in order (no lease)
            a = cfg.actor
            if a.numbered:
                a.name, a.numbered = f"{a.name}#{gid}", False
            actor = (a.name, a.max_restarts, a.checkpoint_every, a.max_concurrency,
                     a.detached, _resources.to_wire(a.req))
            g.actor = a.name
            g.lease_closed = True
        self._groups[gid] = g
        self._executors.add(executor)
        method = cfg.mp_context.get_start_method() if cfg.mp_context is not None else ""
        limits = tuple(cfg.limits or ())
        if limits:  # its tasks go through the node, which watches them (no lent workers)
            g.lease_closed = True
        g.create = m.CreateGroup(gid, cfg.max_workers, method, cfg.initializer,
                                 cfg.max_tasks, cfg.max_attempts, workdir, actor, limits)
        msgs.append(g.create)
        self._send(msgs)
        if self.leases is not None and not g.lease_closed:
            self.leases.request(g)
        return g

    def group_of(self, group_id: int) -> Any:
        return self._groups.get(group_id)

    def kill_actor(self, group_id: int, node: str, reason: str) -> None:
        g = self._groups.get(group_id)
        if g is not None and g.create is not None:  # this driver's: until its worker exits
            self.terminate_group(g, reason)
        else:  # another driver's: its node ends it
            self._send([m.KillActor(group_id, node, reason)])

    def foreign_actor(self, group_id: int, label: str, node: str) -> RemoteGroup:
        """What this driver submits calls of another driver's actor to (``get_actor``);
        its node learns where the actor lives with the first of them."""
        g = self._groups.get(group_id)
        if g is None:
            g = self._groups[group_id] = RemoteGroup(group_id, 1, None, 1)
            g.actor, g.host = label, node
            g.lease_closed = True
            self.actor_route(group_id, node, label)
        return g

    def start_workers(self, group: RemoteGroup, n: int) -> None:
        pass  # the nodes start their workers when work needs them; none are on this host

    def fork_point(self) -> None:
        pass  # no worker is forked on this host

    def close_group_soon(self, group: RemoteGroup) -> None:
        """(From a finalizer: no lock may be taken here.)"""
        group.lease_closed = True
        if group.lease is not None:
            self._ending.append(group)
        group.closing = group.closing or "close"
        self.queue(m.GroupOp(group.group_id, "close", ""))

    def close_group(self, group: RemoteGroup) -> None:
        self._end_lease(group)
        group.closing = group.closing or "close"
        self.send([m.GroupOp(group.group_id, "close", "")])

    def _end_lease(self, group: RemoteGroup) -> None:
        if self.leases is not None:
            self.leases.end(group, closed=True)

    def cancel_running(self, task_id: int, recursive: bool) -> bool:
        raise errors.Error("cancel(force=True) and shutdown(cancel_running=True) stop "
                           "running tasks of the embedded runtime only; on a cluster, "
                           "give the task a timeout (options(timeout=...)) instead")

    def cancel_group_running(self, group: RemoteGroup) -> list:
        return self.cancel_running(0, False)  # type: ignore[return-value]

    def cancel_queued(self, group: RemoteGroup) -> None:
        group.cancelled.clear()
        self.send([m.GroupOp(group.group_id, "cancel_queued", "")])
        if not self.is_io_thread():
            group.cancelled.wait(CONNECT_TIMEOUT)

    def wait_group_exited(self, group: RemoteGroup, timeout: float = 30.0) -> None:
        """Until the group's tasks are done and its workers exited (the node answers
        then, however long its tasks run, as ``shutdown(wait=True)`` waits in the
        stdlib), or the connection to the node is lost."""
        if group.exited.is_set():
            return
        group.closing = "close_notify"
        try:
            self.send([m.GroupOp(group.group_id, "close_notify", "")])
        except NodeLostError:
            return
        while not group.exited.wait(1.0) and self._lost is None:
            pass

    def terminate_group(self, group: RemoteGroup, reason: str) -> None:
        group.broken = group.broken or reason
        self._end_lease(group)
        try:
            self.send([m.GroupOp(group.group_id, "terminate", reason)])
        except NodeLostError:
            return
        if not self.is_io_thread():
            self.wait_group_exited(group)

    def is_io_thread(self) -> bool:
        if threading.current_thread() is self._reader:
            return True
        return self.leases is not None and self.leases.is_io_thread()

    # -- the runtime's settings: the node's ------------------------------------------------
    def estimate(self, fn_id: int, default: Any = ...) -> Any:
        return 0.001 if default is ... else default

    def set_store_capacity(self, capacity: int) -> None:
        log.debug("object_store_memory is the node's (`dpool start "
                  "--object-store-memory`); ignored on a cluster driver")

    def set_resource_offer(self, spec: Optional[dict]) -> None:
        log.debug("runtime_resources is the node's (`dpool start --num-gpus/--resources`); "
                  "ignored on a cluster driver")

    # -- placement groups: the node relays them to a global scheduler ----------------------
    # (``node._placement_groups``)
    def reserve_placement_group(self, pg_id: int, bundles: list, strategy: str,
                                on_state: Callable[[str, tuple, str], None]) -> None:
        self._pg_states[pg_id] = on_state
        self._send([m.PlacementGroupReserve(
            pg_id, "", tuple(_resources.to_wire(b) for b in bundles), strategy)])

    def remove_placement_group(self, pg_id: int) -> None:
        if self._pg_states.pop(pg_id, None) is not None and self._lost is None:
            try:
                self._send([m.PlacementGroupRemove(pg_id, "")])
            except (NodeLostError, OSError):
                pass  # its node is gone, and the group with it

    # -- the task API ----------------------------------------------------------------------
    def submit(self, group: RemoteGroup, fn: Callable[..., Any], args: tuple,
               kwargs: dict, req: Optional[_resources.Request], future_type: Any) -> Future:
        oid = self.new_id()
        fut = _ClusterFuture(oid, self)
        if group.actor and group.broken is not None:  # (lost with its node: ``_move``)
            fut._client = None
            return _calls.failed_future(fut, errors.actor_died(group.actor, group.broken))
        try:
            if self.store_owner:  # on the node's host: large values go to its store
                fn_id, payload, deps = _calls.submit_prepared(self, fn, args, kwargs, fut)
            else:
                fn_id = self.functions.fn_id(fn)
                deps = _calls.dependency_ids(args, kwargs)
                if deps and self.mover is not None and self.mover.lost:
                    lost = self.mover.lost_input(deps)
                    if lost is not None:
                        raise lost
                payload = _calls.pinned_payload(fut, args, kwargs, self._tcp_call, args,
                                                kwargs)
        except Exception as exc:  # noqa: BLE001 - reported on the future, as the stdlib does
            fut._client = None
            return _calls.failed_future(fut, exc)
        leases = self.leases
        if leases is not None and not deps and req is None and not group.lease_closed:
            # (a task with a resource request goes through the node, which holds them)
            if leases.try_submit(group, oid, fn_id, payload, fut):
                return fut
            if group.lease is None and not self._futures:  # waits, one task at a time
                leases.request(group)
        self._futures[oid] = fut
        msg = m.SubmitTask(oid, fn_id, payload, deps, group.group_id,
                           None if req is None else tuple(req))
        if self.mover is None:
            self._send([msg])
        else:
            self._send([msg], (self.mover.records, oid,
                               TaskRecord(fut, group, fn, fn_id, args, kwargs, req)))
        return fut

    def _tcp_call(self, args: tuple, kwargs: dict) -> Optional[bytes]:
        """A call's arguments over TCP; a push that failed with the node is done again
        on the node the driver moves to."""
        while True:
            gen = self.mover.generation if self.mover is not None else 0
            try:
                return self._tcp_values.dumps_call(args, kwargs)
            except NodeLostError:
                if self.mover is None or not self.mover.wait_moved(gen):
                    raise
            except Exception as exc:
                errors.add_note(exc, "dpool: this happened while pickling the task's arguments")
                raise

    def resubmit(self, group: RemoteGroup, oid: int, fn_id: int, payload: Optional[bytes],
                 fut: Future) -> None:
        """A leased worker died with this task: the node runs it."""
        self._futures[oid] = fut
        try:
            self._send([m.LeasedLost(oid), m.SubmitTask(oid, fn_id, payload, None,
                                                        group.group_id)])
        except NodeLostError as exc:  # (the connection may have failed the others first)
            self._futures.pop(oid, None)
            if not fut.done():
                try:
                    fut.set_exception(exc)
                except Exception:  # noqa: BLE001 - cancelled meanwhile
                    pass

    def lead(self, fut: TaskFuture, timeout: Any) -> Any:
        """Read a leased worker's result on the waiting thread (``_lease``)."""
        if self.leases is None:
            return timeout
        return self.leases.lead(fut, timeout)

    def put(self, value: Any) -> ObjectRef:
        oid = self.new_id()
        if self.store_owner:
            payload = _payload.dumps_value(value, oid, self.store_owner)
            self._send([m.PutObject(oid, payload)])
            return ObjectRef(oid, self)
        while True:
            gen = self.mover.generation if self.mover is not None else 0
            try:
                payload = self._tcp_values.dumps_value(value, oid)
                break
            except NodeLostError:  # the upload failed with the node: again on the next
                if self.mover is None or not self.mover.wait_moved(gen):
                    raise
                oid = self.new_id()  # (a push names an id of the new node's prefix)
        if self.mover is None:
            self._send([m.PutObject(oid, payload)])
        else:  # a small value is kept to put again after a move; a large one cannot be
            kept = payload if _values.stored(payload) is None else None
            self._send([m.PutObject(oid, payload)], (self.mover.puts, oid, kept))
        return ObjectRef(oid, self)

    def future_for(self, ref: ObjectRef) -> TaskFuture:
        if self.mover is not None and ref.id in self.mover.lost:
            fut = Future()
            fut.set_exception(self.mover.lost_error(ref.id))
            return fut
        return super().future_for(ref)

    def cancel_task(self, task_id: int) -> None:
        self._futures.pop(task_id, None)
        if self.mover is not None:
            self.mover.records.pop(task_id, None)
        self._pending.append(m.CancelTask((task_id,)))
        self._wake.set()

    def queue(self, msg: Any) -> None:
        """Send ``msg`` soon, without taking any lock (finalizers)."""
        self._pending.append(msg)
        self._wake.set()

    def send(self, msgs: list) -> None:
        self._send(msgs)

    # -- receiving -------------------------------------------------------------------------
    def _read_loop(self, chan: Channel) -> None:
        try:
            while True:
                for frame in chan.recv_frames():
                    for msg in decode_batch(frame):
                        self._handle(msg)
        except (ChannelClosed, OSError) as exc:
            if not self._closed:
                self._connection_lost(f"lost the connection to node {self.node_id}: {exc}",
                                      chan)
        except Exception:  # noqa: BLE001 - a protocol error ends this connection
            log.exception("dpool: bad message from node %s", self.node_id)
            self._connection_lost(f"node {self.node_id} sent a message this driver does "
                                  "not understand (run the same dpool version everywhere)")

    def _handle(self, msg: Any) -> None:
        code = msg.CODE
        if code == m.ObjectValue.CODE:
            fut = self._futures.pop(msg.object_id, None)
            if fut is not None:
                payload = msg.payload
                if msg.ok and payload and payload[0] == _pull.TAG_REMOTE:
                    ref = _pull.parse_remote(payload)  # large: pulled off this thread
                    self._tcp_values.fetch(fut, msg.object_id, ref)  # type: ignore[arg-type]
                else:
                    if self.mover is not None:
                        self.mover.records.pop(msg.object_id, None)
                    self.complete(fut, msg.ok, payload)
        elif code == m.Output.CODE:
            self.print_output(msg)
        elif code == m.Forget.CODE:  # freed segments of the node's: drop cached mappings
            _mapping.forget(msg.names)
        elif code == m.GroupExited.CODE:
            g = self._groups.get(msg.group_id)
            if g is not None:
                g.exited.set()
        elif code == m.GroupBroken.CODE:
            g = self._groups.get(msg.group_id)
            if g is not None:
                g.broken = msg.reason
        elif code == m.CancelTask.CODE:  # the queued tasks the node dropped for us
            for tid in msg.task_ids:
                fut = self._futures.pop(tid, None)
                if fut is not None:
                    fut.cancel()
        elif code == m.LeaseRecall.CODE:  # tasks wait at the node for the lent CPU
            g = self._groups.get(msg.group_id)
            if g is not None and self.leases is not None:
                self.leases.end(g)
        elif code == m.LeaseLost.CODE:  # the lent worker exited
            g = self._groups.get(msg.group_id)
            if g is not None and self.leases is not None:
                self.leases.lost(g, msg.worker_id)
        elif code == m.GroupOp.CODE and msg.op == "cancelled":  # after that list
            g = self._groups.get(msg.group_id)
            if g is not None:
                g.cancelled.set()
        elif code == m.StatusReply.CODE and self.mover is not None:  # the node table
            self.mover.learn(msg.status)
        elif code == m.PlacementGroupState.CODE:  # what became of a placement group
            cb = self._pg_states.get(msg.pg_id)
            if cb is not None:
                cb(msg.state, tuple(msg.nodes), msg.reason)
        else:
            raise ValueError(f"unexpected message {type(msg).__name__} from the node")

    def print_output(self, msg: m.Output) -> None:
        """A worker's output (from the node's connection or a leased worker's)."""
        self.output.print(msg)

    def _connection_lost(self, reason: str, chan: Optional[Channel] = None) -> bool:
        """The connection ``chan`` broke: move to a live node (True), or fail every
        unfinished future with ``NodeLostError``."""
        if self._pg_states and not self._closed:  # the node relayed them: lost with it
            states, self._pg_states = self._pg_states, {}
            for cb in states.values():
                cb("lost", (), reason)
        if self.mover is not None and chan is not None and not self._closed:
            return self.mover.move(reason, chan)
        self._fail_all(reason)
        return False

    def _fail_all(self, reason: str) -> None:
        if self._lost is not None:
            return
        self._lost = reason
        log.error("dpool: %s", reason)
        for g in self._groups.values():
            g.broken = g.broken or reason
            g.exited.set()
            g.cancelled.set()
        futures, self._futures = self._futures, {}
        for fut in futures.values():
            try:
                fut.set_exception(NodeLostError(reason))
            except Exception:  # noqa: BLE001 - cancelled or already done
                pass

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """End of the driver: finish executors' work (as the stdlib does at exit), detach."""
        if self._closed or os.getpid() != self.pid:
            return
        for ex in list(self._executors):
            try:
                ex.shutdown(wait=True)
            except Exception:  # noqa: BLE001 - keep closing the others
                log.exception("dpool: error shutting down %r at exit", ex)
        if self._lost is None:
            try:
                self._send([])  # the last releases
            except (NodeLostError, OSError):
                pass
        self._closed = True
        if self.leases is not None:
            self.leases.stop()
        self.output.flush()  # unfinished lines (the reader may still be printing)
        self._wake.set()
        try:
            self._chan.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._chan.close()
