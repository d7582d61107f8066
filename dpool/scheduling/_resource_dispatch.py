"""The local scheduler's resource path: tasks with a resource request (``_resources.Request``).

    group.queue ──its head has a request──▶ _route_with_request_locked
        ├─ asks where to run, or for a bundle held elsewhere: a node's spillback (the
        │  embedded runtime runs it here, or fails it with PlacementError)
        ├─ can never be met here: a node's spillback, else ResourceError at once
        └─▶ group.by_request[request] ──all of it free──▶ an idle worker, alone,
                                                           holding an Allocation

A task without a request never comes here (``_dispatch_locked`` reads ``t.req``, nothing
more). One with a request waits in its group's ``by_request``: a queue per distinct
request, first come first served within it; a request that must wait does not hold back
another. It starts when all it asks is free: its CPUs within the group's ``max_workers``
(busy workers plus ``WorkerGroup.extra``) and, on a node, within ``cpu_limit``; its GPUs,
memory and custom resources from the ``Ledger`` every group shares. A bundle's task takes
all of it from its bundle (``_bundle_ledger``). While one waits for CPUs or a worker, the
group is ``starved``: its tasks without a request wait too. It runs alone on its worker,
holding its ``Allocation`` until it ends or leaves the worker; in a nested wait
(``Blocked``) its CPUs are given back, its GPUs are not.

GPUs: a worker's ``CUDA_VISIBLE_DEVICES`` is fixed when it starts. A worker bound to devices
(``WorkerHandle.gpus``) runs only tasks given exactly those; one started while GPUs are held
sees only the others (``WorkerHandle.sees``). A worker that is bound, runs a task with an
allocation, or can see a held GPU is *fenced*: it takes no task without a request. Idle
fenced workers are retired first when a process slot is needed. A task already running
when a GPU it sees is taken: compat/DIFFERENCES.md.

Lock rule (``_api``): ``_locked`` methods expect the scheduler's lock held;
``_waiting_for_resources`` is read without it (a hint).
"""

from __future__ import annotations

import os
import time
from collections import deque

from dpool import _log
from dpool.errors import PlacementError, ResourceError
from dpool.objects import payload as _payload
from dpool.protocol import messages as m
from dpool.scheduling._core import SchedulerCore
from dpool.scheduling._records import Task, WorkerGroup, WorkerHandle
from dpool.scheduling._resources import BUNDLE, HERE, Ledger, Request
from dpool.scheduling._states import NEXT, SEND, illegal

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Optional

    from dpool.scheduling._bundle_ledger import BundleLedger

log = _log.getLogger("dpool.scheduling")

_now = time.time


