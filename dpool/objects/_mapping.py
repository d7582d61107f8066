"""This process's read mappings of large object segments: lend views, mark use, cache.

``_segment.read_object`` maps a segment ``MAP_PRIVATE`` (copy-on-write) and hands out
views onto the mapping; segments of at least ``LARGE`` bytes go through :func:`lend`:

Lending. Each lend wraps the mapping in a fresh ctypes exporter from which every view of
that read (numpy arrays, memoryviews, slices of them) derives its buffer, so a weakref
callback on the exporter fires exactly when the last view is gone, in whichever thread.

In use. While views of a lend are alive, this process holds a shared ``flock`` on the
segment, through a descriptor kept with the mapping (the soft ``RLIMIT_NOFILE`` is
raised to the hard limit on first use). ``_recycle`` reuses a freed segment's pages only
if it takes the exclusive lock, so it never rewrites pages a reader can still see. Once
locked, a lend checks that the name still refers to the inode it opened: an object freed
while being opened raises ``FileNotFoundError``, never reads wrong bytes.

Cache. When the last view is gone the mapping is kept (``CACHE_ENTRIES``, LRU), found
by name or by inode (a recycled segment keeps its inode and pages). It is reused only if
the segment has the same inode and size and no page of the mapping was written
(``/proc/self/pagemap`` tells private copies from file pages), so a task never sees
another task's writes. Mappings whose inode has no name left are not kept: they go on
:func:`forget`/:func:`prune` (the owner announces frees, spills and pool expiry).

Fork. A flock belongs to the open file description, which a forked child shares, so a
child needs a description and a lock of its own for each view alive at the fork. The
parent opens and locks them just before it forks (``_before_fork``) and closes its copies
just after: the child holds them from its first instant, so the parent dropping its own
views right after the fork can never leave the child's unprotected (taking them in the
child, after the fork, left a window in which the parent's unlock let a writer recycle
the pages under the child's views). Callbacks take no lock; the cache is guarded by
``_lock``.
"""

from __future__ import annotations

import fcntl
import functools
import mmap
import os
import threading
import weakref
from collections import OrderedDict, deque

from dpool.objects import _forkguard

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Optional

__all__ = ["CACHE_ENTRIES", "LARGE", "SHM_DIR", "cached", "clear", "forget", "lend", "prune"]

SHM_DIR = "/dev/shm"
LARGE = 1 << 20
"""Segments of at least this many bytes are lent, locked and cached (and recyclable)."""
CACHE_ENTRIES = 4
_PAGE = mmap.PAGESIZE
# pagemap entry, top byte: bit 63 present, bit 62 swapped, bit 61 file page/shared anon.
# A present or swapped page that is not a file page is a private copy: the map was written.
_WRITTEN = bytes(1 if (b & 0xC0) and not (b & 0x20) else 0 for b in range(256))


class _Mapping:
    """One mapping of a large segment, with the descriptor its lock is taken through.

    In a forked child, a view alive at the fork gets a descriptor of the child's own
    (``inherited``): a flock belongs to the open file description, which fork shares
    with the parent."""

    __slots__ = ("fd", "inherited", "ino", "locked", "mm", "name", "pid", "size")

    def __init__(self, name: str, fd: int, ino: int, size: int, mm: mmap.mmap) -> None:
        self.name = name
        self.fd = fd
        self.ino = ino
        self.size = size
        self.mm = mm
        self.locked = False
        self.pid = os.getpid()
        self.inherited = False

    def unlock(self) -> None:
        if self.locked and self.fd >= 0:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            except OSError:
                pass
        self.locked = False

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # the lock goes with the last descriptor of the description
            self.fd = -1
        try:
            self.mm.close()
        except BufferError:  # a view is still alive: the mapping goes with it
            pass


_lock = threading.Lock()
_cache: OrderedDict[str, _Mapping] = OrderedDict()
_returned: deque[_Mapping] = deque()  # filled by weakref callbacks, drained under _lock
_live: dict[int, tuple[weakref.ref, _Mapping]] = {}  # id(ref) -> lend whose views live


