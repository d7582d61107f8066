"""Batched writes of the Redis control store: queued ops -> one RESP buffer per shard.

redis-py's pipeline costs several microseconds of Python per command (argument checks, a
command stack, reply callbacks), twice per task for the two writes a task makes, in the
process that schedules. The writes of the ``ControlStore`` interface come in a handful of fixed
shapes, so they are packed here directly (with hiredis's C packer when it is installed),
sent as one buffer on one pooled connection, and their replies read back with only errors
kept (per-task cost: bench/NOTES.md, bench/micro/control_redis.py).

Key names come from ``_keys``; the op tuples are the ones ``RedisControlStore`` queues
(the same codes as ``InProcessControlStore``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from dpool.control import _keys as K
from dpool.objects import payload as _payload


def _pack_py(args: tuple) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join([b"$%d\r\n%s\r\n" % (len(a), a) for a in args])


pack: Callable[[tuple], bytes]  # a tuple of bytes -> one RESP command
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is in the cluster extra
    pack = _pack_py
else:
    pack = _hiredis_pack

_HSET = b"HSET"
_PENDING = b"PENDING"
_ZERO = b"0"
OUTPUT_CAP = 10_000  # entries of a node's output stream (MAXLEN ~)


def encode_ops(ops: list, node_id: bytes, event_cap: int) -> list[bytes]:
    """The RESP commands for ``ops`` (all routed to one shard), in order; the events
    among them become one ``XADD`` at the end."""
    out: list[bytes] = []
    add = out.append
    events = []
    fns: list[int] = []  # task id, fn id of each task submitted (its "submit" event)
    for op in ops:
        code = op[0]
        if code == 1:
            _, tid, fn_id, args, dep_ids, group_id, at, worker_id = op
            cmd = [_HSET, K.task_key(tid), b"fn", b"%d" % fn_id, b"group", b"%d" % group_id,
                   b"state", _PENDING, b"att", _ZERO]
            if args is not None:
                cmd += (b"args", args)
            if dep_ids:
                cmd += (b"deps", K.pack_ids(dep_ids))
            if node_id:
                cmd += (b"node", node_id)
            if at is not None:
                cmd += (b"t0", b"%r" % at)
                events.append((tid, "submit", at, worker_id))
                fns += (tid, fn_id)
            add(pack(tuple(cmd)))
        elif code == 2:
            tid, state, attempts, at = op[1:5]
            state_cmd = [_HSET, K.task_key(tid), b"state", state.encode(),
                         b"att", b"%d" % attempts]
            if at is not None:
                state_cmd += (b"t1", b"%r" % at)
                events.append((tid, "end" if state == "FINISHED" else "error", at, 0))
            if len(op) > 5:
                if op[5] is not None:  # a failed task's error: its traceback (dashboard, logs)
                    text = _payload.error_text(op[5])
                    if text:
                        state_cmd += (b"err", text.encode("utf-8", "replace"))
                if op[6] is not None:  # its result's size in the store (dpool objects)
                    state_cmd += (b"size", b"%d" % op[6])
            add(pack(tuple(state_cmd)))
        elif code == 5:
            events.append(op[1:])
        elif code == 0:
            add(pack((_HSET, K.fn_key(op[1]), b"name", op[2].encode(), b"payload", op[3])))
        elif code == 3:
            add(pack((_HSET, K.object_key(op[1]), b"size", b"%d" % op[2])))
            # "host": the writer's own store -- in a node, the node
            where = node_id if op[3] == "host" and node_id else op[3].encode()
            add(pack((b"SADD", K.locations_key(op[1]), where)))
        elif code == 6:  # a node keeps a copy (the object's size is its holder's to set)
            add(pack((b"SADD", K.locations_key(op[1]), op[2].encode())))
        elif code == 7:
            add(pack((b"SREM", K.locations_key(op[1]), op[2].encode())))
        elif code == 8:  # what a worker printed (node id, worker id, pid, stream, t, data)
            add(pack((b"XADD", K.output_key(node_id), b"MAXLEN", b"~", b"%d" % OUTPUT_CAP,
                      b"*", b"w", b"%d" % op[2], b"p", b"%d" % op[3], b"s", b"%d" % op[4],
                      b"t", b"%r" % op[5], b"d", op[6])))
        elif code == 9:  # an actor's call and the call before it (a stateful edge)
            add(pack((_HSET, K.task_key(op[1]), b"after", b"%d" % op[2])))
        elif code == 4:
            oid = op[1]  # the lineage goes with the object (same id, same shard)
            add(pack((b"DEL", K.object_key(oid), K.locations_key(oid), K.task_key(oid))))
        else:  # pragma: no cover - guards edits of the op codes
            raise ValueError(f"unknown control-store op {code}")
    if events:
        add(pack((b"XADD", K.EVENTS, b"MAXLEN", b"~", b"%d" % event_cap, b"*",
                  b"e", K.pack_events(events), b"n", node_id, b"f", K.pack_ids(fns))))
    return out


def _get_connection(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # pragma: no cover - redis-py < 5.3 wants a command name
        return pool.get_connection("PIPELINE")


def send(client: Any, commands: list[bytes],
         before: Callable[[Any], list[bytes]] | None = None) -> None:
    """Send ``commands`` on one of ``client``'s pooled connections and read every reply.
    ``before(connection)``: commands to send first on that connection (``_sentinel``'s
    replay after a failover).

    Raises redis-py's exception: the first error reply after reading them all (the
    connection stays usable), or a connection error/timeout (the connection is dropped,
    since replies may be left unread on it).
    """
    pool = client.connection_pool
    conn = _get_connection(pool)
    first_error = None
    try:
        if before is not None:
            commands = before(conn) + commands
        conn.send_packed_command([b"".join(commands)], check_health=False)
        for _ in range(len(commands)):
            try:
                conn.read_response(disable_decoding=True)
            except redis.ResponseError as e:
                first_error = first_error or e
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
    if first_error is not None:
        raise first_error
