"""Tasks/s one global scheduler places: a fake origin node spills N no-op tasks through a
real GlobalScheduler (its own process) to a fake executing node that only counts them.

    python bench/micro/gs_place.py [--tasks 50000] [--batch 64]

Both fake nodes are real peers (token handshake, PeerHello, the wire protocol); the
figure is the scheduler's placement rate, without any execution behind it.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from dpool.node._links import dial, peer_hello  # noqa: E402
from dpool.protocol import decode_batch, encode_batch  # noqa: E402
from dpool.protocol import _messages as m  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    token = secrets.token_hex(16)
    r, w = os.pipe()
    env = dict(os.environ, DPOOL_TOKEN=token, PYTHONPATH=os.getcwd())
    gs = subprocess.Popen([sys.executable, "-m", "dpool.global_scheduler", "--bind",
                           "127.0.0.2", "--ready-fd", str(w), "--log-level", "WARNING"],
                          pass_fds=(w,), env=env)
    os.close(w)
    line = os.read(r, 200).decode().split()
    os.close(r)
    address = line[1]
    try:
        origin, _ = dial(address, token.encode(), peer_hello("origin", "127.0.0.3:1", 0))
        runner, _ = dial(address, token.encode(), peer_hello("runner", "127.0.0.4:1", 64))
        runner.send(encode_batch([m.Load(0, 0, 64, 1e-4, ())]))
        task = m.RemoteTask(0, "127.0.0.3:1", 1, (2, "fork", None, None, 3), 1,
                            b"\x80\x05N.", None, None, "/", (), ())
        got = 0
        t0 = time.perf_counter()
        sent = 0
        while got < args.tasks:
            if sent < args.tasks and sent - got < 4096:
                n = min(args.batch, args.tasks - sent)
                origin.send(encode_batch([task] * n))
                sent += n
            for frame in runner.recv_frames(timeout=0 if sent < args.tasks else 5):
                got += sum(1 for x in decode_batch(frame) if isinstance(x, m.RemoteTask))
        dt = time.perf_counter() - t0
        print(f"one global scheduler placed {args.tasks} tasks in {dt:.2f} s: "
              f"{args.tasks / dt:,.0f} tasks/s (batches of {args.batch})")
    finally:
        gs.terminate()
        gs.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
