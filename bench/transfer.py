"""Moving objects between node stores, against this machine's memcpy rate (same run).

    python bench/transfer.py [--sizes 1,64,1024] [--reps 5] [--out bench/TRANSFER.md]

A head that runs nothing (127.0.0.2, ``--num-cpus 0``) and one node with 2 CPUs
(127.0.0.3); a driver on the head's host puts an array of each size (MB) into the head's
store and a task on the other node reads it: the other node pulls it (``objects._manager``).
Reported per size: the median time of put + task, the same for a tiny array (the fixed
cost of a remote task), their difference, and the transfer rate that difference implies,
next to ``numpy`` copying the same bytes in this process (memcpy: the limit); and the
holder's own time for sending each copy (its node log's ``sent ... in X ms (N bytes from
OFFSET)`` lines, one per range sent at once:
the transfer alone, without the put and the task). Then the same 64 MB array broadcast to
8 tasks; and the cost of packing a project of ~1,000 files for the nodes, first and cached
(``runtime._workdir``). ``bench/micro/fetch.py`` times the transfer path with no cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cluster import _cli, _env, _free_port  # noqa: E402

DRIVER = r"""
import json, statistics, sys, time
import numpy as np
import dpool

def touch(a):
    return float(a[::65536].sum())

def node(_):
    import os
    return os.environ["DPOOL_NODE_ID"]

sizes, reps = [int(x) for x in sys.argv[1].split(",")], int(sys.argv[2])
out = {}
with dpool.ProcessPoolExecutor(2) as ex:
    ex.submit(touch, np.ones(10)).result()
    for mb in [0] + sizes:
        n = max(1, mb * (1 << 20) // 8)
        times = []
        for _ in range(reps):
            arr = np.random.rand(n)
            t0 = time.perf_counter()
            ref = dpool.put(arr)
            assert ex.submit(touch, ref).result() == touch(arr)
            times.append(time.perf_counter() - t0)
            del ref, arr
        out[mb] = statistics.median(times)
    arr = np.random.rand(8 << 20 >> 3 << 3)  # 64 MB
    t0 = time.perf_counter()
    ref = dpool.put(arr)
    fs = [ex.submit(touch, ref) for _ in range(8)]
    assert all(f.result() == touch(arr) for f in fs)
    out["broadcast8"] = time.perf_counter() - t0
print(json.dumps(out))
"""


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
    copies: dict = {}  # segment -> [ms, bytes] of the copy being summed
    done = []
    for name, ms, size, offset in line.findall(text):
        if not offset or int(offset) == 0:
            if name in copies:
                done.append(copies[name])
            copies[name] = [0.0, 0]
        c = copies.setdefault(name, [0.0, 0])
        c[0], c[1] = max(c[0], float(ms)), c[1] + int(size)
    for ms, size in done + list(copies.values()):
        out.setdefault(round(size / (1 << 20)), []).append(ms)
    return out


def package_cost(tmp: str) -> tuple[float, float]:
    from dpool.runtime import _workdir

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
    ap.add_argument("--out", default=str(ROOT / "bench/TRANSFER.md"))
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    tmp = tempfile.mkdtemp(prefix="dpool-transfer-")
    head, node = os.path.join(tmp, "head"), os.path.join(tmp, "node")
    port = _free_port("127.0.0.2")
    try:
        out = _cli(["start", "--head", "--port", str(port), "--node-ip", "127.0.0.2",
                    "--num-cpus", "0", "--global-schedulers", "1"], head)
        token = [x for x in out.stdout.splitlines() if x.startswith("DPOOL_TOKEN=")][0][12:]
        try:
            _cli(["start", "--address", f"127.0.0.2:{port}", "--token", token, "--node-ip",
                  "127.0.0.3", "--num-cpus", "2"], node)
            time.sleep(1.5)
            run = subprocess.run(
                [sys.executable, "-c", DRIVER, args.sizes, str(args.reps)],
                env=_env(DPOOL_ADDRESS=f"127.0.0.2:{port}", DPOOL_TOKEN=token,
                         DPOOL_STATE_DIR=head), capture_output=True, text=True, timeout=900)
            if run.returncode != 0:
                raise RuntimeError(run.stderr[-3000:])
            res = json.loads(run.stdout.strip().splitlines()[-1])
        finally:
            _cli(["stop"], node)
            _cli(["stop"], head)
        sends = sent_ms(os.path.join(head, "node.log"))
        first, cached = package_cost(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = res["0"]
    lines = [f"# Objects between nodes ({time.strftime('%Y-%m-%d %H:%M')}, "
             f"{os.cpu_count()} cores, loopback 'hosts')", "",
             "`python bench/transfer.py` -- one run. A task on node B reads an array put on "
             "node A (a 0-CPU head); B pulls it into its own store.", "",
             f"Fixed cost of put + remote task with a tiny array: {base * 1e3:.1f} ms. "
             "The holder's send time is the median over the copies of that size it sent "
             "(the broadcast's included), from its node log.", "",
             "| size | put + remote task | minus fixed cost | implied rate | memcpy of the "
             "same bytes | rate ÷ memcpy rate | holder's send time (rate) |",
             "|---|---|---|---|---|---|---|"]
    for mb in sizes:
        t = res[str(mb)]
        extra = max(t - base, 1e-9)
        mc = memcpy_s(mb)
        rate = mb / 1024 / extra
        sent = statistics.median(sends[mb]) if sends.get(mb) else None
        send = f"{sent:.1f} ms ({mb / 1024 / (sent / 1e3):.2f} GB/s)" if sent else "n/a"
        lines.append(f"| {mb} MB | {t * 1e3:.1f} ms | {extra * 1e3:.1f} ms | "
                     f"{rate:.2f} GB/s | {mc * 1e3:.1f} ms ({mb / 1024 / mc:.2f} GB/s) | "
                     f"{mc / extra:.2f} | {send} |")
    lines += ["", f"The same 64 MB array to 8 tasks on the other node (put included): "
              f"{res['broadcast8'] * 1e3:.1f} ms (sent once per node: "
              f"`tests/cluster/test_multinode.py::test_a_broadcast_input_crosses_once_per_node`"
              f" counts the holder's transfers).", "",
              f"Packing a project of 1,000 files for the nodes: {first * 1e3:.1f} ms the "
              f"first time, {cached * 1e3:.1f} ms unchanged (cached).", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
