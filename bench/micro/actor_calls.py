"""Actor calls on one host, for before/after comparisons of the call path:

    PYTHONPATH=BUILD python bench/micro/actor_calls.py

Prints the best of 3 bursts of 20,000 pipelined calls to 1 actor (``t1``) and round-robin
to 8 (``t8``), in calls/s, and the median plain call round trip over 2,000 (``call_us``).
Alternate builds in one sitting (the machine is noisy)."""

from __future__ import annotations

import statistics
import time

from dpool import ProcessPoolExecutor


class Echo:
    def ping(self, x: int = 0) -> int:
        return x


if __name__ == "__main__":
    with ProcessPoolExecutor(2) as ex:
        hs = [ex.actor(Echo) for _ in range(8)]
        for h in hs:
            h.ping()
        out: dict = {}
        for name, targets in (("t1", hs[:1]), ("t8", hs)):
            best = 0.0
            for _ in range(3):
                t0 = time.perf_counter()
                fs = [targets[i % len(targets)].ping.submit(i) for i in range(20000)]
                for f in fs:
                    f.result()
                best = max(best, 20000 / (time.perf_counter() - t0))
            out[name] = round(best)
        lat = []
        for _ in range(2000):
            t = time.perf_counter()
            hs[0].ping()
            lat.append(time.perf_counter() - t)
        out["call_us"] = round(statistics.median(lat) * 1e6, 1)
        print(out)
