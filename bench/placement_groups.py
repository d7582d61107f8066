"""Time to reserve a gang of 4 one-CPU bundles on 3 nodes (2 CPUs each), dpool and Ray,
on loopback clusters on this machine: ``placement_group(...)`` to ``ready()`` resolved,
then ``remove``, ``--rounds`` times per strategy (the first round is a warm-up).

    python bench/placement_groups.py [--rounds 20] [--no-ray]

dpool: ``dpool start --head`` on 127.0.0.2 (Redis shard, global scheduler, a node with 2
CPUs) and two nodes on 127.0.0.3 and .4; the driver attaches to the head's node. Ray:
``ray start --head`` on 127.0.0.2 with 2 CPUs and two nodes on .3 and .4, driver on the
head (bench/.venv-peers or ``$DPOOL_BENCH_RAY_PYTHON``). Prints one JSON line per system.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from cluster import _cli, _env, _free_port, _ray_python

DPOOL_DRIVER = r"""
import json, statistics, sys, time
import dpool
rounds = int(sys.argv[1])
out = {}
for strategy, n in (("spread", 4), ("pack", 4), ("strict_spread", 3)):
    times = []
    for i in range(rounds + 1):
        t0 = time.perf_counter()
        pg = dpool.placement_group([{"CPU": 1}] * n, strategy=strategy)
        pg.ready().result(60)
        dt = time.perf_counter() - t0
        nodes = pg.bundle_nodes
        pg.remove()
        if i:
            times.append(dt)
        time.sleep(0.05)
    times.sort()
    out[strategy] = {"bundles": n, "median_ms": statistics.median(times) * 1e3,
                     "p90_ms": times[int(len(times) * 0.9) - 1] * 1e3,
                     "nodes": len(set(nodes))}
print(json.dumps(out))
"""

RAY_DRIVER = r"""
import json, statistics, sys, time
import ray
from ray.util.placement_group import placement_group, remove_placement_group
rounds = int(sys.argv[1])
ray.init(address=sys.argv[2], _node_ip_address="127.0.0.2", logging_level="ERROR",
         log_to_driver=False)
out = {}
for strategy, n in (("SPREAD", 4), ("PACK", 4), ("STRICT_SPREAD", 3)):
    times = []
    for i in range(rounds + 1):
        t0 = time.perf_counter()
        pg = placement_group([{"CPU": 1}] * n, strategy=strategy)
        ray.get(pg.ready(), timeout=60)
        dt = time.perf_counter() - t0
        nodes = {b for b in ray.util.placement_group_table(pg)["bundles_to_node_id"].values()}
        remove_placement_group(pg)
        if i:
            times.append(dt)
        time.sleep(0.05)
    times.sort()
    out[strategy.lower()] = {"bundles": n, "median_ms": statistics.median(times) * 1e3,
                             "p90_ms": times[int(len(times) * 0.9) - 1] * 1e3,
                             "nodes": len(nodes)}
print(json.dumps(out))
"""


def dpool_gangs(rounds: int) -> dict:
    tmp = tempfile.mkdtemp(prefix="dpool-pg-bench-")
    states = [os.path.join(tmp, f"n{i}") for i in range(3)]
    port = _free_port("127.0.0.2")
    started = []
    try:
        out = _cli(["start", "--head", "--port", str(port), "--node-ip", "127.0.0.2",
                    "--num-cpus", "2", "--shards", "1"], states[0])
        started.append(states[0])
        token = [x for x in out.stdout.splitlines() if x.startswith("DPOOL_TOKEN=")][0][12:]
        for i, ip in ((1, "127.0.0.3"), (2, "127.0.0.4")):
            _cli(["start", "--address", f"127.0.0.2:{port}", "--token", token, "--node-ip", ip,
                  "--num-cpus", "2"], states[i])
            started.append(states[i])
        time.sleep(2.0)  # the nodes link to the global scheduler at their first heartbeat
        env = _env(DPOOL_ADDRESS=f"127.0.0.2:{port}", DPOOL_TOKEN=token)
        res = subprocess.run([sys.executable, "-c", DPOOL_DRIVER, str(rounds)], env=env,
                             capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-2000:])
        return json.loads(res.stdout.strip().splitlines()[-1])
    finally:
        for state in reversed(started):
            try:
                _cli(["stop"], state)
            except RuntimeError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


def ray_gangs(py: str, rounds: int) -> dict:
    ray = str(Path(py).parent / "ray")
    port = _free_port("127.0.0.2")
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_TOKEN=secrets.token_hex(32))
    try:
        subprocess.run([ray, "start", "--head", "--num-cpus", "2", "--port", str(port),
                        "--node-ip-address", "127.0.0.2", "--disable-usage-stats"],
                       env=env, check=True, capture_output=True, timeout=180)
        for ip in ("127.0.0.3", "127.0.0.4"):
            subprocess.run([ray, "start", "--address", f"127.0.0.2:{port}", "--num-cpus", "2",
                            "--node-ip-address", ip,
                            "--dashboard-agent-listen-port", str(_free_port(ip)),
                            "--metrics-export-port", str(_free_port(ip))],
                           env=env, check=True, capture_output=True, timeout=180)
        res = subprocess.run([py, "-c", RAY_DRIVER, str(rounds), f"127.0.0.2:{port}"],
                             env=env, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-2000:])
        return json.loads(res.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=180)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    print(json.dumps({"dpool": dpool_gangs(args.rounds)}), flush=True)
    if not args.no_ray:
        py = _ray_python()
        if py is None:
            print(json.dumps({"ray": "not installed (bench/.venv-peers)"}))
        else:
            try:
                print(json.dumps({"ray": ray_gangs(py, args.rounds)}))
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(json.dumps({"ray_error": str(exc)[-1500:]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
