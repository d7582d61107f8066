"""Start a cluster's head on this host (``--head``), or join this host to one (``--address``).

The head runs the control store's Redis shards, the global schedulers and this host's
node daemon; a joining host runs its node daemon. Each prints the variables a driver
needs and records what it started (``dpool stop`` stops it; ``DPOOL_ADDRESS=auto`` reads it).
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys

from dpool.cli._procs import StartError, launch, stop_pid
from dpool.errors import Error
from dpool.runtime import _address


def add_arguments(p: argparse.ArgumentParser) -> None:
    role = p.add_mutually_exclusive_group(required=True)
    role.add_argument("--head", action="store_true", help="start a new cluster here")
    role.add_argument("--address", metavar="HOST:PORT", help="join the cluster at HOST:PORT")
    p.add_argument("--port", type=int, default=6380,
                   help="the head node's port: the cluster's address (default 6380)")
    p.add_argument("--node-port", type=int, default=0,
                   help="a joining node's port (default: any free port)")
    p.add_argument("--token", default=None,
                   help="the cluster token (joining; default $DPOOL_TOKEN)")
    p.add_argument("--num-cpus", type=int, default=None,
                   help="CPUs this node offers (default: all it may use; 0: runs no tasks)")
    p.add_argument("--node-ip", default="127.0.0.1",
                   help="the address other hosts reach this node at (default 127.0.0.1)")
    p.add_argument("--bind", default=None,
                   help="the address to listen on (default: --node-ip)")
    p.add_argument("--object-store-memory", type=int, default=None, metavar="BYTES",
                   help="bytes of shared memory this node's object store may hold")


def run(args: argparse.Namespace) -> int:
    if args.num_cpus is not None and args.num_cpus < 0:
        sys.stderr.write("dpool start: --num-cpus must be >= 0\n")
        return 2
    existing = _address.read_record()
    if existing is not None and _node_alive(existing):
        sys.stderr.write(
            f"dpool start: a dpool node already runs on this host (pid "
            f"{existing['node']['pid']}, cluster {existing['address']}); `dpool stop` first, "
            f"or set DPOOL_STATE_DIR to run another one\n")
        return 1
    if args.head:
        token = secrets.token_hex(16)
        port = args.port
    else:
        token = args.token or os.environ.get("DPOOL_TOKEN") or ""
        if not token:
            sys.stderr.write("dpool start: joining needs the cluster token (--token or "
                             "$DPOOL_TOKEN)\n")
            return 2
        try:
            _address.parse_hostport(args.address, "--address")
        except Error as exc:
            sys.stderr.write(f"dpool start: {exc}\n")
            return 2
        port = args.node_port
    state = _address.state_dir()
    os.makedirs(state, mode=0o700, exist_ok=True)
    record: dict = {"head": bool(args.head), "token": token}
    try:
        node = _start_node(args, token, port, state)
    except StartError as exc:
        sys.stderr.write(f"dpool start: {exc}\n")
        return 1
    record["node"] = node
    record["address"] = node["address"] if args.head else args.address
    _address.write_record(record)
    print(f"dpool: {'head' if args.head else 'node'} started on {socket.gethostname()} "
          f"(node {node['address']}, log {node['log']})")
    print(f"DPOOL_ADDRESS={record['address']}")
    print(f"DPOOL_TOKEN={token}")
    return 0


def _start_node(args: argparse.Namespace, token: str, port: int, state: str) -> dict:
    unix_path = os.path.join(state, "node.sock")
    log_path = os.path.join(state, "node.log")
    argv = ["--node-ip", args.node_ip, "--port", str(port), "--unix-path", unix_path]
    if args.bind:
        argv += ["--bind", args.bind]
    if args.num_cpus is not None:
        argv += ["--num-cpus", str(args.num_cpus)]
    if args.object_store_memory:
        argv += ["--object-store-memory", str(args.object_store_memory)]
    proc, line = launch("dpool.node", argv, log_path, {"DPOOL_TOKEN": token})
    node_id = line.split()[1]
    return {"address": node_id, "pid": proc.pid, "unix_path": unix_path, "log": log_path}


def _node_alive(record: dict) -> bool:
    import psutil

    pid = record.get("node", {}).get("pid")
    try:
        return bool(pid) and psutil.Process(pid).is_running()
    except psutil.Error:
        return False


__all__ = ["add_arguments", "run", "stop_pid"]
