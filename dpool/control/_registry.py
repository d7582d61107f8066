"""The cluster's registries: the node table and the global schedulers, with heartbeats.

A mixin of ``RedisControlStore`` (it uses the store's clients, routing and error mapping).
Rows are hashes (``info``, ``load``, ``hb``: the heartbeat as the shard's own clock,
``dead``: a mark), listed in two sets on the singleton shard; a node's row lives on the
shard its id routes to, a global scheduler's on the singleton shard. Liveness compares a
row's heartbeat with the same shard's clock, so skew between hosts cannot make a live
node look dead. A heartbeat to a row that is gone or marked dead is refused (False): its
owner registers again, which clears the mark.

Reads come in two sizes. ``nodes()`` and ``global_schedulers()`` read one table each.
``cluster_view()`` reads both, as a daemon's heartbeat thread polls them: one round trip
to the singleton shard for both listings (with a global scheduler's own heartbeat in the
same pipeline) and one per shard holding rows. Idle cost: bench/IDLE.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from dpool.control import _keys as K

log = logging.getLogger("dpool.control")

DEAD_AFTER = 3.0  # seconds without a heartbeat before a node counts as dead
BEAT_S = 1.0  # how often nodes and global schedulers heartbeat: DEAD_AFTER is 3 beats

# HSET the heartbeat (the server's clock) plus ARGV's field/value pairs. ARGV[1] == '1':
# (re-)register, clearing a dead mark; else a beat, refused (0) for a row that is gone
# (removed) or marked dead -- the caller must register again.
_HEARTBEAT = """
if ARGV[1] == '1' then
  redis.call('HDEL', KEYS[1], 'dead')
elseif redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], 'dead') == 1 then
  return 0
end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'hb', t[1] .. '.' .. string.format('%06d', tonumber(t[2])),
           unpack(ARGV, 2))
return 1
"""

# Mark a row dead unless it is gone or already marked (1: newly marked).
_MARK_DEAD = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
return redis.call('HSETNX', KEYS[1], 'dead', '1')
"""

READ_MARGIN_S = 0.05  # a read comes this long after a heartbeat could first have aged out


def next_read_s(nodes: list[dict], dead_after: float = DEAD_AFTER) -> float:
    """Seconds from a read of the node table (``nodes``: its rows) until the next read
    could find a node dead that this one found alive: the least time any of them has left
    before its heartbeat ages past ``dead_after``, plus ``READ_MARGIN_S``. ``dead_after``
    when none is alive (a node that registers links to the global schedulers, and that
    wakes their read)."""
    left = [dead_after - n["age"] for n in nodes if n.get("alive")]
    return max(0.0, min(left, default=dead_after)) + READ_MARGIN_S


def _server_time(reply: Sequence[int]) -> float:
    return reply[0] + reply[1] / 1e6


class ClusterView(NamedTuple):
    """One read of both registries (``cluster_view``)."""

    global_schedulers: list[dict]
    nodes: list[dict]
    beat: bool | None  # the global scheduler heartbeat sent with it (None: none sent)


