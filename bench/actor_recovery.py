"""An actor's recovery time against the calls it must replay, with and without checkpoints.

    python bench/actor_recovery.py [--calls 999,4999,9999,19999] [--every 500] [--reps 3]

For each number of calls N: an actor (``max_restarts=-1``) runs N calls of a method that
updates its state (a 256-float list, ~10 us of work); its process is SIGKILLed; the time
from the kill until the next call's result is its recovery (the new process boots from
its last checkpoint, or the constructor, and replays the calls after it). Once without
checkpoints (N calls replayed), once with ``checkpoint_every`` (N mod it replayed: the
default Ns are one short of a checkpoint, the most a restart replays).
The state after recovery is checked against the state before. Writes
``bench/actor_recovery.json``; ``python bench/plots.py --only actor_recovery`` draws it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import dpool  # noqa: E402


class Model:
    def __init__(self) -> None:
        self.weights = [0.0] * 256
        self.updates = 0

    def update(self, step: float) -> int:
        w = self.weights
        for i in range(len(w)):
            w[i] = w[i] * 0.999 + step
        self.updates += 1
        return self.updates

    @dpool.readonly  # (else they would count towards a checkpoint)
    def pid(self) -> int:
        return os.getpid()

    @dpool.readonly
    def digest(self) -> tuple:
        return self.updates, round(sum(self.weights), 6)


def one(ex: Any, n: int, every: int) -> dict:
    a = ex.options(max_restarts=-1, checkpoint_every=every).actor(Model)
    fs = [a.update.submit(1e-3) for _ in range(n)]
    fs[-1].result()
    before = a.digest()
    pid = a.pid()
    t = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    after = a.digest()  # waits for the restart and its replay
    recovery = time.perf_counter() - t
    assert after == before, (after, before)
    dpool.kill(a)
    return {"recovery_s": recovery, "replayed": n % every if every else n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", default="999,4999,9999,19999")
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from dpool import ProcessPoolExecutor

    calls = [int(x) for x in args.calls.split(",")]
    rows = []
    with ProcessPoolExecutor(2) as ex:
        one(ex, 100, 0)  # warm
        for n in calls:
            for every in (0, args.every):
                runs = [one(ex, n, every) for _ in range(args.reps)]
                med = statistics.median(r["recovery_s"] for r in runs)
                rows.append({"calls": n, "checkpoint_every": every,
                             "replayed": runs[0]["replayed"], "recovery_s": med,
                             "samples_s": [r["recovery_s"] for r in runs]})
                print(f"{n:>6} calls, checkpoint_every={every:<4}: replayed "
                      f"{runs[0]['replayed']:>6}, recovery {med * 1e3:8.1f} ms")
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
           "every": args.every, "rows": rows,
           "command": "python bench/actor_recovery.py " + " ".join(sys.argv[1:])}
    with open(os.path.join(ROOT, "bench", "actor_recovery.json"), "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
