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
from typing import Any, Callable, Optional

from dpool.control import ClusterControlStore
from dpool.node._actor_placement import ActorPlacement
from dpool.node._actor_rebuild import ActorRebuilds
from dpool.node._answer import answer
from dpool.objects import payload as _payload
from dpool.protocol import messages as m
from dpool.scheduling import ActorState, SchedulerAPI, WorkerGroup, proxy_group

log = logging.getLogger("dpool.scheduling")


class ActorCalls:
    """A node's routes to the actors of other nodes, its part of the actor directory,
    and its placements of its drivers' actors elsewhere (``placement``)."""

    def __init__(self, scheduler: SchedulerAPI, node_id: str,
                 send: Callable[[str, list], None]) -> None:
        self._s = scheduler
        self.node_id = node_id
        self._send = send  # a peer link's send, by node address
        self.control: Optional[ClusterControlStore] = None  # the directory (a cluster's)
        self.alive_nodes: Callable[[], set] = lambda: {node_id}
        # (origin node, its group id) of an actor placed here for another node's driver
        # (``_remote``): read, and taken once it ended
        self.origin_of: Callable[[WorkerGroup], Optional[tuple]] = lambda g: None
        self.take_origin: Callable[[WorkerGroup], Optional[tuple]] = lambda g: None
        # the origin's task id of a call of such an actor, by this node's id (``_remote``)
        self.origin_call: Callable[[WorkerGroup, int], Optional[int]] = lambda g, t: None
        self.hosted_id: Callable[[int], int] = lambda gid: gid  # (``_remote``)
        self.placement = ActorPlacement(scheduler, node_id, send)
        self.rebuilds = ActorRebuilds(scheduler, self.placement)
        self._names: dict[int, tuple[str, bytes]] = {}  # group id -> its name and record
        scheduler.attach_services(actors=self)
        for msg_type, handler in ((m.ActorRoute, self._on_route_locked),
                                  (m.ActorName, self._on_name_locked),
                                  (m.ActorFind, self._on_find_locked),
                                  (m.KillActor, self._on_kill_locked),
                                  (m.ActorEnded, self.placement.on_ended_locked)):
            scheduler.register_handler(msg_type.CODE, handler)

    # -- calls ---------------------------------------------------------------------------
    def _on_route_locked(self, h: Any, msg: m.ActorRoute) -> None:
        s = self._s
        if not msg.node or s.group(msg.group_id) is not None or \
                s.ended_actor(msg.group_id) is not None:
            return  # hosted here (or it was, and its calls fail), or routed already
        # (naming this node, which lost it -- restarted, ...: its calls fail)
        s.insert_group_locked(proxy_group(
            msg.group_id, msg.name, msg.node,
            f"it is not on its node {msg.node} any more" if msg.node == self.node_id
            else None))
        log.debug("calls of actor %s go to node %s", msg.name, msg.node)

    def _on_kill_locked(self, h: Any, msg: m.KillActor) -> None:
        s = self._s
        g = s.group(self.hosted_id(msg.group_id))
        a = g.actor if g is not None else None
        if a is not None and (not a.host or a.host == ActorState.PLACING):
            # hosted here, or being placed (its proxy ends: its placement is undone)
            if s.kill_actor_locked(g, msg.reason):  # type: ignore[arg-type]
                self._tell_origin_locked(g)  # type: ignore[arg-type]  # (before the
                # failures of the calls after it: the lock is still held)
        elif a is not None:  # a proxy: to the actor's node
            self._send(a.host, [m.KillActor(msg.group_id, a.host, msg.reason)])
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

    def node_lost_locked(self, address: str) -> None:
        """Node ``address`` was declared dead: the actors placed here for its drivers
        end (nobody can call or end them any more: their GPUs would be held for good)."""
        s = self._s
        for g in list(s.groups_locked()):
            if g.actor is not None and not g.actor.host and g.broken is None:
                origin = self.origin_of(g)
                if origin is None or origin[0] != address:
                    continue
                s.kill_actor_locked(g, f"the node of its driver ({address}) was lost")
        self.rebuilds.hosts_lost_locked({address}, f"its node {address} was declared dead")

    def saved_locked(self, g: WorkerGroup, state: bytes, through: int) -> None:
        """A checkpoint of an actor placed here for another node's driver: that node
        keeps a copy, with the calls after it, to rebuild the actor should this node
        die (``_actor_rebuild``)."""
        origin = self.origin_of(g)
        if origin is None or not g.actor or not g.actor.cfg.max_restarts:
            return
        call = self.origin_call(g, through)
        if call is not None:
            self._send(origin[0], [m.ActorSaved(origin[1], state, call)])

    def ended_locked(self, g: WorkerGroup) -> None:
        """Actor group ``g`` ended: its name is free; the actor a proxy stood for ends
        too; the node whose driver's actor this was (a placed one) hears of it."""
        held = self._names.pop(g.group_id, None)
        control = self.control
        if held is not None and control is not None:
            threading.Thread(target=control.release_actor_name, args=held, daemon=True,
                             name="dpool-actor-unname").start()
        if g.actor is not None and g.actor.host:
            self.rebuilds.ended_locked(g)
            self.placement.ended_locked(g)
        else:
            self._tell_origin_locked(g)

    def _tell_origin_locked(self, g: WorkerGroup) -> None:
        """An actor placed here for another node's driver ended: that node hears it
        (once), before the failures of the calls made after the end."""
        origin = self.take_origin(g)
        if origin is not None:
            self._send(origin[0], [m.ActorEnded(origin[1],
                                                g.broken or "its executor was shut down")])

    def _answer(self, h: Any, request_id: int, ok: bool, payload: bytes) -> None:
        answer(self._s, h, request_id, ok, payload)
