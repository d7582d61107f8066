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


def _recv_spinning(sock: socket.socket) -> bytes:
    """``recv`` on a non-blocking socket, retried without sleeping."""
    while True:
        try:
            return sock.recv(4096)
        except BlockingIOError:
            pass


def _echo(sock: socket.socket, other: socket.socket, spin: bool) -> None:
    other.close()  # the parent's end, inherited through fork: its close must reach us as EOF
    sock.setblocking(not spin)
    while True:
        data = _recv_spinning(sock) if spin else sock.recv(4096)
        if not data:
            return
        sock.sendall(data)


def measure(p: Params, spin: bool = False) -> list[float]:
    """Round-trip samples (seconds) of ``MESSAGE`` to a child process and back.

    ``spin``: both sides poll without sleeping (no wake-up of a sleeping process: on a
    VM that can be most of the blocking figure); a reference, not the floor itself.
    """
    parent, child = socket.socketpair()
    proc = multiprocessing.Process(target=_echo, args=(child, parent, spin), daemon=True)
    proc.start()
    child.close()
    parent.setblocking(not spin)
    recv = _recv_spinning if spin else (lambda s: s.recv(4096))
    try:
        def ping() -> None:
            parent.sendall(MESSAGE)
            got = 0
            while got < len(MESSAGE):
                got += len(recv(parent))

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
        stats = summarize(measure(p))
        spinning = summarize(measure(p, spin=True))
        rec.metric("floor_s", stats["median"], **stats, spin_median=spinning["median"],
                   spin_p10=spinning["p10"], spin_p90=spinning["p90"])
    rec.done()
    return 0


if __name__ == "__main__":
    sys.exit(main())
