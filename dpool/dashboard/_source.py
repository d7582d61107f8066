"""Where the dashboard's data comes from: the cluster's control store, read only.

``locate`` finds the cluster as ``dpool status`` does (``--address``, ``$DPOOL_ADDRESS``,
else this host's record of ``dpool start``), then its Redis shards: from the record on
the head's host, else by asking the node (as a joining node does: a peer handshake whose
welcome names the shards). It also finds where the dashboard should listen: where this
host's node listens. ``ControlReader`` reads what the page shows: the node and global
scheduler tables and the shards' health (through ``RedisControlStore``), the event
stream from where it last read, and the task-table rows of the tasks on the page.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dpool.control import function_name
from dpool.errors import ControlStoreError, Error
from dpool.runtime import address as _address

log = logging.getLogger("dpool.dashboard")

# ``err``: a failed task's traceback, where its scheduler records one in the task row
_ROW_FIELDS = (b"fn", b"node", b"att", b"state", b"t0", b"err")
_XRANGE_COUNT = 2000


@dataclass(frozen=True)
class ClusterInfo:
    """The cluster the dashboard shows: a node's address, the token, the Redis shards,
    and the address to listen on (where this host's node listens)."""

    address: str
    token: bytes
    shards: tuple[str, ...]
    bind: str


def locate(address: str | None = None) -> ClusterInfo:
    """The cluster at ``address`` (default ``$DPOOL_ADDRESS``, else this host's record).

    Raises ``dpool.Error`` saying what to do when there is no cluster to show (the
    embedded runtime has no server to watch), no token, or an unreachable node."""
    address = address or os.environ.get("DPOOL_ADDRESS")
    record = _address.read_record()
    if not address:
        if record is None:
            raise Error(
                "dpool dashboard needs a cluster: DPOOL_ADDRESS is not set and no cluster "
                f"was started on this host (no {_address.record_path()}). Without a "
                "cluster dpool runs embedded in your program, with no server to watch; "
                "start one with `dpool start --head`, or set DPOOL_ADDRESS and DPOOL_TOKEN")
        address = "auto"
    target = _address.resolve(address)
    ours = record if record is not None and _names(record, target.address) else None
    shards = tuple(r["address"] for r in (ours or {}).get("redis", []) if r.get("address"))
    if not shards:
        shards = _ask_node(target.address, target.token)
    return ClusterInfo(target.address, target.token, shards, _node_bind(ours))


def _names(record: dict, address: str) -> bool:
    return address in {record.get("address"), record.get("node", {}).get("address")}


def _ask_node(address: str, token: bytes) -> tuple[str, ...]:
    """The shards, from the welcome a node gives a peer (what a joining node reads)."""
    import json

    from dpool.node import dial, peer_hello

    me = f"dashboard-{os.getpid()}"  # no node has this id: closing the link affects none
    chan, welcome = dial(address, token, peer_hello(me, me, 0))
    chan.close()
    shards = tuple(json.loads(welcome.info or "{}").get("redis", []))
    if not shards:
        raise Error(f"the dpool node at {address} is not part of a cluster (it has no "
                    "control store): start it with `dpool start --head` or `--address`")
    return shards


def _node_bind(record: dict | None) -> str:
    """Where this host's node of the cluster listens (its TCP listener's address), else
    its advertised address; loopback when this host runs no node of it."""
    if record is None:
        return "127.0.0.1"
    node = record.get("node", {})
    host, _, port = str(node.get("address", "")).rpartition(":")
    try:
        import psutil

        for c in psutil.Process(int(node.get("pid", 0))).net_connections("tcp"):
            if c.status == psutil.CONN_LISTEN and port.isdigit() and c.laddr.port == int(port):
                return str(c.laddr.ip)
    except Exception as exc:  # noqa: BLE001 - no psutil, the node gone: its address
        log.debug("cannot read where node %s listens: %s", node.get("address"), exc)
    return host or "127.0.0.1"


class ControlReader:
    """Read-only access to the control store for the dashboard (one per dashboard)."""

    def __init__(self, shards: Sequence[str], password: str, timeout: float = 3.0) -> None:
        import redis

        from dpool.control import RedisControlStore

        self._clients: list[Any] = []  # (redis-py's stubs cannot tell bytes replies)
        for a in shards:
            host, _, port = a.rpartition(":")
            if not host or not port.isdigit():
                raise Error(f"the dashboard reads control-store shards at HOST:PORT; "
                            f"cannot read {a!r}")
            self._clients.append(redis.Redis(
                host=host, port=int(port), password=password or None,
                socket_timeout=timeout, socket_connect_timeout=min(timeout, 2.0)))
        # the tables through the store's own reads (it PINGs: a wrong token fails here)
        self.tables = RedisControlStore(shards, password, timeout=timeout)
        self._next: list[bytes | None] = [None] * len(self._clients)
        self._fn_names: dict[int, str | None] = {}

    @property
    def nshards(self) -> int:
        return len(self._clients)

    def events_since(self, oldest: float) -> tuple[list, list[str]]:
        """The events logged since the last call (the first call: since ``oldest``, a
        time), and an error message per shard that failed (its events come next time)."""
        from dpool.control import keys as K

        out: list = []
        errors = []
        for i, client in enumerate(self._clients):
            start = self._next[i] or b"%d-0" % max(0, int(oldest * 1000))
            try:
                while True:
                    entries = client.xrange(K.EVENTS, min=start, max=b"+",
                                            count=_XRANGE_COUNT)
                    for _eid, fields in entries:
                        out.extend(K.unpack_events(fields[b"e"]))
                    if entries:
                        start = b"(" + entries[-1][0]
                    if len(entries) < _XRANGE_COUNT:
                        break
            except Exception as exc:  # noqa: BLE001 - redis-py's errors: one shard's problem
                errors.append(f"shard {i} ({self.tables.addresses[i]}): {exc}")
            self._next[i] = start
        return out, errors

    def task_rows(self, task_ids: Iterable[int]) -> dict[int, dict]:
        """Task-table rows (``fn`` name, ``node``, ``att``, ``state``, ``t0``, ``err``) of
        ``task_ids``; a task whose row is gone (its result was released) is left out."""
        from dpool.control import keys as K

        ids = list(task_ids)
        by_shard: dict[int, list[int]] = {}
        for tid in ids:
            by_shard.setdefault(K.shard_for(tid, self.nshards), []).append(tid)
        rows: dict[int, dict] = {}
        for shard, shard_ids in by_shard.items():
            pipe = self._clients[shard].pipeline(transaction=False)
            for tid in shard_ids:
                pipe.hmget(K.task_key(tid), *_ROW_FIELDS)
            try:
                replies = pipe.execute()
            except Exception as exc:
                raise ControlStoreError(f"shard {shard}: reading task rows: {exc}") from exc
            for tid, values in zip(shard_ids, replies):
                if values[0] is None:
                    continue
                row = {k.decode(): _text(v) for k, v in zip(_ROW_FIELDS, values)}
                row["function"] = self._function_name(int(row["fn"] or 0))
                rows[tid] = row
        return rows

    def _function_name(self, fn_id: int) -> str | None:
        """The function's name (from its payload when the table has none); None when the
        function table has no such function (a node's local id for a task spilled to it)."""
        if fn_id in self._fn_names:
            return self._fn_names[fn_id]
        from dpool.control import keys as K

        client = self._clients[K.shard_for(fn_id, self.nshards)]
        name, payload = client.hmget(K.fn_key(fn_id), b"name", b"payload")
        found = (_text(name) or function_name(payload or b"") or f"function {fn_id:#x}"
                 if payload is not None else None)
        self._fn_names[fn_id] = found
        return found

    def close(self) -> None:
        for c in self._clients:
            c.close()
        self.tables.close()


def _text(v: Any) -> str | None:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v
