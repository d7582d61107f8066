"""Cluster benchmarks: dpool on loopback "hosts" side by side with Ray, in one run.

    python bench/cluster.py [--tasks 10000] [--pings 1000] [--no-ray] [--out bench/CLUSTER.md]

Setups (each started fresh and stopped afterwards):

- *remote*: a head with ``--num-cpus 0`` on 127.0.0.2 (dpool: plus 2 Redis shards and one
  global scheduler) and one node with 2 CPUs on 127.0.0.3: every task runs on the other
  node. Ray the same way: ``ray start --head --num-cpus 0``, ``ray start --address ...
  --num-cpus 2``.
- *local*: one dpool node with 2 CPUs, the driver attached to it (unix socket), against
  dpool's embedded runtime (no ``DPOOL_ADDRESS``) in the same run.

Figures: sequential no-op round trip (median and p90 of ``--pings``), no-op throughput
(``--tasks`` submitted at once, then all awaited), a 64 MB put read by a task on the
other node and a 64 MB result of such a task (driver on the head's host, and over TCP),
Redis commands and bytes per task (the shards' ``INFO stats`` around the throughput
run), and the tasks/s that the one global scheduler placed in that run. Ray is run from ``bench/.venv-peers`` (or
``$DPOOL_BENCH_RAY_PYTHON``) when it has ``ray``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]

DRIVER = r"""
import json, os, statistics, sys, time
import dpool

def noop(*a):
    return None

