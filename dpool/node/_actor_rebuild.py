"""Placed actors rebuilt on another node when theirs is lost: their driver's node keeps
a copy of their latest checkpoint and of the calls run after it.

A driver's actor that a global scheduler placed on node H (``_actor_placement``) is
called through its proxy on the driver's node D: every call of it -- the driver's, and
those that other nodes send to D (``_remote``) -- is a task of D's that goes to H and
whose result comes back to D. When the actor may be restarted (``max_restarts``), D
keeps what rebuilding it takes, in the proxy's ``ActorState`` (its ``log`` and
``checkpoint``, which a proxy does not use otherwise):

    D forwards call c (its n-th) ──RemoteTask──▶ H runs it ──TaskResult──▶ D: c joins
                                                                          the log
    H's worker checkpoints after c ──ActorSaved(through=c)──▶ D: the checkpoint
                                                    replaces the log up to c

(A checkpoint may overtake the result of the last call it holds: the calls are
compared by the order D forwarded them in, not by arrival.)

When H is lost (the link to it closes, or the node table declares it dead), the calls
that were away at H go back first in the actor's order, uncharged, and D asks a global
scheduler to place the actor again: its worker there boots from D's checkpoint and
replays D's log (stored values inline), then the calls go to the new node in order. A
call that was away completes once: it had not run, or it ran on H, whose state was
lost with it. Each rebuild counts as a restart; without restarts left, the calls fail
with ``ActorDiedError`` as before. Everything here runs under the scheduler's lock.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from dpool.node._actor_placement import ActorPlacement
from dpool.objects import inline as _inline
from dpool.protocol import messages as m
from dpool.scheduling import SchedulerAPI, Task, WorkerGroup

log = logging.getLogger("dpool.scheduling")


class ActorRebuilds:
    """The copies a driver's node keeps of its placed actors, and their rebuilds."""

    def __init__(self, scheduler: SchedulerAPI, placement: ActorPlacement) -> None:
        self._s = scheduler
        self._placement = placement
        self._n = 0  # calls forwarded, over all actors (their order: ``_sent``)
        # group id -> {task id: its forwarding number} of the calls that no checkpoint
        # holds yet
        self._sent: dict[int, dict[int, int]] = {}
        self._logged: dict[int, list[int]] = {}  # group id -> the number of each log entry
        self._saved: dict[int, int] = {}  # group id -> the last call its checkpoint holds
        # (the spillback's) the calls of a proxy still away at its actor's node, taken
        self.take_away: Callable[[WorkerGroup], list] = lambda g: []
        scheduler.register_handler(m.ActorSaved.CODE, self._on_saved_locked)

    def _keeps(self, g: WorkerGroup) -> bool:
        a = g.actor
        return a is not None and a.cfg.max_restarts != 0 and \
            g.group_id in self._placement.placed and self._may_restart(g)

    def _may_restart(self, g: WorkerGroup) -> bool:
        cfg = g.actor.cfg  # type: ignore[union-attr]
        return g.broken is None and not g.closed and (
            cfg.max_restarts < 0 or g.actor.restarts < cfg.max_restarts)  # type: ignore[union-attr]

    # -- calls ---------------------------------------------------------------------------
    def forwarded_locked(self, g: WorkerGroup, calls: list) -> None:
        """``calls`` of ``g``'s actor left for its node, in this order."""
        if not self._keeps(g):
            return
        sent = self._sent.setdefault(g.group_id, {})
        for t in calls:
            self._n += 1
            sent[t.task_id] = self._n

    def ran_locked(self, t: Task) -> None:
        """The result of call ``t`` came back: it joins the log (unless a checkpoint
        that came first holds it already)."""
        g = t.group
        sent = self._sent.get(g.group_id)
        n = sent.get(t.task_id) if sent is not None else None
        if n is None or n <= self._saved.get(g.group_id, 0) or g.actor is None:
            return
        if t.dep_ids and t.deps is None:  # (a proxy's call took its inputs from the
            # object table as it left): the log keeps their values, inline
            try:
                t.deps = tuple((oid, ok, _inline.inline_payload(p) if ok else p)
                               for oid, ok, p in self._s.inputs_locked(t))
            except Exception:  # noqa: BLE001 - gone: a replay fails that call, as a lost
                log.warning("actor %s: the inputs of call %#x are gone; a rebuild will "
                            "not replay it faithfully", g.actor.cfg.name, t.task_id)
        self._s.actor_ran_locked(t)
        self._logged.setdefault(g.group_id, []).append(n)

    def _on_saved_locked(self, h: Any, msg: m.ActorSaved) -> None:
        if self._placement.placed.get(msg.group_id) not in (h.address, h.peer_id):
            return  # (from a node it left)
        g = self._s.group(msg.group_id)
        sent = self._sent.get(msg.group_id)
        n = sent.get(msg.through) if sent is not None else None
        if g is None or g.actor is None or sent is None or n is None:
            return  # (ended, or a checkpoint of a node it left)
        logged = self._logged.get(msg.group_id, [])
        held = 0
        while held < len(logged) and logged[held] <= n:
            held += 1
        self._s.actor_saved_locked(g, msg.state, held)
        del logged[:held]
        self._saved[msg.group_id] = n
        for tid in [tid for tid, k in sent.items() if k <= n]:
            del sent[tid]

    # -- its node lost -------------------------------------------------------------------
    def calls_lost_locked(self, g: WorkerGroup, calls: list, reason: str) -> bool:
        """``calls`` of ``g``'s actor (in the order forwarded) were away on a node that
        was lost: back first in its order, and the actor rebuilt elsewhere (True); False
        if it may not be (they fail)."""
        if not self._keeps(g) or not self._may_restart(g):
            return False
        self._rebuild_locked(g, reason, calls)
        return True

    def hosts_lost_locked(self, names: set, reason: str) -> None:
        """Nodes ``names`` were lost: the placed actors they hosted are rebuilt (those
        that may be; the others' calls fail when they are made)."""
        for gid, host in list(self._placement.placed.items()):
            if host not in names:
                continue
            g = self._s.group(gid)
            if g is not None and self._keeps(g) and self._may_restart(g):
                self._rebuild_locked(g, reason)

    def _rebuild_locked(self, g: WorkerGroup, reason: str, lost: Sequence = ()) -> None:
        if g.group_id not in self._placement.placed:
            return  # (being placed again already)
        s = self._s
        a = g.actor
        # Every call still away at the lost node -- those reported lost and the rest,
        # accepted or not -- goes back first in the actor's order, in the order forwarded
        sent = self._sent.get(g.group_id, {})
        calls = {t.task_id: t for t in (*lost, *self.take_away(g))}
        for t in sorted(calls.values(), key=lambda t: sent.get(t.task_id, 0),
                        reverse=True):
            s.back_locked(t)
            t.attempts -= 1  # (not charged: it completes once, on the new node)
            g.queue.appendleft(t)
            a.order.appendleft(t)  # type: ignore[union-attr]
        a.restarts += 1  # type: ignore[union-attr]
        cfg = a.cfg  # type: ignore[union-attr]
        log.warning("actor %s: %s; placing it again (restart %d of %s), to replay %d "
                    "call(s)%s", cfg.name, reason, a.restarts,  # type: ignore[union-attr]
                    "unlimited" if cfg.max_restarts < 0 else cfg.max_restarts,
                    len(a.log), " after its checkpoint" if a.checkpoint else "")  # type: ignore[union-attr]
        self._sent[g.group_id] = {}  # (forwarded again, numbered anew)
        # here, if a global scheduler says so (``RunHere``); elsewhere, values inline
        g.initializer = s.actor_boot_locked(g, inline=False)
        self._placement.place_again_locked(g, s.actor_boot_locked(g, inline=True), reason)

    def ended_locked(self, g: WorkerGroup) -> None:
        """``g`` ended: what was kept for it goes."""
        for table in (self._sent, self._logged, self._saved):
            table.pop(g.group_id, None)  # type: ignore[attr-defined]
