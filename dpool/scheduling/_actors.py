"""Actors: a worker group of one worker that keeps its state between calls.

An actor is a ``WorkerGroup`` whose ``actor`` is an ``ActorState``. Its one worker runs
the actor's constructor as its initializer (``ActorConfig.boot``, given by the public API,
which this layer does not import), then the actor's method calls -- tasks of that group --
one after another, in the order the scheduler admitted them: a call waiting for an input
(a future argument) holds back the calls after it (``order``), unlike an ordinary group's
tasks, which start as each becomes ready. The group never gets a second worker.

The calls the worker reported as run since the last checkpoint are the actor's **log**
(``log``: function id, arguments, inputs; their stored payloads kept pinned). When the
worker dies with restarts left (``max_restarts``; -1: no limit), a new worker boots from
the latest checkpoint (``ActorCheckpoint``, which the worker sends every
``checkpoint_every`` calls) or the constructor, replays the log in order, then takes
the calls that were in flight (uncharged: each completes once) and the rest. Without
restarts left, or once it is killed, the group is broken: its pending and later calls
fail with ``ActorDiedError``. Results of actor calls keep no lineage (re-running a call
would change the actor's state): one that is lost raises ``ObjectLostError``.

The functions here are the scheduler's part for actor groups (``s``: the scheduler, its
lock held); its other parts call them where a group is an actor's, importing this module
then, so that a program without actors never loads it.
"""

from __future__ import annotations

import os
import time
from collections import deque

from dpool import _log, errors
from dpool.objects import payload as _payload
from dpool.protocol import messages as m
from dpool.protocol import record
from dpool.scheduling._lineage import STORED
from dpool.scheduling._resources import BUNDLE
from dpool.scheduling._states import DONE, NEXT, QUEUED, SEND, WAITING, illegal
from dpool.scheduling._exits import describe_exit

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Optional

    from dpool.scheduling._core import SchedulerCore
    from dpool.scheduling._records import Task, WorkerGroup, WorkerHandle

log = _log.getLogger("dpool.scheduling")

_now = time.time


@record
class ActorConfig:
    """What an actor group is made with (``WorkerGroupConfig.actor``)."""

    name: str  # how errors and logs name it: its ``name=``, else class and id
    # ``boot(ctor, checkpoint, replay, checkpoint_every, max_concurrency)`` runs in the
    # worker as its
    # initializer: the instance from ``checkpoint`` (a pickled instance) or ``ctor`` (a
    # pickled ``(cls, args, kwargs)``), then each ``(fn payload, args, inputs)`` of
    # ``replay`` in order.
    boot: Any
    ctor: bytes
    max_restarts: int = 0  # -1: restarted whenever it dies
    checkpoint_every: int = 0  # 0: never
    max_concurrency: int = 1  # calls that may run at once (on threads of the worker)
    detached: bool = False  # lifetime="detached": on a cluster, outlives its driver
    req: Any = None  # the resources it holds while its worker lives (a ``Request``)
    numbered: bool = False  # unnamed: its runtime adds "#<group id>" to ``name``