def _open(name: str) -> int:
    import posix_ipc  # here: ctypes and posix_ipc load with the first large object

    try:
        shm = posix_ipc.SharedMemory(name, read_only=True)
    except posix_ipc.ExistentialError as exc:
        raise FileNotFoundError(f"no shared memory segment {name}") from exc
    fd = os.dup(shm.fd)
    shm.close_fd()
    return fd


def _current_ino(name: str) -> Optional[int]:
    try:
        return os.stat(SHM_DIR + name).st_ino
    except OSError:
        return None


def _linked(entry: _Mapping) -> bool:
    """Does the mapped inode still have a name (its object's, or a pool slot's)?"""
    try:
        return entry.fd >= 0 and os.fstat(entry.fd).st_nlink > 0
    except OSError:
        return False


def lend(name: str) -> memoryview:
    """A writable copy-on-write byte view of segment ``name``; see the module header.

    Raises :class:`FileNotFoundError` when the segment does not exist (anymore).
    """
    entry = _take(name)
    with _forkguard.no_fork():  # no child may inherit a descriptor not yet registered
        if entry is None:
            fd = _open(name)
            try:
                st = os.fstat(fd)
                mm = mmap.mmap(fd, st.st_size, flags=mmap.MAP_PRIVATE,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE)
            except BaseException:
                os.close(fd)
                raise
            if st.st_size < LARGE:  # small: no lock, no cache, no descriptor kept
                os.close(fd)
                return memoryview(mm)
            entry = _Mapping(name, fd, st.st_ino, st.st_size, mm)
            _raise_fd_limit()
        try:
            fcntl.flock(entry.fd, fcntl.LOCK_SH)
            entry.locked = True
            if _current_ino(name) != entry.ino:  # freed (and maybe recycled) meanwhile
                raise FileNotFoundError(
                    f"shared memory segment {name} was freed while opened")
        except BaseException:
            entry.close()
            raise
        import ctypes

        exporter = (ctypes.c_char * entry.size).from_buffer(entry.mm)
        ref = weakref.ref(exporter, functools.partial(_views_gone, entry))
        _live[id(ref)] = (ref, entry)
    return memoryview(exporter).cast("B")


_fd_limit_raised = False


def _raise_fd_limit() -> None:
    """Each live large view keeps a descriptor (its lock): allow as many as the OS does."""
    global _fd_limit_raised
    if _fd_limit_raised:
        return
    _fd_limit_raised = True
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass


def _views_gone(entry: _Mapping, ref: weakref.ref) -> None:
    """The last view of one lend is gone. Runs in any thread, maybe inside GC: no locks.

    The exporter is still being torn down here (its mmap export is released after the
    callbacks), so the mapping cannot be closed yet: an entry that is not cached is
    simply dropped, and the mmap unmaps itself once the exporter is gone.
    """
    _live.pop(id(ref), None)
    if entry.pid != os.getpid():  # not this process's to unlock (see _after_fork_in_child)
        return
    entry.unlock()
    if entry.inherited or not _linked(entry):
        # A forked child's copy, or pages nobody can name again: not cached. The
        # descriptor goes now; the mmap unmaps itself once the exporter is collected.
        if entry.fd >= 0:
            os.close(entry.fd)
            entry.fd = -1
        return
    _returned.append(entry)


def _drain() -> None:
    """Move mappings whose views are gone into the cache (caller holds _lock)."""
    while _returned:
        entry = _returned.popleft()
        if not _linked(entry):  # freed (and not pooled) since its views went
            entry.close()
            continue
        old = _cache.pop(entry.name, None)
        if old is not None and old is not entry:
            old.close()
        _cache[entry.name] = entry
        while len(_cache) > CACHE_ENTRIES:
            _cache.popitem(last=False)[1].close()


def _take(name: str) -> Optional[_Mapping]:
    """A cached mapping that shows segment ``name`` as it is now, or None.

    Found by name, or by inode: a recycled segment keeps its inode (and its pages), so a
    mapping of the freed object whose pages it reuses already maps the new one.
    """
    try:
        st = os.stat(SHM_DIR + name)
    except OSError:
        return None
    with _lock:
        _drain()
        entry = _cache.pop(name, None)
        if entry is None or entry.ino != st.st_ino:
            if entry is not None:
                entry.close()
            entry = None
            for key, e in _cache.items():
                if e.ino == st.st_ino:
                    entry = _cache.pop(key)
                    break
    if entry is None:
        return None
    if entry.size == st.st_size and _pristine(entry):
        entry.name = name
        return entry
    entry.close()
    return None


