"""The local scheduler's worker processes: dispatching to them, starting them, their deaths.

Dispatch (``_dispatch_locked``) sends a group's queued tasks to the least-loaded worker with
room (``BatchPolicy``: short tasks in batches, long ones one at a time), starting workers
up to the group's ``max_workers`` on demand; on a node, the workers busy over every group
stay within its ``cpu_limit``. With ``idle_only`` (a submitting thread) it sends only to
idle workers. A task's inputs are pinned as it is sent (``pin_inputs_locked``); while the
store is under pressure, one with large inputs not yet pinned goes only to an idle worker
(``only_to_idle_locked``). A task with a resource request leaves the queue for
``_resource_dispatch``.

Starting (``spawn_locked``): workers of the stock ``fork`` context are ``_forkproc``
processes, forked by the fork server (``_zygote``, forked once at ``fork_point``) once this
process runs threads; here while it runs none, without a fork server, or for initargs
that only inheritance passes. Other contexts start their own ``Process``.

Deaths (``_on_closed``, the IO loop's call when a worker's socket closes): of the tasks it
held, only the one it was running (read from the running board; without a slot on it,
the first held) is charged an attempt, and fails with ``WorkerCrashedError`` when out of
attempts; the others go back to the queue uncharged. A worker that dies running none
charges the first it held only after ``_BOUNCES`` x ``max_attempts`` such deaths. One
that dies before its Hello charges none; ``_START_FAILURES`` such deaths in a row, not
SIGKILLed from outside, break the group (``break_group_locked``).

Lock rule (``_api``): ``_locked`` methods expect the scheduler's lock held; ``_on_closed``
and ``stop_workers`` take it; ``fork_point`` takes only ``_fork_lock``.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

from dpool import _log, errors
from dpool.errors import Error
from dpool.objects import owners as _owners
from dpool.objects import payload as _payload
from dpool.protocol import Channel, WorkerConfig, start_worker
from dpool.protocol import messages as m
from dpool.protocol import running as _running
from dpool.scheduling import _forkproc, _limits
from dpool.scheduling._exits import describe_exit, reap
from dpool.scheduling._core import SchedulerCore
from dpool.scheduling._lock import write_sends
from dpool.scheduling._records import Task, WorkerGroup, WorkerHandle
from dpool.scheduling._states import (
    NEXT,
    REQUEUE,
    SEND,
    W_READY,
    W_STARTING,
    W_STOPPING,
    illegal,
    transition,
)

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Optional

log = _log.getLogger("dpool.scheduling")

_now = time.time

# workers of a group that die by themselves before saying Hello, one after another,
# that break the group (``_died_starting_locked``)
_START_FAILURES = 3
# a worker that dies running no task charges the first it held after this many times its
# max_attempts of such deaths (``_on_closed``)
_BOUNCES = 5


class WorkerPool(SchedulerCore):
    # -- forking ---------------------------------------------------------------------------
    def init_forking(self) -> None:
        """In the constructor, before anything could fork: no fork server yet (forked at
        ``fork_point``; None where workers are forked here: ``_forkproc.fork_server``),
        and the board where forked workers say which task they run (``_running``)."""
        self.zygote = None
        self._forked_server = False
        self._fork_lock = threading.Lock()
        _running.create()

    def fork_point(self) -> None:
        """Fork the fork server now if it is not yet (once): the last moment this process
        runs no thread of the runtime's -- before the IO thread starts, a ``Pool``'s
        threads start or the first worker is forked -- so that the server is forked
        single-threaded, as late as can be: a worker is a copy of the program as it was
        then (for the first executor's workers, what the stdlib's would see)."""
        if self._forked_server:
            return
        with self._fork_lock:
            if not self._forked_server:
                self.zygote = _forkproc.fork_server()
                self._forked_server = True

    def stop_workers(self) -> None:
        """End of the runtime: every group's workers told to exit and reaped (killed
        after 1 s), then the fork server, which reports their ends and ends with them."""
        with self.lock:
            self.closed = True
            workers = [w for g in self._groups.values() for w in g.workers]
            for w in workers:
                w.mark_stopping()
                self.send_locked(w, [m.Shutdown()])
        if self.zygote is not None:
            self.zygote.finish()
        for w in workers:
            reap(w, kill_after=1.0)
        with self._fork_lock:
            self._forked_server = True  # none after the end
        if self.zygote is not None:
            self.zygote.close()

    # -- dispatch --------------------------------------------------------------------------
    def _dispatch_locked(self, g: WorkerGroup, idle_only: bool = False) -> None:
        """Send queued tasks of ``g`` to workers with room (only idle ones if ``idle_only``:
        busy workers get theirs in batches when their results come back)."""
        q = g.queue
        if g.broken is not None:
            self.fail_group_locked(g, g.broken)
            return
        if g.actor is not None:  # one worker, calls in order (``_actors``)
            from dpool.scheduling import _actors

            _actors.dispatch_locked(self, g, idle_only)
            return
        if g.by_request:  # tasks with resource requests first: what was released is theirs
            self._dispatch_requests_locked(g)
        batch = self.batch
        log_event = self.control.log_event
        while q:
            if q[0].req is not None:  # asks for resources: ``_resource_dispatch``
                self._route_with_request_locked(g, q.popleft())
                continue
            if g.starved and g.by_request:
                # A task with a request waits for the CPUs (or worker slot) that tasks
                # without one would take: they wait instead, so the workers drain and it
                # starts (else a stream of short tasks would hold it back for good).
                return
            prefetch = len(q) >= 2 * g.max_workers
            head = q[0]
            # A task pins its inputs when it is sent; with the store under pressure, one
            # with large inputs goes only to a worker that runs it at once.
            w = self._pick_worker_locked(
                g, idle_only or (head.dep_ids is not None and self.only_to_idle_locked(head)),
                prefetch)
            if w is None:
                if not self._maybe_spawn_locked(g):
                    leases = self._leases
                    if leases is not None and leases.lent:
                        leases.recall_locked()  # a lent worker may hold the CPU they need
                    return
                continue
            quota = None if g.max_tasks is None else g.max_tasks - w.assigned
            msgs: list = []
            inflight = w.inflight
            while q and (quota is None or quota > 0):
                t = q[0]
                if t.req is not None:
                    break
                if inflight and t.dep_ids is not None and self.only_to_idle_locked(t):
                    break  # (another worker, or this one once it is idle)
                est = batch.estimate(t.fn_id)
                if not batch.fits(len(inflight), w.load, est, prefetch):
                    break
                q.popleft()
                if t.dep_ids and t.deps is None and not self._build_deps_locked(t):
                    continue  # (``pin_inputs_locked``) it waits for room or a lost input,
                    # or failed
                if not t.started:
                    if t.future is not None and not t.future.set_running_or_notify_cancel():
                        self.skip_cancelled_locked(t)
                        continue
                    t.started = True
                to = NEXT[t.state][SEND]  # (``_states.transition``, inline: every task)
                if to < 0:
                    raise illegal(t, SEND)
                t.state = to
                t.attempts += 1
                t.estimate_s = est
                if t.fn_id not in w.functions:
                    w.functions.add(t.fn_id)
                    msgs.append(m.RegisterFunction(t.fn_id, self._functions[t.fn_id]))
                msgs.append(m.ExecuteTask(t.task_id, t.fn_id, t.args, t.deps))
                inflight[t.task_id] = t
                if g.watch:  # (timeouts, memory limits: ``_limits``)
                    self.limits.watch_locked(w)
                log_event(t.task_id, "start", _now(), w.worker_id)
                w.load += est
                w.assigned += 1
                if quota is not None:
                    quota -= 1
            if g.max_tasks is not None and w.assigned >= g.max_tasks:
                w.retiring = True
            if msgs:
                self._outbox.append((w, msgs))  # (``send_locked``, inline: every task)

    def _pick_worker_locked(self, g: WorkerGroup, idle_only: bool = False,
                            prefetch: bool = False) -> Optional[WorkerHandle]:
        """The least-loaded worker of ``g`` that can take the head task, within slots."""
        busy = 0
        best = None
        est = self.batch.estimate(g.queue[0].fn_id)
        fits = self.batch.fits
        for w in g.workers:
            if not w.alive or w.blocked:
                continue
            if w.leased is not None:  # lent to a driver: busy, not ours to send to
                busy += 1
                continue
            n = len(w.inflight)
            if n:
                busy += 1
            if w.retiring or w.fenced or (n and idle_only) or not fits(n, w.load, est,
                                                                       prefetch):
                continue
            if best is None or w.load < best.load:
                best = w
        if best is not None and not best.inflight:
            if busy + g.extra >= g.max_workers:  # (extra: CPUs of multi-CPU tasks)
                return None  # an extra worker (started while others were blocked) stays idle
            if self.cpu_limit is not None and self.busy_cpus_locked() >= self.cpu_limit:
                return None  # the node's CPUs are all in use (by other groups too)
        return best

    def busy_cpus_locked(self) -> int:
        """Workers running tasks now, over every group (an actor that holds CPUs: those,
        running or not)."""
        return sum(1 for g in self._groups.values()
                   if g.actor is None or g.actor.alloc is None or not g.actor.cfg.req.cpus
                   for w in g.workers
                   if (w.inflight or w.leased is not None) and w.alive and not w.blocked) + \
            sum(g.extra for g in self._groups.values())

    def _maybe_spawn_locked(self, g: WorkerGroup) -> bool:
        if self.closed or g.broken is not None:
            return False
        if self.cpu_limit is not None and self.busy_cpus_locked() >= self.cpu_limit:
            return False
        if len(g.workers) < g.max_workers:
            return self._try_spawn_locked(g)
        if g.n_blocked == 0 and g.max_tasks is None and not g.n_fenced \
                and not g.limits.max_memory:
            return False  # the common case: every worker counts against max_workers
        if g.n_fenced:
            return self._spawn_past_fenced_locked(g)
        active = sum(1 for w in g.workers if w.alive and not w.blocked and not w.retiring)
        if active >= g.max_workers:
            return False
        return self._try_spawn_locked(g)

    def _spawn_past_fenced_locked(self, g: WorkerGroup) -> bool:
        """Some workers take no task without a request (``_resource_dispatch``): a worker for
        one if CPUs are left, retiring an idle fenced one to stay within the slots."""
        busy = sum(1 for w in g.workers if w.alive and not w.blocked and not w.retiring
                   and (w.inflight or not w.fenced))
        if busy + g.extra >= g.max_workers:
            return False
        if self.slots_used_locked(g) >= g.max_workers:
            victim = next((w for w in g.workers if w.alive and w.fenced and not w.inflight
                           and w.leased is None), None)
            if victim is None:
                return False
            self._retire_worker_locked(victim)
        return self._try_spawn_locked(g)

    def _try_spawn_locked(self, g: WorkerGroup, gpus: Optional[tuple] = None) -> bool:
        try:
            self.spawn_locked(g, gpus)
            return True
        except (OSError, Error) as exc:  # out of processes / fds / memory / id prefixes
            log.error("dpool: cannot start a worker process: %s", exc)
            if not any(w.alive for w in g.workers):
                self.fail_group_locked(g, f"cannot start a worker process: {exc}")
            return False
        except Exception as exc:  # noqa: BLE001 - e.g. the Process's arguments (initargs
            # handed over at creation) fail to pickle under spawn: every start would fail
            log.error("dpool: cannot start a worker process: %r", exc)
            self.fail_group_locked(g, f"cannot start a worker process: {exc!r}")
            return False

    def spawn_locked(self, g: WorkerGroup, gpus: Optional[tuple] = None,
                     lease: Optional[socket.socket] = None) -> WorkerHandle:
        """A new worker of ``g``; ``gpus``: bound to these devices (``_resource_dispatch``);
        ``lease``: a driver's connection it is lent to."""
        self.fork_point()  # (before this worker's sockets: a server forked now has none)
        parent_sock, child_sock = socket.socketpair()
        wid = next(self._worker_ids)
        if gpus is not None:
            led = self.resources_locked()
            gpu_names = tuple(led.gpu_names[i] for i in gpus)
            env: Optional[dict] = {"CUDA_VISIBLE_DEVICES": ",".join(gpu_names)}
            sees: Optional[frozenset] = frozenset(gpus)
        else:
            gpu_names = ()
            env, sees = self.spawn_env_locked()
        ctx = g.mp_context
        make = _forkproc.ForkedWorker if _forkproc.uses_light_fork(ctx) else ctx.Process
        # a forked worker shares the board of running tasks (``_running``): a slot on it
        slot = _running.take() if make is not ctx.Process else -1
        cfg = WorkerConfig(wid, g.group_id, os.getpid(), g.initializer, g.max_tasks,
                           g.cwd or os.getcwd(), list(g.sys_path or sys.path),
                           self.store.capacity, self._sessions is not None,
                           (self.id_prefix() << 40) if self.id_prefix is not None else 0,
                           env, gpu_names, slot, g.limits.max_memory)
        args: tuple = (child_sock, cfg) if lease is None else (child_sock, cfg, lease)
        if g.inherited is not None:
            args = (child_sock, cfg, lease, g.inherited)
        proc = make(target=start_worker, args=args, name=f"dpool-worker-{wid}")
        if make is not ctx.Process and g.inherited is None and (
                self.io.started or not _forkproc.single_threaded()):
            # forked by the fork server (``_zygote``) -- unless this process runs no
            # thread (the first worker: forked here, just after the server, saving a
            # round trip to a server just started), or it needs what only this process
            # has: initargs handed over by inheritance
            proc._dpool_zygote = self.zygote
        try:
            proc.start()
        except BaseException:
            parent_sock.close()
            _running.give(slot)
            raise
        finally:
            child_sock.close()
        _forkproc.disown(proc)
        w = WorkerHandle(wid, g, proc, Channel(parent_sock, blocking=False))
        w.oom_base = _limits.oom_kills()  # (a SIGKILL it dies of, with more: the kernel's)
        w.slot = slot
        g.workers.append(w)
        if gpus is not None:
            w.gpus = gpus
            self._fence_locked(w, True)  # for good: it runs only tasks given these devices
        w.sees = sees
        self.io.add(w)
        log.debug("started worker %d (pid %s) for group %d", wid, w.pid, g.group_id)
        return w

    def send_locked(self, w: WorkerHandle, msgs: list) -> None:
        """Record ``msgs`` for ``w``: the lock writes them as this region ends (``_lock``)."""
        self._outbox.append((w, msgs))

    def flush_locked(self, outbox: list) -> None:
        """Write the sends a region recorded (``_lock.write_sends``)."""
        write_sends(outbox, self.io.want_write)

    def _requeue_locked(self, w: WorkerHandle, task_ids: tuple) -> None:
        for tid in reversed(task_ids):
            t = w.inflight.pop(tid, None)
            if t is not None:
                if t.alloc is not None:
                    self._release_allocation_locked(t, w)
                w.load = w.load - t.estimate_s if w.inflight else 0.0
                w.assigned -= 1
                if w.retiring and w.assigned < (w.group.max_tasks or 0):
                    w.retiring = False
                t.attempts -= 1  # it never ran
                transition(t, REQUEUE)
                t.group.queue.appendleft(t)
                if t.group.actor is not None:
                    t.group.actor.order.appendleft(t)

    def _on_closed(self, w: WorkerHandle) -> None:
        """The IO loop saw a worker's socket close: it exited or died."""
        if w.process is None:  # an attached driver or a peer (cluster mode)
            with self.lock:
                if self._sessions is not None:
                    self._sessions.handle_closed_locked(w)
                out = self.take_out_locked()
            w.chan.close()
            self.deliver(out)
            return
        exitcode = reap(w, kill_after=0.2)
        oom = False
        if exitcode == -signal.SIGKILL and not w.killed_here:  # the kernel's OOM killer?
            oom = _limits.oom_kills() != w.oom_base
        with self.lock:
            left = w.mark_closed()
            was_alive = left < W_STOPPING  # (else it exited as told)
            g = w.group
            if w.leased is not None and self._leases is not None:
                self._leases.lost_locked(w)
            if w.blocked:
                w.blocked = False
                g.n_blocked -= 1
                g.extra += w.extra_cpus  # taken off while blocked; released with its task
            if w in g.workers:
                g.workers.remove(w)
            self._fence_locked(w, False)
            held = list(w.inflight.values())
            for t in held:
                if t.alloc is not None:
                    self._release_allocation_locked(t, w)
                # a result segment the dead worker may have (half) written
                self.store.unlink_unadopted(
                    _owners.segment_name(self.store.owner_pid, t.task_id))
            running: Optional[int] = None  # the task it ran when it died (0: none)
            if w.slot >= 0:
                running = _running.read(w.slot)
                _running.give(w.slot)
                w.slot = -1
            fate = w.fate  # killed by ``_limits`` for one task: the rest go back
            if fate is not None:
                running = fate[0]
            lost = held
            if g.actor is not None:  # restarted with its state, or its calls fail
                from dpool.scheduling import _actors

                _actors.died_locked(self, w, held, exitcode, was_alive)
                lost = held = []
            elif left == W_STARTING and g.broken is None:
                self._died_starting_locked(w, held, exitcode)
                lost = []
            elif was_alive and g.broken is None and held:
                # Only the task it was running is charged an attempt; the others it held
                # (sent and not started, or done with their results not yet sent) go
                # back to the queue uncharged. Without a slot on the board (a spawned
                # worker): the first it held, as it runs them in order.
                if running is not None:
                    lost = [t for t in held if t.task_id == running]
                    if not lost and fate is None:
                        # Died running no task. A task that kills its worker before it
                        # starts (reading it, say) would come back for good: the first
                        # held is charged after dying that way _BOUNCES times its attempts.
                        first = held[0]
                        first.bounced += 1
                        if first.bounced >= _BOUNCES * g.max_attempts:
                            lost = [first]
                    back = tuple(t.task_id for t in held if t not in lost)
                else:
                    lost, back = held[:1], tuple(t.task_id for t in held[1:])
                if back:
                    self._requeue_locked(w, back)
            w.inflight.clear()
            w.load = 0.0
            if fate is not None:  # its task as the fate says; the rest as after a death
                _limits.apply_fate_locked(self, g, lost, fate)
                lost = [t for t in lost if t.task_id != fate[0]]
            elif left == W_READY and held and g.broken is None:
                if lost:
                    log.warning("worker %d (pid %s) died with %s %s task %#x (attempt "
                                "%d of %d); %d other task(s) it held go back uncharged",
                                w.worker_id, w.pid, describe_exit(exitcode, oom),
                                "running" if lost[0].task_id == running else "holding first",
                                lost[0].task_id, lost[0].attempts, g.max_attempts,
                                len(held) - len(lost))
                else:
                    log.warning("worker %d (pid %s) died with %s running no task; the %d "
                                "task(s) it held go back uncharged", w.worker_id, w.pid,
                                describe_exit(exitcode, oom), len(held))
            for t in lost:
                if t.attempts < g.max_attempts and g.broken is None and was_alive:
                    transition(t, REQUEUE)
                    g.queue.appendleft(t)
                else:
                    err = errors.WorkerCrashedError(
                        f"the worker running this task (pid {w.pid}) died with "
                        f"{describe_exit(exitcode, oom)} on attempt {t.attempts} of "
                        f"{g.max_attempts}",
                        exitcode=exitcode, attempts=t.attempts)
                    self.finish_locked(t, False, _payload.dumps_error(err))
            self.drop_handles_locked(w)
            if g.queue or g.by_request:
                self._dispatch_locked(g)
            elif g.closed and not g.workers and g.outstanding == 0 and g.actor is None:
                self._groups.pop(g.group_id, None)  # a shut-down executor leaves nothing
            if g.actor is not None and not g.workers:  # (an ended one: ``_actors``)
                from dpool.scheduling import _actors

                _actors.bury_locked(self, g)
            self._exited.notify_all()
            out = self.take_out_locked()
        w.chan.close()
        self.deliver(out)

    def _died_starting_locked(self, w: WorkerHandle, held: list,
                              exitcode: Optional[int]) -> None:
        """``w`` died before it said Hello (sent once its initializer ran): it ran none
        of the tasks it held, so they go back uncharged. Killed from outside (SIGKILL:
        the OOM killer, an operator, a chaos test) it is simply replaced. Dying by
        itself (an initializer that exits, an import that crashes) ``_START_FAILURES``
        times in a row breaks the group, as the stdlib's pool breaks when an initializer
        fails, instead of respawning workers forever."""
        g = w.group
        if held:
            self._requeue_locked(w, tuple(t.task_id for t in held))
        if exitcode != -signal.SIGKILL or w.killed_here:  # (we killed it: it hung up)
            g.start_failures += 1
        log.warning("worker %d (pid %s) died with %s before it started (%d start-up "
                    "failure(s) in a row); the %d task(s) it held go back uncharged",
                    w.worker_id, w.pid, describe_exit(exitcode), g.start_failures,
                    len(held))
        if g.start_failures >= _START_FAILURES:
            self.break_group_locked(g, (
                "A child process terminated abruptly, the process pool is not usable "
                f"anymore ({g.start_failures} workers in a row died while starting, the "
                f"last with {describe_exit(exitcode)})"))

    def break_group_locked(self, g: WorkerGroup, reason: str) -> None:
        """``g`` cannot run tasks any more (its workers cannot start): fail what it has
        and what it is given, and tell the driver that owns it (cluster mode)."""
        g.broken = reason
        self.fail_group_locked(g, reason)
        if g.actor is not None:
            from dpool.scheduling import _actors

            _actors.end_locked(self, g)
        if g.owner is not None and g.owner.alive:  # an attached driver's executor
            self.send_locked(g.owner, [m.GroupBroken(g.group_id, reason)])

    def drop_handles_locked(self, w: WorkerHandle) -> None:
        """A worker (or attached driver) is gone: the objects it held a handle to (nested
        futures, puts) lose that reference, and it waits for none of them."""
        for oid in w.owned:
            self.decref_locked(oid)
        w.owned.clear()
        for obj in self._objects.values():
            if obj.waiters and w in obj.waiters:
                obj.waiters = [x for x in obj.waiters if x is not w] or None

    def fail_group_locked(self, g: WorkerGroup, reason: str) -> None:
        made: list[bytes] = []

        def err() -> bytes:  # made only if a task fails: the common close fails none
            if not made:
                if g.actor is not None:
                    from dpool.scheduling._actors import actor_error

                    made.append(actor_error(g, reason))
                else:
                    made.append(_payload.dumps_error(errors.broken_pool(reason)))
            return made[0]

        if self._spillback is not None:  # its tasks running on other nodes fail too
            self._spillback.fail_group_locked(g, err())
        while g.queue:
            t = g.queue.popleft()
            if t.future is not None and not t.started:
                t.future.set_running_or_notify_cancel()
                t.started = True
            self.finish_locked(t, False, err())
        if g.by_request:
            self._fail_waiting_for_resources_locked(g, err())
        for w in g.workers:
            for t in list(w.inflight.values()):
                w.inflight.pop(t.task_id)
                if t.alloc is not None:
                    self._release_allocation_locked(t, w)
                self.finish_locked(t, False, err())
        # tasks still waiting for their inputs (maybe another executor's results)
        waiting: dict[int, Task] = {}
        for obj in self._objects.values():
            if obj.waiters:
                for x in obj.waiters:
                    if isinstance(x, Task) and x.group is g:
                        waiting[x.task_id] = x
                if waiting:
                    obj.waiters = [x for x in obj.waiters
                                   if not (isinstance(x, Task) and x.group is g)] or None
        for t in waiting.values():
            if t.future is not None and not t.started:
                t.future.set_running_or_notify_cancel()
                t.started = True
            self.finish_locked(t, False, err())

    def _retire_group_locked(self, g: WorkerGroup) -> None:
        """All of a closed group's work is done: stop its workers, run on_idle hooks."""
        for w in g.workers:
            if w.mark_stopping():
                self.send_locked(w, [m.Shutdown()])
        self._exited.notify_all()
        if g.actor is not None:
            from dpool.scheduling import _actors

            _actors.end_locked(self, g)
        if not g.workers and g.actor is None:
            self._groups.pop(g.group_id, None)
        hooks, g.on_idle = g.on_idle, []
        for hook in hooks:
            hook()  # trivial by contract (Event.set): runs under the lock