pings, tasks = int(sys.argv[1]), int(sys.argv[2])
with dpool.ProcessPoolExecutor(2) as ex:
    warm = time.perf_counter() + 0.5  # workers started (and a driver's lease granted)
    while time.perf_counter() < warm:
        ex.submit(noop).result()
    lat = []
    for _ in range(pings):
        t0 = time.perf_counter()
        ex.submit(noop).result()
        lat.append(time.perf_counter() - t0)
    lat.sort()
    print("PHASE", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    fs = [ex.submit(noop) for _ in range(tasks)]
    for f in fs:
        f.result()
    dt = time.perf_counter() - t0
print(json.dumps({"rtt_median_us": statistics.median(lat) * 1e6,
                  "rtt_p90_us": lat[int(len(lat) * 0.9)] * 1e6,
                  "tasks_per_s": tasks / dt}))
"""

PUT64 = r"""
import json, statistics, sys, time
import numpy as np
import dpool

def touch(a):
    return float(a[::4096].sum())

with dpool.ProcessPoolExecutor(2) as ex:
    ex.submit(touch, np.ones(10)).result()
    times = []
    for _ in range(int(sys.argv[1])):
        arr = np.random.rand(8_000_000)  # 64 MB
        t0 = time.perf_counter()
        ref = dpool.put(arr)
        assert ex.submit(touch, ref).result() == touch(arr)
        times.append(time.perf_counter() - t0)
        del ref
print(json.dumps({"put64_ms": statistics.median(times) * 1e3}))
"""

RAY_PUT64 = r"""
import json, statistics, sys, time
import numpy as np
import ray
ray.init(address=sys.argv[2], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=1)
def touch(a):
    return float(a[::4096].sum())

ray.get(touch.remote(np.ones(10)))
times = []
for _ in range(int(sys.argv[1])):
    arr = np.random.rand(8_000_000)
    t0 = time.perf_counter()
    ref = ray.put(arr)
    assert ray.get(touch.remote(ref)) == float(arr[::4096].sum())
    times.append(time.perf_counter() - t0)
    del ref
print(json.dumps({"put64_ms": statistics.median(times) * 1e3}))
"""

GET64 = r"""
import json, statistics, sys, time
import numpy as np
import dpool

def make(seed):
    return np.full(8_000_000, float(seed))  # 64 MB

with dpool.ProcessPoolExecutor(2) as ex:
    ex.submit(make, 0).result()
    times = []
    for i in range(int(sys.argv[1])):
        t0 = time.perf_counter()
        a = ex.submit(make, i).result()
        times.append(time.perf_counter() - t0)
        assert a[-1] == i
        del a
print(json.dumps({"get64_ms": statistics.median(times) * 1e3}))
"""

RAY_GET64 = r"""
import json, statistics, sys, time
import numpy as np
import ray
ray.init(address=sys.argv[2], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=1)
def make(seed):
    return np.full(8_000_000, float(seed))

ray.get(make.remote(0))
times = []
for i in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    a = ray.get(make.remote(i))
    times.append(time.perf_counter() - t0)
    assert a[-1] == i
    del a
print(json.dumps({"get64_ms": statistics.median(times) * 1e3}))
"""

RAY_DRIVER = r"""
import json, statistics, sys, time
import ray
ray.init(address=sys.argv[3], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=1)
def noop():
    return None

pings, tasks = int(sys.argv[1]), int(sys.argv[2])
for _ in range(50):
    ray.get(noop.remote())
lat = []
for _ in range(pings):
    t0 = time.perf_counter()
    ray.get(noop.remote())
    lat.append(time.perf_counter() - t0)
lat.sort()
t0 = time.perf_counter()
ray.get([noop.remote() for _ in range(tasks)])
dt = time.perf_counter() - t0
print(json.dumps({"rtt_median_us": statistics.median(lat) * 1e6,
                  "rtt_p90_us": lat[int(len(lat) * 0.9)] * 1e6,
                  "tasks_per_s": tasks / dt}))
"""


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    for k in ("DPOOL_ADDRESS", "DPOOL_TOKEN", "DPOOL_STATE_DIR"):
        env.pop(k, None)
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _cli(args: list, state: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "dpool", *args], env=_env(DPOOL_STATE_DIR=state),
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"dpool {' '.join(args)}: {out.stderr}")
    return out


@contextlib.contextmanager
def loopback_cluster(nodes: list) -> Iterator[tuple[dict, list, str]]:
    """A head on 127.0.0.2 (1 CPU, 1 Redis shard, 1 global scheduler) and a node per
    item of ``nodes`` (its extra ``dpool start`` flags) on 127.0.0.3, .4, ...: yields the
    drivers' environment, the nodes' records (``cluster.json``'s ``node``: address, pid)
    and an empty directory for a driver to run in (a driver's working directory ships to
    the nodes: this one is small). Stops them all after, a killed one's failure aside."""
    tmp = tempfile.mkdtemp(prefix="dpool-bench-")
    port = _free_port("127.0.0.2")
    head = os.path.join(tmp, "head")
    out = _cli(["start", "--head", "--port", str(port), "--node-ip", "127.0.0.2",
                "--num-cpus", "1", "--shards", "1", "--global-schedulers", "1"], head)
    token = [x for x in out.stdout.splitlines() if x.startswith("DPOOL_TOKEN=")][0][12:]
    started = [head]
    driver_dir = os.path.join(tmp, "driver")
    os.makedirs(driver_dir)
    try:
        records = []
        for i, flags in enumerate(nodes):
            state = os.path.join(tmp, f"node{i}")
            _cli(["start", "--address", f"127.0.0.2:{port}", "--token", token,
                  "--node-ip", f"127.0.0.{3 + i}", *flags], state)
            started.append(state)
            records.append(json.loads(Path(state, "cluster.json").read_text())["node"])
        time.sleep(1.5)  # (the nodes link to the global scheduler at their first heartbeat)
        yield _env(DPOOL_ADDRESS=f"127.0.0.2:{port}", DPOOL_TOKEN=token), records, driver_dir
    finally:
        for state in reversed(started):
            try:
                _cli(["stop"], state)
            except RuntimeError:
                pass  # (a node the benchmark killed)
        shutil.rmtree(tmp, ignore_errors=True)


def run_driver(code: str, args: list, env: dict, cwd: str | None = None,
               timeout: float = 1800) -> dict:
    """Run ``code`` as a driver; the JSON of its last ``RESULT`` line."""
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _redis_stats(shards: list, password: str) -> tuple[int, int]:
    import redis

    cmds = nbytes = 0
    for address in shards:
        host, port = address.rsplit(":", 1)
        info = redis.Redis(host=host, port=int(port), password=password).info("stats")
        cmds += info["total_commands_processed"]
        nbytes += info["total_net_input_bytes"]
    return cmds, nbytes


def _drive(env: dict, pings: int, tasks: int, before_throughput=None) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(pings), str(tasks)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "PHASE", line
    mark = before_throughput() if before_throughput else None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    result = json.loads(proc.stdout.readline())
    proc.wait(120)
    if mark is not None:
        result["_mark"] = mark
    return result


def dpool_remote(tmp: str, pings: int, tasks: int) -> dict:
    head, node = os.path.join(tmp, "head"), os.path.join(tmp, "node")
    port = _free_port("127.0.0.2")
    out = _cli(["start", "--head", "--port", str(port), "--node-ip", "127.0.0.2",
                "--num-cpus", "0", "--global-schedulers", "1"], head)
    token = [x for x in out.stdout.splitlines() if x.startswith("DPOOL_TOKEN=")][0][12:]
    record = json.loads(Path(head, "cluster.json").read_text())
    shards = [r["address"] for r in record["redis"]]
    try:
        _cli(["start", "--address", f"127.0.0.2:{port}", "--token", token, "--node-ip",
              "127.0.0.3", "--num-cpus", "2"], node)
        time.sleep(1.5)  # the node links to the global scheduler at its first heartbeat
        env = _env(DPOOL_ADDRESS=f"127.0.0.2:{port}", DPOOL_TOKEN=token)
        r = _drive(env, pings, tasks, lambda: (_redis_stats(shards, token), time.time()))
        (c0, b0), t0 = r.pop("_mark")
        time.sleep(1.0)  # let the batched writes land
        c1, b1 = _redis_stats(shards, token)
        r["redis_cmds_per_task"] = (c1 - c0) / tasks
        r["redis_bytes_per_task"] = (b1 - b0) / tasks
        for how, extra in (("unix", {"DPOOL_STATE_DIR": head}), ("tcp", {})):
            for what, script in (("put64", PUT64), ("get64", GET64)):
                out = subprocess.run([sys.executable, "-c", script, "7"],
                                     env=_env(DPOOL_ADDRESS=f"127.0.0.2:{port}",
                                              DPOOL_TOKEN=token, **extra),
                                     capture_output=True, text=True, timeout=300)
                if out.returncode != 0:
                    raise RuntimeError(out.stderr[-2000:])
                r[f"{what}_{how}_ms"] = json.loads(
                    out.stdout.strip().splitlines()[-1])[f"{what}_ms"]
        return r
    finally:
        _cli(["stop"], node)
        _cli(["stop"], head)


def dpool_local(tmp: str, pings: int, tasks: int) -> tuple[dict, dict]:
    head = os.path.join(tmp, "local")
    port = _free_port("127.0.0.2")
    out = _cli(["start", "--head", "--port", str(port), "--node-ip", "127.0.0.2",
                "--num-cpus", "2", "--global-schedulers", "0", "--shards", "1"], head)
    token = [x for x in out.stdout.splitlines() if x.startswith("DPOOL_TOKEN=")][0][12:]
    try:
        attached = _drive(_env(DPOOL_ADDRESS="auto", DPOOL_STATE_DIR=head, DPOOL_TOKEN=token),
                          pings, tasks)
    finally:
        _cli(["stop"], head)
    embedded = _drive(_env(), pings, tasks)
    return attached, embedded


def _ray_python() -> str | None:
    explicit = os.environ.get("DPOOL_BENCH_RAY_PYTHON")
    candidates = [explicit] if explicit else [str(ROOT / "bench/.venv-peers/bin/python")]
    for py in candidates:
        if py and Path(py).exists() and subprocess.run(
                [py, "-c", "import ray"], capture_output=True).returncode == 0:
            return py
    return None


def ray_remote(py: str, pings: int, tasks: int) -> dict:
    ray = str(Path(py).parent / "ray")
    port = _free_port("127.0.0.2")
    import secrets

    # Ray 2.60 heads require a token; joining nodes and drivers pass it the same way
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_TOKEN=secrets.token_hex(32))
    tmp = tempfile.mkdtemp(prefix="ray-bench-")
    try:
        subprocess.run([ray, "start", "--head", "--num-cpus", "0", "--port", str(port),
                        "--node-ip-address", "127.0.0.2", "--disable-usage-stats"],
                       env=env, check=True, capture_output=True, timeout=120)
        subprocess.run([ray, "start", "--address", f"127.0.0.2:{port}", "--num-cpus", "2",
                        "--node-ip-address", "127.0.0.3"],
                       env=env, check=True, capture_output=True, timeout=120)
        out = subprocess.run([py, "-c", RAY_DRIVER, str(pings), str(tasks),
                              f"127.0.0.2:{port}"], env=env, capture_output=True, text=True,
                             timeout=300)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        result = json.loads(out.stdout.strip().splitlines()[-1])
        for script in (RAY_PUT64, RAY_GET64):
            out = subprocess.run([py, "-c", script, "7", f"127.0.0.2:{port}"], env=env,
                                 capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-2000:])
            result.update(json.loads(out.stdout.strip().splitlines()[-1]))
        return result
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--pings", type=int, default=1000)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--local-only", action="store_true",
                    help="only the attached-vs-embedded figures (prints JSON, no report)")
    ap.add_argument("--out", default=str(ROOT / "bench/CLUSTER.md"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dpool-bench-")
    if args.local_only:
        try:
            attached, embedded = dpool_local(tmp, args.pings, args.tasks)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(json.dumps({"attached": attached, "embedded": embedded,
                          "rtt_ratio": attached["rtt_median_us"] / embedded["rtt_median_us"]}))
        return 0
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "tasks": args.tasks,
                     "pings": args.pings, "cpus": os.cpu_count()}
    try:
        results["dpool_remote"] = dpool_remote(tmp, args.pings, args.tasks)
        results["dpool_attached"], results["dpool_embedded"] = dpool_local(
            tmp, args.pings, args.tasks)
        py = None if args.no_ray else _ray_python()
        if py is not None:
            try:
                results["ray_remote"] = ray_remote(py, args.pings, args.tasks)
            except Exception as exc:  # noqa: BLE001 - report, keep dpool's figures
                results["ray_error"] = str(exc)[-500:]
        else:
            results["ray_error"] = "ray is not installed (bench/.venv-peers)"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=2))
    Path(args.out).write_text(_report(results))
    return 0


