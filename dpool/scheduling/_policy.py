"""How many tasks a worker may hold at once (``BatchPolicy``).

Short tasks go to a worker in batches, while the estimated run time of what it holds stays
within ``target_s``; long ones go one at a time, so that no task waits behind another on a
busy worker while a different worker is free -- but a worker running a long task may hold
one more when the queue is long enough to keep every worker busy (``prefetch``). Estimates
are per function: a moving average of the run times workers report.

No lock of its own: the scheduler calls it under its lock (``LocalScheduler.estimate``
reads it without).
"""

from __future__ import annotations


class BatchPolicy:
    """Per-function moving average of run time -> how much work a worker may hold.

    A worker may hold more tasks while the estimated run time of what it holds stays
    within ``target_s``; a worker holding nothing always takes one. A function never seen
    is estimated at ``target_s``, so it goes one at a time until it is measured -- and a
    long task never has others queued behind it on its worker (they stay cancellable in
    the scheduler's queue, as in the stdlib, and free workers can take them).
    """

    __slots__ = ("target_s", "max_batch", "alpha", "_avg")

    def __init__(self, target_s: float = 2e-3, max_batch: int = 256, alpha: float = 0.2):
        self.target_s = target_s
        self.max_batch = max_batch
        self.alpha = alpha
        self._avg: dict[int, float] = {}

    def observe(self, fn_id: int, duration: float) -> None:
        avg = self._avg.get(fn_id)
        self._avg[fn_id] = duration if avg is None else avg + self.alpha * (duration - avg)

    def known(self, fn_id: int) -> bool:
        return fn_id in self._avg

    def estimate(self, fn_id: int) -> float:
        """Expected run time of one task of ``fn_id`` (``target_s`` when unknown)."""
        return self._avg.get(fn_id, self.target_s)

    def fits(self, held_tasks: int, held_s: float, est: float, prefetch: bool = False) -> bool:
        """May a worker holding ``held_tasks`` (``held_s`` of work) take one more?

        ``prefetch``: the queue is long enough that every worker will stay busy; then a
        worker running a long task may hold one more, so it starts the next one without
        waiting a round trip through the scheduler (as the stdlib's call queue does).
        Near the end of a queue no prefetching happens, so the tail stays balanced.
        """
        if held_tasks == 0:
            return True
        if held_tasks < self.max_batch and held_s + est <= self.target_s:
            return True
        return prefetch and held_tasks == 1
