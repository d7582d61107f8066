"""One stored object per POSIX shared-memory segment.

Layout of a segment (all integers little-endian)::

    header   magic "DPOS", u16 version, u16 reserved, u32 nbuffers, u64 meta_len
    table    nbuffers x (u64 offset, u64 nbytes)
    meta     the pickle stream (meta_len bytes), right after the table
    buffers  each out-of-band buffer at a 64-byte-aligned offset

Writing (:func:`write_object`) first tries to reuse a freed segment's pages
(``_recycle``) and copies into them through a mapping (``_writemaps``); else it creates
the segment, allocating a small one's pages up front (``posix_fallocate``), a large
one's by the ``pwrite`` that fills every page. A full ``/dev/shm`` is an
:class:`ObjectStoreFullError` when the segment is written, never a SIGBUS later; on a full
one the owner's pool is given back and the write retried for a while. A failed write
leaves nothing under the name.

Reading (:func:`read_object`) maps the segment ``MAP_PRIVATE`` with
``PROT_READ|PROT_WRITE``: arrays come back as writable views onto the mapping, nothing is
copied until a page is written, and a write changes only this process's private copy of
that page. The mapping lives as long as any view onto it, also after the segment is
unlinked. Large segments are mapped through ``_mapping`` (in-use locks, cache).

Segment names and reaping a dead owner's segments are ``_owners``' (re-exported here).
"""

from __future__ import annotations

import errno
import os
import struct
import time

from dpool import _log
from dpool.errors import ObjectStoreFullError
from dpool.objects import _forkguard, _mapping, _recycle, _writemaps
from dpool.objects._owners import (  # noqa: F401 - names of this module before the split
    _PREFIX,
    SHM_DIR,
    owner_dead,
    owner_of,
    owner_started,
    process_state,
    reap_orphans,
    reap_owner,
    segment_name,
    shm_free_bytes,
    shm_total_bytes,
    unlink,
)
from dpool.objects._serialization import Serialized, deserialize

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    import posix_ipc

__all__ = [
    "SHM_DIR",
    "segment_name",
    "write_object",
    "read_object",
    "unlink",
    "segment_size",
    "reap_orphans",
    "reap_owner",
    "owner_dead",
    "owner_started",
    "shm_free_bytes",
    "shm_total_bytes",
]

logger = _log.getLogger("dpool.objects")

_MAGIC = b"DPOS"
_VERSION = 1
_HEADER = struct.Struct("<4sHHIQ")  # magic, version, reserved, nbuffers, meta_len
_ENTRY = struct.Struct("<QQ")  # offset, nbytes
_ALIGN = 64
_NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.ENOMEM, errno.EFBIG, errno.EDQUOT})
_MAX_WRITE = 1 << 30  # bytes per pwrite call (Linux caps a single write near 2 GiB)
_RETRY_FULL_S = 1.0  # how long a write that found no room waits for pooled pages back


class _Layout:
    __slots__ = ("size", "header", "meta_offset", "buffer_offsets")

    def __init__(self, size: int, header: bytes, meta_offset: int,
                 buffer_offsets: tuple[int, ...]) -> None:
        self.size = size
        self.header = header  # header + table
        self.meta_offset = meta_offset
        self.buffer_offsets = buffer_offsets