def _report(r: dict) -> str:
    rem, att, emb = r["dpool_remote"], r["dpool_attached"], r["dpool_embedded"]
    ray = r.get("ray_remote")
    lines = [f"# Cluster benchmarks ({r['date']}, {r['cpus']} cores, loopback 'hosts')", "",
             "`python bench/cluster.py` -- one run, peers side by side.", "",
             "| figure | dpool | Ray | dpool / Ray |", "|---|---|---|---|"]

    def row(name: str, ours: float, theirs: float | None, unit: str) -> None:
        ratio = f"{ours / theirs:.2f}x" if theirs else "n/a"
        t = f"{theirs:,.0f} {unit}" if theirs else r.get("ray_error", "n/a")
        lines.append(f"| {name} | {ours:,.0f} {unit} | {t} | {ratio} |")

    row("remote no-op round trip, median", rem["rtt_median_us"],
        ray and ray["rtt_median_us"], "us")
    row("remote no-op round trip, p90", rem["rtt_p90_us"], ray and ray["rtt_p90_us"], "us")
    row(f"{r['tasks']:,} no-ops over two nodes", rem["tasks_per_s"],
        ray and ray["tasks_per_s"], "tasks/s")
    row("64 MB put on the head + a task reading it on the other node (driver on the "
        "head's host)", rem["put64_unix_ms"], ray and ray["put64_ms"], "ms")
    row("the same, driver connected over TCP", rem["put64_tcp_ms"],
        ray and ray["put64_ms"], "ms")
    row("a task on the other node returns 64 MB to the driver (driver on the head's host)",
        rem["get64_unix_ms"], ray and ray.get("get64_ms"), "ms")
    row("the same, driver connected over TCP", rem["get64_tcp_ms"],
        ray and ray.get("get64_ms"), "ms")
    lines += ["", "| figure | attached driver | embedded runtime | attached / embedded |",
              "|---|---|---|---|",
              f"| local no-op round trip, median | {att['rtt_median_us']:,.0f} us | "
              f"{emb['rtt_median_us']:,.0f} us | "
              f"{att['rtt_median_us'] / emb['rtt_median_us']:.2f}x |",
              f"| local no-op throughput | {att['tasks_per_s']:,.0f} tasks/s | "
              f"{emb['tasks_per_s']:,.0f} tasks/s | "
              f"{att['tasks_per_s'] / emb['tasks_per_s']:.2f}x |", "",
              f"Control store, remote throughput run: {rem['redis_cmds_per_task']:.2f} Redis "
              f"commands and {rem['redis_bytes_per_task']:,.0f} bytes per task (2 shards). "
              f"Every task of that run went through the one global scheduler, so it placed "
              f"at least {rem['tasks_per_s']:,.0f} tasks/s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
