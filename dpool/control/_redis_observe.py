"""What the cluster recorded, read back for people: the event log with the node that
wrote each event, function names, what workers printed, and the object table.

A mixin of ``RedisControlStore`` (it uses the store's clients and error mapping): these
reads serve ``dpool timeline``, ``dpool logs`` and ``dpool objects``, never a task's path.
The one write here, ``log_output``, is a deque append like every other write; a node calls
it only when one of its workers prints.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from dpool.control import _keys as K
from dpool.control._fnname import function_name

_SCAN_COUNT = 1000

# (task id, kind, time, worker id, node id)
Event = tuple[int, str, float, int, str]


def _stream_min(since: float | None) -> bytes:
    """The lowest stream id to read for entries added since ``since`` (epoch seconds):
    stream ids are the adding server's clock in ms (a second of slack for skew)."""
    if since is None:
        return b"-"
    return b"%d-0" % max(0, int((since - 1.0) * 1000))


class ObserveReads:
    # provided by RedisControlStore
    _clients: list
    _n: int
    node_id: str
    _errors: Any  # (shard, what) -> a context that maps redis errors to ControlStoreError
    _flush_before_read: Any
    _push: Any

    # -- write -----------------------------------------------------------------------------
    def log_output(self, worker_id: int, pid: int, stream: int, data: bytes) -> None:
        """Keep what a worker of this node printed (``dpool logs``); batched."""
        self._push((8, self.node_id, worker_id, pid, stream, time.time(), bytes(data)))

    # -- reads -----------------------------------------------------------------------------
    def event_log(self, since: float | None = None
                  ) -> tuple[list[Event], dict[int, int]]:
        """Every logged event still in the streams (since ``since``, epoch seconds), oldest
        first, each with the node that logged it ("" when unknown); and the function id of
        each task submitted (task id -> fn id)."""
        self._flush_before_read()
        out: list[Event] = []
        fns: dict[int, int] = {}
        lo = _stream_min(since)
        for shard in range(self._n):
            with self._errors(shard, "XRANGE events"):
                entries = self._clients[shard].xrange(K.EVENTS, min=lo)
            for _entry_id, fields in entries:
                node = fields.get(b"n", b"").decode()
                for tid, kind, t, wid in K.unpack_events(fields[b"e"]):
                    if since is None or t >= since:
                        out.append((tid, kind, t, wid, node))
                pairs = K.unpack_ids(fields.get(b"f", b""))
                fns.update(zip(pairs[::2], pairs[1::2]))
        out.sort(key=lambda e: e[2])
        return out, fns

    def function_names(self, fn_ids: Iterable[int]) -> dict[int, str]:
        """The name of each function: the registered one, else read from its pickled
        payload without unpickling it (``_fnname``: a driver's functions reach the table
        through its node without a name); functions not registered are left out."""
        by_shard: dict[int, list[int]] = {}
        for fid in set(fn_ids):
            by_shard.setdefault(K.shard_for(fid, self._n), []).append(fid)
        names = {}
        for shard, ids in by_shard.items():
            with self._errors(shard, "HGET function names"):
                pipe = self._clients[shard].pipeline(transaction=False)
                for fid in ids:
                    pipe.hmget(K.fn_key(fid), b"name", b"payload")
                replies = pipe.execute()
            for fid, (name, payload) in zip(ids, replies):
                found = name.decode() if name else function_name(payload or b"")
                if found:
                    names[fid] = found
        return names

    def _scan(self, shard: int, pattern: bytes) -> list[bytes]:
        with self._errors(shard, f"SCAN {pattern.decode()}"):
            return list(self._clients[shard].scan_iter(match=pattern, count=_SCAN_COUNT))

    def output_log(self, since: float | None = None, after: dict | None = None
                   ) -> list[dict]:
        """What workers printed, oldest first: dicts with ``node``, ``worker``, ``pid``,
        ``stream``, ``t``, ``data`` (bytes). ``after`` (node -> last stream id read,
        updated in place) reads only newer entries: ``dpool logs --follow``."""
        self._flush_before_read()
        out = []
        prefix = K.output_key(b"")
        for shard in range(self._n):
            for key in self._scan(shard, prefix + b"*"):
                node = key[len(prefix):].decode()
                lo = _stream_min(since)
                if after is not None and node in after:
                    lo = b"(" + after[node]
                with self._errors(shard, "XRANGE output"):
                    entries = self._clients[shard].xrange(key, min=lo)
                for entry_id, f in entries:
                    t = float(f[b"t"])
                    if after is not None:
                        after[node] = entry_id
                    if since is not None and t < since:
                        continue
                    out.append({"node": node, "worker": int(f[b"w"]), "pid": int(f[b"p"]),
                                "stream": int(f[b"s"]), "t": t, "data": f[b"d"]})
        out.sort(key=lambda r: r["t"])
        return out

    def object_rows(self) -> list[dict]:
        """Every object the object table lists and every finished task whose result is
        still held: ``object_id``, ``size`` (None when only its task row says it exists:
        a result kept by the node that ran it), ``holders`` (node ids), ``task`` (its
        lineage row's ``state``, ``node`` (its home node), ``fn``) or None for a put.
        A row lives until the last reference to the object (a driver's future or ref, a
        pending task's argument) is released."""
        self._flush_before_read()
        rows: dict[int, dict] = {}
        for shard in range(self._n):
            obj_keys = self._scan(shard, b"dpool:obj:*")
            task_keys = self._scan(shard, b"dpool:task:*")
            ids = sorted({int(k.rsplit(b":", 1)[1]) for k in obj_keys + task_keys})
            if not ids:
                continue
            with self._errors(shard, "read the object table"):
                pipe = self._clients[shard].pipeline(transaction=False)
                for oid in ids:
                    pipe.hget(K.object_key(oid), b"size")
                    pipe.smembers(K.locations_key(oid))
                    pipe.hmget(K.task_key(oid), b"state", b"node", b"fn", b"size")
                replies = pipe.execute()
            for i, oid in enumerate(ids):
                size, holders, (state, node, fn, result_size) = replies[3 * i:3 * i + 3]
                if size is None:  # a result kept where it was made: its task row has it
                    size = result_size
                if state in (b"PENDING", b"RUNNING", b"CANCELLED") and size is None:
                    continue  # a task still to run: no value yet
                task = None if state is None else {
                    "state": state.decode(), "node": (node or b"").decode(),
                    "fn": int(fn) if fn else None}
                holders = {h.decode() for h in holders}
                if not holders and task is not None and task["node"]:
                    holders = {task["node"]}
                rows[oid] = {"object_id": oid, "size": None if size is None else int(size),
                             "holders": sorted(holders), "task": task}
        return list(rows.values())
