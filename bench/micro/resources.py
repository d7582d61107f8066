"""Resource bookkeeping vs the build without it: no-op submit throughput and round trip.

    python bench/micro/resources.py BEFORE_ROOT AFTER_ROOT [rounds]

Runs this file's ``child`` mode with ``PYTHONPATH=BEFORE_ROOT`` and ``AFTER_ROOT`` in
turn (alternating, ``rounds`` times each: the machine is noisy), each child measuring
on a 2-worker executor:

- ``tput``: 10,000 no-op submits, then every result (tasks/s; best of 3 bursts);
- ``cpu_us``: the driver process's CPU time per task in those bursts (its threads:
  submitting, the scheduler's IO thread), best of 3 -- less sensitive than wall time
  to other programs competing for the cores;
- ``rt``: 2,000 sequential submit -> result (median us);
- ``res_tput`` (AFTER only): the same burst through ``options(resources={"R": 1})``
  with R plentiful -- what a task that asks for something costs.

Prints the medians over rounds and the ratio after/before (the issue's bar: the default
path keeps >= 95% of the throughput of the build without resources).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time


def noop(x=None):
    return x


def child() -> None:
    import dpool

    out: dict = {}
    extra = {}
    if hasattr(dpool, "resources"):
        extra = {"runtime_resources": {"R": 1e9}}
    with dpool.ProcessPoolExecutor(2, **extra) as ex:
        for _ in range(200):
            ex.submit(noop, 1).result()
        best = 0.0
        cpu = float("inf")
        for _ in range(3):
            c = time.process_time()
            s = time.perf_counter()
            fs = [ex.submit(noop, 1) for _ in range(10000)]
            for f in fs:
                f.result()
            best = max(best, 10000 / (time.perf_counter() - s))
            cpu = min(cpu, (time.process_time() - c) / 10000 * 1e6)
            del fs
        out["tput"] = best
        out["cpu_us"] = cpu
        rts = []
        for _ in range(2000):
            s = time.perf_counter()
            ex.submit(noop, 1).result()
            rts.append(time.perf_counter() - s)
        out["rt_us"] = statistics.median(rts) * 1e6
        if extra:
            view = ex.options(resources={"R": 1})
            best = 0.0
            for _ in range(3):
                s = time.perf_counter()
                fs = [view.submit(noop, 1) for _ in range(10000)]
                for f in fs:
                    f.result()
                best = max(best, 10000 / (time.perf_counter() - s))
            out["res_tput"] = best
    print(json.dumps(out))


def run(root: str) -> dict:
    env = dict(os.environ, PYTHONPATH=root)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "child"], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    before, after = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    runs: dict = {"before": [], "after": []}
    for i in range(rounds):
        order = [("before", before), ("after", after)]
        if i % 2:
            order.reverse()
        for name, root in order:
            r = run(root)
            runs[name].append(r)
            print(name, {k: round(v, 1) for k, v in r.items()}, flush=True)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for name, rs in runs.items()}
    print("median before:", {k: round(v, 1) for k, v in med["before"].items()})
    print("median after: ", {k: round(v, 1) for k, v in med["after"].items()})
    print(f"throughput after/before: {med['after']['tput'] / med['before']['tput']:.3f}")
    print(f"round trip after/before: {med['after']['rt_us'] / med['before']['rt_us']:.3f}")
    print(f"driver CPU per task after/before: "
          f"{med['after']['cpu_us'] / med['before']['cpu_us']:.3f}")
    if "res_tput" in med["after"]:
        print(f"tasks with a request / without (after): "
              f"{med['after']['res_tput'] / med['after']['tput']:.3f}")


if __name__ == "__main__":
    if sys.argv[1:] == ["child"]:
        child()
    else:
        main()