def _pristine(entry: _Mapping) -> bool:
    """True if no page of the mapping has been written (so it equals the segment)."""
    import ctypes

    try:
        probe = ctypes.c_char.from_buffer(entry.mm)
        addr = ctypes.addressof(probe)
        del probe
        npages = (entry.size + _PAGE - 1) // _PAGE
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
        try:
            raw = os.pread(fd, npages * 8, addr // _PAGE * 8)
        finally:
            os.close(fd)
    except (OSError, ValueError, TypeError):
        return False
    if len(raw) != npages * 8:
        return False
    return b"\x01" not in raw[7::8].translate(_WRITTEN)


def forget(names: list[str] | tuple[str, ...]) -> None:
    """These objects were freed (or spilled): unmap their cached mappings, except those
    whose pages went to the recycling pool (they may serve the object reusing them).
    An empty ``names`` just prunes (the pool gave pages back)."""
    with _lock:
        _drain()
        gone = [_cache.pop(n) for n in names if n in _cache]
        keep = [e for e in gone if _linked(e)]
        for entry in keep:
            _cache[entry.name] = entry
    for entry in gone:
        if entry not in keep:
            entry.close()
    prune()


def prune() -> None:
    """Unmap cached mappings whose pages nobody can name any more."""
    with _lock:
        _drain()
        gone = [e for e in _cache.values() if not _linked(e)]
        for entry in gone:
            del _cache[entry.name]
    for entry in gone:
        entry.close()


def clear() -> None:
    with _lock:
        _drain()
        gone = list(_cache.values())
        _cache.clear()
    for entry in gone:
        entry.close()


def cached() -> list[str]:
    """Names of the segments whose mappings are cached here (for tests)."""
    with _lock:
        _drain()
        return list(_cache)


_for_child: list[tuple[_Mapping, int]] = []  # (lend, a description locked for the child)


def _locked_copy(entry: _Mapping) -> int:
    """A new open file description of ``entry``'s segment holding a shared lock; -1 if
    none can be had (no /proc)."""
    try:
        fd = os.open(f"/proc/self/fd/{entry.fd}", os.O_RDONLY)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return -1
    return fd


def _before_fork() -> None:
    """In the parent, about to fork: a locked description for the child of each view
    alive now (see the module header)."""
    me = os.getpid()
    for _ref, entry in list(_live.values()):
        if entry.pid == me and entry.fd >= 0:
            fd = _locked_copy(entry)
            if fd >= 0:
                _for_child.append((entry, fd))


def _after_fork_in_parent() -> None:
    for _entry, fd in _for_child:
        os.close(fd)  # (the child's copy of the descriptor keeps the lock)
    _for_child.clear()


def _after_fork_in_child() -> None:
    """Runs in a forked child (a worker, or the user's own fork), single-threaded.

    Cached mappings are the parent's: closed here. Views that were alive at the fork
    are the child's too, but their lock lives on an open file description shared with
    the parent, which unlocks it when *its* views go; so each takes the description the
    parent locked for it before the fork (``_before_fork``), released when the child's
    copies of the views go.
    """
    global _lock
    _lock = threading.Lock()
    for entry in list(_cache.values()) + list(_returned):
        entry.close()
    _cache.clear()
    _returned.clear()
    me = os.getpid()
    made = {id(entry): fd for entry, fd in _for_child}
    _for_child.clear()
    for _ref, entry in list(_live.values()):
        if entry.pid == me or entry.fd < 0:
            continue
        fd = made.pop(id(entry), -1)
        if fd < 0:
            fd = _locked_copy(entry)  # (a lend made while the fork began: late, but
            if fd < 0:  # still better than none)
                continue  # no /proc: the child's copy is not protected from recycling
        os.close(entry.fd)  # the parent's description: the parent keeps its lock
        entry.fd = fd
        entry.locked = True
        entry.inherited = True
        entry.pid = me
    for fd in made.values():  # (a lend whose views went while the fork began)
        os.close(fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
