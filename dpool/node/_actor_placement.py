"""Actors a global scheduler places: a driver's actor its own node cannot host.

A driver's actor lives on the node the driver is attached to (``_attach``), unless that
node can never give it what it asks (a GPU, a custom resource, more CPUs than it has), or
it asks where to run (``scheduling=``: ``"spread"``, ``NodeAffinity``), which a global
scheduler decides (``RunHere``: this node).
Then its group there becomes a *proxy* whose calls wait (``ActorState.PLACING``) while a
global scheduler looks for a node:

    node D (the driver's) ──RemoteTask(group_cfg=("actor", ...))──▶ global scheduler
        ▲                                                               │ places it
        │ TaskResult(ok, H's address) / SpillbackRejected / PlacementFailed ▼
        └──────────────────────────────────────────────────────── node H makes the
                                                                    actor's group
                                                                    (``_remote``)

Refused (no node has it free now) it asks again, with a backoff, until
``DPOOL_RESOURCE_GRACE_S`` has passed; then, or when it can never be placed, the actor
breaks: its calls raise ``ActorDiedError`` saying it cannot get its resources. Placed,
its proxy forwards the driver's calls to H, and the calls other nodes send to D (their
handles name D) are relayed there (``_remote``). When the proxy ends (shutdown, kill, its
driver detached) the actor on H is killed; when the actor ends on H, H says so
(``ActorEnded``) and the proxy ends. A placement that was abandoned before its answer
kills what it made. Everything here runs under the scheduler's lock (``_again``, on a
timer's thread, takes it).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from dpool.objects import payload as _payload
from dpool.protocol import messages as m
from dpool.scheduling import ActorState, SchedulerAPI, WorkerGroup

log = logging.getLogger("dpool.scheduling")


class ActorPlacement:
    """A node's placements of its drivers' actors on other nodes."""

    def __init__(self, scheduler: SchedulerAPI, node_id: str,
                 send: Callable[[str, list], None]) -> None:
        self._s = scheduler
        self.node_id = node_id
        self._send = send
        self.schedulers: Callable[[], list] = list  # the global schedulers linked now
        self.grace_s = 10.0  # how long a placement may be refused before it fails
        # calls other nodes sent here for an actor: to its node once placed, or failed
        self.relay_to: Optional[Callable[[int, str], None]] = None
        self.relay_failed: Optional[Callable[[int, str], None]] = None
        self._placing: dict[int, list] = {}  # group id -> [its RemoteTask, since, tries]
        self._abandoned: set[int] = set()  # placements whose proxy ended before the answer
        self.placed: dict[int, str] = {}  # group id -> the node hosting its driver's actor
        self._cfgs: dict[int, tuple] = {}  # group id -> what it was placed with

    def chain_answers(self) -> None:
        """Take the answers to placements (after the spillback registered its own
        handlers for those codes: answers that are not ours go on to it)."""
        for msg_type in (m.SpillbackRejected, m.PlacementFailed, m.RunHere, m.Accepted,
                         m.TaskResult):
            self._chain(msg_type.CODE)

    def _chain(self, code: int) -> None:
        prev: list = [None]

        def chained_locked(h: Any, msg: Any) -> None:  # (a handler: the lock is held)
            tid = msg.task_id
            if tid in self._placing or tid in self._abandoned:
                self._on_answer_locked(msg)
            elif prev[0] is not None:
                prev[0](h, msg)

        prev[0] = self._s.register_handler(code, chained_locked)

    def place_locked(self, g: WorkerGroup, create: m.CreateGroup) -> bool:
        """Ask a global scheduler for a node for ``g``'s actor if this node can never
        host it (True); False: it fits here, or no global scheduler is linked -- it
        starts (or fails) here."""
        s = self._s
        req = g.actor.cfg.req  # type: ignore[union-attr]
        if req is None:
            return False
        limit = s.cpu_limit
        if req.strategy is None and not ((limit is not None and req.cpus > limit)
                                         or s.resources_locked().shortfall(req)):
            return False  # it fits here (once what it asks is free), and asks no place
        st = req.strategy
        if st is not None and st[0] == "bundle" and any(
                k[0] == st[1] and st[2] in (-1, k[1]) for k in s.bundles_held_locked()):
            return False  # in a placement group's bundle this node holds
        gss = self.schedulers()
        if not gss:
            return False
        cfg = ("actor", create.max_workers, create.start_method, create.initializer,
               create.max_tasks, create.max_attempts, create.actor)
        self._cfgs[g.group_id] = cfg
        self._ask_locked(g, cfg, gss)
        return True

    def _ask_locked(self, g: WorkerGroup, cfg: tuple, gss: list) -> None:
        from dpool.scheduling import resources as _resources

        g.actor.host = ActorState.PLACING  # type: ignore[union-attr]
        msg = m.RemoteTask(g.group_id, self.node_id, g.group_id, cfg, 0, b"", None, None,
                           g.cwd or "", tuple(g.sys_path or ()), g.workdir or (),
                           _resources.to_wire(g.actor.cfg.req))  # type: ignore[union-attr]
        self._placing[g.group_id] = [msg, time.monotonic(), 0]
        self._send(gss[0], [msg])

    def place_again_locked(self, g: WorkerGroup, initializer: bytes, reason: str) -> None:
        """``g``'s actor lost its node (``_actor_rebuild``): a global scheduler places
        it again, its worker made with ``initializer`` (which rebuilds its state); its
        calls wait meanwhile. Without a global scheduler, it breaks."""
        gid = g.group_id
        old = self.placed.pop(gid, None)
        if old is not None:  # (in case it only lost its link to us: it ends there)
            self._send(old, [m.KillActor(gid, old, f"it was placed again ({reason})")])
        gss = self.schedulers()
        cfg = self._cfgs.get(gid)
        if not gss or cfg is None:
            self._s.break_group_locked(g, f"{reason}, and no global scheduler is linked "
                                          "to place it again")
            return
        a = g.actor
        name, restarts, *rest = cfg[6]
        if restarts > 0:  # (the restarts left, for its new node's own)
            restarts = max(0, restarts - a.restarts)  # type: ignore[union-attr]
        cfg = cfg[:3] + (initializer,) + cfg[4:6] + ((name, restarts, *rest),)
        self._ask_locked(g, cfg, gss)

    def _on_answer_locked(self, msg: Any) -> None:
        gid = msg.task_id
        if isinstance(msg, m.Accepted):
            return  # (the TaskResult follows)
        if gid in self._abandoned:  # its proxy ended first: undo what it made
            self._abandoned.discard(gid)  # (a refusal is final too: it is not asked again)
            if isinstance(msg, m.TaskResult) and msg.ok:
                host = _payload.loads(msg.payload)
                self._send(host, [m.KillActor(gid, host, "its driver's executor ended "
                                                         "before it was placed")])
            return
        placing = self._placing[gid]
        g = self._s.group(gid)
        if g is None or g.actor is None:
            del self._placing[gid]
            return
        if isinstance(msg, m.SpillbackRejected):  # no node has it free now: again soon
            if time.monotonic() - placing[1] < self.grace_s:
                placing[2] += 1
                timer = threading.Timer(0.2 * min(placing[2], 10), self._again, args=(gid,))
                timer.daemon = True
                timer.start()
                return
            reason = msg.reason
        elif isinstance(msg, m.TaskResult) and msg.ok:
            del self._placing[gid]
            host = _payload.loads(msg.payload)
            g.actor.host = host
            self.placed[gid] = host
            if self.relay_to is not None:
                self.relay_to(gid, host)  # the calls relayed here meanwhile
            log.info("actor %s placed on node %s", g.actor.cfg.name, host)
            self._s.cpu_freed_locked()  # (dispatches its group: its calls go there now)
            return
        elif isinstance(msg, m.TaskResult):
            try:
                reason = str(_payload.loads_error(msg.payload))
            except Exception as exc:  # noqa: BLE001 - say what we can
                reason = f"its node could not say ({exc})"
        elif isinstance(msg, m.RunHere):  # its strategy chose this node: it starts here
            del self._placing[gid]
            g.actor.host = ""
            self._s.cpu_freed_locked()  # (dispatches its group: a worker starts for it)
            return
        else:  # PlacementFailed
            reason = msg.reason
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

    def ended_locked(self, g: WorkerGroup) -> None:
        """``g`` (a proxy of a placed actor, or one being placed) ended: the actor on its
        node ends too, and the calls relayed here for it fail."""
        gid = g.group_id
        reason = g.broken or "its executor was shut down"
        self._cfgs.pop(gid, None)
        if self._placing.pop(gid, None) is not None:
            self._abandoned.add(gid)
        host = self.placed.pop(gid, None)
        if host is not None:
            self._send(host, [m.KillActor(gid, host, reason)])
        if self.relay_failed is not None:
            self.relay_failed(gid, reason)

    def on_ended_locked(self, h: Any, msg: m.ActorEnded) -> None:
        """The node hosting a placed actor says it ended: its proxy here ends."""
        g = self._s.group(msg.group_id)
        if self.placed.get(msg.group_id) not in (h.address, h.peer_id):
            return  # (a node it was placed on before, killed when it was placed again)
        self.placed.pop(msg.group_id, None)
        if g is not None and g.broken is None:
            self._s.break_group_locked(g, msg.reason)
