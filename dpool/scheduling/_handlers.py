"""What the local scheduler does with each message a worker, attached driver or peer sends.

``_on_frames`` (the IO loop's callback) and a leader (``LocalScheduler.lead``) pass a
connection's frames to ``_handle_frames``, which takes the lock and hands each message to
its handler through the one dispatch table (``_handlers``, built by
``LocalScheduler.__init__``; a node's services add theirs with ``register_handler``). An
unknown message raises ``ProtocolError``: none is ignored. Handlers (``_on_*_locked``) run
with the lock held; the completions they gather are delivered after it is released. The
groups a read left work for (``_refill``) are dispatched once, after the whole read: one
frame per worker for the room a batch of results freed, not one per result.
"""

from __future__ import annotations

import time

from dpool import _log, errors
from dpool.errors import ObjectLostError, ObjectStoreFullError, ProtocolError
from dpool.objects import payload as _payload
from dpool.objects import stored_size
from dpool.protocol import decode_batch
from dpool.protocol import messages as m
from dpool.scheduling import _resources
from dpool.scheduling._core import SchedulerCore
from dpool.scheduling._records import ObjectEntry, Task, WorkerHandle

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any

log = _log.getLogger("dpool.scheduling")


class WorkerMessages(SchedulerCore):
    task_metrics: Any = None  # a node's ``/metrics`` counts (``observe(ok, duration)``)

    def count_tasks(self, metrics: Any) -> None:
        """From now on, tell ``metrics.observe(ok, duration)`` each task's outcome (a
        node's ``/metrics``)."""
        with self.lock:
            self.task_metrics = metrics

    def _on_frames(self, w: WorkerHandle, frames: list) -> None:
        self.deliver(self._handle_frames(w, frames))

    def _handle_frames(self, w: WorkerHandle, frames: list) -> list:
        """Handle a worker's frames; returns the completions to deliver (takes the lock)."""
        with self.lock:
            if self._releases:
                self._drain_releases_locked()
            handlers = self._handlers
            try:
                for frame in frames:
                    for msg in decode_batch(frame):
                        h = handlers.get(msg.CODE)
                        if h is None:
                            raise ProtocolError(
                                f"scheduler got unexpected {type(msg).__name__}")
                        h(w, msg)
            finally:
                refill = self._refill
                while refill:
                    g = refill.pop(0)
                    if g.queue or g.by_request:
                        self._dispatch_locked(g)
            return self.take_out_locked()

    def _on_hello_locked(self, w: WorkerHandle, msg: m.Hello) -> None:
        w.pid = msg.pid
        w.mark_ready()
        w.group.start_failures = 0

    def _on_task_done_locked(self, w: WorkerHandle, msg: m.TaskDone) -> None:
        t = w.inflight.pop(msg.task_id, None)
        if t is None:
            # handed back or already failed over; its outcome is decided elsewhere
            self.store.discard(msg.payload if msg.ok else None)
            return
        w.load = w.load - t.estimate_s if w.inflight else 0.0
        if t.alloc is not None:  # it held resources (``_resource_dispatch``)
            self._release_allocation_locked(t, w)
        self.batch.observe(t.fn_id, msg.duration)
        if self.task_metrics is not None:
            self.task_metrics.observe(msg.ok, msg.duration)
        if t.group.actor is not None:
            from dpool.scheduling import _actors

            _actors.ran_locked(self, t)  # (its log, for a restart)
        ok, payload = self._adopt_result_locked(msg.ok, msg.payload,
                                                self.rebuilding_locked(t))
        self.finish_locked(t, ok, payload)
        g = w.group
        if (g.queue or g.by_request) and g not in self._refill:
            # Refilled once the whole read is handled (``_handle_frames``): one frame to
            # each worker for the room a batch of results freed, not one per result (one
            # send() each: a large share of the IO thread's time in a burst of no-ops,
            # bench/NOTES.md).
            self._refill.append(g)
        elif not w.inflight and self.cpu_limit is not None:
            # Its CPU came free and its own group wants nothing: on a node every group
            # shares the CPUs (``cpu_limit``), so another group's tasks that came while
            # they were all busy wait for this one (else they waited for good: a node's
            # mirror group idle, a driver's group queued behind it)
            refill = self._refill
            for other in self._groups.values():
                if other.queue and other not in refill:
                    refill.append(other)

    def _adopt_result_locked(self, ok: bool, payload: bytes,
                             rebuilt: bool = False) -> tuple[bool, bytes]:
        """A task's outcome as the object table keeps it: a value a worker wrote into
        the store is accounted for (or, the store being full, the task failed).
        ``rebuilt``: a lineage rebuild's result (``_lineage``), which readers wait for:
        with no room now -- the store pinned by the inputs of the tasks running
        meanwhile -- it goes to disk and waits for room as a spilled value does, instead
        of failing its readers with ObjectStoreFullError."""
        if ok:
            try:
                if rebuilt:
                    self.store.adopt_or_spill(payload)
                else:
                    self.store.adopt(payload)
            except ObjectStoreFullError as exc:
                return False, _payload.dumps_error(exc)
        return ok, payload

    def _on_init_failed_locked(self, w: WorkerHandle, msg: m.InitFailed) -> None:
        g = w.group
        err = _payload.loads_error(msg.error)
        if g.actor is not None:
            self.break_group_locked(g, f"its constructor raised {type(err).__name__}: {err}"
                                    if g.actor.restarts == 0 else
                                    f"restoring it raised {type(err).__name__}: {err}")
            return
        self.break_group_locked(g, (
            "A child process terminated abruptly, the process pool is not usable anymore "
            f"(the initializer raised {type(err).__name__}: {err})"))

    def _on_register_function_locked(self, w: WorkerHandle, msg: m.RegisterFunction) -> None:
        self._functions[msg.fn_id] = msg.payload
        w.functions.add(msg.fn_id)
        self.control.register_function(msg.fn_id, "", msg.payload)

    def _on_submit_locked(self, w: WorkerHandle, msg: m.SubmitTask) -> None:
        g = self._groups.get(msg.group_id)
        if g is None and msg.group_id in self.ended_actors:  # (``_actors.bury_locked``)
            from dpool.scheduling._actors import ended_error

            err = ended_error(self, msg.group_id)
            if err is not None:
                self.send_locked(w, [m.ObjectValue(msg.task_id, False, err)])
                return
        if g is None:  # (a worker of a mirror group: its driver's group is the origin's)
            g = w.group
            if g is not None and g.actor is not None and g.group_id != msg.group_id:
                g = None  # (an actor's worker never runs a task of another group)
        if g is None:  # an attached driver's group that is gone
            self.send_locked(w, [m.ObjectValue(msg.task_id, False, _payload.dumps_error(
                errors.broken_pool("the pool or actor this task was submitted to was shut "
                                   "down, or is not on this node")))])
            return
        w.owned.add(msg.task_id)
        t = Task(msg.task_id, msg.fn_id, msg.args, msg.dep_ids, g, w, None)
        if msg.req is not None:
            t.req = _resources.from_wire(msg.req)
        self.admit_locked(t)

    def _on_output_locked(self, w: WorkerHandle, msg: m.Output) -> None:
        """What a worker printed (node daemons only): to the driver that owns its group."""
        if self._sessions is not None:
            self._sessions.forward_output_locked(w, msg)

    def _on_blocked_locked(self, w: WorkerHandle, msg: m.Blocked) -> None:
        if not w.blocked:
            w.group.n_blocked += 1
            if w.extra_cpus:
                self._on_blocked_with_resources_locked(w)
        w.blocked = True
        self._requeue_locked(w, msg.returned)
        self._dispatch_locked(w.group)
        if self._room_waiters:  # its task's pins may have been the last that could clear
            self.fail_stuck_room_waiters_locked()

    def _on_unblocked_locked(self, w: WorkerHandle, msg: m.Unblocked) -> None:
        if w.blocked:
            w.group.n_blocked -= 1
            if w.extra_cpus:
                self._on_unblocked_with_resources_locked(w)
        w.blocked = False
        if w.group.actor is not None and w.group.queue:
            self._dispatch_locked(w.group)  # its calls waited for it

    def _on_actor_route_locked(self, w: WorkerHandle, msg: m.ActorRoute) -> None:
        """A handle of a cluster's actor reached this embedded runtime (one made inside a
        task): no route leads there, so its calls fail at once."""
        if msg.group_id in self._groups:
            return
        from dpool.scheduling._actors import proxy_group

        self._groups[msg.group_id] = proxy_group(
            msg.group_id, msg.name, msg.node,
            f"it lives on node {msg.node}, which this runtime cannot reach (an executor "
            "made inside a task is a runtime of its own: call the actor from the task "
            "itself)")

    def _on_actor_find_locked(self, w: WorkerHandle, msg: m.ActorFind) -> None:
        from dpool.scheduling import _actors

        self.send_locked(w, [m.ObjectValue(msg.request_id, True, _payload.dumps(
            _actors.find_locked(self, msg.name)))])

    def _on_kv_put_locked(self, w: WorkerHandle, msg: m.KVPut) -> None:
        kv = self.kv
        now = time.monotonic()
        for key in [k for k, (_v, until) in kv.items() if until <= now]:
            del kv[key]  # (expired: the table stays as small as what is live)
        kv[msg.key] = (msg.value, now + msg.ttl_s)
        self.send_locked(w, [m.ObjectValue(msg.request_id, True, _payload.dumps(None))])

    def _on_kv_get_locked(self, w: WorkerHandle, msg: m.KVGet) -> None:
        have = self.kv.get(msg.key)
        value = have[0] if have is not None and have[1] > time.monotonic() else None
        self.send_locked(w, [m.ObjectValue(msg.request_id, True, _payload.dumps(value))])

    def _on_kill_actor_locked(self, w: WorkerHandle, msg: m.KillActor) -> None:
        g = self._groups.get(msg.group_id)
        if g is not None and g.actor is not None and not g.actor.host:
            self.kill_actor_locked(g, msg.reason)

    def _on_actor_checkpoint_locked(self, w: WorkerHandle, msg: m.ActorCheckpoint) -> None:
        from dpool.scheduling import _actors

        _actors.checkpoint_locked(self, w, msg)

    def _on_return_tasks_locked(self, w: WorkerHandle, msg: m.ReturnTasks) -> None:
        self._requeue_locked(w, msg.task_ids)
        if msg.retire:  # past max_memory_per_worker: replaced before its next task
            w.retiring = True  # (after the requeue, which un-retires for max_tasks)
            if not w.inflight and w.mark_stopping():
                self.send_locked(w, [m.Shutdown()])
        self._dispatch_locked(w.group)

    def _on_get_objects_locked(self, w: WorkerHandle, msg: m.GetObjects) -> None:
        for oid in msg.object_ids:
            obj = self._objects.get(oid)
            if obj is None:
                self.send_locked(w, [m.ObjectValue(oid, False, _payload.dumps_error(
                    ObjectLostError(f"object {oid:#x} is unknown: its last reference "
                                    "was released")))])
            elif obj.ready:
                self._send_object_locked(w, oid, obj)
            else:
                obj.add_waiter(w)

    def _on_release_locked(self, w: WorkerHandle, msg: m.Release) -> None:
        for oid in msg.object_ids:
            if oid in w.owned:
                w.owned.discard(oid)
                self.decref_locked(oid)

    def _on_put_locked(self, w: WorkerHandle, msg: m.PutObject) -> None:
        obj = ObjectEntry()
        obj.ready = True
        obj.payload = msg.payload
        obj.refs = 1  # the putting worker's ref
        try:
            self.store.adopt(msg.payload)
        except ObjectStoreFullError as exc:
            obj.ok, obj.payload = False, _payload.dumps_error(exc)
        self._objects[msg.object_id] = obj
        w.owned.add(msg.object_id)
        self.control.add_object(msg.object_id, stored_size(msg.payload), "host")
