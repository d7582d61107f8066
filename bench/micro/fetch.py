"""One node pulling stored values from another (``transfer._pull.fetch``), alone.

    python bench/micro/fetch.py [--sizes 1,64,1024] [--reps 5] [--fresh]    (BUSY=1: see below)

A holder process (a ``NodeServer`` on 127.0.0.2 that serves segments, as a node does)
and this process as the reader: per size, the median time of ``fetch`` of a segment this
process wrote (each copy is retired into a segment pool, as a node does, so the next
copy lands in its pages; `--fresh`: unlinked instead), and the rate, next to memcpy of the same
bytes. No scheduler, no task: the transfer path only. With ``BUSY=1`` both processes
also run a thread that keeps asking for the GIL, as a node daemon's other threads do.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if "PYTHONPATH" not in os.environ:  # else that dpool (e.g. another checkout, for "before")
    sys.path.insert(0, str(ROOT))

BUSY = r"""
import os, threading
def _busy():  # a thread that wants the GIL, as a node daemon's IO loop and ticks do
    while True:
        sum(range(1000))
if os.environ.get("BUSY"):
    threading.Thread(target=_busy, daemon=True).start()
"""

SERVER = BUSY + r"""
import sys, threading
from dpool.node._server import NodeServer
from dpool.transfer import _pull
token = sys.argv[1].encode()
srv = NodeServer(token, "127.0.0.2", 0, None, None, lambda c, h: c.close(),
                 on_fetch=lambda s, r: _pull.serve(s, r.name, r.offset, r.length))
srv.start()
print(f"127.0.0.2:{srv.address[1]}", flush=True)
sys.stdin.read()
srv.close()
"""


def main() -> int:
    import numpy as np

    from dpool.objects import _recycle, _segment

    from dpool.transfer import _pull
    from dpool.objects._serialization import serialize

    exec(BUSY)  # noqa: S102 - our own snippet, shared with the holder process
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,64,1024")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--fresh", action="store_true",
                    help="unlink each copy (a node retires it into its pool: the default)")
    args = ap.parse_args()
    pool = _recycle.SegmentPool(os.getpid(), 4 << 30, ttl_s=10.0)
    token = secrets.token_hex(16)
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", str(ROOT)))
    srv = subprocess.Popen([sys.executable, "-c", SERVER, token], env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ids = iter(range(1, 1 << 30))
    try:
        address = srv.stdout.readline().strip()  # type: ignore[union-attr]
        for mb in [int(x) for x in args.sizes.split(",")]:
            arr = np.ones(mb << 20, dtype=np.uint8)
            name = "/" + _segment.segment_name(os.getpid(), next(ids)).lstrip("/")
            _segment.write_object(name, serialize(arr, oob_threshold=0))
            size = _segment.segment_size(name)
            times = []
            try:
                for _ in range(args.reps):
                    oid = next(ids)
                    t0 = time.perf_counter()
                    _pull.fetch(address, token.encode(), name, oid, os.getpid(), size)
                    times.append(time.perf_counter() - t0)
                    copy = _segment.segment_name(os.getpid(), oid)
                    if args.fresh or not pool.retire(copy, size):
                        _segment.unlink(copy)
            finally:
                _segment.unlink(name)
            dst = np.empty_like(arr)
            copies = []
            for _ in range(3):
                t0 = time.perf_counter()
                np.copyto(dst, arr)
                copies.append(time.perf_counter() - t0)
            mc = statistics.median(copies)
            t = statistics.median(times)
            print(f"{mb:>5} MB: fetch {t * 1e3:8.1f} ms ({mb / 1024 / t:5.2f} GB/s; "
                  f"min {min(times) * 1e3:.1f} ms)   memcpy {mc * 1e3:6.1f} ms "
                  f"({mb / 1024 / mc:5.2f} GB/s)", flush=True)
    finally:
        pool.purge(everything=True)
        srv.stdin.close()  # type: ignore[union-attr]
        srv.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
