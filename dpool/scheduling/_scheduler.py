"""The local scheduler: one per host, owning that host's worker processes.

    driver threads ──submit()──▶ ┌──────────────────────────────┐
                                  │ LocalScheduler (this module) │──ExecuteTask──▶ worker
    worker sockets ──SubmitTask─▶ │  groups: queue, workers      │◀──TaskDone──── worker
                                  │  objects: id -> value/refs   │
                                  │  IOLoop thread reads sockets │──▶ control store (batched)
                                  └──────────────────────────────┘
                                       │ completions (outside the lock)
                                       ▼
                                  driver Futures: set_result / set_exception

Tasks from the driver (``submit``) and from workers (``SubmitTask``) take the same path,
``_accept``: record lineage, pin dependencies, queue when ready, ``_dispatch``. A worker
group is the set of workers of one executor; dispatch sends a group's queued tasks to its
workers with room (``BatchPolicy``), spawning workers up to ``max_workers`` on demand.
A submission goes out at once, on the submitting thread, only to an *idle* worker (no
hop through the IO thread: that is the latency path). While workers are busy it waits in
the queue, and the IO thread sends queued tasks in batches as results come back and free
room (the throughput path: one frame and one system call for many tasks).

Lock rule: ``self._lock`` guards every record here. Methods named ``_x`` expect it held.
Futures are completed *after* releasing it, because their done-callbacks may submit again,
and by the thread whose locked region produced them (``_take_out`` before unlocking): so
done-callbacks of results run on the IO thread, never inside a caller's ``submit()``.

The latency path back: a driver thread that blocks in ``Future.result()`` on a task its
worker runs alone *leads* (``lead``): it reads that worker's socket itself while the IO
thread leaves it alone, and completes the future on its own thread (one thread hop and
one sleeping wake-up fewer). Completions with done-callbacks still go to the IO thread.

A worker blocked inside a task (nested ``result()``) sends ``Blocked``: it stops counting
against ``max_workers`` and the group may start another worker, so nested tasks never
deadlock. A worker that dies has the task it was running retried up to ``max_attempts``.

This module holds the public calls, the object table and the accept/finish path; its
parts: ``_workers`` (dispatch, worker processes, deaths), ``_handlers`` (worker and
driver messages), ``_core`` (the shared state, declared for the type checker). On a node
daemon the cluster parts plug in: ``_attach`` (drivers), ``_spill``/``_remote``
(bottom-up scheduling).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional, cast

from dpool.errors import ObjectLostError, ObjectStoreFullError
from dpool.objects import _mapping, _payload
from dpool.objects._host import HostStore
from dpool.protocol import _messages as m
from dpool.protocol._ioloop import SPIN_S, IOLoop
from dpool.scheduling._handlers import WorkerMessages
from dpool.scheduling._policy import BatchPolicy
from dpool.scheduling._records import Group, Obj, Task, WorkerHandle
from dpool.scheduling._resdispatch import ResourceDispatch
from dpool.scheduling._resources import Request
from dpool.scheduling._workers import WorkerPool, _broken_error, _reap

log = logging.getLogger("dpool.scheduling")

# (future-or-callable, ok, payload): completions to deliver once the lock is released.
Completion = tuple



@dataclass
class GroupConfig:
    max_workers: int
    mp_context: Any
    initializer: Optional[bytes] = None
    max_tasks: Optional[int] = None
    max_attempts: int = 3
    working_dir: Optional[str] = None  # cluster mode: the directory shipped to the nodes


class LocalScheduler(WorkerMessages, WorkerPool, ResourceDispatch):
    def __init__(self, control: Any) -> None:
        self._lock = threading.Lock()
        self._ctl = control
        self._groups: dict[int, Group] = {}
        self._objects: dict[int, Obj] = {}
        self._functions: dict[int, bytes] = {}
        self._group_ids = itertools.count(1)
        self._worker_ids = itertools.count(1)
        self._batch = BatchPolicy()
        self._releases: deque = deque()  # object ids released from any thread
        self._closing: deque = deque()  # groups of collected executors, closed by the IO thread
        self._closed = False
        self._out: list = []  # completions gathered under the lock, delivered after it
        self._refill: list[Group] = []  # groups to dispatch once a read is handled (lock held)
        self._exited = threading.Condition(self._lock)  # notified when a worker is reaped
        self.store = HostStore(os.getpid())
        self.sessions: Any = None  # _attach.DriverSessions on a node daemon (cluster mode)
        self.spiller: Any = None  # _spill.Spiller on a node of a multi-node cluster
        # A node's CPUs: at most this many workers run tasks at once, over every group
        # (None on the embedded runtime: each executor has its own max_workers only).
        self.cpu_limit: Optional[int] = None
        self.id_prefix: Optional[Callable[[], int]] = None  # a node's cluster-unique prefixes
        # GPUs, memory, custom resources (``_resdispatch``): detected on the first task
        # that asks for any, from ``ledger_spec`` if given (the executor keyword).
        self.ledger = None
        self.ledger_spec: Optional[dict] = None
        self.leases: dict = {}  # worker id -> worker lent to a driver (``_leases``, cluster)
        self.recall_leases: Callable[[], None] = lambda: None
        self._handlers: dict[int, Callable[[WorkerHandle, Any], None]] = {
            m.Hello.CODE: self._on_hello,
            m.TaskDone.CODE: self._on_task_done,
            m.InitFailed.CODE: self._on_init_failed,
            m.RegisterFunction.CODE: self._on_register_function,
            m.SubmitTask.CODE: self._on_submit,
            m.Blocked.CODE: self._on_blocked,
            m.Unblocked.CODE: self._on_unblocked,
            m.ReturnTasks.CODE: self._on_return_tasks,
            m.GetObjects.CODE: self._on_get_objects,
            m.Release.CODE: self._on_release,
            m.PutObject.CODE: self._on_put,
            m.Output.CODE: self._on_output,
        }
        self._leading = threading.Lock()  # held by the one driver thread that leads
        self._io = IOLoop(self._on_frames, self._on_closed, self._on_tick)

    # ================================================================ public (any thread)

    def add_group(self, cfg: GroupConfig) -> Group:
        with self._lock:
            g = Group(next(self._group_ids), cfg.max_workers, cfg.mp_context, cfg.initializer,
                      cfg.max_tasks, cfg.max_attempts)
            self._groups[g.group_id] = g
            return g

    def estimate(self, fn_id: int, default: Any = ...) -> Any:
        """Average run time of ``fn_id``'s tasks; ``default`` (else the policy's guess)."""
        if default is not ... and not self._batch.known(fn_id):
            return default
        return self._batch.estimate(fn_id)

    def set_store_capacity(self, capacity: int) -> None:
        with self._lock:
            self.store.set_capacity(capacity)

    def register_function(self, fn_id: int, name: str, payload: bytes) -> None:
        with self._lock:
            self._functions[fn_id] = payload
        self._ctl.register_function(fn_id, name, payload)

    def submit(self, group: Group, task_id: int, fn_id: int, args: Optional[bytes],
               dep_ids: Optional[tuple], future: Any, req: Optional[Request] = None) -> None:
        t = Task(task_id, fn_id, args, dep_ids, group, None, future)
        if req is not None:
            t.req = req
        with self._lock:
            if self._releases:
                self._drain_releases()
            self._admit(t)
            out = self._take_out()
        self._deliver(out)

    def lead(self, future: Any, timeout: Optional[float]) -> Optional[float]:
        """Wait for a driver ``future`` by reading its worker's socket on this thread.

        The leader/follower read (``_ioloop``): while this thread waits, the IO thread
        leaves the socket of the worker running the task alone, and this thread reads and
        handles that worker's messages itself, so a result wakes the thread waiting for it
        directly. It leads for at most ``_ioloop.LEAD_S`` (longer tasks: the latency of a hop
        does not matter) and only while no other thread leads; completions whose
        futures have done-callbacks go to the IO thread, which runs the callbacks as
        before. Returns what is left of ``timeout`` for the ordinary wait that follows.
        """
        if future.done() or future._done_callbacks or self._io.is_io_thread() \
                or not self._leading.acquire(blocking=False):
            # (a future with callbacks is completed by the IO thread; the IO thread, in
            # a done-callback, must not stop serving the other sockets)
            return timeout
        try:
            return self._lead(future, timeout)
        finally:
            self._leading.release()

    def _lead(self, future: Any, timeout: Optional[float]) -> Optional[float]:
        with self._lock:
            w = self._holder(future._oid)
            # a task expected to end within the spin window: poll without sleeping
            spin = w is not None and w.inflight[future._oid].est < SPIN_S
        if w is None:
            return timeout
        io = self._io
        return io.lead(w, future, timeout, spin,
                       lambda frames: self._handle_frames(w, frames),
                       self._deliver_leading,
                       lambda: io.call_soon(lambda: io.close_handle(w)))

    def _holder(self, task_id: int) -> Optional[WorkerHandle]:
        """The live worker of this host running ``task_id`` and nothing else (lock held).

        Only then does a leader help: with more tasks in flight (a burst), the IO thread
        is busy with results anyway, and two threads handling them contend for the GIL
        and this lock (throughput 44k -> 40k tasks/s when leaders took bursts too)."""
        for g in self._groups.values():
            for w in g.workers:
                inflight = w.inflight
                if task_id in inflight:
                    ok = w.alive and w.process is not None and len(inflight) == 1
                    return w if ok else None
        return None

    def _deliver_leading(self, out: list) -> None:
        """``_deliver`` on a leader: futures with done-callbacks (and object callbacks)
        are completed by the IO thread, so callbacks run there as they always do."""
        here = []
        there = []
        for item in out:
            target = item[0]
            if getattr(target, "_done_callbacks", True):
                there.append(item)
            else:
                here.append(item)
        self._deliver(here)
        if there:
            self._io.call_soon(lambda: self._deliver(there))

    def put(self, object_id: int, payload: bytes) -> None:
        """Store a value under ``object_id`` with one reference (the caller's handle)."""
        with self._lock:
            try:
                self.store.adopt(payload)  # raises ObjectStoreFullError at the put() call
            finally:
                if self.store.has_news:  # adopting may have spilled others
                    self._forget_mappings()
            obj = Obj()
            obj.ready = True
            obj.payload = payload
            obj.refs = 1
            self._objects[object_id] = obj
        self._ctl.add_object(object_id, len(payload), "host")

    def subscribe(self, object_id: int, callback: Callable[[bool, bytes], None]) -> None:
        """Call ``callback(ok, payload)`` once the object is ready (maybe right away)."""
        with self._lock:
            obj = self._objects.get(object_id)
            if obj is None:
                ok, payload = False, _payload.dumps_error(ObjectLostError(
                    f"object {object_id:#x} is unknown here: its last reference was "
                    "released or it was created by another runtime"))
            elif not obj.ready:
                obj.add_waiter(callback)
                return
            else:
                ok, payload = self._resident_value(obj)
        callback(ok, payload)

    def collect_releases(self) -> None:
        """Apply the handle releases queued by ``release`` now rather than at the next
        scheduler event (before a large write, so it can reuse the freed pages)."""
        if self._releases:
            with self._lock:
                self._drain_releases()
                out = self._take_out()
            self._deliver(out)

    def release(self, object_id: int) -> None:
        """Drop one handle's reference. Safe from ``__del__`` in any thread (no lock)."""
        self._releases.append(object_id)

    def addref(self, object_id: int) -> bool:
        with self._lock:
            obj = self._objects.get(object_id)
            if obj is None:
                return False
            obj.refs += 1
            return True

    def set_resource_offer(self, spec: Optional[dict]) -> None:
        """What the embedded runtime offers (``runtime_resources=``); None: detect."""
        from dpool.scheduling import _detect

        led = _detect.embedded_ledger(spec)
        with self._lock:
            self.set_resources(led)
            self.ledger_spec = spec
            for g in self._groups.values():
                if g.rq:
                    self._refill.append(g)

    def cancel_queued(self, group: Group) -> None:
        """``shutdown(cancel_futures=True)``: cancel every task of the group not started."""
        with self._lock:
            for queue in [group.queue, *group.rq.values()]:
                keep: deque = deque()
                for t in queue:
                    if t.future is not None and not t.started and t.future.cancel():
                        self._skip_cancelled(t)
                    else:
                        keep.append(t)
                queue.clear()
                queue.extend(keep)
            for req in [r for r, q in group.rq.items() if not q]:
                del group.rq[req]
            # Tasks still waiting for their inputs: cancel their futures now; dispatch
            # skips them once their inputs are ready.
            for obj in self._objects.values():
                for x in obj.waiters or ():
                    if isinstance(x, Task) and x.group is group and x.future is not None \
                            and not x.started:
                        x.future.cancel()
            out = self._take_out()
        self._deliver(out)

    def close_group_soon(self, group: Group) -> None:
        """``close_group`` from a finalizer: no lock taken here (GC may run while this
        thread holds it); the IO thread closes the group within a tick."""
        self._closing.append(group)
        self._io.wake()

    def close_group(self, group: Group, on_idle: Optional[Callable[[], None]] = None) -> None:
        """No more submissions to ``group``; its workers stop once its work is done."""
        with self._lock:
            group.closed = True
            if on_idle is not None:
                group.on_idle.append(on_idle)
            if group.outstanding == 0:
                self._retire_group(group)

    def wait_group_exited(self, group: Group, timeout: float = 30.0) -> None:
        """Block until the closed ``group`` is idle and every one of its workers exited."""
        deadline = None
        with self._lock:
            while group.outstanding > 0 or any(w.process is not None for w in group.workers):
                if group.outstanding == 0:
                    if deadline is None:
                        deadline = time.monotonic() + timeout
                    elif time.monotonic() > deadline:
                        break
                self._exited.wait(0.1)
            stragglers = list(group.workers)
        for w in stragglers:  # did not exit within `timeout` of being told to
            log.warning("worker %d did not exit when asked; killing it", w.worker_id)
            _reap(w, kill_after=0)

    def terminate_group(self, group: Group, reason: str) -> None:
        """Stop a group's workers now; its unfinished tasks fail with ``reason``."""
        with self._lock:
            group.closed = True
            group.broken = group.broken or reason
            self._fail_group(group, reason)
            victims = list(group.workers)
            for w in victims:
                w.alive = False
                self._send(w, [m.Shutdown()])
            out = self._take_out()
        for w in victims:
            _reap(w, kill_after=0.5)
        self._deliver(out)

    def is_io_thread(self) -> bool:
        return self._io.is_io_thread()

    def shutdown(self) -> None:
        """Stop every group's workers and the IO thread (end of the runtime)."""
        with self._lock:
            self._closed = True
            workers = [w for g in self._groups.values() for w in g.workers]
            for w in workers:
                w.alive = False
                self._send(w, [m.Shutdown()])
        for w in workers:
            _reap(w, kill_after=1.0)
        self._io.stop()
        with self._lock:
            self._objects.clear()
            self.store.clear()

    def stats(self) -> dict:
        with self._lock:
            return {
                "objects": len(self._objects),
                "groups": {gid: {"workers": len(g.workers), "queued": len(g.queue),
                                 "outstanding": g.outstanding}
                           for gid, g in self._groups.items()},
            }

    # ================================================================ accept / finish

    def _admit(self, t: Task) -> None:
        """A submitted task (driver or worker): account its stored arguments, accept it."""
        try:
            self.store.adopt(t.args)
        except ObjectStoreFullError as exc:
            t.args = None
            obj = self._objects[t.task_id] = Obj()
            obj.refs = 1  # the submitter's handle, released as usual
            self._finish(t, False, _payload.dumps_error(exc), counted=False)
        else:
            self._accept(t)

    def _accept(self, t: Task) -> None:
        g = t.group
        obj = Obj()
        obj.refs = 1  # the submitter's handle (driver Future or worker future)
        self._objects[t.task_id] = obj
        if g.broken is not None:
            self._finish(t, False, _payload.dumps_error(_broken_error(g.broken)),
                         counted=False)
            return
        g.outstanding += 1
        self._ctl.add_task(t.task_id, t.fn_id, t.args, t.dep_ids, g.group_id, _now(),
                           t.owner.worker_id if t.owner else 0)
        if t.dep_ids:
            objects = self._objects
            for oid in t.dep_ids:
                d = objects.get(oid)
                if d is None:
                    self._finish(t, False, _payload.dumps_error(ObjectLostError(
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
                return
            if not self._build_deps(t):
                return
        self._enqueue(t)

    def _enqueue(self, t: Task) -> None:
        """A ready task: queue it, dispatch; on a node, the spiller may send the tasks
        that would wait too long elsewhere."""
        g = t.group
        g.queue.append(t)
        # A new task goes only to an idle worker; busy ones get queued tasks in batches
        # as their results come back. (Nested tasks, submitted by workers through the IO
        # thread, may be batched at once; an attached driver's are new tasks like any.)
        owner = t.owner
        self._dispatch(g, idle_only=not self._io.is_io_thread()
                       or (owner is not None and owner.remote_values))
        if self.spiller is not None and g.queue:
            self.spiller.consider(g)

    def _build_deps(self, t: Task) -> bool:
        """Attach ready dependency values to ``t``, pinning stored ones; False if it failed."""
        objects = self._objects
        deps = []
        try:
            for oid in t.dep_ids or ():
                d = objects[oid]
                self.store.pin(d.payload if d.ok else None)
                deps.append((oid, d.ok, d.payload))
        except ObjectStoreFullError as exc:
            for _oid, ok, payload in deps:
                self.store.unpin(payload if ok else None)
            self._finish(t, False, _payload.dumps_error(exc))
            return False
        t.deps = tuple(deps)
        return True

    def _finish(self, t: Task, ok: bool, payload: bytes, counted: bool = True) -> None:
        """Record a task's outcome and wake whatever waits on its result."""
        g = t.group
        if counted:
            g.outstanding -= 1
        if t.deps:
            for _oid, dep_ok, dep_payload in t.deps:
                self.store.unpin(dep_payload if dep_ok else None)
            t.deps = None
        if t.deps_counted:
            t.deps_counted = False
            for oid in t.dep_ids or ():
                self._decref(oid)
        if t.args is not None:
            self.store.drop(t.args)  # a stored argument block lives as long as its task
        self._ctl.set_task_state(t.task_id, "FINISHED" if ok else "FAILED", t.attempts, _now())
        obj = self._objects.get(t.task_id)
        if t.future is not None:
            self._out.append((t.future, ok, payload))
        elif t.owner is not None and t.owner.alive:
            self._send(t.owner, [self._value_message(t.owner, t.task_id, ok, payload)])
        if obj is not None:
            obj.ready = True
            obj.ok = ok
            obj.payload = payload
            if obj.waiters:
                self._wake_waiters(obj, t.task_id)
            if obj.refs <= 0:
                self._drop_object(t.task_id)
        if counted and g.outstanding == 0 and g.closed:
            self._retire_group(g)

    def _wake_waiters(self, obj: Obj, oid: int) -> None:
        waiters, obj.waiters = obj.waiters or [], None
        touched = set()
        for w in waiters:
            if isinstance(w, Task):
                w.missing -= 1
                if w.missing == 0 and self._build_deps(w):
                    w.group.queue.append(w)
                    touched.add(w.group.group_id)
            elif isinstance(w, WorkerHandle):
                if w.alive:
                    self._send_object(w, oid, obj)
            else:
                self._out.append((w, obj.ok, obj.payload))
        for gid in touched:
            self._dispatch(self._groups[gid])

    def _skip_cancelled(self, t: Task) -> None:
        from concurrent.futures import CancelledError

        t.future = None  # already CANCELLED; dependents fail instead
        self._finish(t, False, _payload.dumps_error(CancelledError()))

    def _decref(self, oid: int, n: int = 1) -> None:
        obj = self._objects.get(oid)
        if obj is None:
            return
        obj.refs -= n
        if obj.refs <= 0 and obj.ready:
            self._drop_object(oid)

    def _drop_object(self, oid: int) -> None:
        obj = self._objects.pop(oid)
        if obj.ok:
            self.store.drop(obj.payload)
        self._ctl.remove_object(oid)

    def _forget_mappings(self) -> None:
        """Large segments were freed or spilled, or pooled pages given back: workers (and
        this process) unmap cached mappings nobody can use any more."""
        names = self.store.take_news()
        _mapping.prune()
        msg = [m.Forget(names)]
        for g in self._groups.values():
            for w in g.workers:
                if w.alive:
                    self._send(w, msg)
        if self.sessions is not None:  # drivers on this host map our segments too
            for d in self.sessions.drivers.values():
                if d.local and d.alive:
                    self._send(d, msg)

    def _resident_value(self, obj: Obj) -> tuple[bool, bytes]:
        """A ready object's (ok, payload), brought back from disk first if it was spilled."""
        ok, payload = obj.ok, cast(bytes, obj.payload)  # ready: the payload is set
        if ok:
            try:
                self.store.restore_payload(payload)
            except ObjectStoreFullError as exc:
                ok, payload = False, _payload.dumps_error(exc)
        return ok, payload

    def _send_object(self, w: WorkerHandle, oid: int, obj: Obj) -> None:
        ok, payload = self._resident_value(obj)
        self._send(w, [self._value_message(w, oid, ok, payload)])

    def _value_message(self, w: WorkerHandle, oid: int, ok: bool,
                       payload: bytes) -> m.ObjectValue:
        if w.remote_values:  # an attached driver, maybe on another host
            return self.sessions.value_message(w, oid, ok, payload)
        return m.ObjectValue(oid, ok, payload)

    def _drain_releases(self) -> None:
        rel = self._releases
        while rel:
            self._decref(rel.popleft())

    # ================================================================ delivery

    def _take_out(self) -> list:
        """The completions gathered in this locked region (lock held)."""
        if self.store.has_news:  # large segments freed or spilled in this region
            self._forget_mappings()
        out = self._out
        if out:
            self._out = []
        return out

    def _deliver(self, out: list) -> None:
        """Complete futures / call callbacks gathered by ``_take_out``. Call *without* the lock."""
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
                        from dpool.errors import DeserializationError

                        target.set_exception(DeserializationError.wrap("the task's result", exc))
                        continue
                    target.set_result(value)
                    value = None  # hold no result once delivered: its reader may free it
                else:
                    target.set_exception(_payload.loads_error(payload))
            except Exception:  # InvalidStateError: cancelled meanwhile
                pass

    def _on_tick(self) -> None:
        while self._closing:
            self.close_group(self._closing.popleft())
        if self._refill or self._res_waiting:
            # resources released outside a worker's read; and, as a safety net, tasks
            # waiting for resources are looked at every tick (on a node, CPUs another
            # group frees are theirs too)
            with self._lock:
                self._refill_now()
                out = self._take_out()
            self._deliver(out)
        if self._releases or self.store.has_news:  # news: e.g. the pool expired pages
            with self._lock:
                self._drain_releases()
                if self.store.has_news:
                    self._forget_mappings()
        if self.spiller is not None:
            with self._lock:
                self.spiller.tick()
                out = self._take_out()
            self._deliver(out)
        self._ctl.flush()


_now = time.time
