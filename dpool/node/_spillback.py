"""Bottom-up scheduling, the origin's half: spilling tasks this node should not wait for.

    local queue ──(estimated wait > threshold)──▶ RemoteTask ──▶ global scheduler
        ▲                                                              │ places it
        │ requeue (rejected / GS lost / node lost)                      ▼
    finish_locked(task) ◀── TaskResult ◀── Accepted ◀──────── another node runs it

``consider_locked`` keeps what the placement policy says (``PlacementPolicy.keep``) and
sends the rest of a group's queue, tail first, to the linked global schedulers in turn:
at most ``max_workers`` (times a batch's worth for short tasks) away per group, less its
busy local workers. Mirror groups and groups whose code cannot be shared never spill.

A spilled task stays this node's (``away``): its record (future or owner, attempts, the
references that keep its inputs alive) lives here until its outcome comes back. Its
function and small values travel inline; stored values of ``REFERENCE_MIN`` (256 KiB) or
more go as ``remote_ref`` references that the executing node pulls. Outcomes:

- ``SpillbackRejected``, or no node accepts it within ``place_timeout_s``, or the global
  scheduler's link closes first: home, uncharged (the first result to arrive wins);
- ``RunHere``: it runs here; ``PlacementFailed``: it fails with ``PlacementError``;
- the executing node is lost, or its lent result cannot be pulled whole: run again,
  charged, up to ``max_attempts``, then ``WorkerCrashedError`` or ``ObjectLostError``.

Results and lenders: ``_spillback_results``; resource waits and safety nets: ``_spillback_waits``.
``_locked`` methods run under the scheduler's lock; ``_pull_result`` on its own thread.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, Optional

from dpool.errors import PlacementError, WorkerCrashedError, actor_died
from dpool.node._spillback_base import (
    _BACKOFF_S,
    _CHECK_S,
    GRACE_S,
    LEND_USE_S,
    REFERENCE_MIN,
    _Away,
)
from dpool.node._spillback_results import SpillbackResults
from dpool.node._spillback_waits import SpillbackWaits
from dpool.objects import inline as _inline
from dpool.objects import payload as _payload
from dpool.objects import values as _values
from dpool.placement import HERE, LeastWait, LocalQueue, PlacementPolicy
from dpool.placement import load as load_policy
from dpool.protocol import messages as m
from dpool.scheduling import SchedulerAPI, Task, WorkerGroup
from dpool.scheduling import resources as _resources
from dpool.scheduling import limits as _limits
from dpool.transfer import pull as _pull

log = logging.getLogger("dpool.scheduling")



def resource_grace_s() -> float:
    text = os.environ.get("DPOOL_RESOURCE_GRACE_S")
    try:
        return max(0.0, float(text)) if text else GRACE_S
    except ValueError:
        log.warning("DPOOL_RESOURCE_GRACE_S=%r is not a number: using %g s", text, GRACE_S)
        return GRACE_S


_BUILTIN = LeastWait()


def policy_from_env() -> PlacementPolicy:
    """The policy ``$DPOOL_PLACEMENT_POLICY`` names (the built-in rule when unset, or
    when it cannot be loaded: said in the log)."""
    spec = os.environ.get("DPOOL_PLACEMENT_POLICY")
    try:
        return load_policy(spec)
    except (ValueError, TypeError) as exc:
        log.error("DPOOL_PLACEMENT_POLICY: %s: using the built-in rule", exc)
        return LeastWait()


class Spillback(SpillbackWaits, SpillbackResults):
    """The node's ``SpillbackService``: decides what leaves, and keeps each task's record
    until its outcome comes back."""

    def __init__(self, scheduler: SchedulerAPI, node_address: str,
                 send: Callable[[str, list], None], schedulers: Callable[[], list],
                 threshold_s: float = 0.005, place_timeout_s: float = 10.0,
                 local_groups: Optional[Callable[[WorkerGroup], bool]] = None,
                 mirror: Optional[Callable[[WorkerGroup], bool]] = None,
                 policy: Optional[PlacementPolicy] = None) -> None:
        self._s = scheduler
        self.policy = policy if policy is not None else policy_from_env()
        self.address = node_address
        self._send = send
        self._schedulers = schedulers  # addresses of the global schedulers linked now
        self.threshold_s = threshold_s
        self.place_timeout_s = place_timeout_s
        self._keep_local = local_groups or (lambda g: False)
        self._mirror = mirror or (lambda g: False)  # runs tasks other nodes placed here
        self.away: dict[int, _Away] = {}
        self.actor_logs: Any = None  # what a driver's node keeps of its placed actors
        self._away_per_group: dict[int, int] = {}
        self._paused_until = 0.0
        self._rr = 0
        self.token = b""  # the cluster token, to pull lent results
        self._borrowers: dict[str, set] = {}  # our segment -> nodes that may hold a copy
        # Results pulled from a node that still lends them (data locality):
        # our segment -> (lender, its segment, size, pulled at); released when ours is freed
        self.lent_copies: dict[str, tuple] = {}
        scheduler.store.on_freed = self._freed_locked
        self.grace_s = resource_grace_s()
        self._unmet: dict[int, list] = {}  # task id -> [first seen, why not placed]
        self._parked: list = []  # (when to offer again, group, task): resources unmet
        # Tasks queued on a node with no CPUs that nobody took yet: task id -> [since,
        # why, group]; they fail with ResourceError after ``grace_s`` (``_homeless_locked``)
        self._homeless: dict[int, list] = {}
        # Tasks accepted this long ago: their node is asked whether it still has them
        self.check_s = _CHECK_S
        self._next_check = 0.0
        scheduler.register_handler(m.SpillbackRejected.CODE, self._on_rejected_locked)
        scheduler.register_handler(m.PlacementFailed.CODE, self._on_failed_locked)
        scheduler.register_handler(m.RunHere.CODE, self._on_run_here_locked)
        scheduler.register_handler(m.Accepted.CODE, self._on_accepted_locked)
        scheduler.register_handler(m.TaskResult.CODE, self._on_result_locked)
        scheduler.register_handler(m.TasksKnown.CODE, self._on_known_locked)
        scheduler.attach_services(spillback=self)

    # -- deciding ------------------------------------------------------------------------
    def consider_locked(self, g: WorkerGroup) -> None:
        """Spill the tasks of ``g``'s queue that would wait too long here."""
        q = g.queue
        if not q or g.broken is not None or self._keep_local(g):
            return
        gss = self._schedulers()
        if not gss or time.monotonic() < self._paused_until:
            return
        s = self._s
        cpus = s.cpu_limit or 0
        busy = s.busy_cpus_locked()
        free = max(0, cpus - busy)
        est_s = s.batch.estimate(q[0].fn_id) if cpus and s.batch.known(q[0].fn_id) else None
        view = LocalQueue(len(q), free, cpus, est_s, self.threshold_s)
        try:
            keep = self.policy.keep(view)
        except Exception:  # a loaded policy's bug must not stop this node scheduling
            log.exception("placement policy %r failed: using the built-in rule", self.policy)
            keep = _BUILTIN.keep(view)
        excess = len(q) - keep
        if excess <= 0:
            return
        local_busy = sum(1 for w in g.workers if w.inflight and w.alive and not w.blocked)
        # Tasks away per CPU of the cap: one when they are long (so max_workers bounds
        # how many run at once, cluster-wide); a batch's worth when they are short, so a
        # node busy with them never idles a round trip between two.
        est = max(s.batch.estimate(q[-1].fn_id), 1e-6)
        per_slot = max(1, min(64, int(s.batch.target_s / est)))
        # (a cap of 0 -- a pool sized while its cluster had no CPUs -- still sends one:
        # else its tasks would wait here for good, on a node that may never run them)
        room = max(1, g.max_workers) * per_slot - local_busy - \
            self._away_per_group.get(g.group_id, 0)
        n = min(excess, room)
        batches: dict[str, list] = {}
        for _ in range(max(0, n)):
            t = q.pop()  # the tail: the task that would wait longest
            gs = self._start_locked(t, gss)
            if gs is None:
                continue
            try:
                msg = self._spillback_locked(t, g, gs)
            except Exception as exc:  # noqa: BLE001 - e.g. its input's segment is gone
                log.warning("could not spill task %#x (%s): it stays here", t.task_id, exc)
                q.append(t)
                break
            batches.setdefault(gs, []).append(msg)
        for gs, msgs in batches.items():
            self._send(gs, msgs)

    def forward_locked(self, g: WorkerGroup, calls: list, node: str) -> None:
        """Calls of another node's actor (``g`` is its proxy here) go to that node, in
        order, as spilled tasks do (``node._actor_calls``)."""
        msgs = []
        sent = []
        for t in calls:
            if not self._started_locked(t):
                continue
            try:
                msgs.append(self._spillback_locked(t, g, node))
                sent.append(t)
            except Exception as exc:  # noqa: BLE001 - e.g. its input's segment is gone
                self._s.finish_locked(t, False, _payload.dumps_error(exc))
        if msgs:
            if self.actor_logs is not None:
                self.actor_logs.forwarded_locked(g, sent)
            self._send(node, msgs)

    def _started_locked(self, t: Task) -> bool:
        """``t`` leaves for another node: its future runs (False: it was cancelled, and
        is skipped)."""
        if t.future is not None and not t.started:
            if not t.future.set_running_or_notify_cancel():
                self._s.skip_cancelled_locked(t)
                return False
        t.started = True
        return True

    def _start_locked(self, t: Task, gss: list) -> Optional[str]:
        """``t`` leaves for another node: its future runs (None: it was cancelled, and
        is skipped); the global scheduler to send it to, in turn."""
        if not self._started_locked(t):
            return None
        gs = gss[self._rr % len(gss)]
        self._rr += 1
        return gs

    def _spillback_locked(self, t: Task, g: WorkerGroup, gs: str) -> m.RemoteTask:
        """The message for ``t`` (raises, leaving ``t`` unchanged, if its values cannot be
        read); records it as away."""
        s = self._s
        deps = None
        if t.args:
            s.store.restore_payload(t.args)  # a spilled-to-disk argument block comes back
        lenders: set = set()
        inputs = s.inputs_locked(t)
        if inputs:
            for _oid, ok, p in inputs:
                if ok:
                    s.store.restore_payload(p)
            deps = tuple((oid, ok, self._outgoing(p, lenders) if ok else p)
                         for oid, ok, p in inputs)
        ctx = g.mp_context
        cfg = () if g.actor is not None else (  # (an actor's call: its node has the group)
            g.max_workers, ctx.get_start_method() if ctx is not None else "",
            g.initializer, g.max_tasks, g.max_attempts)
        msg = m.RemoteTask(t.task_id, self.address, g.group_id, cfg, t.fn_id,
                           s.function_payload(t.fn_id),
                           self._outgoing(t.args) if t.args else t.args, deps,
                           g.cwd or os.getcwd(), tuple(g.sys_path or sys.path), g.workdir,
                           _resources.to_wire(_limits.request_with_limits(t)))
        t.attempts += 1
        t.estimate_s = s.batch.estimate(t.fn_id)
        s.away_locked(t)
        a = self.away[t.task_id] = _Away(t, gs, time.monotonic())
        a.refs = tuple(ref[2] for _oid, ok, p in deps or ()
                       if ok and (ref := _pull.parse_remote(p)) is not None)
        a.lenders = lenders
        self._away_per_group[g.group_id] = self._away_per_group.get(g.group_id, 0) + 1
        s.control.log_event(t.task_id, "spill", time.time(), 0)
        return msg

    def _outgoing(self, payload: bytes, lenders: Optional[set] = None) -> bytes:
        """A value for another node: a reference when it is large and in this node's
        store (the node that runs the task pulls it, once), else its bytes inline. A
        result pulled from a node that still lends it (``lent_copies``): a reference
        to the lender's copy, so that the task is placed there and pulls nothing
        (its lender added to ``lenders``)."""
        ref = _values.stored(payload)
        if ref is not None and ref[2] >= REFERENCE_MIN:
            lent = self.lent_copies.get(ref[1]) if lenders is not None else None
            if lent is not None and time.monotonic() - lent[3] < LEND_USE_S:
                lenders.add(lent[0])  # type: ignore[union-attr]
                theirs = _values._STORED_HEAD.pack(_values.TAG_STORED, ref[0], lent[2]) \
                    + lent[1].encode()
                return _pull.remote_ref(theirs, lent[0])
            return _pull.remote_ref(payload, self.address)
        return _inline.inline_payload(payload)

    # -- outcomes ------------------------------------------------------------------------
    def _take_locked(self, task_id: int) -> Optional[Task]:
        a = self.away.pop(task_id, None)
        if a is None:
            return None
        gid = a.task.group.group_id
        left = self._away_per_group.get(gid, 1) - 1
        if left > 0:
            self._away_per_group[gid] = left
        else:
            self._away_per_group.pop(gid, None)
        return a.task

    def _home_locked(self, t: Task, charge: bool) -> None:
        """Back into the local queue (front: it has waited already). A call of another
        node's actor cannot go back: the calls after it may be there already (and it may
        have run), so it fails."""
        if t.group.actor is not None:
            self._actor_lost_locked(t, "its call did not reach the actor's node, or may "
                                       "have run there without an answer")
            return
        if not charge:
            t.attempts -= 1
        self._s.return_task_locked(t)

    def _on_rejected_locked(self, h: Any, msg: m.SpillbackRejected) -> None:
        t = self._take_locked(msg.task_id)
        if t is not None:
            log.debug("spill of task %#x rejected: %s", msg.task_id, msg.reason)
            unmet = self._unmet.get(t.task_id)
            if unmet is not None:  # no node has what it asks (yet): offer it again soon
                self._s.back_locked(t)
                t.attempts -= 1
                unmet[1] = msg.reason
                self._parked.append((time.monotonic() + _BACKOFF_S, t.group, t))
                return
            self._paused_until = time.monotonic() + _BACKOFF_S
            if self._s.cpu_limit == 0:  # and this node cannot run it either
                self._homeless.setdefault(t.task_id, [time.monotonic(), "", t.group])[1] = \
                    msg.reason
            self._home_locked(t, charge=False)

    def _on_run_here_locked(self, h: Any, msg: m.RunHere) -> None:
        """The global scheduler placed this task on its origin (this node): it runs
        here, never spilled again (its strategy is marked ``HERE``)."""
        t = self._take_locked(msg.task_id)
        if t is not None:
            self._unmet.pop(t.task_id, None)
            self._homeless.pop(t.task_id, None)
            if t.req is not None:
                t.req = t.req._replace(strategy=HERE)
            self._home_locked(t, charge=False)

    def _on_failed_locked(self, h: Any, msg: m.PlacementFailed) -> None:
        """The task can never be placed as it asks: it fails with ``PlacementError``."""
        t = self._take_locked(msg.task_id)
        if t is not None:
            self._unmet.pop(t.task_id, None)
            self._homeless.pop(t.task_id, None)
            self._s.finish_locked(t, False, _payload.dumps_error(PlacementError(msg.reason)))

    def _on_accepted_locked(self, h: Any, msg: m.Accepted) -> None:
        a = self.away.get(msg.task_id)
        if a is not None:
            a.node = h.address if h.address else msg.node_id
            a.accepted_at = time.monotonic()
            self._unmet.pop(msg.task_id, None)  # placed: a node has what it asks
            if self._homeless:  # a node takes this group's tasks: the rest wait their turn
                g = a.task.group
                for tid in [k for k, v in self._homeless.items() if v[2] is g]:
                    del self._homeless[tid]
            for name in a.refs:  # it will copy these inputs, and keep them for later tasks
                self._borrowers.setdefault(name, set()).add(a.node)

    def unreachable_locked(self, address: str, msgs: list) -> None:
        """Links could not deliver these messages: take their tasks home."""
        calls: dict = {}
        for msg in msgs:
            if isinstance(msg, m.RemoteTask):
                t = self._take_locked(msg.task_id)
                if t is None:
                    pass
                elif t.group.actor is not None:  # its actor's node: nowhere else to go
                    calls.setdefault(t.group.group_id, (t.group, []))[1].append(t)
                else:
                    self._home_locked(t, charge=False)
        self._actor_calls_lost_locked(calls, f"its node {address} cannot be reached")

    def peer_closed_locked(self, h: Any) -> None:
        """A link closed: a global scheduler's (unplaced tasks come home) or a node's
        (its tasks are retried)."""
        self._lost_locked({h.address, h.peer_id})

    def node_lost_locked(self, address: str) -> None:
        """The node table says ``address`` stopped heartbeating: retry its tasks."""
        self._lost_locked({address}, gs_too=False)

    def _lost_locked(self, names: set, gs_too: bool = True) -> None:
        self._forget_lenders_locked(names)
        lost = [a for a in self.away.values()  # (a result being pulled: its puller decides)
                if (gs_too and a.node is None and a.gs in names) or
                (a.node is not None and a.node in names and not a.pulling)]
        calls: dict = {}
        where = ""
        for a in lost:
            t = self._take_locked(a.task.task_id)
            if t is None:
                continue
            g = t.group
            if g.actor is not None:  # (a call may have changed the actor: not run again)
                calls.setdefault(g.group_id, (g, []))[1].append(t)
                where = a.node or a.gs
                continue
            if a.node is None:
                self._home_locked(t, charge=False)
                continue
            if t.attempts < g.max_attempts and g.broken is None:
                log.warning("node %s went away running task %#x: retrying it", a.node,
                            t.task_id)
                self._home_locked(t, charge=True)
            else:
                err = WorkerCrashedError(
                    f"the node running this task ({a.node}) went away, on attempt "
                    f"{t.attempts} of {g.max_attempts}", attempts=t.attempts)
                self._s.finish_locked(t, False, _payload.dumps_error(err))

        if calls:
            self._actor_calls_lost_locked(calls, f"its node {where} went away")

    def _actor_calls_lost_locked(self, calls: dict, reason: str) -> None:
        """Calls of other nodes' actors (group id -> (proxy group, its calls in the order
        sent)) lost with their node: the actor is rebuilt elsewhere, with them
        (``_actor_rebuild``), or they fail."""
        for g, ts in calls.values():
            if self.actor_logs is None or not self.actor_logs.calls_lost_locked(g, ts, reason):
                for t in ts:
                    self._actor_lost_locked(t, reason)

    def take_away_locked(self, g: WorkerGroup) -> list:
        """The tasks of ``g`` away at other nodes (not being pulled), taken back."""
        return [t for t in (self._take_locked(tid) for tid, a in list(self.away.items())
                            if a.task.group is g and not a.pulling) if t is not None]

    def _actor_lost_locked(self, t: Task, reason: str) -> None:
        """A call of another node's actor is lost with that node: it fails."""
        name = t.group.actor.cfg.name
        self._s.finish_locked(t, False, _payload.dumps_error(actor_died(name, reason)))

    def fail_group_locked(self, g: WorkerGroup, err: bytes) -> None:
        """The group broke or was terminated: its tasks away fail now (late results are
        dropped)."""
        nodes = set()
        for a in [a for a in self.away.values() if a.task.group is g]:
            if a.node is not None:
                nodes.add(a.node)
            t = self._take_locked(a.task.task_id)
            if t is not None:
                self._s.finish_locked(t, False, err)
        parked = [p for p in self._parked if p[1] is g]
        if parked:
            self._parked = [p for p in self._parked if p[1] is not g]
            for _, _, t in parked:
                self._unmet.pop(t.task_id, None)
                if t.future is not None and not t.started:
                    t.future.set_running_or_notify_cancel()
                    t.started = True
                self._s.finish_locked(t, False, err)
        for node in nodes:  # they stop running its tasks, and free its workers there
            self._send(node, [m.DropGroup(self.address, g.group_id,
                                          g.broken or "the pool was terminated")])

    # -- periodic ------------------------------------------------------------------------
    def wants_tick(self) -> bool:
        """Tasks parked or away (timeouts, retries): the scheduler's IO loop keeps
        ticking while there are (``protocol._ioloop``), and while tasks are queued."""
        return bool(self._parked or self.away or self._homeless)

    def tick_locked(self) -> None:
        now = time.monotonic()
        if self._parked:
            self._retry_parked_locked(now)
        stale = [a for a in self.away.values()
                 if a.node is None and now - a.sent_at > self.place_timeout_s]
        for a in stale:
            t = self._take_locked(a.task.task_id)
            if t is not None:
                log.warning("no node accepted spilled task %#x within %g s: taking it back",
                            t.task_id, self.place_timeout_s)
                self._home_locked(t, charge=False)
        for g in list(self._s.groups_locked()):
            if g.queue:
                self.consider_locked(g)
        if self._s.cpu_limit == 0:
            self._homeless_locked(now)
        if self.away and now >= self._next_check:
            self._next_check = now + self.check_s
            self._ask_runners_locked(now)
