"""The round trip's floor: a bare socketpair ping-pong between two Python processes.

    python bench/floor.py [--params '{...}']   # started by run.py with the executor group

The parent sends a small message and blocks until the child echoes it back; no
framing, no pickling, no threads. No executor's round trip can beat this on the
same machine, so ``bench/run.py`` measures it in the same run as the executor
group and the report shows dpool's round trip as a multiple of it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import sys

from params import DEFAULT, Params
from recorder import Recorder
from timing import repeat_capped, summarize

MESSAGE = b"x" * 64  # about the size of a no-op task's frame


def _echo(sock: socket.socket, other: socket.socket) -> None:
    other.close()  # the parent's end, inherited through fork: its close must reach us as EOF
    while True:
        data = sock.recv(4096)
        if not data:
            return
        sock.sendall(data)


def measure(p: Params) -> list[float]:
    """Round-trip samples (seconds) of ``MESSAGE`` to a child process and back."""
    parent, child = socket.socketpair()
    proc = multiprocessing.Process(target=_echo, args=(child, parent), daemon=True)
    proc.start()
    child.close()
    try:
        def ping() -> None:
            parent.sendall(MESSAGE)
            got = 0
            while got < len(MESSAGE):
                got += len(parent.recv(4096))

        for _ in range(p.warmup * 10):
            ping()
        return repeat_capped(p.roundtrip_n, p.cap_s, ping)
    finally:
        parent.close()
        proc.join(5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default=None, help="JSON of bench.params.Params")
    args = ap.parse_args(argv)
    p = Params.from_json(json.loads(args.params)) if args.params else DEFAULT
    rec = Recorder()
    rec.meta(version=f"Python {sys.version.split()[0]}, {multiprocessing.get_start_method()}")
    with rec.workload("floor_s"):
        samples = measure(p)
        stats = summarize(samples)
        rec.metric("floor_s", stats["median"], **stats)
    rec.done()
    return 0


if __name__ == "__main__":
    sys.exit(main())
