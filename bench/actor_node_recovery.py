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
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from cluster import _cli, _env, _free_port  # noqa: E402

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
    tmp = tempfile.mkdtemp(prefix="dpool-actor-rec-")
    port = _free_port("127.0.0.2")
    states = [os.path.join(tmp, f"n{i}") for i in range(3)]
    out = _cli(["start", "--head", "--port", str(port), "--node-ip", "127.0.0.2",
                "--num-cpus", "1", "--shards", "1", "--global-schedulers", "1"], states[0])
    token = [x for x in out.stdout.splitlines() if x.startswith("DPOOL_TOKEN=")][0][12:]
    started = [states[0]]
    os.makedirs(os.path.join(tmp, "driver"))  # (its working directory ships: keep it small)
    try:
        pids = {}
        for i in (1, 2):
            _cli(["start", "--address", f"127.0.0.2:{port}", "--token", token, "--node-ip",
                  f"127.0.0.{2 + i}", "--num-cpus", "1", "--resources", '{"X": 1}'],
                 states[i])
            started.append(states[i])
            rec = json.loads(Path(states[i], "cluster.json").read_text())["node"]
            pids[rec["address"]] = rec["pid"]
        time.sleep(1.5)  # (the nodes link to the global scheduler at their first heartbeat)
        out = subprocess.run([sys.executable, "-c", DRIVER, str(calls), str(every),
                              json.dumps(pids)],
                             env=_env(DPOOL_ADDRESS=f"127.0.0.2:{port}", DPOOL_TOKEN=token),
                             cwd=os.path.join(tmp, "driver"), capture_output=True, text=True,
                             timeout=900)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-3000:])
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
        return json.loads(line[len("RESULT "):])
    finally:
        for state in reversed(started):
            try:
                _cli(["stop"], state)
            except RuntimeError:
                pass  # (the killed node's state says so)
        shutil.rmtree(tmp, ignore_errors=True)


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
