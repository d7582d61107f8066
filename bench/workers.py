"""Throughput against the number of workers, dpool and its peers in one run.

    python bench/workers.py [--workers 1,2,4,8,16] [--peers dpool,ppe,mp,ray,dask]
                            [--out bench/workers.json]

For each worker count, a fresh executor of each peer (the ``bench/peers`` adapters, each
peer in its own child process: Ray and dask.distributed from ``bench/.venv-peers`` or
``$DPOOL_BENCH_RAY_PYTHON``) runs, after a warm-up of one task per worker:

- ``noop_tps``: 3,000 no-op tasks submitted at once, then every result (tasks/s): the
  per-task cost, which more workers than cores cannot help;
- ``sleep_tps``: ``20 x workers`` tasks that sleep 20 ms, submitted at once (tasks/s;
  ``workers / 0.02`` would be perfect): how well the peer keeps that many workers busy.

Writes the figures to ``--out``; ``bench/plots.py`` draws ``workers.png`` from them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
NOOPS = 3000


def child(peer: str, counts: list[int]) -> None:
    sys.path[:0] = [str(BENCH), str(ROOT)]
    import workloads
    from peers import load

    cls, version = load(peer, "executor")
    print(json.dumps({"version": version}), flush=True)
    for w in counts:
        with cls(w) as ex:
            ex.results([ex.submit(workloads.noop) for _ in range(w)])
            t0 = time.perf_counter()
            ex.results([ex.submit(workloads.noop) for _ in range(NOOPS)])
            noop = NOOPS / (time.perf_counter() - t0)
            n = 20 * w
            t0 = time.perf_counter()
            ex.results([ex.submit(workloads.nap, 0.02) for _ in range(n)])
            sleep = n / (time.perf_counter() - t0)
        print(json.dumps({"workers": w, "noop_tps": noop, "sleep_tps": sleep}), flush=True)


def _python(peer: str) -> str:
    if peer not in ("ray", "dask"):
        return sys.executable
    return os.environ.get("DPOOL_BENCH_RAY_PYTHON") or str(BENCH / ".venv-peers/bin/python")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,4,8,16")
    ap.add_argument("--peers", default="dpool,ppe,mp,ray,dask")
    ap.add_argument("--out", default=str(BENCH / "workers.json"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    counts = [int(x) for x in args.workers.split(",")]
    if args.child:
        child(args.child, counts)
        return 0
    out: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
                 "loadavg_start": os.getloadavg(), "noops": NOOPS, "sleep_s": 0.02,
                 "peers": {}}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(BENCH)]),
               RAY_USAGE_STATS_ENABLED="0")
    env.pop("DPOOL_ADDRESS", None)
    sys.path.insert(0, str(BENCH))
    from procs import run_child  # its own session; what a peer leaves behind is killed

    for peer in args.peers.split(","):
        with tempfile.TemporaryDirectory(prefix="dpool-workers-") as tmp:
            res = run_child([_python(peer), __file__, "--child", peer, "--workers",
                             args.workers], cwd=ROOT, env=env, timeout_s=300,
                            out_dir=Path(tmp))
        rows = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
        entry: dict = {"rows": [r for r in rows if "workers" in r], "leftovers": res.leftovers}
        for r in rows:
            if "version" in r:
                entry["version"] = r["version"]
        if res.returncode != 0 or not entry["rows"]:
            entry["error"] = (res.stderr or "")[-1500:]
        out["peers"][peer] = entry
        print(peer, json.dumps(entry)[:400], flush=True)
    out["loadavg_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
