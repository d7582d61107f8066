"""Moving objects between node stores, against this machine's memcpy rate (same run).

    python bench/transfer.py [--sizes 1,64,1024] [--reps 5] [--fresh 3] [--fresh-mb 1024]
                             [--no-ray] [--out bench/TRANSFER.md]
                             [--json bench/transfer.json (default: beside --out)]

A head that runs nothing (127.0.0.2, ``--num-cpus 0``) and one node with 2 CPUs
(127.0.0.3); a driver on the head's host puts an array of each size (MB) into the head's
store and a task on the other node reads it: the other node pulls it (``transfer._pull``).
Ray (``bench/.venv-peers``, or ``DPOOL_BENCH_RAY_PYTHON``) runs the same on the same
layout in the same run, unless ``--no-ray``.

Reported per size: the median time of put + task over ``--reps`` runs after an untimed
one (and the ratio to Ray's, measured the same way), the same for
a tiny array (the fixed cost of a remote task), their difference, and the transfer rate
that difference implies, next to ``numpy`` copying the same bytes in this process
(memcpy: the limit); and the holder's own time for sending each copy (its node log's
``sent ... in X ms (N bytes from OFFSET)`` lines, one per range sent at once: the
transfer alone, without the put and the task). Then the same 64 MB array broadcast to 8
tasks over two nodes (a head and two nodes, for both libraries); the first ``--fresh-mb``
value into a newly started node (``--fresh`` new clusters of each library, alternating:
no freed pages to reuse, no connections yet); and the cost of packing a project of
~1,000 files for the nodes, first and cached (``protocol._workdir``). The header gives
the 1-minute load average before and after the run (the machine may be shared).
``bench/micro/fetch.py`` times the transfer path with no cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cluster import _cli, _env, _free_port, _ray_python  # noqa: E402

DRIVER = r"""
import json, statistics, sys, time
import numpy as np
import dpool

def touch(a):
    return float(a[::65536].sum())

