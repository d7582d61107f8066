"""The group calls of the local scheduler: what an executor or pool does to its worker group.

Cancel the tasks not started (``cancel_queued``), start workers before work needs them
(``start_workers``), close the group (``close_group``; from a finalizer,
``close_group_soon``, which the IO thread applies at its next tick), wait until its
workers are gone (``wait_group_exited``), terminate it (``terminate_group``: its unfinished
tasks fail). A part of ``LocalScheduler`` (``_scheduler``), over the state ``_core``
declares.

Lock rule: each call takes the scheduler's lock and must not be called with it held, but
``close_group_soon``, which takes none (a finalizer may run while this thread holds it).
Workers are reaped (``_exits.reap``) after the lock is released.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from dpool import _log
from dpool.protocol import messages as m
from dpool.scheduling._core import SchedulerCore
from dpool.scheduling._limits import cancel_group_locked, cancel_running_locked
from dpool.scheduling._records import Task, WorkerGroup
from dpool.scheduling._exits import reap

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Callable, Optional

log = _log.getLogger("dpool.scheduling")


class GroupCalls(SchedulerCore):
    def cancel_queued(self, group: WorkerGroup) -> None:
        """``shutdown(cancel_futures=True)``: cancel every task of the group not started."""
        with self.lock:
            for queue in [group.queue, *group.by_request.values()]:
                keep: deque = deque()
                for t in queue:
                    if t.future is not None and not t.started and t.future.cancel():
                        self.skip_cancelled_locked(t)
                    else:
                        keep.append(t)
                queue.clear()
                queue.extend(keep)
            for req in [r for r, q in group.by_request.items() if not q]:
                del group.by_request[req]
            # Tasks still waiting for their inputs: cancel their futures now; dispatch
            # skips them once their inputs are ready.
            for obj in self._objects.values():
                for x in obj.waiters or ():
                    if isinstance(x, Task) and x.group is group and x.future is not None \
                            and not x.started:
                        x.future.cancel()
            out = self.take_out_locked()
        self.deliver(out)

    def cancel_running(self, task_id: int, recursive: bool = False) -> bool:
        """``dpool.cancel(future, force=True)`` of a started task (its future cancelled by
        the caller): its worker is killed and replaced (``_limits``); with ``recursive``,
        the tasks it submitted are cancelled too. False if no worker here holds it."""
        with self.lock:
            found = cancel_running_locked(self, task_id, recursive)
            out = self.take_out_locked()
        self.deliver(out)
        return found

    def cancel_group_running(self, group: WorkerGroup) -> list:
        """``shutdown(cancel_running=True)``: stop every task of ``group`` its workers
        hold; returns their futures (the caller cancels them)."""
        with self.lock:
            futures = cancel_group_locked(self, group)
            out = self.take_out_locked()
        self.deliver(out)
        return futures

    def start_workers(self, group: WorkerGroup, n: int) -> None:
        """Start workers of ``group`` until ``n`` of them run (at most its ``max_workers``).

        Workers otherwise start when work needs them; this is for code that reads
        ``executor._processes``/``pool._pool`` and expects the processes the stdlib would
        have started by then to be there and alive."""
        with self.lock:
            n = min(n, group.max_workers)
            while not (self.closed or group.closed or group.broken is not None):
                running = sum(1 for w in group.workers if w.alive and not w.retiring)
                if running >= n or not self._try_spawn_locked(group):
                    break
            out = self.take_out_locked()  # (a start that broke the group fails its tasks)
        self.deliver(out)

    def close_group_soon(self, group: WorkerGroup) -> None:
        """``close_group`` from a finalizer: no lock taken here (GC may run while this
        thread holds it); the IO thread closes the group within a tick."""
        self._closing.append(group)
        self.io.poke()

    def close_group(self, group: WorkerGroup, on_idle: Optional[Callable[[], None]] = None) -> None:
        """No more submissions to ``group``; its workers stop once its work is done."""
        with self.lock:
            if on_idle is not None:
                group.on_idle.append(on_idle)
            self.close_group_locked(group)

    def wait_group_exited(self, group: WorkerGroup, timeout: float = 30.0) -> None:
        """Block until the closed ``group`` is idle and every one of its workers exited."""
        deadline = None
        with self.lock:
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
            reap(w, kill_after=0)

    def terminate_group(self, group: WorkerGroup, reason: str) -> None:
        """Stop a group's workers now; its unfinished tasks fail with ``reason``."""
        with self.lock:
            group.closed = True
            group.broken = group.broken or reason
            self.fail_group_locked(group, reason)
            victims = list(group.workers)
            for w in victims:
                w.mark_stopping()
                self.send_locked(w, [m.Shutdown()])
            if group.actor is not None:
                from dpool.scheduling import _actors

                _actors.end_locked(self, group)
            out = self.take_out_locked()
        for w in victims:
            reap(w, kill_after=0.5)
        self.deliver(out)

    def kill_actor_locked(self, g: WorkerGroup, reason: str) -> bool:
        """End actor group ``g`` from a handler (lock held): the calls admitted after
        this fail at once (the killer's too); its worker is stopped on a thread of its
        own (``terminate_group`` takes the lock and waits for it). False: it had ended."""
        if g.broken is not None:
            return False
        g.closed, g.broken = True, reason
        threading.Thread(target=self.terminate_group, args=(g, reason), daemon=True,
                         name="dpool-kill-actor").start()
        return True

    # -- a placed actor's log, kept by its driver's node (``node._actor_rebuild``) ------
    def actor_ran_locked(self, t: Task) -> None:
        """Call ``t`` of an actor's proxy came back from the actor's node: into the
        proxy's log, which keeps its arguments and inputs for a rebuild."""
        from dpool.scheduling import _actors

        _actors.ran_locked(self, t)

    def actor_saved_locked(self, g: WorkerGroup, state: bytes, calls: int) -> None:
        """A checkpoint of ``g``'s actor that holds the first ``calls`` calls of its
        log: it replaces them."""
        from dpool.scheduling import _actors

        g.actor.checkpoint = state  # type: ignore[union-attr]
        g.actor.base = []  # type: ignore[union-attr]
        _actors._forget_log_locked(self, g.actor, calls)

    def actor_boot_locked(self, g: WorkerGroup, inline: bool) -> bytes:
        """The initializer that rebuilds ``g``'s actor from its checkpoint and log
        (``inline``: for a worker on another host, stored values by value)."""
        from dpool.objects import inline as _inline

        return g.actor.boot_payload(  # type: ignore[union-attr]
            self._functions, _inline.inline_payload if inline else None)

    # -- named actors (``_actors``) -----------------------------------------------------
    def name_actor(self, name: str, record: tuple) -> bool:
        """Register ``name`` for the actor ``record`` (group id, label, methods, node);
        False if a live actor has it."""
        from dpool.scheduling import _actors

        with self.lock:
            return _actors.name_locked(self, name, record)

    def ended_actor(self, group_id: int) -> Optional[bytes]:
        """The error a call of the actor of ``group_id`` fails with if it ended here and
        left the groups; None otherwise (a dict read: no lock needed)."""
        from dpool.scheduling._actors import ended_error

        return ended_error(self, group_id)

    def find_actor(self, name: str) -> Optional[tuple]:
        """The record of the live actor named ``name``, or None."""
        from dpool.scheduling import _actors

        with self.lock:
            return _actors.find_locked(self, name)