def _align(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


def _as_bytes_view(buf: object) -> memoryview:
    view = memoryview(buf)  # type: ignore[arg-type]
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _layout(meta_len: int, buffer_sizes: list[int]) -> _Layout:
    table_end = _HEADER.size + _ENTRY.size * len(buffer_sizes)
    offsets: list[int] = []
    end = table_end + meta_len
    for nbytes in buffer_sizes:
        offset = _align(end)
        offsets.append(offset)
        end = offset + nbytes
    header = bytearray(_HEADER.pack(_MAGIC, _VERSION, 0, len(buffer_sizes), meta_len))
    for offset, nbytes in zip(offsets, buffer_sizes, strict=True):
        header += _ENTRY.pack(offset, nbytes)
    return _Layout(end, bytes(header), table_end, tuple(offsets))


def _full(name: str, size: int, why: str) -> ObjectStoreFullError:
    return ObjectStoreFullError(
        f"no room in shared memory for object segment {name} of {size} bytes: {why}"
    )


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    total = data.nbytes
    while done < total:
        done += os.pwrite(fd, data[done : done + _MAX_WRITE], offset + done)


def _allocate(fd: int, size: int) -> None:
    """Give the segment ``size`` bytes, every page allocated now (where the OS allows)."""
    if hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
    os.ftruncate(fd, size)


def _copy_mapped(fd: int, size: int, views: list[memoryview], offsets: tuple[int, ...]
                 ) -> None:
    """Copy the buffers into a recycled segment (allocated pages) through a shared
    mapping of it (``_writemaps``): a memory copy. 1 GB here: ~0.1 s into a kept
    mapping, ~0.2 s into a new one, ~0.28 s with ``pwrite``."""
    with _writemaps.mapped(fd, size) as mem:
        for view, offset in zip(views, offsets, strict=True):
            mem[offset:offset + view.nbytes] = view


def _claim_recycled(name: str, size: int) -> int | None:
    """An fd of a freed segment's pages renamed to ``name`` (``_recycle``), or None."""
    owner = owner_of(name)
    if not owner:
        return None
    try:
        return _recycle.claim(owner, name, size)
    except FileExistsError as exc:
        raise FileExistsError(f"shared memory segment {name} already exists") from exc
    except OSError as exc:
        if exc.errno in _NO_SPACE_ERRNOS:
            raise _full(name, size, str(exc)) from exc
        raise


def _create(name: str, size: int, *, allocate: bool = True) -> int:
    """A new segment ``name`` of ``size`` bytes, as an fd open for writing.

    ``allocate``: every page allocated now, so that stores through a mapping cannot hit a
    full ``/dev/shm`` (SIGBUS). A writer that fills the segment with ``pwrite`` passes
    False: a full ``/dev/shm`` is then an ``ENOSPC`` error of the write, and the pages are
    allocated once, as they are written -- allocating first zeroes every page, which costs
    about as much as the write itself.
    """
    import posix_ipc  # in the functions that use it: it loads with the first large object

    free = shm_free_bytes()
    if free is not None and size > free:
        raise _full(name, size, f"only {free} bytes free in {SHM_DIR}")
    try:
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=0)
    except posix_ipc.ExistentialError as exc:
        raise FileExistsError(f"shared memory segment {name} already exists") from exc
    except OSError as exc:
        if exc.errno in _NO_SPACE_ERRNOS:
            raise _full(name, size, str(exc)) from exc
        raise
    fd = os.dup(shm.fd)
    shm.close_fd()
    try:
        if allocate:
            _allocate(fd, size)
        else:
            os.ftruncate(fd, size)
    except BaseException as exc:
        os.close(fd)
        unlink(name)
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE_ERRNOS:
            raise _full(name, size, str(exc)) from exc
        raise
    return fd


def write_object(name: str, ser: Serialized) -> int:
    """Create segment ``name`` holding ``ser``; return the segment's size in bytes.

    Raises :class:`ObjectStoreFullError` (size in the message) when shared memory has no
    room for it, :class:`FileExistsError` when the name is taken; on any failure nothing
    is left behind.
    """
    views = [_as_bytes_view(b) for b in ser.buffers]
    layout = _layout(len(ser.meta), [v.nbytes for v in views])
    size = layout.size
    try:
        with _forkguard.no_fork():
            _write(name, size, layout, ser, views, recycle=True)
    except ObjectStoreFullError:
        released = _recycle.release(owner_of(name))
        # (this process's kept write mappings of segments with no name left -- those just
        # released among them -- pin their pages until let go)
        if not _writemaps.prune() and not released:
            raise
        # The pool's pages were given back. Readers elsewhere that kept mappings of them
        # for reuse let go when the owner announces it (within a pool lifetime and a
        # scheduler tick); this process lets go now. Then try again, for a while.
        _mapping.prune()
        deadline = time.monotonic() + _RETRY_FULL_S
        while True:
            try:
                with _forkguard.no_fork():
                    _write(name, size, layout, ser, views, recycle=False)
                break
            except ObjectStoreFullError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)
    logger.debug("wrote segment %s: %d bytes, %d buffers", name, size, len(views))
    return size


