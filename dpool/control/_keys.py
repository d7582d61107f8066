"""The Redis key layout of the control store, and shard routing -- the only place either lives.

Every key and channel name the cluster uses is spelled here, and no other module writes a
key literal.

Layout (``<id>`` is a decimal int unless noted; all values are bytes):

=========================  ========  ==========================================================
key                        shard     contents
=========================  ========  ==========================================================
``dpool:fn:<fn_id>``       by id     hash: ``name``, ``payload`` (the pickled function)
``dpool:task:<task_id>``   by id     hash: lineage -- ``fn``, ``args`` (absent if None),
                                     ``deps`` (packed ids), ``group``, ``state``, ``att``,
                                     ``node``, ``t0`` (submit time), ``t1`` (end time),
                                     ``after`` (an actor's call: the call before it)
``dpool:obj:<oid>``        by id     hash: ``size``
``dpool:loc:<oid>``        by id     set: node ids holding a copy
``dpool:node:<node_id>``   by id     hash: ``info`` (JSON: ``address``, ``resources``),
                                     ``load`` (JSON), ``hb`` (server time of last
                                     heartbeat), ``dead``
``dpool:nodes``            0         set: every registered node id
``dpool:gs:<gs_id>``       0         hash: ``info`` (JSON: ``address``), ``hb``
``dpool:gss``              0         set: every registered global scheduler id
``dpool:events``           each      stream: one entry per flush per shard; field ``e`` holds
                                     packed events (see ``pack_events``), ``n`` the writer's
                                     node id, ``f`` the submitted tasks' functions (packed
                                     task id, fn id pairs); capped ``MAXLEN ~``
``dpool:out:<node_id>``    by id     stream: what workers of that node printed, one entry per
                                     chunk: ``w`` worker id, ``p`` pid, ``s`` stream (1/2),
                                     ``t`` time, ``d`` the bytes; capped ``MAXLEN ~``
``dpool:idprefix``         0         counter: ``INCR`` hands out id prefixes
``dpool:workdir:<hash>``   by hash   string: a packed working directory by content hash
                                     (``protocol._workdir``), set once, with a TTL
``dpool:actor:<name>``     by name   string: the named actor's record (JSON: ``group``,
                                     ``label``, ``methods``, ``node``); set while it lives
=========================  ========  ==========================================================

Channels: ``dpool:ch:object-ready`` is published on the object's shard (subscribers listen
on every shard); ``dpool:ch:node-dead`` and ``dpool:ch:scheduler-up`` (a global scheduler
registered) on shard 0; ``dpool:ch:wake:<tag>`` wakes one listener. Payloads are encoded
by the helpers below.

A task's result object has the task's id, so ``dpool:task:<id>``, ``dpool:obj:<id>`` and
``dpool:loc:<id>`` always share a shard: dropping an object and its lineage is one
pipeline to one server.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

PREFIX = b"dpool:"

# -- cluster-wide singletons (shard 0) ---------------------------------------------------
NODES = PREFIX + b"nodes"
GLOBAL_SCHEDULERS = PREFIX + b"gss"
ID_PREFIX_COUNTER = PREFIX + b"idprefix"
SINGLETON_SHARD = 0

# -- per shard -------------------------------------------------------------------------
EVENTS = PREFIX + b"events"

# -- pub/sub channels --------------------------------------------------------------------
# the key-value table's key of ``dpool.request_resources``'s standing request (JSON
# ``{"num_cpus": N}``), which the autoscaler reads each round
AUTOSCALE_REQUEST = "dpool:autoscaler:request"

CH_OBJECT_READY = "dpool:ch:object-ready"
CH_NODE_DEAD = "dpool:ch:node-dead"
CH_SCHEDULER_UP = "dpool:ch:scheduler-up"  # a global scheduler registered
CHANNELS = (CH_OBJECT_READY, CH_NODE_DEAD, CH_SCHEDULER_UP)

# The load a node daemon reports in each heartbeat (``dpool:node:<id>`` field ``load``):
# tasks queued, exponential average task time (s), idle CPUs, object store bytes used and
# its capacity. Global schedulers estimate a node's wait as queue_length * avg_task_time.
LOAD_FIELDS = ("queue_length", "avg_task_time", "free_cpus", "store_used", "store_capacity")

# Ids are ``(prefix << ID_PREFIX_SHIFT) | local_counter``: 2**40 ids per process, and
# prefixes below 2**24 so that every id fits an unsigned 64-bit field.
ID_PREFIX_SHIFT = 40
ID_PREFIX_LIMIT = 1 << 24

_M64 = (1 << 64) - 1

Id = int | str


def fn_key(fn_id: int) -> bytes:
    return b"dpool:fn:%d" % fn_id


def actor_key(name: str) -> bytes:
    """A named actor's record (``dpool.get_actor``)."""
    return b"dpool:actor:" + name.encode()


