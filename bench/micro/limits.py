"""What the limits cost a task that uses them: no-op throughput (best of 3 bursts of
10,000) and sequential round trip (median of 2,000) on a 2-worker executor, without
limits, with ``task_timeout=60``, ``max_memory_per_worker=1 GiB`` and per-call
``options(timeout=60)``:

    python bench/micro/limits.py
"""

from __future__ import annotations

import statistics
import time

from dpool import ProcessPoolExecutor


def noop(x=None):
    return x


def measure(ex, submit) -> dict:
    ex.submit(noop).result()
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        fs = [submit(noop, i) for i in range(10000)]
        for f in fs:
            f.result()
        best = max(best, 10000 / (time.perf_counter() - t0))
    lat = []
    for _ in range(2000):
        t = time.perf_counter()
        submit(noop).result()
        lat.append(time.perf_counter() - t)
    return {"tput": round(best), "rt_us": round(statistics.median(lat) * 1e6, 1)}


if __name__ == "__main__":
    for label, kw, per_call in (("none", {}, False), ("task_timeout", {"task_timeout": 60}, False),
                                ("max_memory", {"max_memory_per_worker": 2**30}, False),
                                ("options(timeout)", {}, True)):
        with ProcessPoolExecutor(2, **kw) as ex:
            submit = ex.options(timeout=60).submit if per_call else ex.submit
            print(label, measure(ex, submit))
