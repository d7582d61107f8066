"""64 MB put + 8 tasks that sum it, as the objects group's (b), with a breakdown.

Prints, per repetition: the put, the 8 tasks (submit -> all results), and each task's
own sum time (the first sum on a worker includes faulting the mapping in, unless a
cached mapping serves it). Then the median of the totals after the first repetition.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import dpool


def timed_sum(a: np.ndarray) -> tuple[float, float]:
    t0 = time.perf_counter()
    total = float(a.sum())
    return total, time.perf_counter() - t0


def noop() -> None:
    return None


def main() -> None:
    arr = np.ones(64 * 2**20 // 8)
    totals = []
    with dpool.ProcessPoolExecutor(2) as ex:
        [f.result() for f in [ex.submit(noop) for _ in range(4)]]
        for _ in range(8):
            t0 = time.perf_counter()
            ref = dpool.put(arr)
            t1 = time.perf_counter()
            results = [f.result() for f in [ex.submit(timed_sum, ref) for _ in range(8)]]
            t2 = time.perf_counter()
            del ref
            assert all(r[0] == arr.size for r in results)
            totals.append(t2 - t0)
            sums = " ".join(f"{1e3 * r[1]:.1f}" for r in results)
            print(f"put {1e3 * (t1 - t0):5.1f} ms  tasks {1e3 * (t2 - t1):5.1f} ms  "
                  f"total {1e3 * (t2 - t0):5.1f} ms  sums [{sums}]")
    print(f"median total after the first: {1e3 * statistics.median(totals[1:]):.1f} ms")


if __name__ == "__main__":
    main()