class ActorState:
    """An actor group's calls, log and restarts (under the scheduler's lock)."""

    PLACING = "(placing)"  # ``host`` while a global scheduler looks for a node for it

    __slots__ = ("cfg", "order", "log", "checkpoint", "restarts", "calls", "host", "named",
                 "alloc", "last", "ran_last", "base")

    def __init__(self, cfg: ActorConfig, host: str = "") -> None:
        self.cfg = cfg
        self.named = ""  # the name it holds in the actor directory (``name_locked``)
        self.alloc: Any = None  # what its worker holds of ``cfg.req`` (an ``Allocation``)
        self.last = 0  # its call admitted last (the lineage's chain: ``admitted_locked``)
        # Another node's actor (a node's *proxy* group: no worker here, its calls are
        # sent to ``host`` as they become ready, in order): that node's address.
        self.host = host
        self.order: deque = deque()  # its calls not yet sent, in the order admitted
        self.log: list = []  # (fn_id, args, inputs) of the calls run since ``checkpoint``
        self.checkpoint: Optional[bytes] = None
        self.restarts = 0
        self.calls = 0  # calls run (replays of a restart not counted)
        self.ran_last = 0  # the call logged last (what a checkpoint after it holds)
        # calls to replay before the log, as boot takes them (fn payload, args, inputs):
        # an actor rebuilt on this node from another's copy, until its first checkpoint
        self.base: list = []

    def admitted_locked(self, s: SchedulerCore, t: Task) -> None:
        """Call ``t`` was admitted: it runs after the calls before it, and the task
        table records it after the last of them (the seeds' stateful edge)."""
        self.order.append(t)
        if self.last and not self.host:  # (a proxy's calls are chained where they run)
            s.control.add_call_edge(t.task_id, self.last)
        self.last = t.task_id

    def boot_payload(self, functions: Any, value: Any = None) -> bytes:
        """The initializer of its next worker: from the checkpoint, then the log
        (``functions[fn_id]``: a function's payload; ``value``: what each stored payload
        of the log becomes -- its bytes inline, for a worker on another host)."""
        cfg = self.cfg
        if value is None:
            replay = [(functions[fn_id], args, deps) for fn_id, args, deps in self.log]
        else:
            replay = [(functions[fn_id], value(args) if args else args,
                       tuple((oid, ok, value(p) if ok else p) for oid, ok, p in deps)
                       if deps else deps) for fn_id, args, deps in self.log]
        replay = self.base + replay
        return _payload.dumps((cfg.boot, (cfg.ctor, self.checkpoint, replay,
                                          cfg.checkpoint_every, cfg.max_concurrency)))


def dispatch_locked(s: SchedulerCore, g: WorkerGroup, idle_only: bool = False) -> None:
    """Send ``g``'s calls that are next in its order, ready, to its worker (started
    here if it has none). A call waiting for an input stops the sending. With
    ``idle_only`` (a submitting thread) only to an idle worker: a busy one gets the
    calls queued meanwhile in one batch when its results come back."""
    a: ActorState = g.actor
    if a.host:
        _forward_locked(s, g, a)
        return
    w = None
    for x in g.workers:
        if x.alive:
            w = x
            break
    if w is None:  # (a worker that has not said Hello yet takes calls)
        if g.workers or s.closed or not a.order:
            return
        if a.cfg.req is not None and a.alloc is None and not _acquire_locked(s, g, a):
            return  # (its resources are in use: it starts when they are released)
        if not s._try_spawn_locked(g, a.alloc.gpu_ids or None if a.alloc else None):
            return
        w = g.workers[-1]
    threaded = a.cfg.max_concurrency > 1
    if not threaded and (w.blocked or (idle_only and w.inflight)):
        return  # in a nested wait: its calls wait for it (``_on_unblocked_locked``)
    order, q = a.order, g.queue
    msgs: list = []
    log_event = s.control.log_event
    inflight = w.inflight
    batch = s.batch
    while order:
        t = order[0]
        state = t.state
        if state == WAITING:
            break  # the calls after it wait for its input too
        if state != QUEUED:
            order.popleft()
            continue  # finished unsent (cancelled, failed, an input lost)
        # Short calls go in batches, a long one alone (as to an ordinary worker): the
        # calls behind it stay cancellable here.
        # (with max_concurrency, every call at once: one may wait for another's)
        est = batch.estimate(t.fn_id)
        if not threaded and not batch.fits(len(inflight), w.load, est):
            break
        order.popleft()
        if q and q[0] is t:
            q.popleft()
        else:  # became ready after calls behind it (rare: an input it waited for)
            q.remove(t)
        if t.dep_ids and t.deps is None and not s._build_deps_locked(t):
            if t.state != DONE:
                order.appendleft(t)  # it waits for room or a lost input: in its place
            break
        if not t.started:
            if t.future is not None and not t.future.set_running_or_notify_cancel():
                s.skip_cancelled_locked(t)
                continue
            t.started = True
        to = NEXT[t.state][SEND]
        if to < 0:
            raise illegal(t, SEND)
        t.state = to
        t.attempts += 1
        t.estimate_s = est
        w.load += est
        if t.fn_id not in w.functions:
            w.functions.add(t.fn_id)
            msgs.append(m.RegisterFunction(t.fn_id, s._functions[t.fn_id]))
        msgs.append(m.ExecuteTask(t.task_id, t.fn_id, t.args, t.deps))
        inflight[t.task_id] = t
        log_event(t.task_id, "start", _now(), w.worker_id)
        w.assigned += 1
    if msgs:
        s.send_locked(w, msgs)