class Registry:
    # provided by RedisControlStore
    _clients: list
    _errors: Any  # (shard, what) -> a context that maps redis errors to ControlStoreError
    _shard: Callable[[str], int]
    _run: Callable[[int, str, Callable[[Any], object]], list]

    # -- node table --------------------------------------------------------------------------
    def _beat(self, shard: int, key: bytes, what: str, *fields: Any,
              create: bool = False) -> bool:
        with self._errors(shard, what):
            return bool(self._clients[shard].eval(_HEARTBEAT, 1, key, b"1" if create else b"0",
                                                  *fields))

    def register_node(self, node_id: str, info: dict) -> None:
        """Add (or re-add, clearing a dead mark) a node; ``info``: JSON-able, e.g.
        ``{"address": "10.0.0.2:7000", "resources": {"CPU": 8, "GPU": 1}}``."""
        self._beat(self._shard(node_id), K.node_key(node_id), "register_node",
                   b"info", json.dumps(info),
                   b"load", b"{}", create=True)
        with self._errors(K.SINGLETON_SHARD, "register_node"):
            self._clients[K.SINGLETON_SHARD].sadd(K.NODES, node_id)

    def heartbeat(self, node_id: str, load: dict) -> bool:
        """Record the node's load, a JSON-able dict with (at least) the keys of
        ``_keys.LOAD_FIELDS``. False: the node is unknown or marked dead; register again."""
        return self._beat(self._shard(node_id), K.node_key(node_id), "heartbeat",
                          b"load", json.dumps(load))

    def nodes(self, dead_after: float = DEAD_AFTER) -> list[dict]:
        """Every registered node: its ``info`` keys plus ``node_id``, ``load``,
        ``heartbeat`` (shard clock), ``age`` (s), ``dead`` (marked), ``alive``."""
        with self._errors(K.SINGLETON_SHARD, "SMEMBERS nodes"):
            ids = sorted(m.decode() for m in self._clients[K.SINGLETON_SHARD].smembers(K.NODES))
        return self._rows({K.node_key: (ids, self._shard, "node_id")}, dead_after)[0]

    def global_schedulers(self, dead_after: float = DEAD_AFTER) -> list[dict]:
        """Each: ``gs_id``, ``address``, ``heartbeat``, ``age``, ``dead``, ``alive``."""
        with self._errors(K.SINGLETON_SHARD, "SMEMBERS global schedulers"):
            ids = sorted(m.decode() for m in
                         self._clients[K.SINGLETON_SHARD].smembers(K.GLOBAL_SCHEDULERS))
        return self._rows({K.gs_key: (ids, _singleton, "gs_id")}, dead_after)[0]

    def cluster_view(self, dead_after: float = DEAD_AFTER,
                     gs_beat: str | None = None) -> ClusterView:
        """Both registries, as ``global_schedulers()`` and ``nodes()`` give them, in
        ``1 + shards holding rows`` round trips; with ``gs_beat`` (a global scheduler's
        id), that scheduler's heartbeat too, sent before the listings are read (``beat``:
        False when refused -- register again)."""
        s = K.SINGLETON_SHARD

        def fill(pipe: Any) -> None:
            if gs_beat is not None:
                pipe.eval(_HEARTBEAT, 1, K.gs_key(gs_beat), b"0")
            pipe.smembers(K.GLOBAL_SCHEDULERS)
            pipe.smembers(K.NODES)

        replies = self._run(s, "read the registries", fill)
        beat = bool(replies.pop(0)) if gs_beat is not None else None
        gs_ids, node_ids = (sorted(m.decode() for m in r) for r in replies)
        gss, nodes = self._rows({K.gs_key: (gs_ids, _singleton, "gs_id"),
                                 K.node_key: (node_ids, self._shard, "node_id")}, dead_after)
        return ClusterView(gss, nodes, beat)

    def _rows(self, tables: dict, dead_after: float) -> list[list[dict]]:
        """The registry rows of each table ``{key: (ids, route, id_field)}`` -- row
        ``key(id)`` on shard ``route(id)`` -- with liveness: one pipeline per shard."""
        by_shard: dict[int, list[tuple[int, bytes, str]]] = {}
        for t, (key, (ids, route, _field)) in enumerate(tables.items()):
            for i in ids:
                by_shard.setdefault(route(i), []).append((t, key(i), i))
        found: dict[tuple[int, str], dict] = {}
        fields = [f for _ids, _route, f in tables.values()]
        for shard, rows in by_shard.items():
            def fill(pipe: Any, rows: list = rows) -> None:
                pipe.time()
                for _t, k, _i in rows:
                    pipe.hgetall(k)
            now_reply, *hashes = self._run(shard, "read table", fill)
            now = _server_time(now_reply)
            for (t, _k, i), h in zip(rows, hashes):
                if h:  # (else removed between SMEMBERS and HGETALL)
                    found[(t, i)] = _row(h, fields[t], i, now, dead_after)
        return [[found[(t, i)] for i in ids if (t, i) in found]
                for t, (ids, _route, _field) in enumerate(tables.values())]

    def mark_node_dead(self, node_id: str) -> bool:
        """Mark the node dead and publish a node-death notice. False (and no notice) if it
        was already marked, so K global schedulers noticing at once send one notice, or
        if its row is gone (the node left: ``remove_node``)."""
        shard = self._shard(node_id)
        with self._errors(shard, "mark_node_dead"):
            newly = self._clients[shard].eval(_MARK_DEAD, 1, K.node_key(node_id))
        if newly:
            with self._errors(K.SINGLETON_SHARD, "PUBLISH node-dead"):
                self._clients[K.SINGLETON_SHARD].publish(K.CH_NODE_DEAD,
                                                         K.node_dead_message(node_id))
            log.warning("node %s marked dead", node_id)
        return bool(newly)

    def remove_node(self, node_id: str) -> None:
        with self._errors(K.SINGLETON_SHARD, "remove_node"):
            self._clients[K.SINGLETON_SHARD].srem(K.NODES, node_id)
        shard = self._shard(node_id)
        with self._errors(shard, "remove_node"):
            self._clients[shard].delete(K.node_key(node_id))

    # -- global scheduler registry (shard 0) ----------------------------------------------
    def register_global_scheduler(self, gs_id: str, address: str) -> None:
        """Add (or re-add) a global scheduler and announce it (``CH_SCHEDULER_UP``): the
        nodes link to it at once instead of at their next read of the registries."""
        s = K.SINGLETON_SHARD
        self._beat(s, K.gs_key(gs_id), "register_global_scheduler",
                   b"info", json.dumps({"address": address}), create=True)
        self._run(s, "register_global_scheduler",
                  lambda p: (p.sadd(K.GLOBAL_SCHEDULERS, gs_id),
                             p.publish(K.CH_SCHEDULER_UP, K.scheduler_up_message(address))))

    def heartbeat_global_scheduler(self, gs_id: str) -> bool:
        """False: unknown (unregistered); register again."""
        return self._beat(K.SINGLETON_SHARD, K.gs_key(gs_id), "heartbeat_global_scheduler")

    def unregister_global_scheduler(self, gs_id: str) -> None:
        s = K.SINGLETON_SHARD
        self._run(s, "unregister_global_scheduler",
                  lambda p: (p.srem(K.GLOBAL_SCHEDULERS, gs_id), p.delete(K.gs_key(gs_id))))


def _singleton(_id: str) -> int:
    return K.SINGLETON_SHARD


def _row(h: dict, id_field: str, row_id: str, now: float, dead_after: float) -> dict:
    row = json.loads(h.get(b"info", b"{}"))
    row[id_field] = row_id
    if b"load" in h:
        row["load"] = json.loads(h[b"load"])
    hb = float(h.get(b"hb", 0.0))
    row["heartbeat"] = hb
    row["age"] = now - hb
    row["dead"] = b"dead" in h
    row["alive"] = not row["dead"] and row["age"] <= dead_after
    return row
