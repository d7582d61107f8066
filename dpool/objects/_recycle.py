"""Reuse the pages of freed large segments for the next large write.

When an object of at least ``_mapping.LARGE`` bytes is freed, its store does not unlink
the segment: :meth:`SegmentPool.retire` moves it into the owner's pool, a directory of its
own (``/dev/shm/dpool_<owner>_pool/<n>``). The next large write in *any* process of the
runtime (a ``put`` in the driver, a result in a worker) :func:`claim` s one by renaming it
to a name of its own (atomic: two writers never get the same one), then resizes it,
publishes it under the object's name and writes over its pages, which saves allocating
fresh shared-memory pages. A write takes a pool segment at most ``_MAX_SHRINK`` times its
size, the smallest that is big enough first. Why and by how much: bench/TRANSFER.md.

Safety: a freed segment may still be mapped by a reader holding a view of the old object.
Readers of large segments hold a shared ``flock`` while any view is alive (``_mapping``);
:func:`claim` takes the exclusive lock without blocking and unlinks, instead of reusing,
a segment that is still read. A reader that opened the old name just before the rename
finds, once locked, that the name no longer refers to its inode, and reports the object
missing.

Pool segments live ``DPOOL_SEGMENT_POOL_TTL`` seconds (default 0.5; 0 disables recycling)
plus ``LINGER_S_PER_GIB`` per GiB of their size, and take at most ``max_bytes``. The
owner's timer thread unlinks expired ones, :meth:`SegmentPool.purge` and :func:`release`
unlink all (shutdown, or the store needs the room), and ``_owners.reap_owner`` /
``reap_orphans`` cover an owner that died. ``_cond`` guards the owner's entries.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import threading
import time

from dpool import _log
from dpool.objects._mapping import LARGE, SHM_DIR

__all__ = ["SegmentPool", "claim", "pool_dir", "pool_ttl", "release"]

log = _log.getLogger("dpool.objects")

_DEFAULT_TTL_S = 0.5
LINGER_S_PER_GIB = 4.0
"""Seconds a pool segment lives beyond the TTL, per GiB of its size."""


def pool_ttl() -> float:
    raw = os.environ.get("DPOOL_SEGMENT_POOL_TTL")
    try:
        return max(0.0, float(raw)) if raw else _DEFAULT_TTL_S
    except ValueError:
        return _DEFAULT_TTL_S


def pool_dir(owner_pid: int) -> str:
    """The directory holding the pool of the store owned by process ``owner_pid``."""
    return f"{SHM_DIR}/dpool_{owner_pid}_pool"


class SegmentPool:
    """The owner's side: retire freed segments into the pool, expire and purge them."""

    def __init__(self, owner_pid: int, max_bytes: int, ttl_s: float | None = None) -> None:
        self.owner_pid = owner_pid
        self.dir = pool_dir(owner_pid)
        self.max_bytes = max_bytes
        self.ttl_s = pool_ttl() if ttl_s is None else ttl_s
        self._seq = itertools.count()
        self._entries: dict[str, tuple[int, float]] = {}  # path -> (size, expiry)
        self._cond = threading.Condition()
        self._timer: threading.Thread | None = None
        self.gave_back = False  # pool segments were unlinked: readers may prune mappings

    @property
    def pending(self) -> bool:
        """Whether segments wait in the pool (to be claimed, or to expire)."""
        return bool(self._entries)

    @property
    def bytes(self) -> int:
        """Bytes retired, not yet expired and still in the pool (a claimed one holds the
        claimer's object now: the store counts it as that)."""
        with self._cond:
            return self._pooled_locked()

    def retire(self, name: str, size: int) -> bool:
        """Move a freed segment into the pool; False if it does not qualify (unlink it)."""
        if size < LARGE or self.ttl_s <= 0:
            return False
        with self._cond:
            if self._pooled_locked() + size > self.max_bytes:
                return False
            path = f"{self.dir}/{next(self._seq):x}"
            try:
                os.makedirs(self.dir, mode=0o700, exist_ok=True)
                os.rename(SHM_DIR + name, path)
            except OSError:
                return False
            self._entries[path] = (size, time.monotonic() + self.ttl_s
                                   + LINGER_S_PER_GIB * size / (1 << 30))
            if self._timer is None:
                self._timer = threading.Thread(target=self._expire_loop,
                                               name="dpool-segment-pool", daemon=True)
                self._timer.start()
            self._cond.notify()
        return True

    def _pooled_locked(self) -> int:
        """Bytes of the entries still in the pool (called with ``_cond`` held). Entries
        no longer there are forgotten first: a writer claimed them (their pages hold its
        object now, which the store counts), or a claim found one still read and unlinked
        it. So a claimed segment never counts against the pool's budget, nor twice
        against the store's capacity."""
        gone = [p for p in self._entries if not os.path.exists(p)]
        for p in gone:
            del self._entries[p]
        if gone:
            self.gave_back = True  # (an unlinked one may be mapped by readers: they prune)
        return sum(size for size, _ in self._entries.values())

    def purge(self, everything: bool = False) -> int:
        """Unlink every pool segment now; returns how many were still there.

        ``everything`` (shutdown, no writer left): also what an interrupted claim left.
        """
        with self._cond:
            paths = list(self._entries)
            self._entries.clear()
            n = sum(_unlink(p) for p in paths)
            if paths:
                self.gave_back = True
            if everything and os.path.isdir(self.dir):
                import shutil  # here: a rare case, and its import is not small

                shutil.rmtree(self.dir, ignore_errors=True)
            self._remove_dir()
        return n

    def _remove_dir(self) -> None:
        """Remove the pool's directory once empty (called with ``_cond`` held)."""
        if not self._entries:
            try:
                os.rmdir(self.dir)
            except OSError:  # not there, or a writer is mid-claim: the next purge retries
                pass

    def _expire_loop(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                due = [p for p, (_, t) in self._entries.items() if t <= now]
                for p in due:
                    del self._entries[p]
                    _unlink(p)
                if due:
                    # Even an entry already gone (a claim found it still read and
                    # unlinked it, or release() did) may be mapped by readers for
                    # reuse: they must prune.
                    self.gave_back = True
                    self._remove_dir()
                if self._entries:
                    self._cond.wait(min(t for _, t in self._entries.values()) - now)
                else:
                    self._cond.wait()


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:  # claimed by a writer meanwhile
        return False
    return True


def claim(owner_pid: int, name: str, size: int) -> int | None:
    """A pool segment moved to ``name`` and sized ``size``, as an fd open for writing.

    The fd holds the segment's exclusive lock until closed. None when no pool segment
    can be reused; the caller then creates ``name`` afresh. Raises ``FileExistsError``
    if ``name`` exists, and ``OSError`` (ENOSPC...) when growing a reused segment finds
    no room; on any failure nothing is left under ``name``.
    """
    if size < LARGE:
        return None
    pool = pool_dir(owner_pid)
    try:
        names = os.listdir(pool)
    except OSError:  # no pool (yet, or any more)
        return None
    sized = []
    for n in names:
        if n.startswith("claim-"):
            continue
        try:
            have = os.stat(f"{pool}/{n}").st_size
        except OSError:
            continue
        if have <= _MAX_SHRINK * size:  # (cutting most of a big one costs more than
            sized.append((have, n))     # fresh pages, and the next big value wants it)
    # The smallest that is big enough (only its tail is freed), else the biggest.
    sized.sort(key=lambda x: (x[0] < size, x[0] if x[0] >= size else -x[0]))
    for have, n in sized:
        # Rename to a name of this claim first (atomic: one claimer wins), then link to
        # the target, which fails if it exists, as creating it would (O_EXCL).
        mine = f"{pool}/claim-{os.getpid()}-{next(_claims)}"
        try:
            os.rename(f"{pool}/{n}", mine)
        except OSError:  # another writer claimed it, or the owner expired it
            continue
        fd = _take_over(mine, SHM_DIR + name, have, size)
        if fd is not None:
            log.debug("recycled pool segment %s (%d bytes) as %s (%d bytes)",
                      n, have, name, size)
            return fd
    return None


_claims = itertools.count()
_MAX_SHRINK = 2  # a pool segment is reused for a write at least 1/_MAX_SHRINK its size


def _take_over(mine: str, target: str, have: int, size: int) -> int | None:
    """Lock, resize and publish a claimed pool segment as ``target``; None if in use."""
    fd = -1
    published = False
    try:
        fd = os.open(mine, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a reader still has views of the old object
            return None
        if have > size:
            os.ftruncate(fd, size)
        elif have < size:
            os.posix_fallocate(fd, 0, size)
        os.link(mine, target)  # FileExistsError if the name is taken
        published = True
        return fd
    except BaseException:
        if published:
            _unlink(target)
        raise
    finally:
        _unlink(mine)
        if fd >= 0 and not published:
            os.close(fd)


def release(owner_pid: int) -> int:
    """Unlink every segment in ``owner_pid``'s pool now, from any process; returns how
    many. For a writer that found no room: pooled pages are the first to give back."""
    pool = pool_dir(owner_pid)
    try:
        names = os.listdir(pool)
    except OSError:
        return 0
    return sum(_unlink(f"{pool}/{n}") for n in names if not n.startswith("claim-"))