def new_state_locked(s: SchedulerCore, cfg: ActorConfig, group_id: int) -> ActorState:
    """The state of a new actor group; ``ResourceError`` if it asks for what this
    runtime can never give it."""
    if cfg.numbered:
        cfg.name, cfg.numbered = f"{cfg.name}#{group_id}", False
    why = None if cfg.req is None else impossible_locked(s, cfg.req)
    if why is not None:
        raise errors.ResourceError(why)
    if cfg.req is not None and cfg.req.strategy is not None and s.cpu_limit is None:
        from dpool.placement import NodeAffinity, strategy_from_wire

        st = strategy_from_wire(cfg.req.strategy)  # (one host: every strategy means here
        if isinstance(st, NodeAffinity) and not st.soft and st.node != "local":  # ...)
            raise errors.PlacementError(
                f"the actor must run on node {st.node!r} (NodeAffinity, soft=False), but "
                "this is the embedded runtime: its only node is this host, 'local' (set "
                "DPOOL_ADDRESS to run on a cluster)")
    return ActorState(cfg)


def proxy_group(group_id: int, name: str, host: str,
                broken: Optional[str] = None) -> WorkerGroup:
    """A group standing for actor ``name`` of node ``host`` (no worker: its calls go
    there, ``_forward_locked``); ``broken``: it cannot reach it, its calls fail."""
    from dpool.scheduling._records import WorkerGroup

    g = WorkerGroup(group_id, 1, None, None, None, 1)
    g.actor = ActorState(ActorConfig(name, None, b""), host=host)
    g.broken = broken
    return g


def impossible_locked(s: SchedulerCore, req: Any) -> Optional[str]:
    """Why an actor asking ``req`` can never start here (None: it can, once enough is
    free). Its CPUs count against a node's; on one host, against the host's; in a
    placement group's bundle, against what the bundle reserved."""
    if _in_bundle(req):
        return None  # (its bundle decides, when its worker is to start: ``_acquire``)
    problems = []
    total = s.cpu_limit if s.cpu_limit is not None else (os.cpu_count() or 1)
    if req.cpus > total:
        problems.append(f"CPU: {req.cpus} asked, {total} here")
    short = s.resources_locked().shortfall(req)
    if short:
        problems.append(short)
    if not problems:
        return None
    where = "this host" if s.cpu_limit is None else "this node"
    return f"the actor asks for {req} but {where} offers {s.offer_locked()}: " + \
        "; ".join(problems)


def _acquire_locked(s: SchedulerCore, g: WorkerGroup, a: ActorState) -> bool:
    """Take the actor's resources for its next worker (False: not free now)."""
    req = a.cfg.req
    if _in_bundle(req):
        return _acquire_bundle_locked(s, g, a)
    why = impossible_locked(s, req)
    if why is not None:
        s.break_group_locked(g, f"it cannot get its resources: {why}")
        return False
    if req.cpus and s.cpu_limit is not None and s.busy_cpus_locked() + req.cpus > s.cpu_limit:
        return False
    alloc = s.resources_locked().acquire(req)
    if alloc is None:
        return False
    a.alloc = alloc
    g.extra += req.cpus  # (a node counts them busy: ``busy_cpus_locked``)
    if alloc.gpu_ids:
        s._refence_all_locked()  # other workers that see its GPUs take no plain tasks
    return True


def _in_bundle(req: Any) -> bool:
    st = req.strategy
    return st is not None and st[0] == BUNDLE


