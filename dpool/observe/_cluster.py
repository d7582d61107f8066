"""The cluster's control store, reached from a command line or a driver for reading.

The node at the cluster's address answers a status request with the Redis shards'
addresses; their password is the cluster's token. Without a cluster (no address given, no
``$DPOOL_ADDRESS``, no record of ``dpool start`` on this host) ``NoClusterError`` says so.
"""

from __future__ import annotations

import json
import os
from typing import Any

from dpool.errors import Error
from dpool.protocol import decode_batch, encode_batch
from dpool.protocol import messages as m
from dpool.runtime import address as _address
from dpool.runtime import connect


class NoClusterError(Error):
    """A command that reads the cluster's records ran where there is no cluster."""


def cluster_address(address: str | None = None) -> str:
    """``address``, else ``$DPOOL_ADDRESS``, else ``"auto"`` when this host has a record
    of ``dpool start``; raises ``NoClusterError`` when there is none of these."""
    address = address or os.environ.get("DPOOL_ADDRESS")
    if address:
        return address
    if _address.read_record() is not None:
        return "auto"
    raise NoClusterError(
        "no cluster: this needs one (set DPOOL_ADDRESS and DPOOL_TOKEN, pass --address, "
        f"or run `dpool start --head` on this host; no record at {_address.record_path()})")


def cluster_status(address: str | None = None) -> tuple[dict, _address.Target]:
    """The status the cluster's node reports (nodes, global schedulers, shards)."""
    target = _address.resolve(cluster_address(address))
    return node_status(target), target


def node_status(target: _address.Target) -> dict:
    """The status the node at ``target`` reports (``dpool status --json``), with its
    ``address``."""
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


def open_store(address: str | None = None) -> tuple[Any, dict]:
    """A ``RedisControlStore`` on the cluster's shards (close it after use), and the
    cluster's status."""
    from dpool.control import RedisControlStore

    status, target = cluster_status(address)
    shards = [s["address"] for s in status.get("shards", [])]
    if not shards:
        raise NoClusterError(f"the node at {target.address} is not part of a cluster with "
                             "a control store (it reported no Redis shards)")
    return RedisControlStore(shards, target.token.decode()), status
