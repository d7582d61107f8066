"""Data locality: a chain of tasks passing 64 MB arrays over a 3-node loopback cluster.

    python bench/placement_bench.py [--chains 4] [--links 6] [--runs 2] [--label now]
                                    [--json bench/locality.json]

Cluster (started fresh, stopped afterwards, even on failure): a head with ``--num-cpus 0``
on 127.0.80.1 (2 Redis shards, one global scheduler) and two nodes with 2 CPUs each on
127.0.80.2 and 127.0.80.3. The driver attaches to the head (its state directory: unix
socket), so every task is the head's and runs on one of the two nodes.

Workload: ``--chains`` independent chains of ``--links`` tasks, all submitted at once as
dataflow (each task gets the previous one's future): the first link makes a 64 MB float64
array, each later link takes the previous array and returns a new 64 MB one (``a + 1``).
The driver waits for the chains' last links and checks their values.

Bytes moved between nodes: every large object a node daemon copies from another node is
one ``transfer._pull.fetch``, which logs ``fetched <segment> from node <address> in .. ms
(<n> bytes ...)`` in the receiving node's ``node.log`` (objects of 1 MiB or more). The
bench sums those lines per (from, to) hop, read before and after the timed run; it also
classifies them: a pull *into the head* is a spilled task's result going back to its
origin (``node._spillback._pull_result``), a pull *into a worker node* is a task's input
sent by reference (``node._remote``). Wall time: from the first submit to the last
result, in the driver. Each run repeats the whole workload; the median is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAD_IP, NODE_IPS = "127.0.80.1", ("127.0.80.2", "127.0.80.3")
sys.path.insert(0, str(ROOT / "bench"))

from cluster import _env, _free_port  # (bench/cluster.py)

DRIVER = r"""
import json, sys, time
import numpy as np
import dpool

N = 8_000_000  # float64: 64 MB

def first(seed):
    return np.full(N, float(seed))

def link(a):
    return a + 1.0

def noop(i):
    return i

chains, links = int(sys.argv[1]), int(sys.argv[2])
with dpool.ProcessPoolExecutor() as ex:
    # warm: workers started on both nodes, the functions known there
    for f in [ex.submit(noop, i) for i in range(16)]:
        f.result(timeout=120)
    w = ex.submit(link, ex.submit(first, 0))
    assert w.result(timeout=120)[0] == 1.0
    del w
    print("READY", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    ends = []
    for c in range(chains):
        f = ex.submit(first, c)
        for _ in range(links - 1):
            f = ex.submit(link, f)
        ends.append(f)
    vals = [float(f.result(timeout=600)[-1]) for f in ends]
    dt = time.perf_counter() - t0
    assert vals == [float(c + links - 1) for c in range(chains)], vals
    del ends, f
print(json.dumps({"wall_s": dt}), flush=True)
"""

_FETCHED = re.compile(r"fetched (\S+) from node (\S+) in [\d.]+ ms \((\d+) bytes")


def _cli(args: list, state: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "dpool", *args],
                         env=_env(DPOOL_STATE_DIR=state), capture_output=True, text=True,
                         timeout=120, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"dpool {' '.join(args)}: {out.stderr}")
    return out


def _fetches(states: dict, since: dict | None = None) -> list:
    """(to, from, bytes) of every copy logged by the nodes, after the first ``since[node]``
    lines of each node's log (``_marks``)."""
    rows = []
    for name, state in states.items():
        log = Path(state, "node.log")
        if not log.exists():
            continue
        found = _FETCHED.findall(log.read_text(errors="replace"))
        for seg, src, n in found[(since or {}).get(name, 0):]:
            rows.append((name, src.split(":")[0], int(n)))
    return rows


def _marks(states: dict) -> dict:
    out: Counter = Counter(to for to, _, _ in _fetches(states))
    return dict(out)


def run(chains: int, links: int, runs: int, tmp: str) -> dict:
    states = {"head": os.path.join(tmp, "head")}
    port = _free_port(HEAD_IP)
    out = _cli(["start", "--head", "--port", str(port), "--node-ip", HEAD_IP,
                "--num-cpus", "0", "--global-schedulers", "1"], states["head"])
    token = next(x for x in out.stdout.splitlines() if x.startswith("DPOOL_TOKEN="))[12:]
    started = ["head"]
    try:
        for i, ip in enumerate(NODE_IPS):
            name = f"node{i + 1}"
            states[name] = os.path.join(tmp, name)
            _cli(["start", "--address", f"{HEAD_IP}:{port}", "--token", token, "--node-ip",
                  ip, "--num-cpus", "2"], states[name])
            started.append(name)
        time.sleep(1.5)  # nodes link to the global scheduler at their first heartbeat
        ip_name = {HEAD_IP: "head", NODE_IPS[0]: "node1", NODE_IPS[1]: "node2"}
        walls, per_run = [], []
        for _ in range(runs):
            proc = subprocess.Popen(
                [sys.executable, "-c", DRIVER, str(chains), str(links)],
                env=_env(DPOOL_ADDRESS="auto", DPOOL_STATE_DIR=states["head"],
                         DPOOL_TOKEN=token),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert proc.stdin is not None and proc.stdout is not None
            try:
                line = proc.stdout.readline()
                if line.strip() != "READY":
                    raise RuntimeError(f"driver: {line!r}")
                time.sleep(0.5)  # the warm-up's pulls are logged
                before = _marks(states)
                proc.stdin.write("go\n")
                proc.stdin.flush()
                res = json.loads(proc.stdout.readline())
                proc.wait(120)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            time.sleep(0.5)
            rows = _fetches(states, before)
            hops: Counter = Counter()
            for to, src, n in rows:
                hops[f"{ip_name.get(src, src)}->{to}"] += n
            walls.append(res["wall_s"])
            per_run.append({"wall_s": res["wall_s"], "copies": len(rows),
                            "bytes": sum(n for _, _, n in rows), "hops": dict(hops),
                            "result_pulls_to_head": sum(1 for r in rows if r[0] == "head"),
                            "input_pulls_to_nodes": sum(1 for r in rows if r[0] != "head")})
        return {"chains": chains, "links": links, "runs": per_run,
                "wall_s_median": statistics.median(walls),
                "bytes_median": statistics.median(r["bytes"] for r in per_run)}
    finally:
        for name in reversed(started):
            try:
                _cli(["stop"], states[name])
            except Exception as exc:  # noqa: BLE001 - stop the others anyway
                print(f"stop {name}: {exc}", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--links", type=int, default=6)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--label", default="now")
    ap.add_argument("--json", default=None, help="add the figures under --label to this file")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpool-locality-") as tmp:
        r = run(a.chains, a.links, a.runs, tmp)
    print(json.dumps(r, indent=1))
    if a.json:
        p = Path(a.json)
        data = json.loads(p.read_text()) if p.exists() else {}
        data[a.label] = r
        p.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
