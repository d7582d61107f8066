"""A driver connected over TCP whose node dies moves to a live node: ``Mover``.

    node A dies ──EOF──▶ reader (or a send, or a pull) ──▶ Mover.move
        candidates: DPOOL_ADDRESS's other addresses, then the live nodes the node table
        listed (``StatusRequest`` every ``STATUS_EVERY_S``)
        connect + attach to the first that answers (a new id prefix: new ids from there)
        replay, in one batch, from this driver's own records:
            functions, working directories, groups (``CreateGroup``),
            small ``put`` values (their bytes were inline: kept),
            every task whose future is not set, in submit order: its arguments encoded
            again (large ones pushed to the new node; an input future whose value this
            driver holds goes as that value), the group's close, pending gets
        a new reader thread; nothing of the user's sees the move

The records (TCP drivers only): each unfinished task's function, arguments and group
(``TaskRecord``), and each live ``put``'s payload when it was small; dropped when the
future is set or the ref released; written under the runtime's send lock. What cannot be
replayed fails typed: a large ``put`` value (held only by the dead node:
``ObjectLostError``, and every task and get that takes it), a task of a ``no_rebuild``
function (``ObjectLostError``), a task lost with its node ``max_attempts`` times, and
every future when no node answers within ``MOVE_TIMEOUT_S`` (``NodeLostError``).

A result the driver was told of but had not pulled from the dead node is made again by
the replayed task (``lost_result``), through its inputs; so a task may run twice when
its node dies between running it and the driver's pull. One move runs at a time
(``_lock``); ``moved`` wakes threads waiting for it.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any, Optional

from dpool import _log, errors
from dpool._task_future import ObjectRef, TaskFuture
from dpool.errors import Error, NodeLostError, ObjectLostError
from dpool.futures import Future
from dpool.protocol import ChannelClosed, encode_batch, parse_hostport
from dpool.protocol import messages as m
from dpool.protocol import workdir as _workdir
from dpool.runtime import _calls
from dpool.runtime._address import Target
from dpool.runtime._rebuild import rebuilds

log = _log.getLogger("dpool.runtime")

MOVE_TIMEOUT_S = 20.0  # to find a live node and attach to it
STATUS_EVERY_S = 5.0  # how often the driver asks its node for the node table
_ATTACH_S = 3.0  # per candidate


class TaskRecord:
    """What a TCP driver keeps of an unfinished task to run it on another node."""

    __slots__ = ("fut", "group", "fn", "fn_id", "args", "kwargs", "req", "moves")

    def __init__(self, fut: Future, group: Any, fn: Any, fn_id: int, args: tuple,
                 kwargs: dict, req: Any) -> None:
        self.fut = fut
        self.group = group
        self.fn = fn
        self.fn_id = fn_id
        self.args = args
        self.kwargs = kwargs
        self.req = req
        self.moves = 0


class Mover:
    """The records of one ``ClusterRuntime`` attached over TCP, and its moves."""

    def __init__(self, rt: Any, connect: Any) -> None:
        self._rt = rt
        self._connect = connect  # (Target, timeout) -> (Channel, Attached); _cluster's
        self.records: dict[int, TaskRecord] = {}  # task id -> record, in submit order
        self.puts: dict[int, Optional[bytes]] = {}  # put id -> payload (None: pushed)
        self.lost: dict[int, str] = {}  # put id -> the address of the node it died with
        self.workdirs: dict[str, str] = {}  # digest -> root, shipped to the node
        self.known: list[str] = []  # the live nodes' addresses, from the node table
        self.generation = 0  # moves so far
        self.moved = threading.Condition()
        self._lock = threading.Lock()  # one move at a time
        self._status_at = 0.0

    # -- learning where to go ---------------------------------------------------------
    def tick(self) -> None:
        """Ask for the node table now and then (the flusher thread)."""
        now = time.monotonic()
        if now >= self._status_at:
            self._status_at = now + STATUS_EVERY_S
            self._rt.queue(m.StatusRequest())

    def learn(self, status: str) -> None:
        """The node table, from a ``StatusReply``."""
        try:
            nodes = json.loads(status).get("nodes", [])
            self.known = [n["node_id"] for n in nodes if n.get("alive") and n.get("node_id")]
        except (ValueError, TypeError, KeyError, AttributeError):
            log.debug("dpool: an unreadable status reply: %.200r", status)

    def _candidates(self, dead: str) -> list[str]:
        seen: list[str] = []
        for a in (*self._rt.target.alternates, *self.known):
            if a != dead and a not in seen:
                seen.append(a)
        return seen

    # -- the losses a driver can be told about at once ----------------------------------
    def lost_error(self, oid: int) -> ObjectLostError:
        node = self.lost[oid]
        return ObjectLostError(
            f"object {oid:#x} is lost: it was a dpool.put value held only by node {node}, "
            "which died (a put value cannot be rebuilt; put it again)",
            object_id=oid, node=node)

    def lost_input(self, deps: tuple) -> Optional[ObjectLostError]:
        for d in deps:
            if d in self.lost:
                return self.lost_error(d)
        return None

    def forget(self, object_ids: tuple) -> None:
        """Released refs: nothing to put again (send lock held)."""
        for oid in object_ids:
            self.puts.pop(oid, None)
            self.lost.pop(oid, None)

    # -- moving ------------------------------------------------------------------------
    def move(self, reason: str, chan: Any) -> bool:
        """The connection ``chan`` failed: attach to a live node and replay, or fail
        every future (``_fail_all``). True when the driver is attached again."""
        rt = self._rt
        with self._lock:
            if rt._chan is not chan:  # another thread saw it first
                return rt._lost is None
            if rt._closed or rt._lost is not None:
                return False
            dead = rt.target.address
            log.warning("dpool: %s; moving to another node", reason)
            deadline = time.monotonic() + MOVE_TIMEOUT_S
            tried: list[str] = []
            # none known (a one-node cluster): fail at once; else keep trying a while
            # (the node table may still list nodes that died with this one)
            while self._candidates(dead) and time.monotonic() < deadline \
                    and not rt._closed:
                for address in self._candidates(dead):
                    if address not in tried:
                        tried.append(address)
                    if self._attach(address, dead):
                        log.warning("dpool: node %s was lost; this driver moved to node %s "
                                    "and resubmitted its unfinished tasks", dead, rt.node_id)
                        return True
                time.sleep(0.3)
            where = ", ".join(tried) or "none known"
            rt._fail_all(f"{reason}; no other node could be reached within "
                         f"{MOVE_TIMEOUT_S:g} s (tried: {where})")
            with self.moved:
                self.moved.notify_all()
            return False

    def _attach(self, address: str, dead: str) -> bool:
        rt = self._rt
        try:
            host, port = parse_hostport(address)
            target = Target(host, port, rt.target.token, None, rt.target.alternates)
            chan, hello = self._connect(target, _ATTACH_S)
        except Error as exc:
            log.info("dpool: cannot move to %s: %s", address, exc)
            return False
        with rt._send_lock:
            # the replay is encoded for the new node (its ids, its address for pushes);
            # the move counts (``generation``) only once it was sent
            old = (rt._chan, rt.target, rt.node_id, rt.cluster_cpus, rt._ids)
            rt._chan = chan
            rt.target = target
            rt.node_id = hello.node_id
            rt.cluster_cpus = hello.cluster_cpus
            rt._ids = itertools.count((hello.id_prefix << 40) + 1)
            try:
                msgs = self._replay(dead)
                chan.send(encode_batch(msgs))
            except (ChannelClosed, OSError, NodeLostError) as exc:
                log.info("dpool: node %s failed while this driver moved to it: %s",
                         address, exc)
                chan.close()
                rt._chan, rt.target, rt.node_id, rt.cluster_cpus, rt._ids = old
                return False
            self.generation += 1
        rt._start_reader()
        with self.moved:
            self.moved.notify_all()
        return True

    def wait_moved(self, generation: int, timeout: float = MOVE_TIMEOUT_S + 5) -> bool:
        """Wait until a move after ``generation`` happened (True) or failed (False)."""
        rt = self._rt
        deadline = time.monotonic() + timeout
        with self.moved:
            while self.generation == generation and rt._lost is None and not rt._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.moved.wait(min(left, 0.2))
        return self.generation != generation and rt._lost is None

    def _replay(self, dead: str) -> list:
        """What the new node must know, from this driver's records (send lock held)."""
        rt = self._rt
        msgs: list = [m.RegisterFunction(fid, p) for fid, p in rt._fn_payloads.items()]
        for digest, root in self.workdirs.items():
            try:
                archive = _workdir.package(root)[1]
            except Exception as exc:  # noqa: BLE001 - its groups' tasks will say so
                log.warning("dpool: cannot pack %s again for the new node: %s", root, exc)
                continue
            msgs.append(m.WorkingDir(digest, root, archive))
        for g in rt._groups.values():
            if g.actor and g.broken is None:
                if g.create is None:  # another driver's actor: the new node routes to it
                    msgs.append(m.ActorRoute(g.group_id, g.host, g.actor))
                else:  # this driver's: its state (or its proxy) was the dead node's
                    g.broken = f"its node {dead} was lost"
        groups = [g for g in rt._groups.values()
                  if g.create is not None and not g.exited.is_set() and g.broken is None]
        msgs += [g.create for g in groups]
        for oid, payload in list(self.puts.items()):
            if payload is None:
                del self.puts[oid]
                self.lost[oid] = dead
            else:
                msgs.append(m.PutObject(oid, payload))
        futures = rt._futures
        for oid, rec in list(self.records.items()):
            fut = rec.fut
            if fut.done():  # (a pull may pop it meanwhile: pop, never del)
                self.records.pop(oid, None)
                continue
            try:
                err = self._why_not(oid, rec, dead)
                if err is None:
                    msgs.append(self._encode(oid, rec))
            except BaseException as exc:  # noqa: BLE001 - e.g. an argument that no longer pickles
                err = exc
            if err is not None:
                self.records.pop(oid, None)
                futures.pop(oid, None)
                _fail(fut, err)
                continue
            rec.moves += 1
            futures[oid] = fut
        for oid, fut in list(futures.items()):
            if oid in self.records:
                continue
            if oid in self.lost:  # a get of a lost put
                del futures[oid]
                _fail(fut, self.lost_error(oid))
            else:
                msgs.append(m.GetObjects((oid,)))
        msgs += [m.GroupOp(g.group_id, g.closing, "") for g in groups if g.closing]
        for g in rt._groups.values():  # broken before the move: nothing to run them on
            if g.broken is not None and not g.exited.is_set():
                g.exited.set()
                g.cancelled.set()
        return msgs

    def _why_not(self, oid: int, rec: TaskRecord, dead: str) -> Optional[BaseException]:
        g = rec.group
        if g.actor:
            return errors.actor_died(g.actor, g.broken or f"its node {dead} was lost")
        if g.broken is not None or g.exited.is_set():
            return NodeLostError(f"node {dead} was lost with task {oid:#x}, whose pool "
                                 f"was already broken or shut down ({g.broken})")
        if not rebuilds(rec.fn):
            name = getattr(rec.fn, "__qualname__", repr(rec.fn))
            return ObjectLostError(
                f"the result of task {oid:#x} ({name}) is lost: the task was on node "
                f"{dead}, which died, and {name} is marked no_rebuild, so it is not run "
                "again (it may have run)", object_id=oid, node=dead)
        if rec.moves + 1 >= g.max_attempts:
            return NodeLostError(
                f"task {oid:#x} was lost with its node {rec.moves + 1} times (the last: "
                f"{dead}); its pool's max_attempts={g.max_attempts} are used up")
        for a in (*rec.args, *rec.kwargs.values()):
            if isinstance(a, ObjectRef) and a.id in self.lost:
                return self.lost_error(a.id)
            if isinstance(a, TaskFuture) and a.done() and not a.cancelled():
                exc = a.exception()
                if exc is not None:  # as the node would have failed it
                    return exc
        return None

    def _encode(self, oid: int, rec: TaskRecord) -> m.SubmitTask:
        """The task again, for the new node: an input future whose value this driver
        holds goes as that value (its only stored copy may have been the dead node's)."""
        args = tuple(_held(a) for a in rec.args)
        kwargs = {k: _held(v) for k, v in rec.kwargs.items()}
        payload = self._rt._tcp_values.dumps_call(args, kwargs)
        return m.SubmitTask(oid, rec.fn_id, payload, _calls.dependency_ids(args, kwargs),
                            rec.group.group_id, None if rec.req is None else tuple(rec.req))

    # -- a result whose pull failed --------------------------------------------------
    def lost_result(self, fut: Future, oid: int, generation: int) -> bool:
        """A pull of ``oid``'s result from the node of ``generation`` failed. If that
        node was lost (the driver moves, now or within a few seconds), the move ran the
        task again: its result comes from the new node (True). Else False: the error
        stands."""
        rt = self._rt
        deadline = time.monotonic() + 5.0
        while self.generation == generation and rt._lost is None and not rt._closed \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.generation == generation or rt._lost is not None:
            return False
        # the move ran every unfinished task again (a record is kept until its result is
        # delivered), or failed its future for good
        return oid in self.records or fut.done()


def _held(a: Any) -> Any:
    if isinstance(a, TaskFuture) and a.done() and not a.cancelled() and a.exception() is None:
        return a.result()
    return a


def _fail(fut: Future, exc: BaseException) -> None:
    try:
        fut.set_exception(exc)
    except Exception:  # noqa: BLE001 - cancelled meanwhile
        pass
