"""Part of ``RemoteRunner`` (``_remote``): the actors a global scheduler placed on this
node for other nodes' drivers, and the calls this node's proxies hold for actors being
placed.

A placed actor's group here is made by ``_host_actor_locked`` (its id: the driver's,
unless this node already has a proxy of that actor -- a task here called it -- when it
gets one of its own, found by the driver's through ``_hosted``). Its checkpoints go back
to the driver's node with the driver's id of the last call they hold (``_calls``:
this node's id of each call -> the origin's), so that node can rebuild it elsewhere
(``_actor_rebuild``).
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable, Iterator

from dpool.errors import ResourceError, actor_died
from dpool.node._attach import actor_state
from dpool.objects import payload as _payload
from dpool.protocol import messages as m
from dpool.scheduling import SchedulerAPI, WorkerGroup


class RemoteActors:
    _s: SchedulerAPI
    node_id: str
    _send: Callable[[str, list], None]
    _origin: dict[int, tuple]  # group id -> (origin node, its group id)
    _relay: dict[int, list]  # actor calls waiting for their actor's node
    _calls: dict[int, dict[int, int]]  # group id -> {this node's id: the origin's}
    _hosted: dict[int, int]  # a driver's id of an actor placed here -> ours
    _ids: Iterator[int]  # this node's ids

    def _paths(self, g: WorkerGroup, msg: Any) -> None: raise NotImplementedError

    def _host_actor_locked(self, msg: m.RemoteTask) -> None:
        """A global scheduler placed a driver's actor here (its node lacked what it
        asks): its group, whose output goes to that node; the answer is this node's
        address (``_actor_calls``)."""
        s = self._s
        _, _max_workers, method, initializer, max_tasks, max_attempts, actor = \
            msg.group_cfg
        try:
            gid = self._hosted.get(msg.group_id, msg.group_id)
            there = s.group(gid)
            if there is not None and (there.actor is None or there.actor.host or
                                      there.broken is not None or there.closed):
                # this node has a proxy of it (its handle reached a task here), or the
                # group it hosted before, ended (placed here again): the actor's group
                # gets an id of its own; its calls find it by the driver's (``_hosted``)
                gid, there = next(self._ids), None
            if there is None:  # (else: a placement asked again)
                try:
                    ctx = mp.get_context(method or None)
                except ValueError:
                    ctx = mp.get_context()
                g = WorkerGroup(gid, 1, ctx, initializer, max_tasks, max_attempts)
                self._paths(g, msg)
                g.actor = actor_state(actor, initializer)
                req = g.actor.cfg.req
                limit = s.cpu_limit
                bundle = req is not None and req.strategy is not None and \
                    req.strategy[0] == "bundle"  # (its bundle, held here, has it)
                short = s.resources_locked().shortfall(req) \
                    if req is not None and not bundle else None
                if req is not None and not bundle and limit is not None and req.cpus > limit:
                    short = f"CPU: {req.cpus} asked, {limit} here"
                if short:
                    raise ResourceError(f"node {self.node_id} cannot host it: {short}")
                s.insert_group_locked(g)
                self._origin[g.group_id] = (msg.origin, msg.group_id)  # (its output)
                if gid != msg.group_id:
                    self._hosted[msg.group_id] = gid
            self._send(msg.origin, [m.TaskResult(msg.task_id, True,
                                                 _payload.dumps(self.node_id), 0.0)])
        except Exception as exc:  # noqa: BLE001 - its driver's calls say why
            self._send(msg.origin, [m.TaskResult(msg.task_id, False,
                                                 _payload.dumps_error(exc), 0.0)])

    def placed_locked(self, group_id: int, host: str) -> None:
        """A driver's actor whose proxy is here got its node: the calls other nodes
        sent here meanwhile go there, in order."""
        msgs = self._relay.pop(group_id, [])
        if msgs:
            self._send(host, msgs)

    def relay_failed_locked(self, group_id: int, reason: str) -> None:
        """That actor will never have a node: the calls held for it fail."""
        for msg in self._relay.pop(group_id, []):
            self._send(msg.origin, [m.TaskResult(msg.task_id, False, _payload.dumps_error(
                actor_died(f"#{group_id}", reason)), 0.0)])

    def take_origin_locked(self, g: WorkerGroup) -> "tuple | None":
        """(origin, its group id) of an actor placed here for another node's driver,
        forgotten (its end is told once)."""
        if g.actor is None:
            return None
        self._calls.pop(g.group_id, None)
        origin = self._origin.pop(g.group_id, None)
        if origin is not None and self._hosted.get(origin[1]) == g.group_id:
            del self._hosted[origin[1]]
        return origin

    def hosted_id(self, group_id: int) -> int:
        """This node's id of the group of the actor a driver's node knows as
        ``group_id`` (the same, unless this node had a proxy of it when it was placed
        here)."""
        return self._hosted.get(group_id, group_id)

    def origin_call_locked(self, g: WorkerGroup, local_id: int) -> "int | None":
        """The origin's id of call ``local_id`` of an actor placed here, which a
        checkpoint holds: the calls up to it are forgotten."""
        calls = self._calls.get(g.group_id)
        if not calls or local_id not in calls:
            return None
        for tid in list(calls):  # (in the order admitted: ids grow)
            origin_id = calls.pop(tid)
            if tid == local_id:
                return origin_id
        return None
