"""Bottom-up scheduling, the origin's half: spilling tasks this node should not wait for.

    local queue ──(estimated wait > threshold)──▶ RemoteTask ──▶ global scheduler
        ▲                                                              │ places it
        │ requeue (rejected / GS lost / node lost)                      ▼
    finish_locked(task) ◀── TaskResult ◀── Accepted ◀──────── another node runs it

A node runs a task locally unless it would wait too long for one of the node's CPUs:
the k-th queued task (with ``free`` CPUs idle, ``cpus`` in all, tasks of ``avg`` s) waits
about ``(k - free) / cpus * avg``; the ones past ``threshold_s`` go to a global
scheduler, tail first (the head keeps its place in line). A function never measured may
be long: what cannot start at once goes. A node with no CPUs spills
everything. An executor's ``max_workers`` caps its tasks in flight cluster-wide: local
busy workers plus tasks away.

The task stays this node's: its record (future or owner, pinned inputs, attempts) lives
here until a ``TaskResult`` comes back; the function, arguments and input values travel
inline, so the node that runs it needs nothing from here. What can go wrong:

- no other node can take it (``SpillRejected``): it goes back to the local queue, and
  spilling pauses briefly;
- the global scheduler's link closes before any node accepted it, or nobody accepts it
  within ``place_timeout_s``: back to the local queue, uncharged (it may have started
  elsewhere after all -- the first result to arrive wins, later ones are dropped);
- the node running it goes away (its link closes): it is retried, charging the attempt
  as a worker death does, up to the group's ``max_attempts``;
- its large result is lent (``_remote``) and this node pulls it; the lender dies or
  frees it before the pull is complete: the same -- run again, charged, and once the
  attempts are used the task fails with ``ObjectLostError`` naming the result and node
  (the pull, not the link's closing, decides: the two race when the lender dies).

Data locality: after pulling a lent result, this node leaves it lent (``lent_copies``,
released when its own copy is freed) and, for ``LEND_USE_S``, sends the tasks that take
it a reference to the *lender's* copy. The global scheduler's policy then sees the input
on the lender (``missing_bytes`` 0 there) and places them there when it can start them
soon enough; the lender runs them on its copy, with nothing to pull. A task that finds
that copy gone (``ObjectLostError`` from the lender) is offered again, uncharged, with
this node's copy; a lender that goes away is forgotten (``_lost_locked``).

A task asking for resources this node does not have at all (``_resdispatch``: more
CPUs or GPUs, a custom resource it lacks) goes to a global scheduler at once
(``unmet``), which places it only on a node that has them. While no node has them
(``SpillRejected``, or no global scheduler linked) it is parked here and offered again
every ``_BACKOFF_S``; after ``grace_s`` (``DPOOL_RESOURCE_GRACE_S``, default 10 s: time
for such a node to join) it fails with ``ResourceError``, saying what it asked and what
the nodes offer.

Nothing may hold a task that nobody will act on (issue 17):

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

How many queued tasks a node keeps is the cluster's placement policy's call
(``PlacementPolicy.keep``; the built-in rule is the formula above), named by
``$DPOOL_PLACEMENT_POLICY`` (``dpool start --placement-policy`` sets it). A task the
global scheduler can never place as it asks (``PlacementFailed``: a hard
``NodeAffinity`` to a node not in the cluster) fails with ``PlacementError``.

Runs under the scheduler's lock (called from its handlers and ticks: the ``_locked``
methods); ``_pull_result`` runs on a thread of its own and takes the lock.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Optional

from dpool.errors import ObjectLostError, WorkerCrashedError
from dpool.objects import _inline, _payload, _segment, _values
from dpool.protocol import _messages as m
from dpool.scheduling import Group, SchedulerAPI, Task, _resources
from dpool.scheduling._placement_policy import (
    HERE,
    SPREAD,
    LeastWait,
    LocalQueue,
    PlacementError,
    PlacementPolicy,
    strategy_from_wire,
)
from dpool.scheduling._placement_policy import load as load_policy
from dpool.transfer import _pull

log = logging.getLogger("dpool.scheduling")

_BACKOFF_S = 0.2
# Stored inputs this large go by reference (pulled by the runner): every stored value, at
# the default store threshold. Inline, a large input's bytes cross both peers' IO loops;
# by reference the runner pulls them on a kept connection (bench/NOTES.md).
REFERENCE_MIN = 256 << 10
GRACE_S = 10.0  # default of DPOOL_RESOURCE_GRACE_S
# After pulling a lent result, this node points tasks that take it at the lender's copy
# for this long (data locality: the global scheduler then places them there, with
# nothing to pull). The lender keeps it ``_remote.lend_timeout_s`` (60 s) unreleased.
LEND_USE_S = 20.0
_CHECK_S = 3.0  # how often a node running tasks for this one is asked which it still has


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


class _Away:
    __slots__ = ("task", "gs", "node", "sent_at", "pulling", "refs", "accepted_at",
                 "strikes", "lenders")

    def __init__(self, task: Task, gs: str, sent_at: float) -> None:
        self.task = task
        self.gs = gs
        self.node: Optional[str] = None
        self.sent_at = sent_at
        self.pulling = False  # done there; its lent result is being pulled from ``node``
        self.refs: tuple = ()  # segments of this store it was sent references to
        self.accepted_at = 0.0  # when ``node`` said Accepted
        self.strikes = 0  # answers in a row from ``node`` that it has no trace of it
        self.lenders: set = set()  # nodes whose lent copies its inputs were sent from


class Spiller:
    """The node's ``SpillService``: decides what leaves, and keeps each task's record
    until its outcome comes back."""

    def __init__(self, scheduler: SchedulerAPI, node_address: str,
                 send: Callable[[str, list], None], schedulers: Callable[[], list],
                 threshold_s: float = 0.005, place_timeout_s: float = 10.0,
                 local_groups: Optional[Callable[[Group], bool]] = None,
                 mirror: Optional[Callable[[Group], bool]] = None,
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
        scheduler.register_handler(m.SpillRejected.CODE, self._on_rejected_locked)
        scheduler.register_handler(m.PlacementFailed.CODE, self._on_failed_locked)
        scheduler.register_handler(m.RunHere.CODE, self._on_run_here_locked)
        scheduler.register_handler(m.Accepted.CODE, self._on_accepted_locked)
        scheduler.register_handler(m.TaskResult.CODE, self._on_result_locked)
        scheduler.register_handler(m.TasksKnown.CODE, self._on_known_locked)
        scheduler.attach_services(spiller=self)

    # -- deciding ------------------------------------------------------------------------
    def consider_locked(self, g: Group) -> None:
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
                msg = self._spill_locked(t, g, gs)
            except Exception as exc:  # noqa: BLE001 - e.g. its input's segment is gone
                log.warning("could not spill task %#x (%s): it stays here", t.task_id, exc)
                q.append(t)
                break
            batches.setdefault(gs, []).append(msg)
        for gs, msgs in batches.items():
            self._send(gs, msgs)

    def _start_locked(self, t: Task, gss: list) -> Optional[str]:
        """``t`` leaves for another node: its future runs (None: it was cancelled, and
        is skipped); the global scheduler to send it to, in turn."""
        if t.future is not None and not t.started:
            if not t.future.set_running_or_notify_cancel():
                self._s.skip_cancelled_locked(t)
                return None
        t.started = True
        gs = gss[self._rr % len(gss)]
        self._rr += 1
        return gs

    def _spill_locked(self, t: Task, g: Group, gs: str) -> m.RemoteTask:
        """The message for ``t`` (raises, leaving ``t`` unchanged, if its values cannot be
        read); records it as away."""
        s = self._s
        deps = None
        if t.args:
            s.store.restore_payload(t.args)  # a spilled-to-disk argument block comes back
        lenders: set = set()
        if t.deps:
            for _oid, ok, p in t.deps:
                if ok:
                    s.store.restore_payload(p)
            deps = tuple((oid, ok, self._outgoing(p, lenders) if ok else p)
                         for oid, ok, p in t.deps)
        ctx = g.mp_context
        cfg = (g.max_workers, ctx.get_start_method() if ctx is not None else "",
               g.initializer, g.max_tasks, g.max_attempts)
        msg = m.RemoteTask(t.task_id, self.address, g.group_id, cfg, t.fn_id,
                           s.function_payload(t.fn_id),
                           self._outgoing(t.args) if t.args else t.args, deps,
                           g.cwd or os.getcwd(), tuple(g.sys_path or sys.path), g.workdir,
                           _resources.to_wire(t.req))
        t.attempts += 1
        t.est = s.batch.estimate(t.fn_id)
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
        """Back into the local queue (front: it has waited already)."""
        if not charge:
            t.attempts -= 1
        self._s.return_task_locked(t)

    def _on_rejected_locked(self, h: Any, msg: m.SpillRejected) -> None:
        t = self._take_locked(msg.task_id)
        if t is not None:
            log.debug("spill of task %#x rejected: %s", msg.task_id, msg.reason)
            unmet = self._unmet.get(t.task_id)
            if unmet is not None:  # no node has what it asks (yet): offer it again soon
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

    # -- resources this node lacks ---------------------------------------------------------
    def unmet_locked(self, g: Group, t: Task, reason: str) -> bool:
        """``t`` asks for resources this node never has (``reason``): send it to a node
        that has them, or park it until one joins; after the grace period, fail it.
        False: not this spiller's (a mirror group's task: the caller fails it)."""
        if self._mirror(g):
            return False
        now = time.monotonic()
        gss = self._schedulers()
        strategy = strategy_from_wire(t.req.strategy) if t.req.strategy else None
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
            msg = self._spill_locked(t, g, gs)
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

    def _freed_locked(self, name: str) -> None:
        """Segment ``name`` of this node's store was freed (its last reference died):
        the nodes that may keep a copy of it free theirs (``_remote``), and the node
        that lent it, if it still does."""
        for node in self._borrowers.pop(name, ()):
            self._send(node, [m.ReleaseLent(name)])
        lent = self.lent_copies.pop(name, None)
        if lent is not None:
            for node in {lent[0], *self._borrowers.pop(lent[1], ())}:
                self._send(node, [m.ReleaseLent(lent[1])])

    def _lender_lost_locked(self, t: Task, a: _Away, payload: bytes) -> bool:
        """``t`` failed with its input gone from the lender it was pointed at (the
        lender died, or no longer lends it): forget that lender's copies and offer
        the task again, uncharged, with this node's own copies (True)."""
        try:
            err = _payload.loads_error(payload)
        except Exception:  # noqa: BLE001 - not an error this node can read: the task's
            return False
        if not isinstance(err, ObjectLostError) or (
                err.node is not None and err.node not in a.lenders):
            return False
        self._forget_lenders_locked(a.lenders)
        log.warning("task %#x: an input lent by %s is gone (%s): sending it again with "
                    "this node's copy", t.task_id, ", ".join(sorted(a.lenders)), err)
        self._home_locked(t, charge=False)
        return True

    def _forget_lenders_locked(self, nodes: set) -> None:
        for name, lent in list(self.lent_copies.items()):
            if lent[0] in nodes:
                del self.lent_copies[name]

    def _on_result_locked(self, h: Any, msg: m.TaskResult) -> None:
        a = self.away.get(msg.task_id)
        t = self._take_locked(msg.task_id)
        if t is None:
            return  # a late duplicate: it was retried and finished already
        if a is not None and a.lenders and not msg.ok and \
                self._lender_lost_locked(t, a, msg.payload):
            return
        self._unmet.pop(t.task_id, None)
        self._homeless.pop(t.task_id, None)
        s = self._s
        s.batch.observe(t.fn_id, msg.duration)
        ok, payload = msg.ok, msg.payload
        ref = _pull.parse_remote(payload) if ok else None
        if ref is not None:  # a large result, lent: pull it into this node's store
            a = self.away[t.task_id] = _Away(t, "", time.monotonic())  # out till pulled
            a.node, a.pulling = ref[1], True
            gid = t.group.group_id
            self._away_per_group[gid] = self._away_per_group.get(gid, 0) + 1
            threading.Thread(target=self._pull_result, args=(t, ref), daemon=True,
                             name="dpool-pull-result").start()
            return
        if ok:  # a large result joins this node's store: its drivers and workers map it
            name = _segment.segment_name(s.store.owner_pid, t.task_id)
            stored = None
            try:
                stored = _inline.into_store(payload, name) or payload
                s.store.adopt(stored)
                payload = stored
            except Exception as exc:  # noqa: BLE001 - e.g. full: the task fails with it
                if stored is not None and stored is not payload:
                    _segment.unlink(name)
                ok, payload = False, _payload.dumps_error(exc)
        s.finish_locked(t, ok, payload)
        g = t.group
        if g.queue:
            self.consider_locked(g)  # room away again: do not wait for the next tick

    def _pull_result(self, t: Task, ref: tuple) -> None:
        """Fetch a lent result (own thread), then finish its task and release the lend."""
        s = self._s
        size, holder, name = ref
        lost: Optional[ObjectLostError] = None
        try:
            payload = _pull.fetch(holder, self.token, name, t.task_id, s.store.owner_pid,
                                  size)
            ok = True
        except ObjectLostError as exc:  # the holder died (part-way) or freed it
            lost = ObjectLostError(
                f"the result of task {t.task_id:#x} is lost: its only copy was on node "
                f"{holder}, which ran the task ({exc})", object_id=t.task_id, node=holder)
            lost.__cause__ = exc
            payload, ok = _payload.dumps_error(lost), False
        except Exception as exc:  # noqa: BLE001 - the task fails with it
            payload, ok = _payload.dumps_error(exc), False
        with s.lock:
            t_away = self._take_locked(t.task_id)
            g = t.group
            if t_away is None:  # the group failed meanwhile: the task is finished
                if ok:
                    _segment.unlink(_values.stored(payload)[1])  # type: ignore[index]
            elif lost is not None and t.attempts < g.max_attempts and g.broken is None:
                # As if the node had died running it (``_lost``): run it again.
                log.warning("%s: running it again", lost)
                self._home_locked(t, charge=True)
            else:
                if ok:
                    try:
                        s.store.adopt(payload)
                    except Exception as exc:  # noqa: BLE001 - e.g. the store is full
                        _segment.unlink(_values.stored(payload)[1])  # type: ignore[index]
                        payload, ok = _payload.dumps_error(exc), False
                if ok:  # the lender keeps its copy until ours is freed (``_freed_locked``)
                    ours = _values.stored(payload)[1]  # type: ignore[index]
                    self.lent_copies[ours] = (holder, name, size, time.monotonic())
                    name = ""
                s.finish_locked(t, ok, payload)
            out = s.take_out_locked()
        s.deliver(out)
        if name:
            self._send(holder, [m.ReleaseLent(name)])

    def unreachable_locked(self, address: str, msgs: list) -> None:
        """Links could not deliver these messages: take their tasks home."""
        for msg in msgs:
            if isinstance(msg, m.RemoteTask):
                t = self._take_locked(msg.task_id)
                if t is not None:
                    self._home_locked(t, charge=False)

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
        for a in lost:
            t = self._take_locked(a.task.task_id)
            if t is None:
                continue
            if a.node is None:
                self._home_locked(t, charge=False)
                continue
            g = t.group
            if t.attempts < g.max_attempts and g.broken is None:
                log.warning("node %s went away running task %#x: retrying it", a.node,
                            t.task_id)
                self._home_locked(t, charge=True)
            else:
                err = WorkerCrashedError(
                    f"the node running this task ({a.node}) went away, on attempt "
                    f"{t.attempts} of {g.max_attempts}", attempts=t.attempts)
                self._s.finish_locked(t, False, _payload.dumps_error(err))

    def fail_group_locked(self, g: Group, err: bytes) -> None:
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

    # -- safety nets: nobody may hold a task that nobody will act on -----------------------
    def _homeless_locked(self, now: float) -> None:
        """A node with no CPUs runs nothing itself: a task queued here that no node took
        within ``grace_s`` (none with CPUs joined, no global scheduler linked, ...)
        fails with ``ResourceError`` instead of waiting for good."""
        gss = self._schedulers()
        for g in list(self._s.groups_locked()):
            if not g.queue or g.broken is not None or self._mirror(g):
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
