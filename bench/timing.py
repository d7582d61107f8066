"""Timing helpers shared by the groups.

Some peers are orders of magnitude slower per task than others (dask or Ray
on 2 cores), so the long loops are capped by wall time: a capped workload
records how many iterations it actually did (``n``) and ``capped: true``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence


def summarize(samples: Sequence[float]) -> dict[str, float | int]:
    """Median plus spread of a list of timings."""
    ordered = sorted(samples)
    n = len(ordered)

    def pct(p: float) -> float:
        return ordered[min(n - 1, int(p * n))]

    return {
        "n": n,
        "median": statistics.median(ordered),
        "mean": statistics.fmean(ordered),
        "min": ordered[0],
        "p10": pct(0.10),
        "p90": pct(0.90),
        "max": ordered[-1],
    }


def repeat(reps: int, body: Callable[[], object]) -> list[float]:
    """Time ``body`` ``reps`` times."""
    samples: list[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        body()
        samples.append(time.perf_counter() - t0)
    return samples


def repeat_capped(n: int, cap_s: float, body: Callable[[], object]) -> list[float]:
    """Time ``body`` up to ``n`` times, stopping once ``cap_s`` has elapsed."""
    samples: list[float] = []
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        body()
        t1 = time.perf_counter()
        samples.append(t1 - t0)
        if t1 - start > cap_s:
            break
    return samples


def fit_batch(n: int, cap_s: float, run_batch: Callable[[int], object]) -> int:
    """Pick a batch size ≤ ``n`` that should take about ``cap_s`` or less.

    Runs a pilot batch of ~n/10 items (which also serves as a warm-up) and
    scales from its rate.
    """
    pilot = min(n, max(100, n // 10))
    t0 = time.perf_counter()
    run_batch(pilot)
    rate = pilot / max(time.perf_counter() - t0, 1e-9)
    return n if n <= rate * cap_s else max(pilot, int(rate * cap_s))
