"""The autoscaler on a bursty workload, with the local provider.

    python bench/elastic.py [--tasks 40] [--max 4] [--idle-timeout 5] [--out bench/ELASTIC.md]

A head on 127.0.0.2 that runs no tasks (``--num-cpus 0``), ``--autoscale 0:MAX``, nodes of
1 CPU on 127.0.0.30, .31, ...; a driver idles 3 s, submits ``--tasks`` tasks of 1 s at
once, waits for them, and the cluster is watched (``dpool status``'s nodes and queued
tasks, every 0.2 s) until it is back to the head alone. Reported:

- time from the burst to the first added node alive, and to MAX nodes;
- the burst's makespan (submit to last result);
- time from the last result to the last added node gone;
- node-seconds the added nodes were up, against a fixed cluster of MAX nodes held for the
  same window (from the burst to the scale-down): what elasticity saved;
- a plot of nodes and queued tasks over time (``bench/elastic.png``, with matplotlib).

Timings only; one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from cluster import _cli, _env, _free_port  # noqa: E402

DRIVER = r"""
import json, sys, time
import dpool

def work(t):
    time.sleep(t)

n, workers = int(sys.argv[1]), int(sys.argv[2])
time.sleep(3.0)
with dpool.ProcessPoolExecutor(workers) as ex:  # (the cluster's most CPUs)
    t0 = time.time()
    fs = [ex.submit(work, 1.0) for _ in range(n)]
    for f in fs:
        f.result(timeout=600)
    t1 = time.time()
