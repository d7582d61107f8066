"""Limits on running work: per-task timeouts, a memory limit per worker, the host's
memory threshold, and deaths by the kernel's out-of-memory killer told apart.

Who does what:

- A task's timeout is its own (``options(timeout=)``: it travels in its ``Request`` as
  ``limits`` and lands on ``Task.timeout`` at admission, ``take_task_limits_locked``) or
  its group's (``GroupLimits.timeout``: ``task_timeout=``).
- The watch (``LimitWatch``, one thread per scheduler, started when first needed) looks,
  every ``TICK_S``, at the workers that run tasks of a group with limits or a task with a
  timeout: which task each runs (the running board, ``protocol._running``: a new id is
  a start), for how long, and, with ``max_memory``, its resident memory. A task past its
  timeout, or a worker above twice ``max_memory``, is stopped: the worker is SIGKILLed
  with a *fate* (``WorkerHandle.fate``: the task and the error it fails with), which the
  scheduler's death handling (``_workers._on_closed``) applies instead of charging a
  crash; the worker's other tasks go back to the queue uncharged, and a new worker takes
  its place as after any death.
- With a threshold (``--memory-threshold``, ``DPOOL_MEMORY_THRESHOLD``), the watch also
  reads the host's available memory; above the threshold's share in use, the worker of
  the task that started last is stopped the same way (``OutOfMemoryError``), before the
  kernel's killer picks a victim of its own (the node daemon, the store, Redis).
- The soft limit (``max_memory`` after a task) is the worker's own check: it hands back
  what it holds and retires (``worker._main``; ``ReturnTasks(retire=True)``).
- ``oom_kills()`` counts the kernel's OOM kills (``/proc/vmstat`` and this process's
  memory cgroup): a worker SIGKILLed from outside while the count grew is reported as
  killed by the kernel's out-of-memory killer.

Lock rule (``_api``): ``_locked`` functions expect the scheduler's lock held.
"""

from __future__ import annotations

import os
import threading
import time

from dpool import _log
from dpool.objects import payload as _payload
from dpool.protocol import running as _running

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Optional

    from dpool.scheduling._records import Task, WorkerHandle

log = _log.getLogger("dpool.scheduling")

TICK_S = 0.01  # how often the watch looks at running tasks
HOST_EVERY_S = 0.1  # how often it reads the host's memory (with a threshold)
HOST_SETTLE_S = 1.0  # after stopping a task for it, before the next look
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class GroupLimits(tuple):
    """A group's limits: ``timeout`` (s, 0: none), ``retry_timeout``, ``max_memory``
    (bytes, 0: none), ``retry_oom``. A plain tuple on the wire."""

    __slots__ = ()

    def __new__(cls, timeout: float = 0.0, retry_timeout: bool = False,
                max_memory: int = 0, retry_oom: bool = False) -> GroupLimits:
        return tuple.__new__(cls, (float(timeout or 0.0), bool(retry_timeout),
                                   int(max_memory or 0), bool(retry_oom)))

    @property
    def timeout(self) -> float:
        return self[0]

    @property
    def retry_timeout(self) -> bool:
        return self[1]

    @property
    def max_memory(self) -> int:
        return self[2]

    @property
    def retry_oom(self) -> bool:
        return self[3]


NO_LIMITS = GroupLimits()


def group_limits(task_timeout: Any, retry_on_timeout: Any, max_memory: Any,
                 retry_on_oom: Any) -> GroupLimits:
    """The validated limits of an executor or Pool (``TypeError``/``ValueError`` saying
    which keyword is wrong)."""
    t = check_timeout("task_timeout", task_timeout)
    if max_memory is not None and (isinstance(max_memory, bool)
                                   or not isinstance(max_memory, int) or max_memory <= 0):
        raise ValueError(f"max_memory_per_worker must be a positive int (bytes) or None, "
                         f"got {max_memory!r}")
    return GroupLimits(t or 0.0, bool(retry_on_timeout), max_memory or 0, bool(retry_on_oom))


def check_timeout(name: str, value: Any) -> Optional[float]:
    import math

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, got {value!r}")
    if math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
    return float(value)


def take_task_limits_locked(t: Task) -> None:
    """A task whose request carries limits (``options(timeout=)``): they go on the task;
    the request keeps only what it asks of resources (None: nothing but the default)."""
    r: Any = t.req
    t.timeout, t.retry_timeout = r[5]
    t.group.watch = True
    t.req = None if r[:5] == _PLAIN else r._replace(limits=None)


