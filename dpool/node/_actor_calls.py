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
route. Handlers run under the scheduler's lock.
"""

from __future__ import annotations

import logging
from typing import Any

from dpool.protocol import messages as m
from dpool.scheduling import ActorConfig, ActorState, SchedulerAPI, WorkerGroup

log = logging.getLogger("dpool.scheduling")


class ActorCalls:
    """A node's routes to the actors of other nodes."""

    def __init__(self, scheduler: SchedulerAPI, node_id: str) -> None:
        self._s = scheduler
        self.node_id = node_id
        scheduler.register_handler(m.ActorRoute.CODE, self._on_route_locked)

    def _on_route_locked(self, h: Any, msg: m.ActorRoute) -> None:
        s = self._s
        if not msg.node or msg.node == self.node_id or s.group(msg.group_id) is not None:
            return  # hosted here (or it was, and its calls fail), or routed already
        g = WorkerGroup(msg.group_id, 1, None, None, None, 1)
        g.actor = ActorState(ActorConfig(msg.name, None, b""), host=msg.node)
        s.insert_group_locked(g)
        log.debug("calls of actor %s go to node %s", msg.name, msg.node)