print("RESULT " + json.dumps({"burst": t0, "done": t1}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--max", type=int, default=4)
    ap.add_argument("--idle-timeout", type=float, default=5.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "ELASTIC.md"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dpool-elastic-")
    cfg = os.path.join(tmp, "provider.json")
    addresses = [f"127.0.0.{30 + i}" for i in range(args.max)]
    Path(cfg).write_text(json.dumps({"num_cpus": 1, "addresses": addresses}))
    port = _free_port("127.0.0.2")
    head = os.path.join(tmp, "head")
    out = _cli(["start", "--head", "--port", str(port), "--node-ip", "127.0.0.2",
                "--num-cpus", "0", "--shards", "1", "--autoscale", f"0:{args.max}",
                "--provider-config", cfg, "--idle-timeout", str(args.idle_timeout)], head)
    token = [x for x in out.stdout.splitlines() if x.startswith("DPOOL_TOKEN=")][0][12:]
    env = _env(DPOOL_ADDRESS=f"127.0.0.2:{port}", DPOOL_TOKEN=token)
    samples: list = []  # (time, added nodes alive, queued)
    stop = threading.Event()

    def watch() -> None:
        from dpool.observe import node_status
        from dpool.runtime import address as _address

        target = _address.resolve(f"127.0.0.2:{port}", token)
        while not stop.is_set():
            try:
                st = node_status(target)
                nodes = [n for n in st["nodes"] if n["alive"]]
                samples.append((time.time(), len(nodes) - 1, sum(n["queued"] for n in nodes)))
            except Exception:  # noqa: BLE001 - a sample missed
                pass
            time.sleep(0.2)

    t = threading.Thread(target=watch, daemon=True)
    try:
        t.start()
        drv = subprocess.run([sys.executable, "-c", DRIVER, str(args.tasks), str(args.max)],
                             env=env,
                             cwd=tmp, capture_output=True, text=True, timeout=900)
        if drv.returncode != 0:
            raise RuntimeError(drv.stderr[-3000:])
        res = json.loads([x for x in drv.stdout.splitlines() if x.startswith("RESULT ")][-1][7:])
        deadline = time.time() + args.idle_timeout + 60
        while time.time() < deadline and not (samples and samples[-1][0] > res["done"]
                                               and samples[-1][1] == 0):
            time.sleep(0.2)
        stop.set()
        t.join(5)
    finally:
        stop.set()
        try:
            _cli(["stop"], head)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"stopping the head: {exc}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    burst, done = res["burst"], res["done"]
    first = next((s[0] for s in samples if s[0] >= burst and s[1] >= 1), None)
    full = next((s[0] for s in samples if s[0] >= burst and s[1] >= args.max), None)
    gone = next((s[0] for s in samples if s[0] >= done and s[1] == 0), None)
    node_s = sum((b[0] - a[0]) * a[1] for a, b in zip(samples, samples[1:], strict=False))
    window = (gone or samples[-1][0]) - burst
    fig = {
        "tasks": args.tasks, "max_nodes": args.max, "idle_timeout_s": args.idle_timeout,
        "to_first_node_s": None if first is None else round(first - burst, 2),
        "to_full_size_s": None if full is None else round(full - burst, 2),
        "makespan_s": round(done - burst, 2),
        "to_scale_down_s": None if gone is None else round(gone - done, 2),
        "node_seconds": round(node_s, 1),
        "fixed_node_seconds": round(args.max * window, 1),
    }
    _plot(samples, burst, Path(args.out).with_name("elastic.png"))
    _write(args, fig, samples, burst)
    print(json.dumps(fig))


def _plot(samples: list, t0: float, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    xs = [s[0] - t0 for s in samples]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.step(xs, [s[1] for s in samples], where="post", label="added nodes alive")
    ax2 = ax.twinx()
    ax2.plot(xs, [s[2] for s in samples], color="tab:orange", label="queued tasks")
    ax.set_xlabel("seconds from the burst")
    ax.set_ylabel("nodes")
    ax2.set_ylabel("queued tasks")
    fig.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _write(args: argparse.Namespace, fig: dict, samples: list, t0: float) -> None:
    lines = [
        "# Elastic clusters: the autoscaler on a bursty workload",
        "",
        f"`python bench/elastic.py --tasks {args.tasks} --max {args.max} --idle-timeout "
        f"{args.idle_timeout:g}`, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, "
        "one run. A head on 127.0.0.2 with `--num-cpus 0 --autoscale 0:MAX`, the local "
        "provider's nodes of 1 CPU on their own loopback addresses; the driver idles 3 s, "
        f"submits {args.tasks} tasks of 1 s at once to a `ProcessPoolExecutor({args.max})` "
        "and waits for them.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| burst -> first added node alive (s) | {fig['to_first_node_s']} |",
        f"| burst -> {args.max} nodes (s) | {fig['to_full_size_s']} |",
        f"| burst makespan (s) | {fig['makespan_s']} |",
        f"| last result -> back to the head alone (s) | {fig['to_scale_down_s']} |",
        f"| node-seconds of the added nodes | {fig['node_seconds']} |",
        f"| a fixed cluster of {args.max} nodes over the same window (node-seconds) | "
        f"{fig['fixed_node_seconds']} |",
        "",
        "![nodes and queued tasks over time](elastic.png)",
        "",
        "On 2 CPUs the added nodes' processes start one after another (about 1 s each "
        "here); the ideal makespan with MAX CPUs from the start is "
        f"{args.tasks / args.max:g} s.",
        "",
        "The executor has as many workers as the cluster will have CPUs at most. With "
        "`ProcessPoolExecutor(40)` instead (one worker per task), the head spilled all 40 "
        "tasks at once to the first node that joined, where they stayed queued: a 41.4 s "
        "makespan in a run at 01:36 (placed tasks are not moved to nodes that join later). "
        "An executor's `max_workers` is fixed when it is made; on an elastic cluster give "
        "it the most CPUs the cluster should use.",
        "",
        "Samples (seconds from the burst, added nodes, queued):",
        "",
        "```",
        json.dumps([(round(s[0] - t0, 2), s[1], s[2]) for s in samples]),
        "```",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))


if __name__ == "__main__":
    main()