sizes, reps = [int(x) for x in sys.argv[1].split(",")], int(sys.argv[2])
out = {}
with dpool.ProcessPoolExecutor(2) as ex:
    ex.submit(touch, np.ones(10)).result()
    for mb in [0] + sizes:
        n = max(1, mb * (1 << 20) // 8)
        times = []
        for _ in range(reps + 1):  # the first, untimed: connections, threads, mappings
            arr = np.random.rand(n)
            t0 = time.perf_counter()
            ref = dpool.put(arr)
            assert ex.submit(touch, ref).result() == touch(arr)
            times.append(time.perf_counter() - t0)
            del ref, arr
        out[mb] = statistics.median(times[1:]) if reps else None
        out[f"first{mb}"] = times[0]
print(json.dumps(out))
"""

RAY_DRIVER = r"""
import json, statistics, sys, time
import numpy as np
import ray
ray.init(address=sys.argv[3], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=1)
def touch(a):
    return float(a[::65536].sum())

sizes, reps = [int(x) for x in sys.argv[1].split(",")], int(sys.argv[2])
out = {}
ray.get(touch.remote(np.ones(10)))
for mb in [0] + sizes:
    n = max(1, mb * (1 << 20) // 8)
    times = []
    for _ in range(reps + 1):  # the first, untimed, as for dpool
        arr = np.random.rand(n)
        t0 = time.perf_counter()
        ref = ray.put(arr)
        assert ray.get(touch.remote(ref)) == float(arr[::65536].sum())
        times.append(time.perf_counter() - t0)
        del ref, arr
    out[mb] = statistics.median(times[1:]) if reps else None
    out[f"first{mb}"] = times[0]
print(json.dumps(out))
"""

# The same 64 MB array to 8 tasks that spread over two nodes (each task holds its CPU
# for 50 ms, so neither node takes them all): one copy per node, put included.
BROADCAST = r"""
import json, os, statistics, sys, time
import numpy as np
import dpool

def touch(a):
    time.sleep(0.05)
    return os.environ["DPOOL_NODE_ID"], float(a[::65536].sum())

times, nodes = [], set()
with dpool.ProcessPoolExecutor(4) as ex:
    list(ex.map(touch, [np.ones(10)] * 8))
    for _ in range(int(sys.argv[1])):
        arr = np.random.rand(8 << 20)
        t0 = time.perf_counter()
        ref = dpool.put(arr)
        out = [f.result() for f in [ex.submit(touch, ref) for _ in range(8)]]
        times.append(time.perf_counter() - t0)
        assert {v for _, v in out} == {float(arr[::65536].sum())}
        nodes |= {n for n, _ in out}
        del ref, arr
print(json.dumps({"broadcast8": statistics.median(times), "nodes": len(nodes)}))
"""

RAY_BROADCAST = r"""
import json, statistics, sys, time
import numpy as np
import ray
ray.init(address=sys.argv[2], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=1)
def touch(a):
    time.sleep(0.05)
    return ray.get_runtime_context().get_node_id(), float(a[::65536].sum())

times, nodes = [], set()
ray.get([touch.remote(np.ones(10)) for _ in range(8)])
for _ in range(int(sys.argv[1])):
    arr = np.random.rand(8 << 20)
    t0 = time.perf_counter()
    ref = ray.put(arr)
    out = ray.get([touch.remote(ref) for _ in range(8)])
    times.append(time.perf_counter() - t0)
    assert {v for _, v in out} == {float(arr[::65536].sum())}
    nodes |= {n for n, _ in out}
    del ref, arr
print(json.dumps({"broadcast8": statistics.median(times), "nodes": len(nodes)}))
"""


@contextlib.contextmanager
def dpool_cluster(tmp: str, nodes: int, tag: str = "") -> Iterator[tuple[dict, str]]:
    """A 0-CPU head on 127.0.0.2 and ``nodes`` nodes of 2 CPUs on 127.0.0.3...: (the
    environment of a driver on the head's host, the head's state directory)."""
    head = os.path.join(tmp, f"head-{nodes}{tag}")
    port = _free_port("127.0.0.2")
    out = _cli(["start", "--head", "--port", str(port), "--node-ip", "127.0.0.2",
                "--num-cpus", "0", "--global-schedulers", "1"], head)
    token = [x for x in out.stdout.splitlines() if x.startswith("DPOOL_TOKEN=")][0][12:]
    states = [head]
    try:
        for i in range(nodes):
            states.append(os.path.join(tmp, f"node-{nodes}-{i}{tag}"))
            _cli(["start", "--address", f"127.0.0.2:{port}", "--token", token, "--node-ip",
                  f"127.0.0.{3 + i}", "--num-cpus", "2"], states[-1])
        time.sleep(1.5)  # the nodes link to the global scheduler at their first heartbeat
        yield _env(DPOOL_ADDRESS=f"127.0.0.2:{port}", DPOOL_TOKEN=token,
                   DPOOL_STATE_DIR=head), head
    finally:
        for state in reversed(states):
            _cli(["stop"], state)


@contextlib.contextmanager
def ray_cluster(py: str, nodes: int) -> Iterator[tuple[dict, str]]:
    """The same with Ray: a 0-CPU head and ``nodes`` nodes of 2 CPUs (environment,
    address)."""
    import secrets

    ray = str(Path(py).parent / "ray")
    port = _free_port("127.0.0.2")
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_TOKEN=secrets.token_hex(32))
    try:
        subprocess.run([ray, "start", "--head", "--num-cpus", "0", "--port", str(port),
                        "--node-ip-address", "127.0.0.2", "--disable-usage-stats"],
                       env=env, check=True, capture_output=True, timeout=120)
        for i in range(nodes):
            subprocess.run([ray, "start", "--address", f"127.0.0.2:{port}", "--num-cpus",
                            "2", "--node-ip-address", f"127.0.0.{3 + i}"],
                           env=env, check=True, capture_output=True, timeout=120)
        yield env, f"127.0.0.2:{port}"
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)


def _run_json(cmd: list, env: dict) -> dict:
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-3000:])
    return json.loads(run.stdout.strip().splitlines()[-1])


def memcpy_s(mb: int, reps: int = 5) -> float:
    import numpy as np

    src = np.random.rand(max(1, mb * (1 << 20) // 8))
    dst = np.empty_like(src)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sent_ms(log: str) -> dict:
    """MB -> the holder's send times (ms) of each copy it sent, from its node log. A
    large copy is sent in ranges at once, a line each (``from 0`` starts a copy): its
    time is the longest range's, its size their sum."""
    out: dict = {}
    line = re.compile(r"sent (\S+) to a node in ([0-9.]+) ms \(([0-9]+) bytes(?: from "
                      r"([0-9]+))?\)")
    try:
        text = Path(log).read_text()
    except OSError:
        return out
    copies: dict = {}  # segment -> [ms, bytes, offsets] of the copy being summed
    done = []
    for name, ms, size, offset in line.findall(text):
        off = int(offset or 0)
        c = copies.get(name)
        if c is None or off in c[2]:  # a range seen already: the next copy of it
            if c is not None:
                done.append(c)
            c = copies[name] = [0.0, 0, set()]
        c[0], c[1] = max(c[0], float(ms)), c[1] + int(size)
        c[2].add(off)
    for ms, size, _ in done + list(copies.values()):
        out.setdefault(round(size / (1 << 20)), []).append(ms)
    return out


def fresh_lines(fresh: dict, mb: int, peer: str) -> list:
    """The first ``mb`` MB value into a newly started node (put + remote task, after one
    tiny task), per cluster started, and the medians."""
    if not fresh["dpool"]:
        return []
    ours = [r[f"first{mb}"] for r in fresh["dpool"]]
    theirs = [r[f"first{mb}"] for r in fresh["ray"]]

    def ms(xs: list) -> str:
        return ", ".join(f"{x * 1e3:.0f}" for x in xs) + " ms" if xs else "n/a"

    ratio = (f"{statistics.median(ours) / statistics.median(theirs):.2f}x" if theirs
             else "n/a")
    failed = fresh.get("ray_failed", 0)
    note = [f"({failed} of the fresh {peer} clusters did not start in time; not counted.)",
            ""] if failed else []
    return [f"The first {mb} MB value into a newly started node (a new cluster each time, "
            "one tiny task first; put + remote task), alternating:", "",
            f"| | dpool | {peer} | dpool / peer (medians) |", "|---|---|---|---|",
            f"| first {mb} MB into a fresh node | {ms(ours)} | {ms(theirs)} | {ratio} |",
            "", *note]


def package_cost(tmp: str) -> tuple[float, float]:
    from dpool.protocol import _workdir

    root = Path(tmp, "project")
    for i in range(1000):
        d = root / f"pkg{i % 20}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i}.py").write_text(f"X = {i}\n" + "# padding\n" * 200)
    t0 = time.perf_counter()
    _workdir.package(str(root))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    _workdir.package(str(root))
    return first, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,64,1024")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--fresh", type=int, default=3,
                    help="clusters started for the first-value-into-a-fresh-node figure")
    ap.add_argument("--fresh-mb", type=int, default=1024)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench/TRANSFER.md"))
    ap.add_argument("--json", default=None,
                    help="raw figures (default: transfer.json beside --out)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    py = None if args.no_ray else _ray_python()
    load = [os.getloadavg()[0]]
    tmp = tempfile.mkdtemp(prefix="dpool-transfer-")
    ray: dict = {}
    try:
        with dpool_cluster(tmp, 1) as (env, head):
            res = _run_json([sys.executable, "-c", DRIVER, args.sizes, str(args.reps)], env)
            sends = sent_ms(os.path.join(head, "node.log"))
        with dpool_cluster(tmp, 2) as (env, head):
            res.update(_run_json([sys.executable, "-c", BROADCAST, str(args.reps)], env))
        if py is not None:
            with ray_cluster(py, 1) as (env, address):
                ray = _run_json([py, "-c", RAY_DRIVER, args.sizes, str(args.reps), address],
                                env)
            with ray_cluster(py, 2) as (env, address):
                ray.update(_run_json([py, "-c", RAY_BROADCAST, str(args.reps), address], env))
        fresh: dict = {"dpool": [], "ray": []}  # the first large value into a new node
        for i in range(args.fresh):  # (alternating: both see the same load)
            with dpool_cluster(tmp, 1, f"fresh{i}") as (env, head):
                fresh["dpool"].append(_run_json([sys.executable, "-c", DRIVER,
                                                 str(args.fresh_mb), "0"], env))
            if py is not None:
                try:
                    with ray_cluster(py, 1) as (env, address):
                        fresh["ray"].append(_run_json([py, "-c", RAY_DRIVER,
                                                       str(args.fresh_mb), "0", address], env))
                except (subprocess.SubprocessError, RuntimeError) as exc:  # not the run
                    fresh["ray_failed"] = fresh.get("ray_failed", 0) + 1
                    print(f"a fresh Ray cluster failed: {exc}", file=sys.stderr)
        first, cached = package_cost(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load.append(os.getloadavg()[0])
    base = res["0"]
    peer = "Ray 2.60" if ray else "Ray (not installed)"

    def vs(ours: float, theirs) -> str:
        return f"{theirs * 1e3:.1f} ms | {ours / theirs:.2f}x" if theirs else "n/a | n/a"

    lines = [f"# Objects between nodes ({time.strftime('%Y-%m-%d %H:%M')}, "
             f"{os.cpu_count()} cores, loopback 'hosts', load average "
             f"{' / '.join(f'{x:.1f}' for x in load)} before / after)", "",
             "`python bench/transfer.py` -- one run, peers in the same run. A task on node B "
             "reads an array put on node A (a 0-CPU head, the driver on its host); B pulls "
             f"it into its own store. {peer} does the same on the same layout (a 0-CPU head "
             "and a 2-CPU node).", "",
             f"Fixed cost of put + remote task with a tiny array: {base * 1e3:.1f} ms "
             f"({peer}: {ray['0'] * 1e3:.1f} ms). " if ray else
             f"Fixed cost of put + remote task with a tiny array: {base * 1e3:.1f} ms. ",
             "The holder's send time is the median over the copies of that size it sent, "
             "from its node log (a copy goes in ranges at once: the longest range's time).",
             "", "![GB/s against object size](transfer.png)", "",
             "(`python bench/plots.py --only transfer` draws it from transfer.json.)", "",
             f"| size | put + remote task | {peer} | dpool / peer | minus fixed cost | "
             "implied rate | memcpy of the same bytes | rate ÷ memcpy rate | holder's "
             "send time (rate) |",
             "|---|---|---|---|---|---|---|---|---|"]
    saved: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
                   "reps": args.reps, "peer": peer, "sizes_mb": sizes, "dpool_s": res,
                   "ray_s": ray, "memcpy_s": {}, "holder_send_ms": {}}
    for mb in sizes:
        t = res[str(mb)]
        extra = max(t - base, 1e-9)
        mc = memcpy_s(mb)
        rate = mb / 1024 / extra
        sent = statistics.median(sends[mb]) if sends.get(mb) else None
        saved["memcpy_s"][str(mb)], saved["holder_send_ms"][str(mb)] = mc, sent
        send = f"{sent:.1f} ms ({mb / 1024 / (sent / 1e3):.2f} GB/s)" if sent else "n/a"
        lines.append(f"| {mb} MB | {t * 1e3:.1f} ms | {vs(t, ray.get(str(mb)))} | "
                     f"{extra * 1e3:.1f} ms | {rate:.2f} GB/s | {mc * 1e3:.1f} ms "
                     f"({mb / 1024 / mc:.2f} GB/s) | {mc / extra:.2f} | {send} |")
    lines += ["", "The same 64 MB array to 8 tasks over two nodes of 2 CPUs (a 0-CPU head "
              "holds it; each task sleeps 50 ms so both nodes take some; put included, "
              f"median of {args.reps}):", "",
              f"| | dpool | {peer} | dpool / peer |", "|---|---|---|---|",
              f"| 64 MB to 8 tasks | {res['broadcast8'] * 1e3:.1f} ms | "
              f"{vs(res['broadcast8'], ray.get('broadcast8'))} |",
              f"| nodes that ran them | {res['nodes']} | {ray.get('nodes', 'n/a')} | |", "",
              "It crosses once per node: "
              "`tests/cluster/test_multinode.py::test_a_broadcast_input_crosses_once_per_node` "
              "counts the holder's transfers.", "",
              *fresh_lines(fresh, args.fresh_mb, peer),
              f"Packing a project of 1,000 files for the nodes: {first * 1e3:.1f} ms the "
              f"first time, {cached * 1e3:.1f} ms unchanged (cached).", ""]
    json_out = Path(args.json) if args.json else Path(args.out).with_name("transfer.json")
    json_out.write_text(json.dumps(saved, indent=1))  # bench/plots.py draws it
    out = Path(args.out)
    old = out.read_text() if out.exists() else ""
    kept = old[old.index("\n## ") + 1:] if "\n## " in old else ""  # hand-written history
    out.write_text("\n".join(lines) + ("\n" + kept if kept else ""))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
