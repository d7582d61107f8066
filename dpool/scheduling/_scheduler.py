"""The local scheduler: one per host, owning that host's worker groups and their processes.

    driver threads ──submit()──▶ ┌──────────────────────────────┐
                                  │ LocalScheduler (this module) │──ExecuteTask──▶ worker
    worker sockets ──SubmitTask─▶ │  groups: queue, workers      │◀──TaskDone──── worker
                                  │  objects: id -> value/refs   │
                                  │  IOLoop thread reads sockets │──▶ control store (batched)
                                  └──────────────────────────────┘
                                       │ completions (outside the lock)
                                       ▼
                                  driver Futures: set_result / set_exception

A task from the driver (``submit``) or from a worker (``SubmitTask``) enters through
``admit_locked``: its stored argument block is adopted and pinned, it is recorded in the
control store, it takes a reference on each input, and it is queued once every input is
ready. A new task is sent at once only to an idle worker (a worker's nested task, handled
on the IO thread, may join a busy worker's batch); busy workers get queued tasks in batches
from the IO thread as their results come back (``_workers``). Its inputs are pinned when it
is sent (``_object_table.pin_inputs_locked``). ``finish_locked`` records the outcome: it
unpins the inputs, drops their references and the argument block, keeps the lineage of a
stored result, marks the object ready and wakes what waits on it.

Lock rule: ``self.lock`` guards every record of the scheduler. A ``_locked`` method expects
it held; any other takes it itself if it needs it (the public calls, the IO loop's
callbacks ``_on_frames``, ``_on_closed``, ``_on_tick``, a leader's ``_lead``). Completions
are gathered under it (``take_out_locked``) and delivered after it is released
(``deliver``), by the thread whose locked region produced them: done-callbacks may submit
again. A driver thread blocked on a task its worker runs alone may read that worker's
socket itself (``lead``); futures with done-callbacks are still completed by the IO thread.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque
from collections.abc import ValuesView

from dpool import _log, errors
from dpool._task_future import completes_anywhere
from dpool.errors import ObjectLostError, ObjectStoreFullError
from dpool.objects import HostStore, stored_size
from dpool.objects import payload as _payload
from dpool.protocol import SPIN_S, IOLoop, preload_worker
from dpool.protocol import messages as m
from dpool.scheduling import _forkproc
from dpool.scheduling._group_calls import GroupCalls
from dpool.scheduling._handlers import WorkerMessages
from dpool.scheduling._limits import NO_LIMITS, GroupLimits, LimitWatch, take_task_limits_locked
from dpool.scheduling._lineage import STORED
from dpool.scheduling._lock import SchedulerLock
from dpool.scheduling._object_table import ObjectTable
from dpool.scheduling._policy import BatchPolicy
from dpool.scheduling._records import ObjectEntry, Task, WorkerGroup, WorkerHandle
from dpool.scheduling._records import WorkerGroupConfig
from dpool.scheduling._resource_dispatch import ResourceDispatch
from dpool.scheduling._resources import Request
from dpool.scheduling._states import (
    FINISH,
    NEXT,
    READY,
    RETURN,
    SPILLBACK,
    WAIT,
    illegal,
    transition,
)
from dpool.scheduling._workers import WorkerPool

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from dpool.control import ControlStore
    from dpool.scheduling._api import ActorService, DriverService, Handler
    from dpool.scheduling._api import LeaseService, SpillbackService

log = _log.getLogger("dpool.scheduling")



class LocalScheduler(GroupCalls, WorkerMessages, WorkerPool, ResourceDispatch, ObjectTable):
    """The local scheduler; on a node daemon its services use it as ``SchedulerAPI``."""

    def __init__(self, control: ControlStore) -> None:
        self.init_forking()  # (first: before anything could fork)
        self.lock = SchedulerLock()
        self._outbox = self.lock.outbox  # sends recorded under it (``send_locked``)
        self.lock.set_flush(self.flush_locked)
        self.control = control
        self._groups: dict[int, WorkerGroup] = {}
        self._objects: dict[int, ObjectEntry] = {}
        self._functions: dict[int, bytes] = {}
        self._group_ids = itertools.count(1)
        self._worker_ids = itertools.count(1)
        self.batch = BatchPolicy()
        self._releases: deque = deque()  # object ids released from any thread
        self._closing: deque = deque()  # groups of collected executors, closed by the IO thread
        self.closed = False
        self._out: list = []  # completions gathered under the lock, delivered after it
        self._refill: list[WorkerGroup] = []  # to dispatch once a read is handled (lock held)
        # notified when a worker is reaped
        self._exited = threading.Condition(self.lock)  # type: ignore[arg-type]
        self.store = HostStore(os.getpid())
        self._lineage = {}  # result id -> what re-running its task needs (``_lineage``)
        self._function_refusals = {}  # fn id -> why its tasks may not run again, or None
        self._room_waiters = {}  # inputs tasks wait on for room in the store (``_object_table``)
        # A node daemon's services (``attach_services``); None on the embedded runtime.
        self._sessions: Optional[DriverService] = None
        self._spillback: Optional[SpillbackService] = None
        self._leases: Optional[LeaseService] = None
        self._actor_service: Optional[ActorService] = None  # (a node's actor directory)
        # A node's CPUs: at most this many workers run tasks at once, over every group
        # (None on the embedded runtime: each executor has its own max_workers only).
        self.cpu_limit: Optional[int] = None
        self.id_prefix: Optional[Callable[[], int]] = None  # a node's cluster-unique prefixes
        self.actor_names: dict[str, tuple] = {}  # name -> (group id, label, methods, node)
        self.kv: dict[str, tuple[bytes, float]] = {}  # ``KVPut``: key -> (value, expiry)
        self.ended_actors: dict[int, tuple] = {}  # group id -> (name, why): ``_actors``
        self.limits = LimitWatch(self)  # timeouts, memory limits (``_limits``)
        # GPUs, memory, custom resources (``_resource_dispatch``): detected on the first task
        # that asks for any, from ``ledger_spec`` if given (the executor keyword).
        self.ledger = None
        self.ledger_spec: Optional[dict] = None
        self._handlers: dict[int, Handler] = {
            m.Hello.CODE: self._on_hello_locked,
            m.TaskDone.CODE: self._on_task_done_locked,
            m.InitFailed.CODE: self._on_init_failed_locked,
            m.RegisterFunction.CODE: self._on_register_function_locked,
            m.SubmitTask.CODE: self._on_submit_locked,
            m.Blocked.CODE: self._on_blocked_locked,
            m.Unblocked.CODE: self._on_unblocked_locked,
            m.ReturnTasks.CODE: self._on_return_tasks_locked,
            m.GetObjects.CODE: self._on_get_objects_locked,
            m.Release.CODE: self._on_release_locked,
            m.PutObject.CODE: self._on_put_locked,
            m.Output.CODE: self._on_output_locked,
            m.ActorCheckpoint.CODE: self._on_actor_checkpoint_locked,
            # (a node replaces these three: ``node._actor_calls``)
            m.ActorRoute.CODE: self._on_actor_route_locked,
            m.ActorFind.CODE: self._on_actor_find_locked,
            m.KillActor.CODE: self._on_kill_actor_locked,
            m.KVPut.CODE: self._on_kv_put_locked,  # (a node's: the control store's)
            m.KVGet.CODE: self._on_kv_get_locked,
        }
        self._leading = threading.Lock()  # held by the one driver thread that leads
        self.io = IOLoop(self._on_frames, self._on_closed, self._on_tick)
        self.io.before_start = self.fork_point

    # ================================================================ public (any thread)

    def add_group(self, cfg: WorkerGroupConfig) -> WorkerGroup:
        if _forkproc.uses_light_fork(cfg.mp_context):  # (outside the lock: an import)
            preload_worker()  # its workers will be forked (here or by a fork server that
            # is a copy of this process): their code is loaded once, before
        with self.lock:
            g = WorkerGroup(next(self._group_ids), cfg.max_workers, cfg.mp_context, cfg.initializer,
                      cfg.max_tasks, cfg.max_attempts)
            g.inherited = cfg.inherited
            if cfg.limits is not None and any(cfg.limits):
                g.limits = GroupLimits(*cfg.limits)
            if cfg.actor is not None:
                from dpool.scheduling import _actors

                g.actor = _actors.new_state_locked(self, cfg.actor, g.group_id)
            self.insert_group_locked(g)
            return g

    def estimate(self, fn_id: int, default: Any = ...) -> Any:
        """Average run time of ``fn_id``'s tasks; ``default`` (else the policy's guess)."""
        if default is not ... and not self.batch.known(fn_id):
            return default
        return self.batch.estimate(fn_id)

    def set_store_capacity(self, capacity: int) -> None:
        with self.lock:
            self.store.set_capacity(capacity)

    def register_function(self, fn_id: int, name: str, payload: bytes) -> None:
        with self.lock:
            self._functions[fn_id] = payload
        self.control.register_function(fn_id, name, payload)

    def submit(self, group: WorkerGroup, task_id: int, fn_id: int, args: Optional[bytes],
               dep_ids: Optional[tuple], future: Any, req: Optional[Request] = None) -> None:
        t = Task(task_id, fn_id, args, dep_ids, group, None, future)
        if req is not None:
            t.req = req
        with self.lock:
            if self._releases:
                self._drain_releases_locked()
            self.admit_locked(t)
            out = self.take_out_locked()
        self.deliver(out)

    def lead(self, future: Any, timeout: Optional[float]) -> Optional[float]:
        """Wait for a driver ``future`` by reading its worker's socket on this thread.

        The leader/follower read (``_ioloop``): while this thread waits, the IO thread
        leaves the socket of the worker running the task alone, and this thread reads and
        handles that worker's messages itself, so a result wakes the thread waiting for it
        directly. It leads for at most ``_ioloop.LEAD_S`` (longer tasks: the latency of a hop
        does not matter), only while no other thread leads, and only on a task its worker
        runs alone (``_holder_locked``); completions whose futures have done-callbacks go
        to the IO thread, which runs the callbacks. Returns what is left of ``timeout``
        for the ordinary wait that follows.
        """
        if future.done() or not completes_anywhere(future) or self.io.is_io_thread() \
                or not self._leading.acquire(blocking=False):
            # (a future with callbacks is completed by the IO thread -- but for a Pool's
            # own; the IO thread, in a done-callback, must not stop serving the others)
            return timeout
        try:
            return self._lead(future, timeout)
        finally:
            self._leading.release()

    def _lead(self, future: Any, timeout: Optional[float]) -> Optional[float]:
        with self.lock:
            w = self._holder_locked(future._oid)
            # a task expected to end within the spin window: poll without sleeping
            spin = w is not None and w.inflight[future._oid].estimate_s < SPIN_S
        if w is None:
            return timeout
        io = self.io
        return io.lead(w, future, timeout, spin,
                       lambda frames: self._handle_frames(w, frames),
                       self._deliver_leading,
                       lambda: io.call_soon(lambda: io.close_handle(w)))

    def _holder_locked(self, task_id: int) -> Optional[WorkerHandle]:
        """The live worker of this host running ``task_id`` and nothing else.

        Only then does a leader help: with more tasks in flight (a burst), the IO thread
        is busy with results anyway, and two threads handling them contend for the GIL
        and this lock (bench/NOTES.md)."""
        for g in self._groups.values():
            for w in g.workers:
                inflight = w.inflight
                if task_id in inflight:
                    ok = w.alive and w.process is not None and len(inflight) == 1
                    return w if ok else None
        return None

    def _deliver_leading(self, out: list) -> None:
        """``deliver`` on a leader: futures with done-callbacks (but a Pool's own) and
        object callbacks are completed by the IO thread, so callbacks run there as they
        always do."""
        here = []
        there = []
        for item in out:
            if completes_anywhere(item[0]):
                here.append(item)
            else:
                there.append(item)
        self.deliver(here)
        if there:
            self.io.call_soon(lambda: self.deliver(there))

    def set_resource_offer(self, spec: Optional[dict]) -> None:
        """What the embedded runtime offers (``runtime_resources=``); None: detect."""
        from dpool.scheduling import _detect

        led = _detect.embedded_ledger(spec)
        with self.lock:
            self.set_resources_locked(led)
            self.ledger_spec = spec
            for g in self._groups.values():
                if g.by_request:
                    self._refill.append(g)
            self.io.poke()

    def is_io_thread(self) -> bool:
        return self.io.is_io_thread()

    def shutdown(self) -> None:
        """Stop every group's workers and the IO thread (end of the runtime)."""
        self.limits.stop()
        self.stop_workers()
        self.io.stop()
        with self.lock:
            self._objects.clear()
            self.store.clear()

    def stats(self) -> dict:
        with self.lock:
            return {
                "objects": len(self._objects),
                "groups": {gid: {"workers": len(g.workers), "queued": len(g.queue),
                                 "outstanding": g.outstanding}
                           for gid, g in self._groups.items()},
            }

    # ================================================================ plugging in

    def register_handler(self, code: int, handler: Handler) -> Optional[Handler]:
        with self.lock:
            old = self._handlers.get(code)
            self._handlers[code] = handler
            return old

    def attach_services(self, *, sessions: Optional[DriverService] = None,
                        spillback: Optional[SpillbackService] = None,
                        leases: Optional[LeaseService] = None,
                        actors: Optional[ActorService] = None) -> None:
        with self.lock:
            if actors is not None:
                self._actor_service = actors
            if sessions is not None:
                self._sessions = sessions
            if spillback is not None:
                self._spillback = spillback
            if leases is not None:
                self._leases = leases

    def set_control(self, control: ControlStore) -> None:
        with self.lock:
            self.control = control

    # ================================================================ the services' calls

    def group(self, group_id: int) -> Optional[WorkerGroup]:
        return self._groups.get(group_id)

    def function_payload(self, fn_id: int) -> bytes:
        return self._functions[fn_id]

    def groups_locked(self) -> ValuesView[WorkerGroup]:
        return self._groups.values()

    def insert_group_locked(self, g: WorkerGroup) -> None:
        self._groups[g.group_id] = g
        # (its workers are watched for limits: its own, or the host's memory threshold)
        g.watch = g.limits is not NO_LIMITS or bool(self.limits.threshold)

    def close_group_locked(self, g: WorkerGroup) -> None:
        g.closed = True
        if g.outstanding == 0:
            self._retire_group_locked(g)

    def away_locked(self, t: Task) -> None:
        transition(t, SPILLBACK)

    def back_locked(self, t: Task) -> None:
        transition(t, RETURN)

    def return_task_locked(self, t: Task) -> None:
        transition(t, RETURN)
        g = t.group
        g.queue.appendleft(t)
        self._dispatch_locked(g)

    def cpu_freed_locked(self) -> None:
        refill = self._refill
        for g in self._groups.values():
            if g.queue and g not in refill:
                refill.append(g)
        self.io.poke()  # (the tick dispatches them when no read does: ``protocol._ioloop``)

    def set_function_locked(self, fn_id: int, payload: bytes) -> None:
        self._functions[fn_id] = payload

    # ================================================================ accept / finish

    def admit_locked(self, t: Task) -> None:
        """A submitted task (driver or worker): account its stored arguments, accept it."""
        if t.req is not None and t.req.limits is not None:
            take_task_limits_locked(t)  # (``options(timeout=)``: onto the task)
        try:
            self.store.adopt(t.args, pin=True)  # (never evicted before the task ran)
        except ObjectStoreFullError as exc:
            t.args = None
            obj = self._objects[t.task_id] = ObjectEntry()
            obj.refs = 1  # the submitter's handle, released as usual
            self.finish_locked(t, False, _payload.dumps_error(exc), counted=False)
        else:
            self._accept_locked(t)

    def _accept_locked(self, t: Task) -> None:
        g = t.group
        obj = ObjectEntry()
        obj.refs = 1  # the submitter's handle (driver Future or worker future)
        self._objects[t.task_id] = obj
        if g.broken is not None or (g.closed and g.actor is not None):
            why = g.broken or _SHUT_DOWN
            if g.actor is None:
                err = _payload.dumps_error(errors.broken_pool(why))
            else:
                from dpool.scheduling._actors import actor_error

                err = actor_error(g, why)
            self.finish_locked(t, False, err, counted=False)
            return
        g.outstanding += 1
        self.control.add_task(t.task_id, t.fn_id, t.args, t.dep_ids, g.group_id, _now(),
                              t.owner.worker_id if t.owner else 0)
        if g.actor is not None:  # (its calls start in this order, a chain: ``_actors``)
            g.actor.admitted_locked(self, t)
        if t.dep_ids:
            objects = self._objects
            for oid in t.dep_ids:
                d = objects.get(oid)
                if d is None:
                    self.finish_locked(t, False, _payload.dumps_error(ObjectLostError(
                        f"argument object {oid:#x} was released before this task used it")))
                    return
            t.deps_counted = True
            for oid in t.dep_ids:
                d = objects[oid]
                d.refs += 1
                if not d.ready:
                    t.missing += 1
                    d.add_waiter(t)
            if t.missing:
                transition(t, WAIT)
                return
        to = NEXT[t.state][READY]  # (``_states.transition``, inline: every task)
        if to < 0:
            raise illegal(t, READY)
        t.state = to
        self._enqueue_locked(t)

    def _enqueue_locked(self, t: Task) -> None:
        """A task just made QUEUED: queue it, dispatch; on a node, the spillback may send
        the tasks that would wait too long elsewhere."""
        g = t.group
        g.queue.append(t)
        # A new task goes only to an idle worker; busy ones get queued tasks in batches
        # as their results come back. (Nested tasks, submitted by workers through the IO
        # thread, may be batched at once; an attached driver's are new tasks like any.)
        owner = t.owner
        self._dispatch_locked(g, idle_only=not self.io.is_io_thread()
                              or (owner is not None and owner.remote_values))
        if self._spillback is not None and g.queue:
            self._spillback.consider_locked(g)

    def finish_locked(self, t: Task, ok: bool, payload: bytes, counted: bool = True) -> None:
        """Record a task's outcome and wake whatever waits on its result."""
        to = NEXT[t.state][FINISH]  # (``_states.transition``, inline: every task)
        if to < 0:
            raise illegal(t, FINISH)
        t.state = to
        g = t.group
        if counted:
            g.outstanding -= 1
        if ok and payload[:1] == STORED and g.actor is None:
            self.keep_lineage_locked(t)  # a large result, which may be evicted and lost
            # (an actor's call is not run again: ``_actors``)
        unpinned = bool(t.deps) or t.args is not None
        if t.deps:
            for _oid, dep_ok, dep_payload in t.deps:
                self.store.unpin(dep_payload if dep_ok else None)
            t.deps = None
        if t.deps_counted:
            t.deps_counted = False
            for oid in t.dep_ids or ():
                self.decref_locked(oid)
        if t.args is not None:
            self.store.drop(t.args, unpin=True)  # it lives as long as its task
        if unpinned and self._room_waiters:  # tasks wait for the room it may have freed
            self.room_freed_locked()
        if ok:
            self.control.set_task_state(t.task_id, "FINISHED", t.attempts, _now(),
                                        size=stored_size(payload))
        else:
            self.control.set_task_state(t.task_id, "FAILED", t.attempts, _now(), payload)
        obj = self._objects.get(t.task_id)
        if t.future is not None:
            self._out.append((t.future, ok, payload))
        elif t.owner is not None and t.owner.alive:
            self.send_locked(t.owner, [self._value_message_locked(t.owner, t.task_id, ok, payload)])
        if obj is not None:
            obj.ready = True
            obj.ok = ok
            obj.payload = payload
            if obj.waiters:
                self._wake_waiters_locked(obj, t.task_id)
            if obj.refs <= 0:
                self._drop_object_locked(t.task_id)
        if counted and g.outstanding == 0 and g.closed:
            self._retire_group_locked(g)

    def _wake_waiters_locked(self, obj: ObjectEntry, oid: int) -> None:
        waiters, obj.waiters = obj.waiters or [], None
        touched = set()
        for w in waiters:
            if isinstance(w, Task):
                w.missing -= 1
                if w.missing == 0:
                    transition(w, READY)
                    w.group.queue.append(w)
                    touched.add(w.group.group_id)
            elif isinstance(w, WorkerHandle):
                if w.alive:
                    self._send_object_locked(w, oid, obj)
            else:
                self._out.append((w, obj.ok, obj.payload))
        for gid in touched:
            self._dispatch_locked(self._groups[gid])

    def skip_cancelled_locked(self, t: Task) -> None:
        from concurrent.futures import CancelledError

        t.future = None  # already CANCELLED; dependents fail instead
        self.finish_locked(t, False, _payload.dumps_error(CancelledError()))

    # ================================================================ delivery

    def take_out_locked(self) -> list:
        """The completions gathered in this locked region (and its sends written now:
        the worker starts on them before the bookkeeping below)."""
        if self._outbox:
            self.flush_locked(self._outbox)
        if self.store.has_news:  # large segments freed or spilled in this region
            self._forget_mappings_locked()
        if self.io.idle and self._tick_wanted() and not self.is_io_thread():
            self.io.poke()  # (one attribute read while it ticks; the tick itself says
            # whether more is left when it returns)
        out = self._out
        if out:
            self._out = []
        return out

    def deliver(self, out: list) -> None:
        """Complete futures / call callbacks gathered by ``take_out_locked``. Call
        *without* the lock."""
        if not out:
            return
        loads = _payload.loads
        for target, ok, payload in out:
            if callable(target) and not hasattr(target, "set_result"):
                try:
                    target(ok, payload)
                except Exception:  # noqa: BLE001 - one callback must not cost the others
                    log.exception("dpool: an object-ready callback raised")
                continue
            try:
                if ok:
                    try:
                        value = loads(payload)
                    except BaseException as exc:  # noqa: BLE001 - report on the future
                        if isinstance(exc, FileNotFoundError) and payload[:1] == STORED:
                            self.reread(target)  # evicted before it was mapped (``_object_table``)
                            continue
                        from dpool.errors import DeserializationError

                        target.set_exception(DeserializationError.wrap("the task's result", exc))
                        continue
                    target.set_result(value)
                    value = None  # hold no result once delivered: its reader may free it
                else:
                    target.set_exception(_payload.loads_error(payload))
            except Exception:  # InvalidStateError: cancelled meanwhile
                pass

    def _on_tick(self) -> bool:
        """The IO loop's periodic work; returns whether there is more for the next tick
        (else the loop sleeps until something wakes it: ``_ioloop``)."""
        while self._closing:
            self.close_group(self._closing.popleft())
        if self._refill or self._waiting_for_resources:
            # resources released outside a worker's read; and, as a safety net, tasks
            # waiting for resources are looked at every tick (on a node, CPUs another
            # group frees are theirs too)
            with self.lock:
                self._refill_now_locked()
                out = self.take_out_locked()
            self.deliver(out)
        if self._releases or self.store.has_news:  # news: e.g. the pool expired pages
            with self.lock:
                self._drain_releases_locked()
                if self.store.has_news:
                    self._forget_mappings_locked()
        if self._spillback is not None:
            with self.lock:
                self._spillback.tick_locked()
                out = self.take_out_locked()
            self.deliver(out)
        self.control.flush()
        return self._tick_wanted()

    def _tick_wanted(self) -> bool:
        """Whether the tick has something to look at (read without the lock: a hint; a
        region that leaves such work while the loop is idle pokes it, ``take_out_locked``)."""
        spillback = self._spillback
        return bool(self._closing or self._refill or self._releases or self._waiting_for_resources
                    or self.store.has_news or self.store.expiring or self.control.backlog()
                    or (spillback is not None and (  # queued tasks: to spill, maybe
                        spillback.wants_tick()
                        or any(g.queue for g in list(self._groups.values())))))


_now = time.time
_SHUT_DOWN = "it was shut down (by its executor's shutdown())"