def _write(name: str, size: int, layout: _Layout, ser: Serialized, views: list[memoryview],
           recycle: bool) -> None:
    """Create (or claim, if ``recycle``) segment ``name`` and write ``ser`` into it."""
    fd = _claim_recycled(name, size) if recycle else None
    allocated = fd is not None
    if fd is None:
        # A large one's pages are allocated as ``pwrite`` fills them (every page is
        # written just below): allocating first zeroes each page, 0.1-0.2 s per GB here.
        fd = _create(name, size, allocate=size < _mapping.LARGE)
    try:
        _pwrite_all(fd, memoryview(layout.header), 0)
        _pwrite_all(fd, memoryview(ser.meta), layout.meta_offset)
        if allocated and views:
            _copy_mapped(fd, size, views, layout.buffer_offsets)
        else:
            for view, offset in zip(views, layout.buffer_offsets, strict=True):
                _pwrite_all(fd, view, offset)
    except BaseException as exc:
        unlink(name)
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE_ERRNOS:
            raise _full(name, size, str(exc)) from exc
        raise
    finally:
        os.close(fd)


def _open(name: str) -> posix_ipc.SharedMemory:
    import posix_ipc

    try:
        return posix_ipc.SharedMemory(name, read_only=True)
    except posix_ipc.ExistentialError as exc:
        raise FileNotFoundError(f"no shared memory segment {name}") from exc


def read_object(name: str) -> object:
    """Rebuild the object stored in segment ``name``, zero-copy and copy-on-write.

    Out-of-band buffers (numpy arrays) are views onto a private mapping of the segment:
    writable, sharing the pages until written, never writing through to the segment.
    Raises :class:`FileNotFoundError` when the segment does not exist (anymore),
    :class:`ValueError` when it is not a dpool object segment, and
    :class:`SerializationError` when unpickling fails.
    """
    meta, buffers = parts(_mapping.lend(name), name)
    try:
        return deserialize(meta, buffers)
    finally:
        meta.release()  # the result keeps only the buffers (and through them the mapping)


def parts(view: memoryview, name: str) -> tuple[memoryview, list[memoryview]]:
    """(pickle stream, out-of-band buffers) of a segment's bytes, as views into ``view``.
    Raises :class:`ValueError` when they are not a dpool object segment."""
    size = view.nbytes
    if size < _HEADER.size:
        raise ValueError(f"{name} is not a dpool object segment ({size} bytes)")
    magic, version, _, nbuffers, meta_len = _HEADER.unpack_from(view, 0)
    meta_offset = _HEADER.size + _ENTRY.size * nbuffers
    if magic != _MAGIC or version != _VERSION or meta_offset + meta_len > size:
        raise ValueError(f"{name} is not a dpool object segment (version {_VERSION})")
    buffers = []
    for i in range(nbuffers):
        offset, nbytes = _ENTRY.unpack_from(view, _HEADER.size + _ENTRY.size * i)
        if offset + nbytes > size:
            raise ValueError(f"{name}: buffer {i} runs past the end of the segment")
        buffers.append(view[offset : offset + nbytes])
    return view[meta_offset : meta_offset + meta_len], buffers


def segment_size(name: str) -> int:
    """Size in bytes of segment ``name`` (:class:`FileNotFoundError` if missing)."""
    shm = _open(name)
    try:
        return int(shm.size)
    finally:
        shm.close_fd()