def _acquire_bundle_locked(s: SchedulerCore, g: WorkerGroup, a: ActorState) -> bool:
    """Take the actor's share of its placement group's bundle, held here."""
    req = a.cfg.req
    _, pg_id, index = req.strategy
    bl = s._bundles
    which = f"bundle {index}" if index >= 0 else "a bundle"
    if bl is None or not bl.holds(pg_id, index):
        s.break_group_locked(g, f"it asks to run in {which} of placement group "
                                f"{pg_id:#x}, which is not held here (the group was "
                                "removed, is not ready yet, or lost a node)")
        return False
    why = bl.never_fits(pg_id, index, req)
    if why is not None:
        s.break_group_locked(g, f"it cannot get its resources: {why}")
        return False
    idle = bl.idle_cpus
    alloc = bl.acquire(pg_id, index, req)
    s._bundle_cpus_moved_locked(idle)
    if alloc is None:
        return False  # (the bundle's tasks hold it now: it starts when they end)
    a.alloc = alloc
    g.extra += req.cpus
    if alloc.gpu_ids:
        s._refence_all_locked()
    return True


def _free_locked(s: SchedulerCore, g: WorkerGroup, a: ActorState) -> None:
    """The actor's worker is gone: what it held is free for others (a restart takes
    it again)."""
    alloc, a.alloc = a.alloc, None
    if alloc is None:
        return
    s._free_alloc_locked(alloc)
    g.extra -= a.cfg.req.cpus
    if alloc.gpu_ids:
        s._refence_all_locked()
    refill = s._refill
    for x in s._groups.values():
        if (x.by_request or x.queue) and x not in refill:
            refill.append(x)
    s.io.poke()


def _forward_locked(s: SchedulerCore, g: WorkerGroup, a: ActorState) -> None:
    """A proxy's calls that are next in its order, ready, go to the actor's node (its
    inputs travel with each: the hosting node admits them in the order sent)."""
    if a.host == ActorState.PLACING:
        return  # (its calls wait, in order, until it has a node)
    order, q = a.order, g.queue
    calls = []
    while order:
        t = order[0]
        if t.state == WAITING:
            break
        order.popleft()
        if t.state != QUEUED:
            continue
        if q and q[0] is t:
            q.popleft()
        else:
            q.remove(t)
        calls.append(t)
    if calls:
        if s._spillback is None:  # (proxies are made by nodes, which have one)
            for t in calls:
                s.finish_locked(t, False, actor_error(g, "no route to its node"))
            return
        s._spillback.forward_locked(g, calls, a.host)


def ran_locked(s: SchedulerCore, t: Task) -> None:
    """Its worker ran call ``t`` (reported its outcome): into the log, which keeps
    its stored arguments and inputs (pinned) for a replay."""
    a: ActorState = t.group.actor
    a.calls += 1
    args = t.args
    t.args = None  # (the log owns them now: ``finish_locked`` does not drop them)
    deps = t.deps
    if deps:
        store = s.store
        for _oid, ok, payload in deps:
            if ok:
                store.pin(payload)  # (``finish_locked`` takes back the task's own pin)
    a.log.append((t.fn_id, args, deps))
    a.ran_last = t.task_id

def checkpoint_locked(s: SchedulerCore, w: WorkerHandle, msg: m.ActorCheckpoint) -> None:
    a: Optional[ActorState] = w.group.actor
    if a is None:
        return
    a.checkpoint = msg.state
    a.base = []
    _forget_log_locked(s, a)
    if s._actor_service is not None:  # (a node: the driver's node of a placed actor
        s._actor_service.saved_locked(w.group, msg.state, a.ran_last)  # keeps a copy)

def _forget_log_locked(s: SchedulerCore, a: ActorState, n: Optional[int] = None) -> None:
    """The log lets go of its first ``n`` calls (None: all) and what they kept."""
    if n is None:
        log_, a.log = a.log, []
    else:
        log_, a.log = a.log[:n], a.log[n:]
    store = s.store
    for _fn_id, args, deps in log_:
        if args is not None and args[:1] == STORED:
            store.drop(args, unpin=True)
        for _oid, ok, payload in deps or ():
            if ok:
                store.unpin(payload)

