"""What the event stream says about tasks: how many ended per second, which run now,
which failed lately. Pure bookkeeping (no IO), fed by ``_collect`` with the events it
reads from ``dpool:events``.

The events are the ones the local schedulers already log (``control._keys.pack_events``):
``(task_id, kind, t, worker_id)`` with ``kind`` one of ``submit``, ``start``, ``spill``,
``end`` (finished) and ``error`` (failed). A task is *running* from its last ``start``
until its ``end`` or ``error``. The events of one task share a shard (they are routed by
its id) but may come from two writers (its home node and the node it was spilled to),
so an ``end`` can be read before the ``start`` it follows: a ``start`` older than the
task's end is ignored. A task its node spilled to another runs there under a local id
of that node (its own ``submit``, ``start`` and ``end``), and ends at home too when its
result comes back: the home task's end (after a ``spill``) is not counted again, and
the run's failure is listed once, at home (a run for another node is the one task
whose ``submit`` names no submitter: worker id 0; drivers' are negative, workers'
positive).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass

Event = tuple[int, str, float, int]


@dataclass(slots=True)
class Running:
    task_id: int
    started: float
    worker_id: int
    starts: int = 1  # ``start`` events seen: more than one means a retry


@dataclass(slots=True)
class Failure:
    task_id: int
    at: float
    row: dict | None = None  # its task-table row, once read (the row goes with the result)


class Activity:
    """Tasks ended per ``bucket_s`` over the last ``window_s``, the running set and the
    last ``keep_failed`` failures. Memory is bounded: at most ``max_tracked`` running
    tasks and as many recently ended ids are kept (the oldest go first)."""

    def __init__(self, window_s: float = 300.0, bucket_s: float = 5.0,
                 keep_failed: int = 50, max_tracked: int = 20_000) -> None:
        if window_s <= 0 or bucket_s <= 0 or bucket_s > window_s:
            raise ValueError(f"need 0 < bucket_s <= window_s, got {bucket_s}, {window_s}")
        self.window_s = float(window_s)
        self.bucket_s = float(bucket_s)
        self.max_tracked = max_tracked
        self._done: collections.Counter[int] = collections.Counter()  # bucket -> ended ok
        self._failed: collections.Counter[int] = collections.Counter()
        self.running: dict[int, Running] = {}
        self._ended: collections.OrderedDict[int, float] = collections.OrderedDict()
        self._spilled: collections.OrderedDict[int, float] = collections.OrderedDict()
        self._mirrors: collections.OrderedDict[int, float] = collections.OrderedDict()
        self.failures: collections.deque[Failure] = collections.deque(maxlen=keep_failed)
        self.events_seen = 0

    def add(self, events: Iterable[Event]) -> None:
        """Account a batch of events (any order; applied oldest first)."""
        for task_id, kind, t, worker_id in sorted(events, key=lambda e: e[2]):
            self.events_seen += 1
            if kind == "start":
                self._start(task_id, t, worker_id)
            elif kind == "end" or kind == "error":
                self._end(task_id, t, kind == "error")
            elif kind == "spill":
                self._remember(self._spilled, task_id, t)
            elif kind == "submit" and worker_id == 0:
                self._remember(self._mirrors, task_id, t)

    def _start(self, task_id: int, t: float, worker_id: int) -> None:
        ended = self._ended.get(task_id)
        if ended is not None and ended >= t:
            return  # its end was read first
        r = self.running.get(task_id)
        if r is not None:
            r.started, r.worker_id, r.starts = t, worker_id, r.starts + 1
            return
        self.running[task_id] = Running(task_id, t, worker_id)
        if len(self.running) > self.max_tracked:
            oldest = min(self.running.values(), key=lambda x: x.started)
            del self.running[oldest.task_id]

    def _remember(self, ids: collections.OrderedDict[int, float], task_id: int,
                  t: float) -> None:
        ids[task_id] = t
        ids.move_to_end(task_id)
        if len(ids) > self.max_tracked:
            ids.popitem(last=False)

    def _end(self, task_id: int, t: float, failed: bool) -> None:
        self.running.pop(task_id, None)
        again = task_id in self._ended  # (an event batch logged twice: a retried flush)
        self._remember(self._ended, task_id, t)
        if again:
            return
        if task_id not in self._spilled:  # (else counted where it ran)
            bucket = int(t // self.bucket_s)
            (self._failed if failed else self._done)[bucket] += 1
        if failed and task_id not in self._mirrors:
            self.failures.appendleft(Failure(task_id, t))

    def forget(self, task_ids: Iterable[int]) -> None:
        """Tasks the task table says are over (or gone) although no end event was read."""
        for tid in task_ids:
            self.running.pop(tid, None)

    def rate(self, now: float) -> dict:
        """Tasks per second, per bucket over the window ending at ``now`` (oldest first):
        ``{"bucket_s", "start", "done": [...], "failed": [...]}``. Older buckets are
        dropped."""
        last = int(now // self.bucket_s)
        n = round(self.window_s / self.bucket_s)
        first = last - n + 1
        for counter in (self._done, self._failed):
            for b in [b for b in counter if b < first]:
                del counter[b]
        per_s = 1.0 / self.bucket_s
        return {"bucket_s": self.bucket_s, "start": first * self.bucket_s,
                "done": [self._done.get(b, 0) * per_s for b in range(first, last + 1)],
                "failed": [self._failed.get(b, 0) * per_s for b in range(first, last + 1)]}

    def spilled_here(self, task_id: int) -> bool:
        """Whether ``task_id`` runs for another node (a spilled task's local run)."""
        return task_id in self._mirrors

    def longest_running(self, n: int) -> list[Running]:
        return sorted(self.running.values(), key=lambda r: r.started)[:n]

    def recent_failures(self, n: int) -> list[Failure]:
        return list(self.failures)[:n]
