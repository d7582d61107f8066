"""The origin's waits (``_spillback.Spillback``): tasks asking for resources this node lacks, and
the safety nets.

A task asking for resources this node does not have at all (``_resource_dispatch``: more
CPUs or GPUs, a custom resource it lacks) goes to a global scheduler at once
(``unmet``), which places it only on a node that has them. While no node has them
(``SpillbackRejected``, or no global scheduler linked) it is parked here and offered again
every ``_BACKOFF_S``; after ``grace_s`` (``DPOOL_RESOURCE_GRACE_S``, default 10 s: time
for such a node to join) it fails with ``ResourceError``, saying what it asked and what
the nodes offer.

Nothing may hold a task that nobody will act on:

- a node with no CPUs runs nothing itself: a task queued there that no node takes
  (every offer rejected, no global scheduler linked, its code not shareable) fails
  with ``ResourceError`` after ``grace_s``, like a task whose resources nobody has;
  a pool whose ``max_workers`` is 0 (sized while the cluster had no CPUs) still
  sends one task at a time;
- a task accepted by another node is not timed out (it may run for hours), but every
  ``check_s`` (3 s) the node running tasks accepted that long ago is asked which of them
  it still has (``TasksQuery``; ``_remote`` answers ``TasksKnown`` on the link its
  results take, after them). One it has no trace of in two answers in a row (the first
  may have crossed its result) is offered again, uncharged.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from dpool.errors import PlacementError
from dpool.node._spillback_base import _BACKOFF_S, SpillbackBase
from dpool.objects import payload as _payload
from dpool.placement import SPREAD, strategy_from_wire
from dpool.protocol import messages as m
from dpool.scheduling import Task, WorkerGroup

log = logging.getLogger("dpool.scheduling")


class SpillbackWaits(SpillbackBase):
    """Part of ``Spillback``: parked and homeless tasks, and asking runners what they hold."""

    # -- resources this node lacks ---------------------------------------------------------
    def unmet_locked(self, g: WorkerGroup, t: Task, reason: str) -> bool:
        """``t`` asks for resources this node never has (``reason``): send it to a node
        that has them, or park it until one joins; after the grace period, fail it.
        False: not this spillback's (a mirror group's task: the caller fails it)."""
        if self._mirror(g):
            return False
        now = time.monotonic()
        gss = self._schedulers()
        r = t.req
        assert r is not None  # (only a task with a request is unmet)
        strategy = strategy_from_wire(r.strategy) if r.strategy else None
        if strategy is not None and not gss and t.task_id not in self._unmet and (
                strategy == SPREAD or strategy.soft):
            return False  # nobody to ask where: a soft strategy runs here (the caller)
        unmet = self._unmet.get(t.task_id)
        if unmet is None:
            unmet = self._unmet[t.task_id] = [now, reason]
        if now - unmet[0] >= self.grace_s:
            del self._unmet[t.task_id]
            why = (f"{unmet[1]}; no node of the cluster offered it within "
                   f"{self.grace_s:g} s (DPOOL_RESOURCE_GRACE_S)")
            if strategy is not None:
                if t.future is not None and not t.started:
                    if not t.future.set_running_or_notify_cancel():
                        self._s.skip_cancelled_locked(t)
                        return True
                    t.started = True
                self._s.finish_locked(t, False, _payload.dumps_error(PlacementError(why)))
            else:
                self._s.fail_unmet_locked(t, why)
            return True
        if not gss or self._keep_local(g):  # (its code is not published for others yet)
            if not gss:
                unmet[1] = f"{reason} (and no global scheduler is linked to place it)"
            self._parked.append((now + _BACKOFF_S, g, t))
            return True
        gs = self._start_locked(t, gss)
        if gs is None:
            del self._unmet[t.task_id]
            return True
        try:
            msg = self._spillback_locked(t, g, gs)
        except Exception as exc:  # noqa: BLE001 - e.g. its input's segment is gone
            del self._unmet[t.task_id]
            self._s.fail_unmet_locked(
                t, f"{reason}; it could not be sent to another node: {exc}")
            return True
        self._send(gs, [msg])
        return True

    def _retry_parked_locked(self, now: float) -> None:
        due = [p for p in self._parked if p[0] <= now]
        if not due:
            return
        self._parked = [p for p in self._parked if p[0] > now]
        for _, g, t in due:
            if g.broken is not None:
                continue  # failed with its group
            if t.future is not None and not t.started and t.future.cancelled():
                self._unmet.pop(t.task_id, None)
                self._s.skip_cancelled_locked(t)
                continue
            reason = self._unmet.get(t.task_id, [0.0, ""])[1]
            self.unmet_locked(g, t, reason)


    # -- safety nets: nobody may hold a task that nobody will act on -----------------------
    def _homeless_locked(self, now: float) -> None:
        """A node with no CPUs runs nothing itself: a task queued here that no node took
        within ``grace_s`` (none with CPUs joined, no global scheduler linked, ...)
        fails with ``ResourceError`` instead of waiting for good."""
        gss = self._schedulers()
        for g in list(self._s.groups_locked()):
            if not g.queue or g.broken is not None or self._mirror(g) or \
                    g.actor is not None:  # (an actor holds no CPU unless it asks: it runs)
                continue
            why = ("no global scheduler is linked to place it" if not gss else
                   "its code could not be shared with other nodes" if self._keep_local(g)
                   else None)
            if why is not None:
                for t in g.queue:
                    self._homeless.setdefault(t.task_id, [now, why, g])
        for tid, (since, why, g) in list(self._homeless.items()):
            if now - since < self.grace_s or tid in self.away:
                continue  # (away: it may be accepted yet)
            del self._homeless[tid]
            t = next((t for t in g.queue if t.task_id == tid), None)
            if t is None:
                continue  # it ran, was cancelled or failed meanwhile
            g.queue.remove(t)
            self._s.fail_unmet_locked(
                t, f"this node has no CPUs and no node of the cluster took the task within "
                f"{self.grace_s:g} s (DPOOL_RESOURCE_GRACE_S): {why or 'none with CPUs'}; "
                "add a node with CPUs, or give this one some (--num-cpus)")

    def _ask_runners_locked(self, now: float) -> None:
        """Ask each node running tasks accepted ``check_s`` ago or more whether it still
        has them (``TasksQuery``; the answer: ``_on_known_locked``)."""
        ask: dict[str, list] = {}
        for tid, a in self.away.items():
            if a.node is not None and not a.pulling and now - a.accepted_at >= self.check_s:
                ask.setdefault(a.node, []).append(tid)
        for node, ids in ask.items():
            self._send(node, [m.TasksQuery(self.address, tuple(ids))])

    def _on_known_locked(self, h: Any, msg: m.TasksKnown) -> None:
        """A node's answer: which of the tasks it accepted from here it still has. One
        it has no trace of in two answers in a row (the first may cross its result) is
        offered again, uncharged: no result of it will ever come."""
        sender = {h.address, h.peer_id, msg.node_id}
        for tid in msg.known:
            a = self.away.get(tid)
            if a is not None and a.node in sender:
                a.strikes = 0
        for tid in msg.unknown:
            a = self.away.get(tid)
            if a is None or a.pulling or a.node not in sender:
                continue
            a.strikes += 1
            if a.strikes < 2:
                continue
            t = self._take_locked(tid)
            if t is not None:
                log.warning("node %s has no trace of task %#x it accepted: offering it "
                            "again", a.node, tid)
                self._home_locked(t, charge=False)
