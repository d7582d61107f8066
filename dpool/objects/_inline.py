"""Self-contained payloads: values that leave this host's shared-memory store.

A payload that names a segment (``_values.TAG_STORED``) only means something on the host
that holds the segment. Before such a value goes to a process that may be elsewhere (a
driver attached over TCP), :func:`inline_payload` turns it into the inline form
(``_values.TAG_INLINE``: the pickle stream with its buffers appended), reading the
segment's raw bytes -- the value itself is never unpickled here, so the node daemon needs
none of the user's modules. :func:`dumps_value_inline` and :func:`dumps_call_inline` are
what a process without a store (a driver in cluster mode) serializes with.

A driver that reaches its node over TCP passes ``push``: a value whose buffers reach
the store threshold is then uploaded into the node's store (``transfer._push``) and the
payload names the segment there; below it, nothing changes. :func:`loads_fetched` reads
a large result that such a driver pulled into its own memory
(``transfer._pull.fetch_into``).
"""

from __future__ import annotations

import mmap
import os
import pickle
from typing import Any, Callable, Optional

from dpool.errors import SerializationError
from dpool.objects import _segment, _values
from dpool.objects._serialization import Serialized, deserialize, serialize

_PLAIN = frozenset((int, float, str, bytes, bool, type(None)))


def inline_payload(payload: bytes) -> bytes:
    """``payload`` with a stored value's bytes copied in (other payloads unchanged)."""
    ref = _values.stored(payload)
    if ref is None:
        return payload
    _oid, name, _size = ref
    path = os.path.join(_segment.SHM_DIR, name.lstrip("/"))
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        with mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mm:
            view = memoryview(mm)
            try:
                meta, buffers = _segment.parts(view, name)
                out = _values._inline(Serialized(bytes(meta), buffers))
                meta.release()
                for b in buffers:
                    b.release()
                return out
            finally:
                view.release()


def dumps_value_inline(obj: Any, push: Optional[Callable[[Serialized], bytes]] = None
                       ) -> bytes:
    """Serialize ``obj`` as a self-contained payload (no shared memory); with ``push``,
    a value whose buffers reach the store threshold is ``push(serialized)`` instead."""
    if type(obj) in _PLAIN:
        return pickle.dumps(obj, protocol=5)
    try:
        ser = serialize(obj, oob_threshold=64 * 1024)
    except SerializationError as exc:  # the type pickle gave it, as the embedded runtime
        raise (exc.__cause__ or exc) from None
    if not ser.buffers:
        return ser.meta
    if push is not None \
            and sum(b.nbytes for b in ser.buffers) >= _values.store_threshold_bytes():
        return push(ser)
    return _values._inline(ser)


def dumps_call_inline(args: tuple, kwargs: dict,
                      push: Optional[Callable[[Serialized], bytes]] = None
                      ) -> Optional[bytes]:
    """A call's arguments as a self-contained payload; None for a call without any."""
    if not args and not kwargs:
        return None
    return dumps_value_inline((args, kwargs), push)


_HUGE_MIN = 4 << 20  # a buffer this large asks for huge pages


def private_memory(size: int) -> Any:
    """A writable buffer of ``size`` zero bytes, this process's own, to pull a large
    value into. A large one is an anonymous mapping that asks for transparent huge pages:
    the kernel then faults in 2 MB at a time instead of 4 KB, so receiving a large value
    into it costs a fraction of the faults of a bytearray's pages (one fault each). Where
    huge pages are not to be had it gets ordinary pages; a first use that finds memory
    fragmented may pay once for compacting it."""
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if size < _HUGE_MIN or advise is None:
        return bytearray(size)
    mem = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mem.madvise(advise)
    except OSError:
        pass  # (a kernel without them: ordinary pages)
    return mem


def loads_fetched(data: Any, name: str) -> Any:
    """The value in ``data``, a stored value's segment bytes pulled into this process:
    its buffers (numpy arrays) are writable views onto ``data``, nothing copied."""
    meta, buffers = _segment.parts(memoryview(data), name)
    try:
        return deserialize(meta, buffers)
    finally:
        meta.release()  # the value keeps only the buffers (and through them ``data``)


def into_store(payload: Optional[bytes], name: str) -> Optional[bytes]:
    """An inline payload whose buffers are large, written into segment ``name`` of this
    host's store (a stored payload, as a local process would have made); other payloads
    unchanged. The node does this for drivers that reach it over TCP, so its workers map
    the value instead of each getting a copy in its message."""
    if not payload or payload[0] != _values.TAG_INLINE:
        return payload
    meta, buffers = _values.split_inline(memoryview(payload))
    if sum(b.nbytes for b in buffers) < _values.store_threshold_bytes():
        return payload
    oid = int(name.rsplit("_", 1)[1], 16)
    _values._STORED_HEAD.pack(_values.TAG_STORED, oid, 0)  # a bad id fails before writing
    size = _segment.write_object(name, Serialized(bytes(meta), buffers))
    return _values._STORED_HEAD.pack(_values.TAG_STORED, oid, size) + name.encode()
