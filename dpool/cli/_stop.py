"""Stop everything ``dpool start`` started on this host: the node (and its workers), the
global schedulers and Redis shards (replicas, Sentinels) of a head; then remove the store
segments and the record, so nothing is left behind."""

from __future__ import annotations

import argparse
import sys

from dpool.cli._procs import stop_pid
from dpool.errors import Error
from dpool.objects import segment as _segment
from dpool.runtime import address as _address


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds to wait for each process before killing it")


def _stop_autoscaled(timeout: float) -> list:
    """Nodes the autoscaler started that still run (it was killed, or one's stop failed):
    each has a record in a folder of the autoscaler's (``autoscaler/node-*``)."""
    import glob
    import json
    import os

    out = []
    for path in glob.glob(os.path.join(_address.state_dir(), "autoscaler", "node-*",
                                       "cluster.json")):
        try:
            with open(path) as f:
                node = json.load(f).get("node", {})
        except (OSError, ValueError):
            continue
        if stop_pid(node.get("pid"), max(timeout, float(node.get("drain_grace", 0)) + 5.0),
                    node.get("started")):
            out.append(f"node {node.get('address')} (the autoscaler's)")
        try:
            os.remove(path)
        except OSError:
            pass
    return out


def run(args: argparse.Namespace) -> int:
    try:
        record = _address.read_record()
    except Error as exc:
        sys.stderr.write(f"dpool stop: {exc}\n")
        return 1
    if record is None:
        print("dpool stop: nothing was started on this host")
        return 0
    stopped = []
    scaler = record.get("autoscaler")
    if scaler:  # first: it stops (drains) the nodes it added
        if stop_pid(scaler.get("pid"), max(args.timeout, 60.0), scaler.get("started")):
            stopped.append("autoscaler")
        stopped += _stop_autoscaled(args.timeout)
    for gs in record.get("global_schedulers", []):
        if stop_pid(gs.get("pid"), args.timeout, gs.get("started")):
            stopped.append(f"global scheduler {gs.get('address')}")
    node = record.get("node", {})
    # (a node drains first: its running tasks get its grace, then it hands them back)
    node_timeout = max(args.timeout, float(node.get("drain_grace", 0)) + 5.0)
    if stop_pid(node.get("pid"), node_timeout, node.get("started")):
        stopped.append(f"node {node.get('address')}")
    # Sentinels first: with them gone, no primary stopped below is "failed over"
    servers = sorted(record.get("redis", []), key=lambda r: r.get("role") != "sentinel")
    for shard in servers:
        if stop_pid(shard.get("pid"), args.timeout, shard.get("started")):
            what = {"sentinel": "redis sentinel", "replica": "redis replica"}.get(
                shard.get("role", ""), "redis shard")
            stopped.append(f"{what} {shard.get('address')}")
    _segment.reap_orphans()  # segments of a node that was killed rather than stopped
    _address.remove_record()
    print("dpool stop: stopped " + (", ".join(stopped) if stopped else "nothing (not running)"))
    sys.stdout.flush()
    return 0
