"""Calls of actors that another node hosts: this node's *proxies* of them.

An actor lives on one node, in a group of one worker (``scheduling._actors``). A handle
that reaches a task or driver on another node carries the hosting node's address; before
its first call from there, the caller's client says where the actor is:

    worker/driver on B ──ActorRoute(group, A, name)──▶ node B: a proxy group with that id
                       ──SubmitTask(group)──────────▶ node B: queued in the proxy, in order
    node B ──RemoteTask(group_cfg=())──▶ node A: admitted to the actor's group, in the
                                         order sent (``_remote``), run there
    node B ◀──Accepted, TaskResult──── node A: finished at B as a spilled task is
                                       (``_spillback``), the value back to its caller

A proxy has no worker: its calls wait at B for their inputs (a call waiting holds back the
calls after it), then go to A one message each, over the link between the two nodes, so
A admits them in the order the caller made them. A call whose node goes away fails with
``ActorDiedError`` (it may have run: it is not sent again). The hosting node ignores the
route.

Named actors are in the cluster's actor directory (the control store's
``dpool:actor:<name>``): the node that hosts one claims its name for it when its driver
asks (``ActorName``, answered once the claim is made or refused) and frees it when the
actor ends; ``ActorFind`` (``dpool.get_actor``, from a driver or a task) reads it. A name
whose actor's node is dead, or gone from its node, is free. ``KillActor`` ends an actor
from any driver or task: the hosting node terminates it, another passes it on there.
Handlers run under the scheduler's lock; the control store is read and written on
threads of their own, which take the lock to answer.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Optional

from dpool.control import ClusterControlStore
from dpool.objects import payload as _payload
from dpool.protocol import messages as m
from dpool.scheduling import ActorConfig, ActorState, SchedulerAPI, WorkerGroup

log = logging.getLogger("dpool.scheduling")


class ActorCalls:
    """A node's routes to the actors of other nodes, and its part of the actor
    directory."""

    def __init__(self, scheduler: SchedulerAPI, node_id: str,
                 send: Callable[[str, list], None]) -> None:
        self._s = scheduler
        self.node_id = node_id
        self._send = send  # a peer link's send, by node address
        self.control: Optional[ClusterControlStore] = None  # the directory (a cluster's)
        self.alive_nodes: Callable[[], set] = lambda: {node_id}
        self.schedulers: Callable[[], list] = list  # the global schedulers linked now
        self.placed_hook: Optional[Callable[[int, str], None]] = None  # (``_remote``)
        self.grace_s = 10.0  # how long a placement may be refused before it fails
        self._names: dict[int, tuple[str, bytes]] = {}  # group id -> its name and record
        self._placing: dict[int, list] = {}  # group id -> [its RemoteTask, since, tries]
        self._placed: dict[int, str] = {}  # group id -> the node hosting its driver's actor
        scheduler.attach_services(actors=self)
        for msg_type, handler in ((m.ActorRoute, self._on_route_locked),
                                  (m.ActorName, self._on_name_locked),
                                  (m.ActorFind, self._on_find_locked),
                                  (m.KillActor, self._on_kill_locked)):
            scheduler.register_handler(msg_type.CODE, handler)

    def chain_placement_answers(self) -> None:
        """Take the answers to placements (after the spillback registered its own
        handlers for those codes: answers that are not ours go on to it)."""
        for msg_type in (m.SpillbackRejected, m.PlacementFailed, m.RunHere, m.Accepted,
                         m.TaskResult):
            self._chain(msg_type.CODE)

    def _chain(self, code: int) -> None:
        prev: list = [None]

        def chained_locked(h: Any, msg: Any) -> None:  # (a handler: the lock is held)
            if msg.task_id in self._placing:
                self._on_placement_answer_locked(h, msg)
            elif prev[0] is not None:
                prev[0](h, msg)

        prev[0] = self._s.register_handler(code, chained_locked)

    # -- placement by a global scheduler ------------------------------------------------
    def place_locked(self, g: WorkerGroup, create: m.CreateGroup) -> bool:
        """A driver's actor this node cannot host (it lacks what it asks): ask a global
        scheduler for a node that can (True); False: none is linked -- it starts (or
        fails) here."""
        s = self._s
        req = g.actor.cfg.req  # type: ignore[union-attr]
        if req is None:
            return False
        limit = s.cpu_limit
        if not (req.cpus > (limit if limit is not None else req.cpus)
                or s.resources_locked().shortfall(req)):
            return False  # it fits here (once what it asks is free)
        gss = self.schedulers()
        if not gss:
            return False
        from dpool.scheduling import resources as _resources

        g.actor.host = ActorState.PLACING  # type: ignore[union-attr]
        cfg = ("actor", create.max_workers, create.start_method, create.initializer,
               create.max_tasks, create.max_attempts, create.actor)
        msg = m.RemoteTask(g.group_id, self.node_id, g.group_id, cfg, 0, b"", None, None,
                           g.cwd or "", tuple(g.sys_path or ()), g.workdir or (),
                           _resources.to_wire(req))
        self._placing[g.group_id] = [msg, time.monotonic(), 0]
        self._send(gss[0], [msg])
        return True

    def _on_placement_answer_locked(self, h: Any, msg: Any) -> None:
        gid = msg.task_id
        placing = self._placing.get(gid)
        g = self._s.group(gid)
        if placing is None or g is None or g.actor is None:
            return
        if isinstance(msg, m.Accepted):
            return  # (the TaskResult follows)
        if isinstance(msg, m.SpillbackRejected):  # no node has it free now: again soon
            if time.monotonic() - placing[1] < self.grace_s:
                placing[2] += 1
                threading.Timer(0.2 * min(placing[2], 10), self._again, args=(gid,)).start()
                return
            reason = msg.reason
        elif isinstance(msg, m.TaskResult) and msg.ok:
            del self._placing[gid]
            host = _payload.loads(msg.payload)
            g.actor.host = host
            self._placed[gid] = host
            if self.placed_hook is not None:
                self.placed_hook(gid, host)  # calls relayed to it meanwhile
            log.info("actor %s placed on node %s", g.actor.cfg.name, host)
            self._s.cpu_freed_locked()  # (dispatches its group: its calls go there now)
            return
        elif isinstance(msg, m.TaskResult):
            try:
                reason = str(_payload.loads_error(msg.payload))
            except Exception as exc:  # noqa: BLE001 - say what we can
                reason = f"its node could not say ({exc})"
        else:  # PlacementFailed, or RunHere (this node cannot host it)
            reason = getattr(msg, "reason", "the global scheduler chose this node")
        del self._placing[gid]
        g.actor.host = ""
        self._s.break_group_locked(g, f"it cannot get its resources: {reason}")

    def _again(self, gid: int) -> None:
        s = self._s
        with s.lock:
            placing = self._placing.get(gid)
            gss = self.schedulers()
            if placing is not None and gss:
                self._send(gss[placing[2] % len(gss)], [placing[0]])
            out = s.take_out_locked()
        s.deliver(out)

    # -- calls ---------------------------------------------------------------------------
    def _on_route_locked(self, h: Any, msg: m.ActorRoute) -> None:
        s = self._s
        if not msg.node or msg.node == self.node_id or s.group(msg.group_id) is not None:
            return  # hosted here (or it was, and its calls fail), or routed already
        g = WorkerGroup(msg.group_id, 1, None, None, None, 1)
        g.actor = ActorState(ActorConfig(msg.name, None, b""), host=msg.node)
        s.insert_group_locked(g)
        log.debug("calls of actor %s go to node %s", msg.name, msg.node)

    def _on_kill_locked(self, h: Any, msg: m.KillActor) -> None:
        g = self._s.group(msg.group_id)
        host = self._placed.get(msg.group_id)
        if host is not None:  # its driver's proxy: the actor is there
            self._send(host, [m.KillActor(msg.group_id, host, msg.reason)])
            return
        if g is not None and g.actor is not None and not g.actor.host:
            g.closed = True  # the calls after this message fail (the killer's too: its
            g.broken = g.broken or msg.reason  # node forwards them after it, in order)
            threading.Thread(target=self._s.terminate_group, args=(g, msg.reason),
                             daemon=True, name="dpool-kill-actor").start()
        elif msg.node and msg.node != self.node_id:
            self._send(msg.node, [msg])

    # -- the directory -------------------------------------------------------------------
    def _on_name_locked(self, h: Any, msg: m.ActorName) -> None:
        threading.Thread(target=self._name, args=(h, msg), daemon=True,
                         name="dpool-actor-name").start()

    def _on_find_locked(self, h: Any, msg: m.ActorFind) -> None:
        threading.Thread(target=self._find, args=(h, msg), daemon=True,
                         name="dpool-actor-find").start()

    def _name(self, h: Any, msg: m.ActorName) -> None:
        s = self._s
        gid = msg.record[0]
        taken = ValueError(f"an actor named {msg.name!r} exists already")
        err: Optional[BaseException] = None
        try:
            if self.control is None:
                if not s.name_actor(msg.name, msg.record):
                    err = taken
            else:
                gid, label, methods, node = msg.record
                blob = json.dumps({"group": gid, "label": label, "methods": methods,
                                   "node": node}, sort_keys=True).encode()
                if self.control.claim_actor_name(msg.name, blob, self._stale) is not None:
                    err = taken
                else:
                    with s.lock:
                        g = s.group(gid)
                        live = g is not None and g.actor is not None and g.broken is None
                        if live:
                            g.actor.named = msg.name  # type: ignore[union-attr]
                            self._names[gid] = (msg.name, blob)
                    if not live:  # it ended meanwhile
                        self.control.release_actor_name(msg.name, blob)
        except Exception as exc:  # noqa: BLE001 - the driver's create() raises it
            err = exc
        self._answer(h, msg.request_id, err is None,
                     _payload.dumps(None) if err is None else _payload.dumps_error(err))

    def _find(self, h: Any, msg: m.ActorFind) -> None:
        try:
            if self.control is None:
                record = self._s.find_actor(msg.name)
            else:
                blob = self.control.find_actor_name(msg.name)
                record = None
                if blob is not None and not self._stale(blob):
                    r = json.loads(blob)
                    record = (r["group"], r["label"], r["methods"], r["node"])
            self._answer(h, msg.request_id, True, _payload.dumps(record))
        except Exception as exc:  # noqa: BLE001 - get_actor() raises it
            self._answer(h, msg.request_id, False, _payload.dumps_error(exc))

    def _stale(self, blob: bytes) -> bool:
        """Whether the actor of a directory record is gone: its node is dead, or it is
        not on its node (this one) any more."""
        try:
            r = json.loads(blob)
        except ValueError:
            return True
        if r.get("node") != self.node_id:
            return r.get("node") not in self.alive_nodes()
        with self._s.lock:
            g = self._s.group(r.get("group", 0))
            return g is None or g.actor is None or g.broken is not None or g.closed

    def ended_locked(self, g: WorkerGroup) -> None:
        """Actor group ``g`` ended: its name is free; if it stood for its driver's actor
        placed on another node, that actor ends too."""
        held = self._names.pop(g.group_id, None)
        control = self.control
        if held is not None and control is not None:
            threading.Thread(target=control.release_actor_name, args=held, daemon=True,
                             name="dpool-actor-unname").start()
        self._placing.pop(g.group_id, None)
        host = self._placed.pop(g.group_id, None)
        if host is not None:
            self._send(host, [m.KillActor(g.group_id, host,
                                          g.broken or "its executor was shut down")])

    def _answer(self, h: Any, request_id: int, ok: bool, payload: bytes) -> None:
        s = self._s
        with s.lock:
            if h.alive:
                s.send_locked(h, [m.ObjectValue(request_id, ok, payload)])
            out = s.take_out_locked()
        s.deliver(out)
