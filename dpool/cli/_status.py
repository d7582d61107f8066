"""Show the cluster: its nodes (id, alive, CPUs used/total, queued tasks, store use)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from dpool.errors import Error
from dpool.protocol import _messages as m
from dpool.protocol import decode_batch, encode_batch
from dpool.runtime import _address
from dpool.runtime._cluster import connect


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help="the cluster (default: $DPOOL_ADDRESS, else this host's record)")
    p.add_argument("--json", action="store_true", help="print JSON")


def query(address: str) -> dict:
    """The cluster's state as a dict (what ``--json`` prints)."""
    target = _address.resolve(address)
    chan, hello = connect(target)
    try:
        chan.send(encode_batch([m.StatusRequest()]))
        frames = chan.recv_frames(timeout=10.0)
        replies = [x for f in frames for x in decode_batch(f) if isinstance(x, m.StatusReply)]
        if not replies:
            raise Error(f"node {hello.node_id} did not answer the status request")
        status = json.loads(replies[0].status)
    finally:
        chan.close()
    status["address"] = target.address
    return status


def run(args: argparse.Namespace) -> int:
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
        print(f"redis shard {sh['address']} alive={sh['alive']}")
    return 0
