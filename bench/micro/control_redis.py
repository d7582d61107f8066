"""The Redis control store's cost per task: commands, bytes, and writes/s from one process.

Starts ``--shards`` redis-server shards on 127.0.0.1, then for each batch size writes
``--tasks`` tasks as the scheduler does (``add_task`` with a submit time, optionally a
``log_event("start")``, ``set_task_state`` with an end time), calling ``flush()`` every
``batch`` tasks. Commands and bytes are the shards' own counters (``INFO stats``:
``total_commands_processed``, ``total_net_input_bytes``), so they count exactly what
reached the servers (the one ``INFO`` call per shard is subtracted). Time is the writer's
wall clock for enqueue + flush, so writes/s includes sending.

    PYTHONPATH=. python bench/micro/control_redis.py --tasks 10000 --batches 1,10,100,1000
    PYTHONPATH=. python bench/micro/control_redis.py --tasks 100000 --batches 0 --flusher 0.005
"""

from __future__ import annotations

import argparse
import secrets
import socket
import time

import redis

from dpool.control._redis import RedisControlStore
from dpool.control._redis_server import RedisServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def counters(clients: list) -> tuple[int, int]:
    cmds = nbytes = 0
    for c in clients:
        st = c.info("stats")
        cmds += int(st["total_commands_processed"])
        nbytes += int(st["total_net_input_bytes"])
    return cmds, nbytes


def run(store: RedisControlStore, clients: list, tasks: int, batch: int, args_size: int,
        start_event: bool, base: int, flusher: bool) -> dict:
    args = b"\x80" * args_size if args_size else None
    c0, b0 = counters(clients)
    c_info, b_info = counters(clients)  # what one round of INFO costs
    c_info, b_info = c_info - c0, b_info - b0
    t0 = time.perf_counter()
    add, state, event, flush = (store.add_task, store.set_task_state, store.log_event,
                                store.flush)
    now = time.time()
    for i in range(tasks):
        tid = base + i
        add(tid, 7, args, (), 1, now, 1)
        if start_event:
            event(tid, "start", now, 1)
        state(tid, "FINISHED", 1, now)
        if not flusher and (i + 1) % batch == 0:
            flush()
    enqueued = time.perf_counter() - t0
    if flusher:
        while store.backlog():
            time.sleep(0.0005)
    flush()
    elapsed = time.perf_counter() - t0
    c1, b1 = counters(clients)
    cmds = c1 - c0 - 2 * c_info
    nbytes = b1 - b0 - 2 * b_info
    writes = tasks * (3 if start_event else 2)
    return {"batch": batch, "cmds_per_task": cmds / tasks, "bytes_per_task": nbytes / tasks,
            "writes_per_s": writes / elapsed, "tasks_per_s": tasks / elapsed,
            "us_per_task": elapsed / tasks * 1e6, "enqueue_us_per_task": enqueued / tasks * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--batches", default="1,10,100,1000")
    ap.add_argument("--args-size", type=int, default=64)
    ap.add_argument("--start-event", action="store_true",
                    help="also log_event('start') per task, as the scheduler does")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--flusher", type=float, default=0.0, metavar="INTERVAL",
                    help="no explicit flush: start_flusher(INTERVAL) sends in the background "
                         "while this thread writes (batches are whatever queued meanwhile)")
    opts = ap.parse_args()
    password = secrets.token_hex(16)
    servers = []
    try:
        for _ in range(opts.shards):
            servers.append(RedisServer(free_port(), password).start())
        addresses = [s.address for s in servers]
        clients = [redis.Redis(host=s.bind, port=s.port, password=password) for s in servers]
        store = RedisControlStore(addresses, password, node_id="node-1")
        if opts.flusher:
            store.start_flusher(opts.flusher)
        print(f"{opts.shards} shards, {opts.tasks} tasks, args {opts.args_size} B, "
              f"start event: {opts.start_event}, flusher thread: {opts.flusher or 'no'}; "
              f"best of {opts.repeat}")
        print(f"{'batch':>6} {'cmds/task':>10} {'bytes/task':>11} {'writes/s':>10} "
              f"{'tasks/s':>9} {'us/task':>8} {'enqueue us/task':>16}")
        base = 1
        for batch in (int(b) for b in opts.batches.split(",")):
            best = None
            for _ in range(opts.repeat):
                for c in clients:
                    c.flushall()
                r = run(store, clients, opts.tasks, batch, opts.args_size,
                        opts.start_event, base, bool(opts.flusher))
                base += opts.tasks
                if best is None or r["writes_per_s"] > best["writes_per_s"]:
                    best = r
            assert best is not None
            print(f"{best['batch']:>6} {best['cmds_per_task']:>10.3f} "
                  f"{best['bytes_per_task']:>11.1f} {best['writes_per_s']:>10.0f} "
                  f"{best['tasks_per_s']:>9.0f} {best['us_per_task']:>8.1f} "
                  f"{best['enqueue_us_per_task']:>16.2f}")
        store.close()
        for c in clients:
            c.close()
    finally:
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
