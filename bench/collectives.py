"""Allreduce: dpool.collective against mpi4py's Allreduce on Debian's OpenMPI, and against
reducing through the driver with the object store, in the same run.

    python bench/collectives.py [--sizes 1024,65536,...] [--members 2,4] [--round-mb 100]

Setups, each in processes of its own:
- ``dpool shm``: members (actors) on one host, the embedded runtime: shared memory.
- ``dpool tcp``: members on separate loopback nodes (a cluster started here: a head on
  127.0.0.2 and a node per member on 127.0.0.3, ...; each actor pinned to its node):
  member-to-member TCP links, the ring for large arrays.
- ``mpi shm``: ``mpirun -n N`` (OpenMPI's shared-memory transport, vader).
- ``mpi tcp``: ``mpirun --mca btl tcp,self -n N`` (OpenMPI over loopback TCP), the peer of
  ``dpool tcp``.
- ``driver``: the embedded runtime, no collective: each member returns its array (the
  object store), the driver sums them and ``put``s the sum, each member reads it.

Each figure is the slowest member's mean over the repetitions (after a warm-up), then
bus bandwidth as nccl-tests defines it: size / time x 2(n-1)/n. Also the seeds' shape: a
100 MB allreduce per round on 4 members. Writes ``bench/collectives.json``; the plot is
``bench/collectives.png`` (``--plot``, needs matplotlib).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from cluster import _env, loopback_cluster, run_driver  # noqa: E402

MEMBER = r"""
import json, sys, time
import numpy as np
import dpool
import dpool.collective as col
from dpool import ProcessPoolExecutor


