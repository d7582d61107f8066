"""The node daemon: the papers' local scheduler in a process of its own.

    drivers on this host ──unix socket──┐
    drivers elsewhere ───────TCP────────┼──▶ NodeServer ──▶ LocalScheduler ──▶ workers
                                        │     (auth)         + HostStore (/dev/shm)

One per host. It owns the host's workers and shared-memory store; drivers attach to it
instead of starting workers of their own. Started by ``dpool start`` as
``python -m dpool.node ...`` with the token in ``$DPOOL_TOKEN`` (never on the command
line, where ``ps`` would show it); it reports readiness on ``--ready-fd`` and runs until
SIGTERM/SIGINT, then stops its workers and removes its store's segments.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from typing import Optional

from dpool.control import InProcessControlStore
from dpool.protocol import Channel
from dpool.protocol import _messages as m
from dpool.scheduling import LocalScheduler
from dpool.scheduling._attach import DriverSessions

log = logging.getLogger("dpool.node")


def _default_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class NodeDaemon:
    def __init__(self, token: bytes, node_ip: str, bind: str, port: int, num_cpus: int,
                 unix_path: str, object_store_memory: Optional[int] = None) -> None:
        from dpool.node._server import NodeServer

        self.num_cpus = num_cpus
        self.control = InProcessControlStore()
        self.scheduler = LocalScheduler(self.control)
        if object_store_memory:
            self.scheduler.set_store_capacity(object_store_memory)
        self.server = NodeServer(token, bind, port, unix_path, self._attach)
        self.node_id = f"{node_ip}:{self.server.address[1]}"
        os.environ["DPOOL_NODE_ID"] = self.node_id  # inherited by the workers
        self.sessions = DriverSessions(self.scheduler, self.node_id, num_cpus)
        self._stopped = threading.Event()

    def _attach(self, chan: Channel, hello: m.Attach) -> None:
        self.sessions.attach(chan, hello, cluster_cpus=self.num_cpus)

    def serve(self) -> None:
        self.server.start()

    def wait(self) -> None:
        while not self._stopped.wait(0.5):
            pass

    def stop(self) -> None:
        self._stopped.set()

    def close(self) -> None:
        self.server.close()
        self.scheduler.shutdown()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dpool.node",
                                description="a dpool node daemon (started by `dpool start`)")
    p.add_argument("--node-ip", default="127.0.0.1")
    p.add_argument("--bind", default=None, help="listen address (default: --node-ip)")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--unix-path", required=True)
    p.add_argument("--object-store-memory", type=int, default=None)
    p.add_argument("--ready-fd", type=int, default=None)
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: Optional[list] = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    token = os.environ.pop("DPOOL_TOKEN", "")
    if not token:
        sys.stderr.write("dpool node: $DPOOL_TOKEN is not set\n")
        return 2
    num_cpus = args.num_cpus if args.num_cpus is not None else _default_cpus()
    ready = os.fdopen(args.ready_fd, "w") if args.ready_fd is not None else None
    try:
        daemon = NodeDaemon(token.encode(), args.node_ip, args.bind or args.node_ip,
                            args.port, num_cpus, args.unix_path, args.object_store_memory)
    except OSError as exc:
        msg = f"ERROR cannot listen on {args.bind or args.node_ip}:{args.port}: {exc}"
        if ready is not None:
            ready.write(msg + "\n")
            ready.close()
        sys.stderr.write(msg + "\n")
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: daemon.stop())
    daemon.serve()
    log.info("node %s serving (%d CPUs, unix socket %s)", daemon.node_id, num_cpus,
             args.unix_path)
    if ready is not None:
        ready.write(f"READY {daemon.node_id} {socket.gethostname()}\n")
        ready.close()
    try:
        daemon.wait()
    finally:
        daemon.close()
        log.info("node %s stopped", daemon.node_id)
    return 0
