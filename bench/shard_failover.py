"""Failover time of a replicated control-store shard: SIGKILL -> first successful write.

Starts what ``dpool start --head --shards 2 --replicas 1`` starts for the control store
(two primaries, a replica of each, three Sentinels; dpool's settings: down-after 1000 ms),
writes lineage rows to shard 1 through a ``RedisControlStore`` (``sentinel://`` spec) every
few milliseconds, SIGKILLs shard 1's primary, and times how long until a write (``add_task``
+ ``flush``) succeeds again, retried every ``--retry-ms``. Fresh servers for every run.

    python bench/shard_failover.py [--runs 5] [--retry-ms 10]
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import socket
import statistics
import time

from dpool.control import _keys as K
from dpool.control._redis import RedisControlStore
from dpool.control._redis_server import RedisServer
from dpool.control._sentinel_server import sentinel_address, start_replicated
from dpool.errors import ControlStoreError

IP = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((IP, 0))
        return s.getsockname()[1]


def one_run(retry_s: float) -> float:
    password = secrets.token_hex(16)
    servers: list[RedisServer] = []
    try:
        primaries = []
        for _ in range(2):
            server = RedisServer(free_port(), password)
            servers.append(server)
            primaries.append(server.start(timeout=20))
        _, sentinels = start_replicated(
            primaries, password, ports=[free_port(), free_port()],
            sentinel_ports=[free_port() for _ in range(3)], announce_ip=IP, bind=IP,
            started=servers)
        store = RedisControlStore([sentinel_address([s.address for s in sentinels], 2)],
                                  password, node_id="bench", timeout=1.0, connect_timeout=1.0)
        try:
            ids = (i for i in range(1, 1 << 30) if K.shard_for(i, 2) == 1)
            for _ in range(50):  # a steady stream before the kill
                store.add_task(next(ids), 1, b"x", None, 1)
                store.flush()
                time.sleep(0.002)
            t0 = time.monotonic()
            os.kill(primaries[1].pid, signal.SIGKILL)
            while True:
                store.add_task(next(ids), 1, b"x", None, 1)
                try:
                    store.flush()
                    return time.monotonic() - t0
                except ControlStoreError:
                    time.sleep(retry_s)
        finally:
            store.close()
    finally:
        for s in reversed(servers):
            s.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--retry-ms", type=float, default=10.0)
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    times = []
    for i in range(args.runs):
        t = one_run(args.retry_ms / 1000)
        times.append(t)
        print(f"run {i + 1}: kill -> first successful write {t:.2f} s", flush=True)
    print(f"median {statistics.median(times):.2f} s, min {min(times):.2f} s, "
          f"max {max(times):.2f} s over {len(times)} runs")


if __name__ == "__main__":
    main()
