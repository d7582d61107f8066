"""Serve a live page of the cluster: its nodes, tasks per second, running and failed
tasks, global schedulers and control-store shards. Prints its address and a login URL
once, then serves until interrupted (Ctrl-C or SIGTERM)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

from dpool.errors import Error

if TYPE_CHECKING:
    from dpool.dashboard import DashboardServer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help="the cluster (default: $DPOOL_ADDRESS, else this host's record)")
    p.add_argument("--port", type=int, default=8265, help="port to serve on (default 8265; "
                   "0: any free port)")
    p.add_argument("--bind", default=None,
                   help="address to listen on (default: where this host's node listens, "
                   "else 127.0.0.1)")
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between reads of the control store (default 1)")


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0 or not 0 <= args.port < 65536:
        sys.stderr.write("dpool dashboard: --interval must be > 0 and --port in 0..65535\n")
        return 2
    from dpool.dashboard import Collector, ControlReader, DashboardServer, locate

    try:
        cluster = locate(args.address)
        reader = ControlReader(cluster.shards, cluster.token.decode())
    except Error as exc:
        sys.stderr.write(f"dpool dashboard: {exc}\n")
        return 1
    collector = Collector(reader, cluster.address, interval=args.interval)
    try:
        bind = args.bind or cluster.bind
        try:
            server = DashboardServer(collector.snapshot, cluster.token, bind, args.port,
                                     period_s=max(args.interval, 1.0),
                                     advertise=cluster.address.rpartition(":")[0])
        except OSError as exc:
            sys.stderr.write(f"dpool dashboard: cannot listen on {bind}:{args.port}: "
                             f"{exc.strerror or exc} (choose another with --port/--bind)\n")
            return 1
        collector.start()
        print(f"dpool dashboard: cluster {cluster.address} at {server.url}")
        print(f"login: {server.login_url}", flush=True)
        _serve_until_signalled(server)
    finally:
        collector.stop()
        reader.close()
    return 0


def _serve_until_signalled(server: DashboardServer) -> None:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    server.start()
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.close()