def kv_key(key: str) -> bytes:
    """A value of the runtime's small key-value table (``KVPut``: the rendezvous of
    collective groups)."""
    return b"dpool:kv:" + key.encode()


def workdir_key(digest: str) -> bytes:
    """A driver's working directory, packed (``protocol._workdir``), by content hash."""
    return b"dpool:workdir:" + digest.encode()


def output_key(node_id: bytes) -> bytes:
    """The stream of what a node's workers printed (``dpool logs``)."""
    return b"dpool:out:" + node_id


def task_key(task_id: int) -> bytes:
    return b"dpool:task:%d" % task_id


def object_key(object_id: int) -> bytes:
    return b"dpool:obj:%d" % object_id


def locations_key(object_id: int) -> bytes:
    return b"dpool:loc:%d" % object_id


def node_key(node_id: str) -> bytes:
    return b"dpool:node:" + node_id.encode()


def gs_key(gs_id: str) -> bytes:
    return b"dpool:gs:" + gs_id.encode()


# -- routing -----------------------------------------------------------------------------
def _mix64(x: int) -> int:
    """splitmix64's finalizer: consecutive ids (one process's counter) land far apart."""
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def shard_for(key_id: Id, nshards: int) -> int:
    """The shard that holds every key of ``key_id`` (an int id or a str node/gs id).

    Stable across processes, hosts and Python versions (no ``hash()``: it is salted for
    str). ``nshards`` is the number of shards the cluster was started with; changing it
    re-homes keys, so it is fixed for a cluster's life.
    """
    if nshards == 1:
        return 0
    if isinstance(key_id, int):
        return _mix64(key_id) % nshards
    return _mix64(zlib.crc32(key_id.encode())) % nshards


def make_id(prefix: int, counter: int) -> int:
    """A cluster-unique id from a process's prefix (``new_id_prefix``) and its own counter."""
    if not 0 <= counter < (1 << ID_PREFIX_SHIFT):
        raise ValueError(f"id counter {counter} out of range for one prefix")
    return (prefix << ID_PREFIX_SHIFT) | counter


def wake_channel(tag: str) -> str:
    """A channel of one pub/sub listener's own: a notice on it wakes the listener (to
    stop); nobody else listens."""
    return f"dpool:ch:wake:{tag}"


def channel_shards(channel: str, nshards: int) -> range:
    """The shards a channel's notices are published on (a subscriber listens on all)."""
    if channel in (CH_NODE_DEAD, CH_SCHEDULER_UP):
        return range(SINGLETON_SHARD, SINGLETON_SHARD + 1)
    if channel == CH_OBJECT_READY:
        return range(nshards)
    raise ValueError(f"unknown control-store channel {channel!r}; known: {CHANNELS}")


# -- value encodings ---------------------------------------------------------------------
def pack_ids(ids: Iterable[int]) -> bytes:
    ids = tuple(ids)
    return struct.pack(f"<{len(ids)}Q", *ids)


def unpack_ids(data: bytes) -> tuple:
    return struct.unpack(f"<{len(data) // 8}Q", data)


_EVENT = struct.Struct("<QdqB")  # task id, time, worker id, len(kind); then kind


def pack_events(events: Iterable[tuple]) -> bytes:
    """``(task_id, kind, t, worker_id)`` tuples -> one stream field (one XADD per flush)."""
    out = bytearray()
    for task_id, kind, t, worker_id in events:
        k = kind.encode()
        out += _EVENT.pack(task_id, t, worker_id, len(k))
        out += k
    return bytes(out)


def unpack_events(data: bytes) -> list[tuple[int, str, float, int]]:
    out = []
    pos, size, n = 0, _EVENT.size, len(data)
    while pos < n:
        task_id, t, worker_id, klen = _EVENT.unpack_from(data, pos)
        pos += size
        out.append((task_id, data[pos:pos + klen].decode(), t, worker_id))
        pos += klen
    return out


def object_ready_message(object_id: int, size: int, node_id: str) -> bytes:
    return b"%d %d %s" % (object_id, size, node_id.encode())


def parse_object_ready(data: bytes) -> tuple[int, int, str]:
    """``(object_id, size, node_id)`` from an object-ready notice."""
    oid, size, node = data.split(b" ", 2)
    return int(oid), int(size), node.decode()


def node_dead_message(node_id: str) -> bytes:
    return node_id.encode()


def parse_node_dead(data: bytes) -> str:
    return data.decode()


def scheduler_up_message(address: str) -> bytes:
    """A global scheduler registered: the address nodes link to."""
    return address.encode()


def parse_scheduler_up(data: bytes) -> str:
    return data.decode()