class ResourceDispatch(SchedulerCore):
    ledger: Optional[Ledger]
    ledger_spec: Optional[dict]
    # placement-group bundles held here (``_bundle_ledger``); made by the first hold, so
    # a runtime that never holds one pays nothing
    _bundles: Optional[BundleLedger] = None

    def resources_locked(self) -> Ledger:
        """This runtime's (or node's) ledger, detected on first use."""
        if self.ledger is None:
            from dpool.scheduling import _detect

            self.ledger = _detect.embedded_ledger(self.ledger_spec)
        return self.ledger

    def set_resources_locked(self, ledger: Ledger) -> None:
        """What this runtime offers from now on (nothing may be held)."""
        if self.ledger is not None and self.ledger.held:
            raise ResourceError("cannot change the runtime's resources while tasks hold "
                                "some of them")
        self.ledger = ledger
        # Workers bound to (or started without) devices of the old offer: their sets
        # mean nothing now. None of them runs a task with GPUs (nothing is held).
        for g in self._groups.values():
            for w in g.workers:
                if w.alive and not w.inflight and w.leased is None and (
                        w.gpus is not None or w.sees is not None):
                    self._retire_worker_locked(w)

    # -- entering ------------------------------------------------------------------------
    def _route_with_request_locked(self, g: WorkerGroup, t: Task) -> None:
        """A task with a request reached the head of its group's queue."""
        r = t.req
        assert r is not None  # (the caller routes only tasks with a request here)
        st = r.strategy
        if st is not None and st != HERE:
            if st[0] == BUNDLE:
                self._route_bundle_locked(g, t)
                return
            if self._place_strategy_locked(g, t):
                return
        try:
            reason = self._impossible_locked(g, r)
        except Exception as exc:  # noqa: BLE001 - e.g. a malformed DPOOL_NUM_GPUS
            self.fail_unmet_locked(t, f"cannot tell what this runtime offers: {exc}")
            return
        if reason is not None:
            if self._spillback is not None and self._spillback.unmet_locked(g, t, reason):
                return  # a node of a cluster: another node may have it
            self.fail_unmet_locked(t, reason)
            return
        self._wait_for_resources_locked(g, t)

    def _place_strategy_locked(self, g: WorkerGroup, t: Task) -> bool:
        """``t`` asks where to run (``scheduling=``): True if it went to a global
        scheduler (or failed); False: it runs here (its strategy is marked ``HERE``).

        A node hands it to its spillback at once, which sends it to a global scheduler
        (``unmet_locked``; False there means run it here: it is a task another node
        placed here, or a soft strategy with no global scheduler to ask). The embedded
        runtime is one host: every strategy means run here, but a hard ``NodeAffinity``
        to another node can never be met (``PlacementError``)."""
        from dpool.placement import NodeAffinity, strategy_from_wire

        r = t.req
        assert r is not None
        s = strategy_from_wire(r.strategy)
        here = os.environ.get("DPOOL_NODE_ID") or "local"  # (a node sets it: its address)
        if isinstance(s, NodeAffinity) and s.node == here:
            t.req = r._replace(strategy=HERE)
            return False
        sp = self._spillback
        if sp is not None:
            if sp.unmet_locked(g, t, f"the task asks to be placed ({_strategy_text(s)})"):
                return True
        elif isinstance(s, NodeAffinity) and not s.soft:
            self.fail_placement_locked(t, PlacementError(
                f"the task must run on node {s.node!r} (NodeAffinity, soft=False), but "
                f"this is the embedded runtime: its only node is this host, "
                f"{here!r} (set DPOOL_ADDRESS to run on a cluster)"))
            return True
        t.req = r._replace(strategy=HERE)
        return False

    def _route_bundle_locked(self, g: WorkerGroup, t: Task) -> None:
        """``t`` runs in a placement group's bundle: here if this scheduler holds it
        (it waits in ``g.by_request`` for the bundle's room), else on the node that does (a node
        hands it to a global scheduler, which knows where its group's bundles are)."""
        r = t.req
        assert r is not None
        _, pg_id, index = r.strategy
        bl = self._bundles
        which = f"bundle {index}" if index >= 0 else "a bundle"
        if bl is not None and bl.holds(pg_id, index):
            why = bl.never_fits(pg_id, index, r)
            if why is None and r.cpus > g.max_workers:
                why = (f"the task asks for {r.cpus} CPUs, more than its executor's "
                       f"max_workers ({g.max_workers})")
            if why is not None:
                self.fail_placement_locked(t, PlacementError(why))
                return
            self._wait_for_resources_locked(g, t)
            return
        sp = self._spillback
        if sp is not None and sp.unmet_locked(
                g, t, f"the task runs in {which} of placement group {pg_id:#x}, held by "
                "another node"):
            return
        self.fail_placement_locked(t, PlacementError(
            f"the task asks to run in {which} of placement group {pg_id:#x}, which no node "
            "holds (the group was removed, is not ready yet, or lost a node)"))

    def _wait_for_resources_locked(self, g: WorkerGroup, t: Task) -> None:
        waiting = g.by_request.get(t.req)
        if waiting is None:
            waiting = g.by_request[t.req] = deque()
        waiting.append(t)
        self.io.poke()  # the tick looks at tasks waiting for resources
        self._dispatch_requests_locked(g)

    # -- placement-group bundles -------------------------------------------------------------
    def _cpu_total_locked(self) -> Optional[int]:
        """A node's CPUs, those its bundles reserve included (``cpu_limit`` leaves out
        the reserved ones that no task uses)."""
        if self.cpu_limit is None:
            return None
        bl = self._bundles
        return self.cpu_limit + (bl.idle_cpus if bl is not None else 0)

    def hold_bundle_locked(self, pg_id: int, index: int, req: Request,
                           host_cpus: int = 0) -> Optional[str]:
        """Reserve ``req`` for bundle ``index`` of placement group ``pg_id``: None when
        held, else why not now. ``host_cpus``: the CPUs to count on the embedded runtime
        (a node counts its own)."""
        bl = self._bundles
        if bl is None:  # the first placement group here: its module loads now
            from dpool.scheduling._bundle_ledger import BundleLedger

            bl = self._bundles = BundleLedger(self.resources_locked())
        bl.ledger = self.resources_locked()
        total = self._cpu_total_locked()
        idle = bl.idle_cpus
        why = bl.hold((pg_id, index), req, total if total is not None else host_cpus)
        self._bundle_cpus_moved_locked(idle)
        if why is None:
            self._refence_all_locked()
        return why

    def free_bundles_locked(self, pg_id: int, index: Optional[int] = None) -> int:
        """Give up the bundles of ``pg_id`` held here (``index``: that one only); tasks
        waiting to run in one that is now gone fail with ``PlacementError``. Returns how
        many were freed."""
        bl = self._bundles
        if bl is None:
            return 0
        idle = bl.idle_cpus
        keys = bl.keys(pg_id) if index is None else [(pg_id, index)]
        n = sum(1 for k in keys if bl.free(k))
        self._bundle_cpus_moved_locked(idle)
        for g in list(self._groups.values()):
            a = g.actor
            held = getattr(a.alloc, "key", None) if a is not None else None  # its bundle
            if held is not None and held[0] == pg_id and not bl.holds(*held) and \
                    not a.host:  # type: ignore[union-attr]
                self.kill_actor_locked(g, f"its placement group {pg_id:#x} was removed "
                                          "(or lost a node)")
            for req, waiting in list(g.by_request.items()):
                st = req.strategy
                if st is None or st[0] != BUNDLE or st[1] != pg_id or bl.holds(st[1], st[2]):
                    continue
                del g.by_request[req]
                for t in waiting:
                    self.fail_placement_locked(t, PlacementError(
                        f"placement group {pg_id:#x} was removed (or lost a node) before "
                        "this task could run in it"))
        if n:
            self._refence_all_locked()
            refill = self._refill
            for g in self._groups.values():  # CPUs and resources came free
                if (g.queue or g.by_request) and g not in refill:
                    refill.append(g)
            self.io.poke()
        return n

    def bundles_held_locked(self) -> list:
        """``(pg_id, index)`` of the bundles held here."""
        bl = self._bundles
        return [] if bl is None else [k for k, b in bl.bundles.items() if not b.removed]

    def _bundle_cpus_moved_locked(self, idle_before: int) -> None:
        """Keep ``cpu_limit`` = CPUs - reserved idle ones after ``idle_cpus`` changed."""
        bl = self._bundles
        if self.cpu_limit is not None and bl is not None:
            self.cpu_limit -= bl.idle_cpus - idle_before

    def _free_alloc_locked(self, a: object) -> None:
        bl = self._bundles
        if bl is not None and _is_bundle_share(a):  # (no bundle ledger: no bundle share)
            idle = bl.idle_cpus
            bl.release(a)  # type: ignore[arg-type]
            self._bundle_cpus_moved_locked(idle)
        elif self.ledger is not None:
            self.ledger.release(a)  # type: ignore[arg-type]

    def fail_placement_locked(self, t: Task, err: Exception) -> None:
        """``t`` can never be placed as it asks: its future fails with ``err``."""
        if t.future is not None and not t.started:
            if not t.future.set_running_or_notify_cancel():
                self.skip_cancelled_locked(t)
                return
            t.started = True
        self.finish_locked(t, False, _payload.dumps_error(err))

    def _impossible_locked(self, g: WorkerGroup, r: Request) -> Optional[str]:
        """Why ``r`` can never run here (None: it can, once enough is released)."""
        led = self.resources_locked()
        problems = []
        total = self._cpu_total_locked()
        cap = g.max_workers if total is None else min(g.max_workers, total)
        if r.cpus > cap:
            problems.append(f"CPU: {r.cpus} asked, {cap} here")
        short = led.shortfall(r)
        if short:
            problems.append(short)
        if not problems:
            return None
        where = "this executor (max_workers) and runtime offer" if self.cpu_limit is None \
            else "this node offers"
        return f"the task asks for {r} but {where} {self.offer_locked(g)}: {'; '.join(problems)}"

    def offer_locked(self, g: Optional[WorkerGroup] = None) -> str:
        from dpool.scheduling._resources import _describe

        total = self._cpu_total_locked()
        cpus = total if g is None else (
            g.max_workers if total is None else min(g.max_workers, total))
        return _describe(self.resources_locked().offer(cpus))

    def fail_unmet_locked(self, t: Task, reason: str) -> None:
        self.fail_placement_locked(t, ResourceError(reason))

    # -- starting ------------------------------------------------------------------------
    def _dispatch_requests_locked(self, g: WorkerGroup) -> None:
        """Start the waiting tasks of ``g`` whose resources are free: first come, first
        served among tasks asking the same; a request that must wait does not hold back
        a different one (``by_request`` has a queue per distinct request, so this costs the
        tasks started plus the distinct requests, however many wait)."""
        if g.broken is not None:
            return
        by_request = g.by_request
        g.starved = False
        for req, waiting in list(by_request.items()):
            while waiting:
                # taken off first: finishing a cancelled task may dispatch this group
                # again (a dependent of it), which must find the queue consistent
                t = waiting.popleft()
                if t.future is not None and not t.started and t.future.cancelled():
                    self.skip_cancelled_locked(t)
                    continue
                if not self._start_with_request_locked(g, t):
                    waiting.appendleft(t)
                    break
            if not waiting and by_request.get(req) is waiting:
                del by_request[req]

    def _cpus_busy_locked(self, g: WorkerGroup) -> int:
        return sum(1 for w in g.workers if w.alive and (w.inflight or w.leased is not None)
                   and not w.blocked) + g.extra

    def _starve_locked(self, g: WorkerGroup) -> None:
        """A request waits for CPUs (or a worker): a worker lent to a driver may hold
        what it needs -- ask for it back (``_leases``)."""
        g.starved = True
        leases = self._leases
        if leases is not None and leases.lent:
            leases.recall_locked()

    def _start_with_request_locked(self, g: WorkerGroup, t: Task) -> bool:
        r = t.req
        assert r is not None  # (only tasks with a request wait in ``by_request``)
        if r.cpus and self._cpus_busy_locked(g) + r.cpus > g.max_workers:
            self._starve_locked(g)
            return False
        in_bundle = r.strategy is not None and r.strategy[0] == BUNDLE
        if in_bundle:  # its CPUs are the bundle's, among the node's (``_bundle_ledger``)
            total = self._cpu_total_locked()
            if r.cpus and total is not None and self.busy_cpus_locked() + r.cpus > total:
                self._starve_locked(g)
                return False
        elif r.cpus and self.cpu_limit is not None and \
                self.busy_cpus_locked() + r.cpus > self.cpu_limit:
            self._starve_locked(g)
            return False
        led = self.resources_locked()
        idle = [w for w in g.workers if w.alive and not w.inflight and not w.blocked
                and not w.retiring and w.leased is None]
        a: Any
        if in_bundle:
            bl = self._bundles
            _, pg_id, index = r.strategy  # type: ignore[misc]
            if bl is None or not bl.holds(pg_id, index):
                self.fail_placement_locked(t, PlacementError(
                    f"placement group {pg_id:#x} was removed (or lost a node) before this "
                    "task could run in it"))
                return True
            idle_before = bl.idle_cpus
            a = bl.acquire(pg_id, index, r)
            self._bundle_cpus_moved_locked(idle_before)
        else:
            a = led.acquire(r, [w.gpus for w in idle if w.gpus is not None])
        if a is None:
            return False
        # (its inputs before a worker: a pin that fails must not have started or retired
        # a worker for it)
        if t.dep_ids and t.deps is None and not self._build_deps_locked(t):
            # (``pin_inputs_locked``, inline) it waits for room or a lost input, or failed
            self._free_alloc_locked(a)
            return True
        w = self._worker_for_request_locked(g, a.gpu_ids, idle, r.cpus)
        if w is None:
            self._free_alloc_locked(a)
            self.unpin_inputs_locked(t)  # (queued again: it pins nothing)
            self._starve_locked(g)
            return False
        if t.future is not None and not t.started:
            if not t.future.set_running_or_notify_cancel():
                self._free_alloc_locked(a)
                self.skip_cancelled_locked(t)
                return True
        t.started = True
        to = NEXT[t.state][SEND]  # (``_states.transition``, inline: every task)
        if to < 0:
            raise illegal(t, SEND)
        t.state = to
        t.alloc = a
        t.attempts += 1
        t.estimate_s = self.batch.estimate(t.fn_id)
        msgs: list = []
        if t.fn_id not in w.functions:
            w.functions.add(t.fn_id)
            msgs.append(m.RegisterFunction(t.fn_id, self._functions[t.fn_id]))
        msgs.append(m.ExecuteTask(t.task_id, t.fn_id, t.args, t.deps))
        w.inflight[t.task_id] = t
        if g.watch:  # (timeouts, memory limits: ``_limits``)
            self.limits.watch_locked(w)
        self.control.log_event(t.task_id, "start", _now(), w.worker_id)
        w.load += t.estimate_s
        w.assigned += 1
        if g.max_tasks is not None and w.assigned >= g.max_tasks:
            w.retiring = True  # it exits after this task (max_tasks_per_child)
        w.extra_cpus = r.cpus - 1
        g.extra += w.extra_cpus
        self._fence_locked(w, True)
        if a.gpu_ids:
            self._refence_all_locked()
        self.send_locked(w, msgs)
        return True

    def _worker_for_request_locked(self, g: WorkerGroup, gpu_ids: tuple, idle: list,
                                   cpus: int) -> Optional[WorkerHandle]:
        """An idle worker that may run a task given ``gpu_ids`` (bound to exactly them,
        or, for none, one that sees no held GPU), or a new one; None: no process slot.
        (A task holding no CPU needs a process but no slot.)"""
        held = self.ledger.held_gpus() if self.ledger is not None else frozenset()
        for w in idle:
            if gpu_ids:
                if w.gpus == gpu_ids:
                    return w
            elif w.gpus is None and not self._clashes(w, held):
                return w
        if self.slots_used_locked(g) >= g.max_workers:
            victim = next((w for w in idle if w.fenced), None) or (idle[0] if idle else None)
            if victim is not None:
                self._retire_worker_locked(victim)
            elif cpus:
                return None
        try:
            return self.spawn_locked(g, gpu_ids or None)
        except Exception as exc:  # noqa: BLE001 - out of processes: wait, as for any task
            log.error("dpool: cannot start a worker process: %s", exc)
            return None

    @staticmethod
    def slots_used_locked(g: WorkerGroup) -> int:
        """Worker processes that count against ``max_workers``: not those blocked in a
        nested wait, nor those running a task that holds no CPU."""
        return sum(1 for w in g.workers if w.alive and not w.blocked
                   and not (w.extra_cpus < 0 and w.inflight))

    def _retire_worker_locked(self, w: WorkerHandle) -> None:
        w.mark_stopping()
        self._fence_locked(w, False)
        self.send_locked(w, [m.Shutdown()])

    # -- fences --------------------------------------------------------------------------
    def _fence_locked(self, w: WorkerHandle, on: bool) -> None:
        if w.fenced != on:
            w.fenced = on
            w.group.n_fenced += 1 if on else -1

    @staticmethod
    def _clashes(w: WorkerHandle, held: frozenset) -> bool:
        if not held:
            return False
        return w.sees is None or bool(w.sees & held)

    def _refence_locked(self, w: WorkerHandle, held: frozenset) -> None:
        self._fence_locked(w, w.alive and (
            w.gpus is not None or self._clashes(w, held)
            or any(t.alloc is not None for t in w.inflight.values())))

    def _refence_all_locked(self) -> None:
        """The held GPUs changed: fence the workers that can see one, unfence the rest."""
        held = self.ledger.held_gpus() if self.ledger is not None else frozenset()
        for g in self._groups.values():
            for w in g.workers:
                if w.gpus is None:
                    self._refence_locked(w, held)

    def spawn_env_locked(self) -> tuple[Optional[dict], Optional[frozenset]]:
        """(environment changes, devices it sees) for a new worker that asks no GPU."""
        led = self.ledger
        if led is None or not led.num_gpus:
            return None, None
        held = led.held_gpus()
        if not held:
            return None, None
        sees = frozenset(range(led.num_gpus)) - held
        return {"CUDA_VISIBLE_DEVICES": led.names(sorted(sees))}, sees

    # -- ending --------------------------------------------------------------------------
    def _release_allocation_locked(self, t: Task, w: Optional[WorkerHandle]) -> None:
        """``t`` ended or left its worker: what it held is free again."""
        a, t.alloc = t.alloc, None
        assert a is not None  # (callers release only what a task holds)
        led = self.ledger
        self._free_alloc_locked(a)
        if w is not None:
            if not w.blocked:
                w.group.extra -= w.extra_cpus
            w.extra_cpus = 0
            self._refence_locked(w, led.held_gpus() if led is not None else frozenset())
        if a.gpu_ids:
            self._refence_all_locked()
        refill = self._refill
        for g in self._groups.values():
            if (g.by_request or (g.queue and (g.n_fenced or g.actor is not None))) \
                    and g not in refill:  # (an actor may wait for what was released)
                refill.append(g)
        self.io.poke()  # (the tick dispatches them when no read does: ``protocol._ioloop``)

    def _on_blocked_with_resources_locked(self, w: WorkerHandle) -> None:
        w.group.extra -= w.extra_cpus  # its CPUs are given back while it waits; GPUs are not

    def _on_unblocked_with_resources_locked(self, w: WorkerHandle) -> None:
        w.group.extra += w.extra_cpus

    def _fail_waiting_for_resources_locked(self, g: WorkerGroup, err: bytes) -> None:
        waiting = [t for q in g.by_request.values() for t in q]
        g.by_request.clear()
        for t in waiting:
            if t.future is not None and not t.started:
                t.future.set_running_or_notify_cancel()
                t.started = True
            self.finish_locked(t, False, err)

    @property
    def _waiting_for_resources(self) -> bool:
        """Whether tasks wait for resources (read without the lock: a hint)."""
        return self.ledger is not None and any(g.by_request for g in list(self._groups.values()))

    def _refill_now_locked(self) -> None:
        """Dispatch the groups a release left work for, and those with tasks waiting for
        resources (from the IO thread's tick)."""
        refill = self._refill
        for g in self._groups.values():
            if g.by_request and g not in refill:
                refill.append(g)
        while refill:
            g = refill.pop(0)
            if g.queue or g.by_request:
                self._dispatch_locked(g)


def _strategy_text(s: object) -> str:
    return f"scheduling={s!r}"


def _is_bundle_share(a: object) -> bool:
    """Whether ``a`` is a task's share of a placement-group bundle."""
    from dpool.scheduling._bundle_ledger import BundleAllocation  # (loaded by the first hold)

    return isinstance(a, BundleAllocation)
