"""Payload layouts: a value inline in its message, or stored in shared memory.

A payload (task argument block, result, put value) is one of:

- a plain pickle stream (first byte 0x80): small values, travels inline;
- ``TAG_INLINE`` + frame: pickle protocol 5 with its out-of-band buffers appended, for
  values with buffers below ``store_threshold`` (still inline, one copy);
- ``TAG_STORED`` + object id + segment name: the value lives in a POSIX shared-memory
  segment (``_segment``); readers map it copy-on-write without copying.

The payload of a stored value is ~40 bytes whatever the value's size, so the scheduler
forwards it to any number of tasks for free.
"""

from __future__ import annotations

import os
import pickle
import struct

from dpool.errors import ObjectStoreFullError
from dpool.objects._serialization import Serialized, deserialize, serialize

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Optional

_loads = pickle.loads

TAG_INLINE = 0x01
TAG_STORED = 0x02
_STORED_HEAD = struct.Struct("!BQQ")  # tag, object id, segment size
_INLINE_HEAD = struct.Struct("!BII")  # tag, number of buffers, meta length
_SIZE = struct.Struct("!Q")

DEFAULT_STORE_THRESHOLD = 256 * 1024


def store_threshold() -> int:
    """Out-of-band bytes at or above which a value goes through the store."""
    raw = os.environ.get("DPOOL_STORE_THRESHOLD")
    return int(raw) if raw else DEFAULT_STORE_THRESHOLD


_THRESHOLD = store_threshold()


def store_threshold_bytes() -> int:
    return _THRESHOLD


_limit: Optional[int] = None  # this host's store capacity, checked before any copy


def set_capacity_limit(capacity: Optional[int]) -> None:
    global _limit
    _limit = capacity


def encode(obj: Any, object_id: int, owner_pid: int) -> tuple[bytes, int]:
    """(payload, bytes put in shared memory). Raises SerializationError/ObjectStoreFullError."""
    ser = serialize(obj, oob_threshold=min(64 * 1024, _THRESHOLD))
    if not ser.buffers:
        return ser.meta, 0
    total = sum(b.nbytes for b in ser.buffers)
    if total < _THRESHOLD:
        return _inline(ser), 0
    if _limit is not None and total > _limit:
        raise ObjectStoreFullError(
            f"object of {total} bytes is larger than the object store's capacity of "
            f"{_limit} bytes (raise object_store_memory= or $DPOOL_OBJECT_STORE_MEMORY)")
    from dpool.objects import _segment  # (the store's machinery: loaded by its first value)

    name = _segment.segment_name(owner_pid, object_id)
    size = _segment.write_object(name, ser)
    return _STORED_HEAD.pack(TAG_STORED, object_id, size) + name.encode(), size


def _inline(ser: Serialized) -> bytes:
    parts: list = [_INLINE_HEAD.pack(TAG_INLINE, len(ser.buffers), len(ser.meta))]
    parts += [_SIZE.pack(b.nbytes) for b in ser.buffers]
    parts.append(ser.meta)
    parts += ser.buffers
    return b"".join(parts)


def decode(payload: bytes) -> Any:
    tag = payload[0]
    if tag == 0x80:  # a plain pickle stream: the common, small case
        try:
            return _loads(payload)
        except Exception:
            return deserialize(payload)  # re-raises as SerializationError, cause chained
    if tag == TAG_STORED:
        from dpool.objects import _segment

        return _segment.read_object(payload[_STORED_HEAD.size:].decode())
    if tag == TAG_INLINE:
        # writable, as a task's arguments are
        return deserialize(*split_inline(memoryview(bytearray(payload))))
    return deserialize(payload)


def split_inline(data: memoryview) -> tuple[memoryview, list[memoryview]]:
    """(pickle stream, buffers) of a ``TAG_INLINE`` payload, as views into ``data``."""
    _, n, meta_len = _INLINE_HEAD.unpack_from(data, 0)
    pos = _INLINE_HEAD.size
    sizes = []
    for _ in range(n):
        sizes.append(_SIZE.unpack_from(data, pos)[0])
        pos += _SIZE.size
    meta = data[pos:pos + meta_len]
    pos += meta_len
    buffers = []
    for size in sizes:
        buffers.append(data[pos:pos + size])
        pos += size
    return meta, buffers


def stored_size(payload: bytes) -> int:
    """Bytes a value takes in the store: its payload, plus its segment if it has one."""
    info = stored(payload)
    return len(payload) + (info[2] if info is not None else 0)


def stored(payload: Optional[bytes]) -> Optional[tuple[int, str, int]]:
    """(object id, segment name, size) if the payload refers to a stored value."""
    if payload and payload[0] == TAG_STORED:
        _, oid, size = _STORED_HEAD.unpack_from(payload, 0)
        return oid, payload[_STORED_HEAD.size:].decode(), size
    return None