_PLAIN = (1, 0.0, 0, (), None)  # a request's resource fields that ask for nothing


def request_with_limits(t: Task) -> Any:
    """``t``'s request with its timeout (its own, else its group's) put back: what a task
    sent to another node carries, so that node stops it in time too."""
    from dpool.scheduling._resources import Request

    timeout = t.timeout or t.group.limits.timeout
    if not timeout:
        return t.req
    retry = t.retry_timeout if t.timeout else t.group.limits.retry_timeout
    r = t.req if t.req is not None else Request()
    return r._replace(limits=(timeout, retry))


# -- the kernel's OOM killer -------------------------------------------------------------
def _counter(path: str, key: bytes) -> int:
    """The number after ``key`` at the start of a line of ``path`` (0: none)."""
    try:
        with open(path, "rb", buffering=0) as f:
            data = b"\n" + f.read()
        at = data.find(b"\n" + key)
        if at < 0:
            return 0
        return int(data[at + 1 + len(key):data.index(b"\n", at + 1)].split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _cgroup_oom_file() -> Optional[tuple[str, bytes]]:
    """Where this process's memory cgroup counts its OOM kills (v2 ``memory.events``, v1
    ``memory.oom_control``), with the counter's name; None if nowhere readable."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _hier, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            p = f"/sys/fs/cgroup/memory{path}/memory.oom_control"
            if os.path.exists(p):
                return p, b"oom_kill "
        if controllers == "":
            p = f"/sys/fs/cgroup{path}/memory.events"
            if os.path.exists(p):
                return p, b"oom_kill "
    return None


_cgroup_file: Any = ...


def oom_kills() -> int:
    """The kernel's OOM kills so far: the host's (``/proc/vmstat``) plus this process's
    memory cgroup's (a cgroup at its limit kills without the host running short)."""
    global _cgroup_file
    if _cgroup_file is ...:
        _cgroup_file = _cgroup_oom_file()
    n = _counter("/proc/vmstat", b"oom_kill ")
    if _cgroup_file is not None:
        n += _counter(*_cgroup_file)
    return n


def rss(pid: int) -> int:
    """Resident memory of process ``pid`` in bytes (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def host_memory_used() -> float:
    """The share of the host's memory in use (1 - MemAvailable/MemTotal)."""
    total = _counter("/proc/meminfo", b"MemTotal:")
    avail = _counter("/proc/meminfo", b"MemAvailable:")
    return 1.0 - avail / total if total else 0.0


def _mb(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


# -- the watch -------------------------------------------------------------------------
class LimitWatch:
    """Watches running tasks for their limits (see the module's doc). Owned by one
    scheduler (``s``); its thread runs only while something is watched."""

    def __init__(self, s: Any) -> None:
        self.s = s
        self.watched: dict = {}  # WorkerHandle -> [running task id, since, peak rss]
        self.threshold = 0.0  # host memory share in use that stops the newest task; 0: off
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._stop = False
        self._host_at = 0.0
        self._host_killed = 0.0  # when the threshold last stopped a task
        env = os.environ.get("DPOOL_MEMORY_THRESHOLD")
        if env:
            try:
                self.set_threshold(float(env))
            except ValueError as exc:
                raise ValueError(f"$DPOOL_MEMORY_THRESHOLD: {exc}") from None

    def set_threshold(self, share: float) -> None:
        """Stop the newest task when more than ``share`` of the host's memory is in use
        (``--memory-threshold``; ``$DPOOL_MEMORY_THRESHOLD`` on the embedded runtime).
        Its groups' workers are watched from their next task on."""
        if isinstance(share, bool) or not isinstance(share, (int, float)) \
                or not 0.0 < share <= 1.0:
            raise ValueError(f"the memory threshold is a share of the host's memory in "
                             f"(0, 1], got {share!r}")
        self.threshold = float(share)

    def watch_locked(self, w: WorkerHandle) -> None:
        """``w`` was sent a task of a group with limits, or one with a timeout."""
        if w not in self.watched:
            self.watched[w] = [0, 0.0, 0]
            self._ensure_thread()
            self._wake.set()

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self.s.fork_point()  # (threads start after the fork server: ``_zygote``)
            self._thread = threading.Thread(target=self._run, name="dpool-limits",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()

    def _run(self) -> None:
        s = self.s
        while not self._stop:
            if not self.watched and not self.threshold:
                self._wake.wait()
                self._wake.clear()
                continue
            time.sleep(TICK_S)
            try:
                with s.lock:
                    self.tick_locked(time.monotonic())
            except Exception:  # noqa: BLE001 - the watch must outlive one bad look
                log.exception("dpool: the limits watch failed a tick")

    def tick_locked(self, now: float) -> None:
        for w, st in list(self.watched.items()):
            if not w.alive or w.fate is not None:
                del self.watched[w]
                continue
            if not w.ready:  # (starting: its initializer's time is not a task's)
                continue
            tid = _running_task(w)
            if tid != st[0]:
                st[0], st[1], st[2] = tid, now, 0
            lim = w.group.limits
            if not tid:
                if not w.inflight and not lim.max_memory:
                    del self.watched[w]
                continue
            t = w.inflight.get(tid)
            if t is None:
                continue
            timeout = t.timeout or lim.timeout
            if timeout and now - st[1] > timeout:
                retry = t.retry_timeout if t.timeout else lim.retry_timeout
                self._timed_out_locked(w, t, timeout, retry)
                continue
            if lim.max_memory:
                used = rss(w.pid)
                if used > st[2]:
                    st[2] = used
                if used > 2 * lim.max_memory:
                    from dpool.errors import OutOfMemoryError

                    err = OutOfMemoryError(
                        f"the task's worker (pid {w.pid}) used {_mb(used)}, more than "
                        f"twice max_memory_per_worker={lim.max_memory} ({_mb(lim.max_memory)}"
                        f"); it was killed and replaced", limit=lim.max_memory, peak=st[2])
                    stop_locked(self.s, w, t, err, lim.retry_oom, "past its memory limit")
        if self.threshold and now - self._host_at >= HOST_EVERY_S:
            self._host_at = now
            self._host_locked(now)

    def _timed_out_locked(self, w: WorkerHandle, t: Task, timeout: float, retry: bool) -> None:
        from dpool.errors import TaskTimeoutError

        err = TaskTimeoutError(f"the task ran longer than its timeout of {timeout:g} s; its "
                               f"worker (pid {w.pid}) was killed and replaced",
                               timeout=timeout)
        stop_locked(self.s, w, t, err, retry, f"past its timeout of {timeout:g} s")

    def _host_locked(self, now: float) -> None:
        if now - self._host_killed < HOST_SETTLE_S:
            return  # (the last victim's memory may not be back yet: look again later)
        used = host_memory_used()
        if used <= self.threshold:
            return
        newest = None
        for g in list(self.s._groups.values()):
            if g.actor is not None:
                continue  # (an actor's state is not a task to run again)
            for w in g.workers:
                if not w.alive or not w.ready or w.fate is not None or w.process is None:
                    continue
                tid = _running_task(w)
                t = w.inflight.get(tid) if tid else None
                if t is None:
                    continue
                st = self.watched.get(w)
                if st is None or st[0] != tid:  # (a start not seen yet: oldest)
                    self.watched[w] = st = [tid, 0.0, 0]
                if newest is None or st[1] > newest[0]:
                    newest = (st[1], w, t)
        if newest is None:
            return
        _since, w, t = newest
        from dpool.errors import OutOfMemoryError

        peak = rss(w.pid)
        err = OutOfMemoryError(
            f"the host's memory in use ({used:.0%}) went above the node's threshold "
            f"({self.threshold:.0%}); the worker of the newest task (pid {w.pid}, "
            f"{_mb(peak)}) was killed to keep the host alive", limit=0, peak=peak)
        self._host_killed = now
        stop_locked(self.s, w, t, err, w.group.limits.retry_oom, "host memory above the threshold")


def _running_task(w: WorkerHandle) -> int:
    """The task ``w`` runs now (0: none): from the board, or, without a slot there, the
    first it holds (it runs them in order)."""
    if w.slot >= 0:
        return _running.read(w.slot)
    for tid in w.inflight:
        return tid
    return 0


def stop_locked(s: Any, w: WorkerHandle, t: Task, err: BaseException, retry: bool,
                why: str) -> None:
    """Kill ``w`` for its task ``t``: ``t`` fails with ``err`` (or runs again if ``retry``
    and it has attempts left) when the death is handled; the rest ``w`` held go back."""
    w.fate = (t.task_id, _payload.dumps_error(err), retry)
    w.killed_here = True
    log.info("dpool: stopping task %#x: %s (worker pid %s)", t.task_id, why, w.pid)
    try:
        w.process.kill()  # (a forked worker's: through its pidfd, never a reused pid)
    except (OSError, ValueError, AttributeError):
        pass  # already gone: its death is handled all the same


def apply_fate_locked(s: Any, g: Any, lost: list, fate: tuple) -> None:
    """The death of a worker ``stop_locked`` killed: its task (in ``lost`` if it still
    held it) runs again if the fate says so and attempts are left, else fails with the
    fate's error."""
    from dpool.scheduling._states import REQUEUE, transition

    task_id, err, retry = fate
    for t in lost:
        if t.task_id != task_id:
            continue
        if retry and t.attempts < g.max_attempts and g.broken is None:
            transition(t, REQUEUE)
            g.queue.appendleft(t)
        else:
            s.finish_locked(t, False, err)


def cancel_running_locked(s: Any, task_id: int, recursive: bool) -> bool:
    """Stop task ``task_id`` wherever it is held here (``dpool.cancel(force=True)``): its
    worker is killed if it runs it; sent and not started, it may still run, its result
    unwanted (short tasks go to workers in batches; a long one alone).
    With ``recursive``, the tasks it submitted too. False if no worker holds it."""
    from concurrent.futures import CancelledError

    found = False
    todo = [task_id]
    seen = set()
    while todo:
        tid = todo.pop()
        if tid in seen:
            continue
        seen.add(tid)
        for g in list(s._groups.values()):
            if g.actor is not None:
                continue  # (an actor's calls: ``dpool.kill`` ends the actor)
            for w in g.workers:
                t = w.inflight.get(tid)
                if t is None:
                    continue
                found = found or tid == task_id
                running = _running_task(w) == tid and w.ready
                if recursive and running:  # (what it submitted: while it ran)
                    todo.extend(_children_locked(s, w))
                if t.future is not None:
                    t.future = None  # (cancelled by the caller already)
                if running and w.fate is None and w.process is not None:
                    stop_locked(s, w, t, CancelledError(), False, "cancelled")
            for t in list(g.queue):  # (queued again after a death, or a child)
                if t.task_id == tid:
                    found = True
                    g.queue.remove(t)
                    s.skip_cancelled_locked(t)
    return found


def cancel_group_locked(s: Any, g: Any) -> list:
    """Stop every task ``g``'s workers hold (``shutdown(cancel_running=True)``): the
    workers running one are killed; the tasks they hold but have not started fail as
    cancelled at once. Returns the tasks' futures, for the caller to cancel."""
    from concurrent.futures import CancelledError

    futures = []
    cancelled = _payload.dumps_error(CancelledError())
    for w in list(g.workers):
        if not w.inflight or w.process is None:
            continue
        running = _running_task(w) if w.ready else 0
        for t in list(w.inflight.values()):
            if t.future is not None:
                futures.append(t.future)
                t.future = None
            if t.task_id == running:
                if w.fate is None:
                    stop_locked(s, w, t, CancelledError(), False, "cancelled at shutdown")
            else:  # (not started: it never will; a worker running none is killed too)
                del w.inflight[t.task_id]
                w.load = w.load - t.estimate_s if w.inflight else 0.0
                s.finish_locked(t, False, cancelled)
        if not running and w.fate is None:
            w.killed_here = True
            try:
                w.process.kill()
            except (OSError, ValueError, AttributeError):
                pass
    for t in [t for t in g.queue if t.started]:  # (back in the queue after a death)
        g.queue.remove(t)
        if t.future is not None:
            futures.append(t.future)
        s.skip_cancelled_locked(t)
    return futures


def _children_locked(s: Any, w: WorkerHandle) -> list:
    """The unfinished tasks worker ``w`` submitted (its running task's, as it runs one
    at a time)."""
    out: list[int] = []
    for g in s._groups.values():
        out.extend(t.task_id for t in g.queue if t.owner is w)
        for x in g.workers:
            out.extend(tid for tid, t in x.inflight.items() if t.owner is w)
    return out
