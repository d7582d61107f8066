"""A placed actor's recovery when its node dies: SIGKILL the node that hosts it (daemon
and workers), then time until its next call's result -- the link to that node closes,
the driver's node requeues the calls, a global scheduler places the actor on the other
node, its worker boots from the driver's node's copy (checkpoint, then the calls after
it, replayed) and runs the call.

    python bench/actor_node_recovery.py [--calls 1000,5000] [--every 0,500]

A head on 127.0.0.2 (no "X") and two nodes with one "X" each (127.0.0.3, .4); the actor
asks for "X". Prints one line per (calls, checkpoint_every): the calls replayed and the
recovery in ms, the state checked after.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from cluster import loopback_cluster, run_driver  # noqa: E402

DRIVER = r"""
import json, os, sys, time
import psutil
import dpool
from dpool import ProcessPoolExecutor

class Counter:
    def __init__(self):
        self.n = 0
    def add(self, k):
        self.n += k
        return self.n
    @dpool.readonly
    def node(self):
        return os.environ.get("DPOOL_NODE_ID")

calls, every, pids = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
with ProcessPoolExecutor(2) as ex:
    c = ex.options(resources={"X": 1}, max_restarts=1, checkpoint_every=every).actor(Counter)
    fs = [c.add.submit(1) for _ in range(calls)]
    assert fs[-1].result(timeout=600) == calls
    where = c.node()
    p = psutil.Process(pids[where])
    family = [p, *p.children(recursive=True)]
    t0 = time.perf_counter()
    for x in family:
        x.kill()
    n = c.add(1)
    dt = time.perf_counter() - t0
    moved = c.node() != where
    print("RESULT", json.dumps({"ms": dt * 1e3, "ok": n == calls + 1 and moved}), flush=True)
"""


def run(calls: int, every: int) -> dict:
    x_node = ["--num-cpus", "1", "--resources", '{"X": 1}']
    with loopback_cluster([x_node, x_node]) as (env, nodes, cwd):
        pids = {x["address"]: x["pid"] for x in nodes}
        return run_driver(DRIVER, [calls, every, json.dumps(pids)], env, cwd, timeout=900)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", default="1000,5000")
    ap.add_argument("--every", default="0,500")
    a = ap.parse_args()
    for calls in (int(x) for x in a.calls.split(",")):
        for every in (int(x) for x in a.every.split(",")):
            r = run(calls, every)
            replayed = calls if not every else calls % every
            print(f"calls {calls}, checkpoint_every {every or 'none'}: {replayed} replayed, "
                  f"recovery {r['ms']:.0f} ms, state right: {r['ok']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
