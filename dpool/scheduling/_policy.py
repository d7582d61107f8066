"""Scheduling policies kept behind small seams.

``SpillPolicy`` decides whether the local scheduler runs a task here or spills it to a
global scheduler (the paper's bottom-up scheduling). On one host nothing is spilled; the
cluster plugs in a policy that spills when the queue is over a threshold or a resource is
missing here.

``BatchPolicy`` decides how many tasks a worker may hold at once. Short tasks are sent in
batches (a worker holding ~2 ms of work amortizes the per-message cost without hurting
balance); long ones go one at a time so no task waits behind another on a busy worker
while a different worker is free.
"""

from __future__ import annotations

from typing import Protocol


class SpillPolicy(Protocol):
    def should_spill(self, queue_length: int, needs: dict, available: dict) -> bool: ...


class LocalOnlySpillPolicy:
    """Single host: there is nowhere to spill to."""

    def should_spill(self, queue_length: int, needs: dict, available: dict) -> bool:
        return False


class BatchPolicy:
    """Per-function moving average of run time -> how many tasks a worker may hold."""

    __slots__ = ("target_s", "max_batch", "alpha", "_avg")

    def __init__(self, target_s: float = 2e-3, max_batch: int = 256, alpha: float = 0.2):
        self.target_s = target_s
        self.max_batch = max_batch
        self.alpha = alpha
        self._avg: dict[int, float] = {}

    def observe(self, fn_id: int, duration: float) -> None:
        avg = self._avg.get(fn_id)
        self._avg[fn_id] = duration if avg is None else avg + self.alpha * (duration - avg)

    def capacity(self, fn_id: int) -> int:
        """Tasks of ``fn_id`` one worker may hold (unknown functions: one at a time)."""
        avg = self._avg.get(fn_id)
        if avg is None:
            return 1
        if avg <= 0:
            return self.max_batch
        return max(1, min(self.max_batch, int(self.target_s / avg)))