class Member:
    def run(self, size, reps):
        a = np.ones(max(1, size // 8)); out = np.empty_like(a)
        for _ in range(3):  # (warm: segments made, pages touched, caches)
            col.allreduce(a, out=out, group_name="b")
        col.barrier(group_name="b")
        t = time.perf_counter()
        for _ in range(reps):
            col.allreduce(a, out=out, group_name="b")
        return (time.perf_counter() - t) / reps

    def mine(self, size):
        return np.ones(max(1, size // 8))

    def take(self, total):
        return float(total[0])


def reps_for(size):  # (about half a second of each size at a few GB/s)
    return max(5, min(20000, int(1.5e9 // max(size, 1))))


def collective(ms, sizes, transport, round_mb):
    used = col.create_group(ms, "b", transport=transport)
    out = {"transport": used[0]}
    for size in sizes:
        reps = reps_for(size)
        out[str(size)] = max(f.result() for f in [m.run.submit(size, reps) for m in ms])
    if round_mb:
        size = round_mb << 20
        out["round"] = max(f.result() for f in [m.run.submit(size, 3) for m in ms])
    return out


def through_driver(ms, sizes):
    out = {}
    for size in sizes:
        reps = max(2, min(200, reps_for(size) // 20))
        times = []
        for _ in range(reps + 1):
            t = time.perf_counter()
            parts = [f.result() for f in [m.mine.submit(size) for m in ms]]
            total = np.sum(parts, axis=0)
            ref = dpool.put(total)
            [f.result() for f in [m.take.submit(ref) for m in ms]]
            times.append(time.perf_counter() - t)
            del parts, total, ref
        out[str(size)] = sum(times[1:]) / reps
    return out


if __name__ == "__main__":
    n, sizes, mode, round_mb = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], \
        int(sys.argv[4])
    nodes = sys.argv[5].split(",") if len(sys.argv) > 5 else []
    with ProcessPoolExecutor(n) as ex:
        if nodes:
            ms = [ex.options(scheduling=dpool.NodeAffinity(nodes[r])).actor(Member)
                  for r in range(n)]
        else:
            ms = [ex.actor(Member) for _ in range(n)]
        if mode == "driver":
            res = through_driver(ms, sizes)
        else:
            res = collective(ms, sizes, mode, round_mb)
    print("RESULT", json.dumps(res), flush=True)
"""

MPI = r"""
import json, os, sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
sizes, round_mb = json.loads(sys.argv[1]), int(sys.argv[2])
out = {}
def run(size, reps):
    a = np.ones(max(1, size // 8)); b = np.empty_like(a)
    for _ in range(3):
        comm.Allreduce(a, b)
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(reps):
        comm.Allreduce(a, b)
    return comm.allreduce((time.perf_counter() - t) / reps, op=MPI.MAX)
for size in sizes:
    out[str(size)] = run(size, max(5, min(20000, int(1.5e9 // max(size, 1)))))
if round_mb:
    out["round"] = run(round_mb << 20, 3)
if comm.Get_rank() == 0:
    print("RESULT", json.dumps(out), flush=True)
"""


def _result(stdout: str) -> dict:
    line = [x for x in stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def run_dpool(n: int, sizes: list, mode: str, round_mb: int) -> dict:
    return run_driver(MEMBER, [n, json.dumps(sizes), mode, round_mb], _env())


def run_dpool_nodes(n: int, sizes: list, round_mb: int) -> dict:
    """Members on ``n`` loopback nodes of a cluster started here (the head holds none)."""
    with loopback_cluster([["--num-cpus", "1"]] * n) as (env, nodes, cwd):
        return run_driver(MEMBER, [n, json.dumps(sizes), "tcp", round_mb,
                                   ",".join(x["address"] for x in nodes)], env, cwd)


def _mpi_python() -> str | None:
    py = os.environ.get("DPOOL_BENCH_MPI_PYTHON") or str(ROOT / "bench/.venv-peers/bin/python")
    if shutil.which("mpirun") and Path(py).exists() and subprocess.run(
            [py, "-c", "import mpi4py"], capture_output=True).returncode == 0:
        return py
    return None


def run_mpi(py: str, n: int, sizes: list, tcp: bool, round_mb: int) -> dict:
    args = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", str(n)]
    if tcp:
        args += ["--mca", "btl", "tcp,self"]
    out = subprocess.run([*args, py, "-c", MPI, json.dumps(sizes), str(round_mb)],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return _result(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,65536,1048576,16777216,67108864,268435456")
    ap.add_argument("--members", default="2,4")
    ap.add_argument("--round-mb", type=int, default=100)
    ap.add_argument("--out", default=str(ROOT / "bench/collectives.json"))
    ap.add_argument("--plot", action="store_true")
    ap.add_argument("--report", action="store_true",
                    help="only print the table and draw the plot of --out's results")
    args = ap.parse_args()
    if args.report:
        result = json.loads(Path(args.out).read_text())
        print(report(result))
        plot(result, Path(args.out).with_suffix(".png"))
        return 0
    sizes = [int(x) for x in args.sizes.split(",")]
    py = _mpi_python()
    result: dict = {"sizes": sizes, "round_mb": args.round_mb,
                    "load_before": os.getloadavg()[0],
                    "machine": f"{os.cpu_count()} CPUs", "runs": {}}
    for n in (int(x) for x in args.members.split(",")):
        rnd = args.round_mb if n == 4 else 0
        runs = result["runs"][str(n)] = {}
        runs["dpool shm"] = run_dpool(n, sizes, "shm", rnd)
        print(n, "dpool shm", runs["dpool shm"], flush=True)
        if py is not None:
            runs["mpi shm"] = run_mpi(py, n, sizes, False, rnd)
            print(n, "mpi shm", runs["mpi shm"], flush=True)
        runs["dpool tcp"] = run_dpool_nodes(n, sizes, rnd)
        print(n, "dpool tcp", runs["dpool tcp"], flush=True)
        if py is not None:
            runs["mpi tcp"] = run_mpi(py, n, sizes, True, rnd)
            print(n, "mpi tcp", runs["mpi tcp"], flush=True)
        runs["driver"] = run_dpool(n, [s for s in sizes if s <= 64 << 20], "driver", 0)
        print(n, "driver", runs["driver"], flush=True)
    result["load_after"] = os.getloadavg()[0]
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, Path(args.out).with_suffix(".png"))
    return 0


def _size(b: int) -> str:
    return f"{b >> 20} MB" if b >= 1 << 20 else f"{b >> 10} KB"


def report(result: dict) -> str:
    """The markdown tables: time and bus bandwidth per size; ratios to MPI's."""
    lines = []
    for n, runs in sorted(result["runs"].items(), key=lambda kv: int(kv[0])):
        n_ = int(n)
        lines += [f"### {n} members", "",
                  "| size | dpool shm | MPI shm | MPI/dpool | dpool tcp (nodes) | MPI tcp "
                  "| MPI/dpool | through the driver |", "|---|---|---|---|---|---|---|---|"]
        for size in result["sizes"]:
            k = str(size)

            def cell(name: str) -> str:
                t = runs.get(name, {}).get(k)
                if t is None:
                    return "-"
                return f"{t * 1e6:,.1f} us ({busbw(size, t, n_):.2f} GB/s)" if t < 1e-3 \
                    else f"{t * 1e3:,.2f} ms ({busbw(size, t, n_):.2f} GB/s)"

            def ratio(a: str, b: str) -> str:
                ta, tb = runs.get(a, {}).get(k), runs.get(b, {}).get(k)
                return f"{tb / ta:.2f}x" if ta and tb else "-"

            lines.append(f"| {_size(size)} | {cell('dpool shm')} | {cell('mpi shm')} | "
                         f"{ratio('dpool shm', 'mpi shm')} | {cell('dpool tcp')} | "
                         f"{cell('mpi tcp')} | {ratio('dpool tcp', 'mpi tcp')} | "
                         f"{cell('driver')} |")
        if "round" in runs.get("dpool shm", {}):
            lines += ["", f"A {result.get('round_mb', 100)} MB allreduce per round: "
                      + ", ".join(f"{name} {runs[name]['round'] * 1e3:.0f} ms"
                                  for name in ("dpool shm", "mpi shm", "dpool tcp",
                                               "mpi tcp") if "round" in runs.get(name, {}))]
        lines.append("")
    return "\n".join(lines)


def busbw(size: int, seconds: float, n: int) -> float:
    return size / seconds * 2 * (n - 1) / n / 1e9


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    members = sorted(result["runs"], key=int)
    fig, axes = plt.subplots(1, len(members), figsize=(6 * len(members), 4.2), squeeze=False)
    styles = {"dpool shm": ("#1f77b4", "-"), "dpool tcp": ("#1f77b4", "--"),
              "mpi shm": ("#d62728", "-"), "mpi tcp": ("#d62728", "--"),
              "driver": ("#7f7f7f", ":")}
    for ax, n in zip(axes[0], members):
        for name, run in result["runs"][n].items():
            xs = [s for s in result["sizes"] if str(s) in run]
            ys = [busbw(s, run[str(s)], int(n)) for s in xs]
            color, ls = styles.get(name, ("k", "-"))
            ax.plot(xs, ys, ls, color=color, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("array size (bytes)")
        ax.set_ylabel("allreduce bus bandwidth (GB/s)")
        ax.set_title(f"{n} members")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
