"""Show the cluster: its nodes (id, alive, CPUs used/total, queued tasks, store use)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from dpool.errors import Error
from dpool.runtime import address as _address


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help="the cluster (default: $DPOOL_ADDRESS, else this host's record)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--watch", nargs="?", type=float, const=2.0, default=None,
                   metavar="SECONDS", help="refresh in place every SECONDS (2) until Ctrl-C")
    p.add_argument("--wait-nodes", type=int, default=None, metavar="N",
                   help="wait until N nodes (the head's own included) are up: exit 0 then, "
                        "1 after --timeout seconds (a readiness probe)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="with --wait-nodes: how long to wait (default 60 s)")


def query(address: str) -> dict:
    """The cluster's state as a dict (what ``--json`` prints)."""
    from dpool.observe import node_status

    return node_status(_address.resolve(address))


def _watch(args: argparse.Namespace) -> int:
    """Redraw the status every ``args.watch`` seconds, in place, until Ctrl-C."""
    import contextlib
    import io
    import time

    once = argparse.Namespace(**{**vars(args), "watch": None})
    try:
        while True:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
                rc = run(once)
            stamp = time.strftime("%H:%M:%S")
            sys.stdout.write(f"\x1b[H\x1b[J{buf.getvalue()}(every {args.watch:g} s, {stamp}; "
                             f"Ctrl-C to stop{'' if rc == 0 else '; the last query failed'})\n")
            sys.stdout.flush()
            time.sleep(max(args.watch, 0.2))
    except KeyboardInterrupt:
        return 0


def wait_nodes(address: str, n: int, timeout: float) -> tuple[bool, int]:
    """Poll the cluster until ``n`` nodes are alive (retrying while it cannot be reached
    yet); (whether they are, how many were last seen)."""
    import time

    deadline = time.monotonic() + timeout
    seen = 0
    while True:
        try:
            seen = sum(1 for x in query(address)["nodes"] if x["alive"])
        except Error:
            seen = 0  # (not up yet: retried)
        if seen >= n:
            return True, seen
        if time.monotonic() >= deadline:
            return False, seen
        time.sleep(0.2)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "watch", None) is not None:
        return _watch(args)
    if getattr(args, "wait_nodes", None) is not None:
        address = args.address or os.environ.get("DPOOL_ADDRESS") or "auto"
        ok, seen = wait_nodes(address, args.wait_nodes, args.timeout)
        if ok:
            print(f"dpool status: {seen} node(s) up")
            return 0
        sys.stderr.write(f"dpool status: {seen} of {args.wait_nodes} node(s) up after "
                         f"{args.timeout:g} s\n")
        return 1
    address = args.address or os.environ.get("DPOOL_ADDRESS") or "auto"
    try:
        status = query(address)
    except Error as exc:
        sys.stderr.write(f"dpool status: {exc}\n")
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(f"cluster {status['address']}")
    print(f"{'node':<24}{'alive':<7}{'CPUs used/total':<17}{'queued':<8}"
          f"{'store used/capacity':<22}other resources")
    for n in status["nodes"]:
        store = f"{n['store_used'] / 2**20:.1f}/{n['store_capacity'] / 2**20:.0f} MiB"
        cpus = f"{n['cpus_used']}/{n['cpus_total']}"
        other = ", ".join(f"{k}: {v:g}" for k, v in (n.get("resources") or {}).items()
                          if k not in ("CPU", "memory") and v)
        print(f"{n['node_id']:<24}{'yes' if n['alive'] else 'NO':<7}{cpus:<17}"
              f"{n['queued']:<8}{store:<22}{other or '-'}")
    for gs in status["global_schedulers"]:
        print(f"global scheduler {gs['address']} alive={gs['alive']}")
    for sh in status["shards"]:
        print(_shard_line(sh))
    if status.get("error"):
        print(f"control store: {status['error']}")
    return 0


def _shard_line(sh: dict) -> str:
    """One shard: its primary now and replicas (with Sentinel), or what is degraded."""
    line = f"redis shard {sh.get('shard', '')} {sh['address']} alive={sh['alive']}"
    if sh.get("primary"):
        line += f" primary={sh['primary']}"
    if "replicas" in sh:
        line += f" replicas={sh['replicas']}"
    if sh.get("degraded"):
        line += f" DEGRADED: {sh['degraded']}"
    return line