def died_locked(s: SchedulerCore, w: WorkerHandle, held: list, exitcode: Optional[int],
                was_alive: bool) -> None:
    """The worker of an actor exited or died holding ``held`` (sent, not reported):
    they go back first in its order, uncharged; then it restarts (from its
    checkpoint and log) if it may, else every call it has fails."""
    g = w.group
    a: ActorState = g.actor
    _free_locked(s, g, a)
    if held:
        s._requeue_locked(w, tuple(t.task_id for t in held))
    if not was_alive or g.broken is not None:
        return  # told to stop (its group closed, or it was killed)
    how = describe_exit(exitcode)
    cfg = a.cfg
    if cfg.max_restarts < 0 or a.restarts < cfg.max_restarts:
        a.restarts += 1
        log.warning("actor %s: its worker (pid %s) died with %s; restarting it (restart "
                    "%d of %s) and replaying %d call(s)%s", cfg.name, w.pid, how,
                    a.restarts, "unlimited" if cfg.max_restarts < 0 else cfg.max_restarts,
                    len(a.log), " after its checkpoint" if a.checkpoint else "")
        g.initializer = a.boot_payload(s._functions)
        return  # (``_on_closed`` dispatches: a worker starts for its calls)
    s.break_group_locked(g, f"its worker (pid {w.pid}) died with {how}" + (
        f" after {a.restarts} restart(s)" if a.restarts else " (max_restarts=0)"))

def end_locked(s: SchedulerCore, g: WorkerGroup) -> None:
    """An actor group is gone: its log lets go of what it kept, its name is free."""
    a: Optional[ActorState] = g.actor
    if a is not None:
        _forget_log_locked(s, a)
        if not g.workers:
            _free_locked(s, g, a)  # (else when its process has exited: ``died_locked``)
        a.order.clear()
        if a.named:
            name, a.named = a.named, ""
            if s.actor_names.get(name, (0,))[0] == g.group_id:
                del s.actor_names[name]
        owner = g.owner
        if g.broken is not None and owner is not None and owner.alive:
            # a cluster driver's actor ended by another (a kill from a task, another
            # driver): its driver learns it (its handles, its name)
            s.send_locked(owner, [m.GroupBroken(g.group_id, g.broken)])
        if s._actor_service is not None:
            s._actor_service.ended_locked(g)
        bury_locked(s, g)


ENDED_KEPT = 10_000  # ended actors remembered for late calls (the oldest forgotten first)


def bury_locked(s: SchedulerCore, g: WorkerGroup) -> None:
    """An ended actor group with no worker and no call left leaves the scheduler's
    groups, so that what scans them stays as fast however many actors came and went;
    its name and why it ended stay (``ended_actors``) for the calls that come late."""
    if g.workers or g.outstanding or (not g.closed and g.broken is None) or \
            s._groups.get(g.group_id) is not g:
        return
    del s._groups[g.group_id]
    ended = s.ended_actors
    ended[g.group_id] = (g.actor.cfg.name,
                         g.broken or "it was shut down (by its executor's shutdown())")
    if len(ended) > ENDED_KEPT:
        del ended[next(iter(ended))]


def ended_error(s: SchedulerCore, group_id: int) -> Optional[bytes]:
    """What a call of a buried actor fails with (None: no such actor ended here)."""
    ended = s.ended_actors.get(group_id)
    return None if ended is None else _payload.dumps_error(errors.actor_died(*ended))


def _live(s: SchedulerCore, group_id: int) -> Optional[WorkerGroup]:
    g = s._groups.get(group_id)
    if g is None or g.actor is None or g.broken is not None or g.closed:
        return None
    return g


def name_locked(s: SchedulerCore, name: str, record: tuple) -> bool:
    """Give the actor of ``record`` (group id, label, methods, node) ``name``, unless a
    live actor has it (False)."""
    have = s.actor_names.get(name)
    if have is not None and _live(s, have[0]) is not None:
        return False
    g = _live(s, record[0])
    if g is None:
        return True  # (it ended already: nothing to find it by)
    s.actor_names[name] = record
    g.actor.named = name
    return True


def find_locked(s: SchedulerCore, name: str) -> Optional[tuple]:
    """The record of the live actor named ``name``, or None."""
    rec = s.actor_names.get(name)
    return rec if rec is not None and _live(s, rec[0]) is not None else None


def actor_error(g: WorkerGroup, reason: str) -> bytes:
    """What the calls of actor group ``g`` fail with once it died for ``reason``."""
    return _payload.dumps_error(errors.actor_died(g.actor.cfg.name, reason))
