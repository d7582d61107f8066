"""Actors on a two-node loopback cluster: dpool against Ray, in one run.

    python bench/actors_cluster.py [--calls 2000] [--tput 20000] [--no-ray]
                                   [--out bench/ACTORS_CLUSTER.json]

Setup (each started fresh, stopped afterwards): a head on 127.0.0.2 with 2 CPUs and a
custom resource ``H`` (dpool: plus 2 Redis shards and a global scheduler), and a node on
127.0.0.3 with 2 CPUs and ``X``. The driver runs on this host, attached to the head
(dpool: over TCP, as from another host; Ray: ``ray.init(address=...)``). The actor asks
for ``X``, so the cluster places it on 127.0.0.3 (dpool: the head's global scheduler).

- ``call_us``: the driver's plain call of a no-op method, median of ``--calls``;
- ``tput``: ``--tput`` calls submitted at once, then every result (calls/s);
- ``task_call_us``: a task on the head (it asks for ``H``) calls the actor on the other
  node ``--calls`` times; the median, timed inside the task.

Prints JSON and writes ``--out``; ``bench/ACTORS.md`` quotes it. Timings only.
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

from cluster import _cli, _env, _free_port, _ray_python  # noqa: E402

DPOOL_DRIVER = r"""
import json, statistics, sys, time
import dpool

class Echo:
    def ping(self, x=0):
        return x

def calls_from_a_task(echo, n):
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        echo.ping()
        lat.append(time.perf_counter() - t)
    return statistics.median(lat) * 1e6, dpool.node_id()

n, tput = int(sys.argv[1]), int(sys.argv[2])
with dpool.ProcessPoolExecutor(2) as ex:
    echo = ex.options(resources={"X": 1}).actor(Echo)
    echo.ping()
    where = echo.ping.submit()  # (warm)
    where.result()
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        echo.ping()
        lat.append(time.perf_counter() - t)
    t0 = time.perf_counter()
    fs = [echo.ping.submit(i) for i in range(tput)]
    for f in fs:
        f.result()
    rate = tput / (time.perf_counter() - t0)
    task_us, task_node = ex.options(resources={"H": 1}).submit(
        calls_from_a_task, echo, n).result(timeout=600)
print("RESULT", json.dumps({"call_us": statistics.median(lat) * 1e6, "tput": rate,
                            "task_call_us": task_us, "task_node": task_node}), flush=True)
"""

RAY_DRIVER = r"""
import json, statistics, sys, time
import ray

ray.init(address=sys.argv[3], log_to_driver=False)

@ray.remote(resources={"X": 1}, num_cpus=0)
class Echo:
    def ping(self, x=0):
        return x

@ray.remote(resources={"H": 1})
def calls_from_a_task(echo, n):
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        ray.get(echo.ping.remote())
        lat.append(time.perf_counter() - t)
    return statistics.median(lat) * 1e6, ray.get_runtime_context().get_node_id()

n, tput = int(sys.argv[1]), int(sys.argv[2])
echo = Echo.remote()
ray.get(echo.ping.remote())
lat = []
for _ in range(n):
    t = time.perf_counter()
    ray.get(echo.ping.remote())
    lat.append(time.perf_counter() - t)
t0 = time.perf_counter()
refs = [echo.ping.remote(i) for i in range(tput)]
ray.get(refs)
rate = tput / (time.perf_counter() - t0)
task_us, task_node = ray.get(calls_from_a_task.remote(echo, n))
print("RESULT", json.dumps({"call_us": statistics.median(lat) * 1e6, "tput": rate,
                            "task_call_us": task_us}), flush=True)
"""


def _result(stdout: str) -> dict:
    line = [x for x in stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def run_dpool(n: int, tput: int) -> dict:
    tmp = tempfile.mkdtemp(prefix="dpool-actors-")
    head, node = os.path.join(tmp, "head"), os.path.join(tmp, "node")
    port = _free_port("127.0.0.2")
    out = _cli(["start", "--head", "--port", str(port), "--node-ip", "127.0.0.2",
                "--num-cpus", "2", "--resources", '{"H": 2}', "--global-schedulers", "1"],
               head)
    token = [x for x in out.stdout.splitlines() if x.startswith("DPOOL_TOKEN=")][0][12:]
    try:
        _cli(["start", "--address", f"127.0.0.2:{port}", "--token", token, "--node-ip",
              "127.0.0.3", "--num-cpus", "2", "--resources", '{"X": 1}'], node)
        time.sleep(1.5)  # the node links to the global scheduler at its first heartbeat
        out = subprocess.run([sys.executable, "-c", DPOOL_DRIVER, str(n), str(tput)],
                             env=_env(DPOOL_ADDRESS=f"127.0.0.2:{port}", DPOOL_TOKEN=token),
                             capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-3000:])
        return _result(out.stdout)
    finally:
        _cli(["stop"], node)
        _cli(["stop"], head)
        shutil.rmtree(tmp, ignore_errors=True)


def run_ray(py: str, n: int, tput: int) -> dict:
    ray = str(Path(py).parent / "ray")
    port = _free_port("127.0.0.2")
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_TOKEN=secrets.token_hex(32))
    try:
        subprocess.run([ray, "start", "--head", "--num-cpus", "2", "--resources",
                        '{"H": 2}', "--port", str(port), "--node-ip-address", "127.0.0.2",
                        "--disable-usage-stats"], env=env, check=True, capture_output=True,
                       timeout=120)
        subprocess.run([ray, "start", "--address", f"127.0.0.2:{port}", "--num-cpus", "2",
                        "--resources", '{"X": 1}', "--node-ip-address", "127.0.0.3"],
                       env=env, check=True, capture_output=True, timeout=120)
        out = subprocess.run([py, "-c", RAY_DRIVER, str(n), str(tput), f"127.0.0.2:{port}"],
                             env=env, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-3000:])
        return _result(out.stdout)
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--tput", type=int, default=20000)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench/actors_cluster.json"))
    args = ap.parse_args()
    result = {"dpool": run_dpool(args.calls, args.tput)}
    py = None if args.no_ray else _ray_python()
    if py is not None:
        result["ray"] = run_ray(py, args.calls, args.tput)
    result["load_before"] = os.getloadavg()[0]
    result["machine"] = f"{os.cpu_count()} CPUs"
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
