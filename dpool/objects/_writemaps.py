"""Writable mappings of recycled segments, kept for the next write into the same pages.

A recycled segment's pages are allocated (``_recycle.claim``), so a large write copies
into them through a shared mapping (:func:`mapped`): a plain memory copy, where
``pwrite`` or ``splice`` pays the file system's work per page. Filling a new mapping's
page tables costs about as much as the copy, and the pool hands the same pages to the
next large write again and again, most often in the same process. So a process keeps its
last ``KEEP`` mappings, keyed by inode, and the next write into the same inode reuses one.

Lifetime. An entry holds a descriptor of the inode (so ``fstat`` tells when it has no
name left, and its inode number cannot be reused while the entry lives) and the mapping.
Both pin the pages, so an entry goes once its inode has no name left (the object was
freed, or the pool expired the segment): checked on each use and by a timer thread that
runs while entries exist. An entry is out of the table while a write uses it, so nothing
closes a mapping under a writer.

Fork. The mappings are made with ``mmap(2)`` through ctypes, not as ``mmap.mmap`` objects
(whose duplicate descriptor a child would inherit), and marked ``MADV_DONTFORK``: a
forked child gets neither them nor their pages. It closes the entries' descriptors and
forgets the entries without unmapping them (their ranges are holes in the child).

:func:`mapped`'s caller must drop every view of the memory it was given before its block
ends: the mapping may be unmapped then, and nothing could tell a view still alive.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["KEEP", "clear", "kept", "mapped", "prune"]

KEEP = 2
"""Mappings a process keeps for reuse (each as large as a recent large value)."""

_CHECK_S = 1.0  # how often the timer looks for entries whose inode has no name left
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_DONTFORK = getattr(mmap, "MADV_DONTFORK", None)


class _Entry:
    __slots__ = ("addr", "fd", "length")

    def __init__(self, fd: int, addr: int, length: int) -> None:
        self.fd = fd
        self.addr = addr
        self.length = length

    def view(self, size: int) -> memoryview:
        """The first ``size`` bytes (the segment's: a kept mapping of a segment that
        shrank since runs past its end, where a store would be a SIGBUS)."""
        import ctypes

        return memoryview((ctypes.c_ubyte * size).from_address(self.addr)).cast("B")

    def linked(self) -> bool:
        try:
            return os.fstat(self.fd).st_nlink > 0
        except OSError:
            return False

    def close(self) -> None:
        _libc().munmap(self.addr, self.length)
        os.close(self.fd)


_cond = threading.Condition()
_entries: OrderedDict[tuple[int, int], _Entry] = OrderedDict()  # (dev, ino) -> entry
_busy: set[_Entry] = set()  # entries a write uses now (a forked child closes theirs too)
_timer: threading.Thread | None = None


_lib = None


def _libc() -> Any:
    global _lib
    if _lib is None:
        import ctypes

        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, ctypes.c_long)
        lib.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        lib.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        _lib = lib
    return _lib


def _map(fd: int, size: int) -> int:
    """The address of a shared, writable mapping of ``size`` bytes of an allocated
    segment, its page tables filled in one go (``MAP_POPULATE``), not inherited by a
    fork. Only for allocated pages: a store into a hole of a full ``/dev/shm`` would be a
    SIGBUS."""
    import ctypes

    lib = _libc()
    addr = lib.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE,
                    mmap.MAP_SHARED | _POPULATE, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap: {os.strerror(err)}")
    if _DONTFORK is not None and lib.madvise(addr, size, _DONTFORK) != 0:
        err = ctypes.get_errno()
        lib.munmap(addr, size)
        raise OSError(err, f"madvise: {os.strerror(err)}")
    return int(addr)


_MAP_FAILED = (1 << 64) - 1 if sys.maxsize > 2**32 else (1 << 32) - 1


@contextlib.contextmanager
def mapped(fd: int, size: int) -> Iterator[memoryview]:
    """Writable shared memory onto the first ``size`` bytes (at least) of the segment
    open as ``fd``, whose every page must be allocated: a kept mapping of the same
    inode, or a new one, kept afterwards. The caller drops every view of it before the
    block ends; a block that raises does not keep it."""
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    with _cond:
        entry = _entries.pop(key, None)
    if entry is not None and entry.length < size:  # the segment grew: map it again
        entry.close()
        entry = None
    if entry is None:
        # A descriptor of its own (kept to see the inode's links): ``fd`` may hold the
        # claim's exclusive ``flock``, which a duplicate would hold on to.
        try:
            own = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        except OSError:  # no /proc: a mapping for this write only
            once = _Entry(-1, _map(fd, size), size)
            view = once.view(size)
            try:
                yield view
            finally:
                view.release()
                _libc().munmap(once.addr, once.length)
            return
        try:
            entry = _Entry(own, _map(own, size), size)
        except BaseException:
            os.close(own)
            raise
    with _cond:
        _busy.add(entry)
    view = entry.view(size)
    try:
        yield view
    except BaseException:
        view.release()
        _discard_busy(entry)
        entry.close()
        raise
    view.release()
    _discard_busy(entry)
    _keep(key, entry)


def _discard_busy(entry: _Entry) -> None:
    with _cond:
        _busy.discard(entry)


def _keep(key: tuple[int, int], entry: _Entry) -> None:
    global _timer
    if not entry.linked():
        entry.close()
        return
    dropped = []
    with _cond:
        _entries[key] = entry
        while len(_entries) > KEEP:
            dropped.append(_entries.popitem(last=False)[1])
        if _timer is None:
            _timer = threading.Thread(target=_watch, name="dpool-write-maps", daemon=True)
            _timer.start()
        _cond.notify()
    for e in dropped:
        e.close()


def _watch() -> None:
    while True:
        with _cond:
            while not _entries:
                _cond.wait()
            _cond.wait(_CHECK_S)
        prune()


def prune() -> int:
    """Close the kept mappings whose inode has no name left; returns how many."""
    with _cond:
        gone = [k for k, e in _entries.items() if not e.linked()]
        dropped = [_entries.pop(k) for k in gone]
    for e in dropped:
        e.close()
    return len(dropped)


def clear() -> None:
    """Close every kept mapping (a store that needs the room, shutdown, tests)."""
    with _cond:
        dropped = list(_entries.values())
        _entries.clear()
    for e in dropped:
        e.close()


def kept() -> int:
    """How many mappings this process keeps now."""
    with _cond:
        return len(_entries)


def _after_fork_in_child() -> None:
    global _cond, _timer
    _cond = threading.Condition()  # (the parent's may have been held by another thread)
    _timer = None
    for e in [*_entries.values(), *_busy]:
        try:
            os.close(e.fd)
        except OSError:
            pass
    _entries.clear()
    _busy.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
