"""The host's object store as the scheduler uses it: adopt, pin, drop, spill, restore.

It speaks in *payloads* (``_values``), so the scheduler never parses one; the accounting
(``ObjectStore``, ``_accounting``) and the pool of freed pages (``_recycle``) are made
with the first stored value. Eviction is spilling: an evicted segment is copied to a
spill file (``<tmp>/dpool-spill-<pid>-*/``) and unlinked, and ``restore`` brings it back
when a task or a reader needs it. ``ObjectStoreFullError`` comes only when pinned values
alone leave no room or a value is bigger than the whole store (``adopt_or_spill``, for a
rebuilt result, writes it straight to a spill file instead). A spill file that is gone or
cut short makes ``restore`` raise ``ObjectLostError``; the scheduler rebuilds the value
from lineage (``scheduling._lineage``).

Who keeps a stored value alive:

- the scheduler's object table entry (``ObjectEntry.refs``: live handles, and pending tasks that
  take it as an argument) holds one store reference, ``adopt`` .. ``drop``; at zero the
  segment (or its spill file) is freed;
- a task on a worker pins each stored input (``pin`` .. ``unpin``); a task's own stored
  argument block has no entry: pinned from ``adopt(pin=True)`` to ``drop(unpin=True)``;
- processes that mapped a segment are not counted (a freed name leaves their mappings
  valid), nor are refs unpickled in another process (they *borrow*);
- a freed large segment goes to the segment pool, whose pages count against the capacity
  until claimed; the scheduler tells workers (``Forget``) to drop cached mappings of it.

Called under the scheduler's lock.
"""

from __future__ import annotations

import os
import re

from dpool import _log
from dpool.errors import ObjectLostError, ObjectStoreFullError
from dpool.objects import _owners, _values

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Callable, Optional

    from dpool.objects._accounting import ObjectStore
    from dpool.objects._recycle import SegmentPool

__all__ = ["HostStore", "default_capacity", "parse_size", "ENV_CAPACITY"]

log = _log.getLogger("dpool.objects")

ENV_CAPACITY = "DPOOL_OBJECT_STORE_MEMORY"
_MEMORY_FRACTION = 0.30
_SHM_FRACTION = 0.90
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = r"^\s*([0-9][0-9_]*)\s*([kmgt]?)(?:i?b)?\s*$"  # compiled when first used


def parse_size(text: str) -> int:
    """Parse a byte count: ``"1073741824"``, ``"1_000_000"``, ``"512M"``, ``"2GiB"``, ``"4g"``.

    Suffixes K/M/G/T are powers of 1024. Raises ValueError for anything else or for zero.
    """
    match = re.match(_SIZE, text, re.IGNORECASE)  # (re caches the compiled pattern)
    if match is None:
        raise ValueError(
            f"{text!r} is not a size in bytes (examples: 1073741824, 512M, 2G)"
        )
    number = int(match.group(1).replace("_", ""))
    value = number * _UNITS[match.group(2).lower()]
    if value <= 0:
        raise ValueError(f"{text!r}: the size must be positive")
    return value


def default_capacity() -> int:
    """The object store's capacity in bytes.

    ``$DPOOL_OBJECT_STORE_MEMORY`` when set and not empty (bytes, or with a K/M/G/T suffix;
    a bad value raises ValueError naming the variable), else the smaller of 30% of the
    machine's memory and 90% of the size of ``/dev/shm``.
    """
    raw = os.environ.get(ENV_CAPACITY, "")
    if raw.strip():
        try:
            return parse_size(raw)
        except ValueError as exc:
            raise ValueError(f"bad ${ENV_CAPACITY}: {exc}") from None
    capacity = int(_memory_total() * _MEMORY_FRACTION)
    shm_total = _owners.shm_total_bytes()
    if shm_total is not None:
        capacity = min(capacity, int(shm_total * _SHM_FRACTION))
    return capacity


def _memory_total() -> int:
    """The machine's RAM in bytes, as ``psutil.virtual_memory().total`` says (without
    importing psutil, a good part of a short program's start-up: bench/NOTES.md)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no such sysconf names here
        import psutil

        return int(psutil.virtual_memory().total)



class HostStore:
    """The host's store (see the module docstring). Its accounting (``ObjectStore``) and
    its pool of freed pages (``SegmentPool``) are made, with the shared-memory machinery
    they load, when the first stored value needs them: a program whose values all travel
    inline never loads it."""

    def __init__(self, owner_pid: int, capacity: Optional[int] = None) -> None:
        self.owner_pid = owner_pid
        self._capacity = capacity or default_capacity()
        _values.set_capacity_limit(self._capacity)
        self._store: Optional[ObjectStore] = None
        self._pool: Optional[SegmentPool] = None
        self.forgotten: list[str] = []  # large segments freed since the scheduler looked
        self._prune = False  # a segment outside the store was unlinked since it looked
        self._spill_dir: Optional[str] = None
        self._spilled: dict[int, tuple[str, str, int]] = {}  # oid -> (path, name, size)
        self.on_freed: Optional[Callable[[str], None]] = None  # told each freed segment

    @property
    def store(self) -> ObjectStore:
        """The accounting, made with the first stored value."""
        store = self._store
        if store is None:
            from dpool.objects._accounting import ObjectStore

            store = self._store = ObjectStore(self._capacity, self.owner_pid,
                                              on_evict=self._spill, on_free=self._free)
        return store

    @property
    def pool(self) -> SegmentPool:
        """The pool of freed segments' pages, made with the first stored value."""
        pool = self._pool
        if pool is None:
            from dpool.objects._recycle import SegmentPool

            pool = self._pool = SegmentPool(self.owner_pid, self._pool_budget(self._capacity))
        return pool

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def spilled_bytes(self) -> int:
        """Bytes of objects spilled to disk now."""
        return sum(size for _path, _name, size in self._spilled.values())

    @property
    def under_pressure(self) -> bool:
        """Over half the store is in use: pins taken ahead of need may keep out a value
        that needs the room (the scheduler sends tasks with large inputs to idle workers
        only, then)."""
        store = self._store
        return store is not None and store.used * 2 > self._capacity

    def pinned(self, payload: Optional[bytes]) -> bool:
        """Whether this stored value is pinned (another pin of it holds no more room)."""
        info = _values.stored(payload)
        return info is not None and self._store is not None and \
            self._store.pincount(info[0]) > 0

    def set_capacity(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"object_store_memory must be > 0 bytes, got {capacity}")
        self._capacity = capacity
        if self._store is not None:
            self._store._capacity = capacity  # noqa: SLF001 - its own field, resized here
        _values.set_capacity_limit(capacity)
        if self._pool is not None:
            self._pool.max_bytes = self._pool_budget(capacity)

    @staticmethod
    def _pool_budget(capacity: int) -> int:
        """Freed pages kept for reuse: a quarter of the store, within what /dev/shm has
        beyond the store (writers give pooled pages back first when space runs out)."""
        total = _owners.shm_total_bytes()
        spare = capacity // 4 if total is None else max(0, total - capacity)
        return min(capacity // 4, spare)

    # -- lifetime --------------------------------------------------------------------------
    def adopt(self, payload: Optional[bytes], pin: bool = False) -> None:
        """Account a stored value that a process just wrote (may evict; may raise full).
        ``pin``: a pending task's own argument block, never evicted before it ran."""
        info = _values.stored(payload)
        if info is not None:
            oid, name, size = info
            if self.store.used + size + self.pool.bytes > self.store.capacity:
                self.pool.purge()  # pooled pages count against the cap: give them back first
            self.store.add(oid, name, size)
            self.store.incref(oid)
            if pin:
                self.store.pin(oid)

    def adopt_or_spill(self, payload: Optional[bytes]) -> None:
        """``adopt`` a value that must not fail for want of room *now* (a result rebuilt
        from lineage, which no caller asked for at this moment): when pinned values leave
        no room, it goes straight to a spill file, as if evicted at
        once, and its readers bring it back -- waiting for room -- as for any spilled
        value. Raises ``ObjectStoreFullError`` only when it can never fit, or the spill
        file cannot be written (the segment is unlinked, as ``adopt`` leaves it)."""
        info = _values.stored(payload)
        if info is None:
            return
        oid, name, size = info
        if self.store.used + size + self.pool.bytes > self.store.capacity:
            self.pool.purge()
        try:
            self.store.reserve(size)  # evicts what it can; changes nothing if it raises
        except ObjectStoreFullError:
            if size > self.store.capacity:
                _owners.unlink(name)
                raise
            try:
                self._spill_segment(oid, name, size)
            except OSError as exc:
                _owners.unlink(name)
                raise ObjectStoreFullError(
                    f"no room for object {oid:#x} ({size} bytes) in shared memory, and "
                    f"it could not be written to disk: {exc}") from exc
            _owners.unlink(name)
            self.store.incref(oid)  # counted as an evicted value is (``drop`` ends it)
            return
        self.store.add(oid, name, size)
        self.store.incref(oid)

    def drop(self, payload: Optional[bytes], unpin: bool = False) -> None:
        """The object table let go of this value: free its segment (or spill file).
        ``unpin``: a finished task's argument block, pinned by ``adopt``."""
        info = _values.stored(payload)
        if info is None:
            return
        oid = info[0]
        if unpin and self.store.pincount(oid):
            self.store.unpin(oid)
        spilled = self._spilled.pop(oid, None)
        if spilled is not None:
            _remove(spilled[0])
        if self.store.refcount(oid):
            self.store.decref(oid)
        else:
            self.store.remove(oid, freed=True)

    @property
    def has_news(self) -> bool:
        """Frees, spills or pool expiry that readers' cached mappings should hear of."""
        pool = self._pool
        return bool(self.forgotten) or (pool is not None and pool.gave_back) or self._prune

    @property
    def expiring(self) -> bool:
        """Freed pages wait in the pool to expire (news to come: the scheduler looks)."""
        return self._pool is not None and self._pool.pending

    def take_news(self) -> tuple[str, ...]:
        """The large segments freed or spilled since last asked (may be empty: then
        only the pool gave pages back), clearing the news."""
        names, self.forgotten = tuple(self.forgotten), []
        if self._pool is not None:
            self._pool.gave_back = False
        self._prune = False
        return names

    def _free(self, name: str, size: int) -> bool:
        """A stored object was freed: recycle its segment's pages if it is large."""
        if self.on_freed is not None:
            self.on_freed(name)  # (a node tells the nodes that copied it: node._spillback)
        from dpool.objects import _mapping  # (loaded: a stored value was freed)

        if size >= _mapping.LARGE:
            _mapping.forget([name])  # this process's cached mapping; workers are told
            self.forgotten.append(name)
        return self.pool.retire(name, size)

    def discard(self, payload: Optional[bytes]) -> None:
        """Unlink a stored value that was never adopted (a result nobody will read)."""
        info = _values.stored(payload)
        if info is not None and (self._store is None or not self._store.contains(info[0])):
            self.unlink_unadopted(info[1])

    def unlink_unadopted(self, name: str) -> None:
        """Unlink a segment the store never held (e.g. a dead worker's half-written
        result). Its pages may be recycled ones that readers still keep mapped for
        reuse: tell them to prune."""
        if _owners.unlink(name):
            self._prune = True

    def pin(self, payload: Optional[bytes]) -> None:
        """A task sent to a worker will read this value: bring it back if spilled, keep it."""
        info = _values.stored(payload)
        if info is not None:
            self.restore(info[0])
            self.store.pin(info[0])
            self.store.touch(info[0])

    def fit_together(self, payloads: Iterable[Optional[bytes]]) -> bool:
        """Whether these values (stored ones; each counted once) fit in the store at
        once when nothing else pins it: a task that needs them can wait for room."""
        sizes: dict[int, int] = {}
        for payload in payloads:
            info = _values.stored(payload)
            if info is not None:
                sizes[info[0]] = info[2]
        return sum(sizes.values()) <= self._capacity

    def unpin(self, payload: Optional[bytes]) -> None:
        info = _values.stored(payload)
        if info is not None and self._store is not None and self._store.pincount(info[0]):
            self._store.unpin(info[0])

    def restore(self, oid: int) -> None:
        """Bring a spilled object back into shared memory (no-op if it is not spilled).

        Raises ``ObjectStoreFullError`` when it cannot fit (it stays on disk), and
        ``ObjectLostError`` when its spill file is gone or cut short (a tmp cleaner, disk
        trouble): the object is forgotten here, and the scheduler rebuilds it from
        lineage or fails its readers (``scheduling._lineage``)."""
        spilled = self._spilled.get(oid)
        if spilled is None:
            return
        path, name, size = spilled
        try:
            src = open(path, "rb")  # noqa: SIM115 - closed by the with below
            on_disk = os.fstat(src.fileno()).st_size
        except OSError as exc:
            del self._spilled[oid]
            raise _lost(oid, path, exc.strerror or type(exc).__name__) from exc
        with src:
            if on_disk != size:
                del self._spilled[oid]
                _remove(path)
                raise _lost(oid, path, f"{on_disk} of its {size} bytes are left")
            self.store.reserve(size)  # may evict (spill) others; raises when it cannot
            target = _owners.SHM_DIR + name
            import shutil  # spilling is rare: its imports load on first use

            try:
                with open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            except OSError as exc:  # /dev/shm is full: the file stays, nothing is lost
                _owners.unlink(name)
                raise ObjectStoreFullError(
                    f"cannot bring object {oid:#x} ({size} bytes) back from disk into "
                    f"shared memory: {exc}") from exc
        self.store.add(oid, name, size)
        del self._spilled[oid]
        _remove(path)
        log.debug("restored object %d from disk", oid)

    def restore_payload(self, payload: Optional[bytes]) -> None:
        info = _values.stored(payload)
        if info is not None:
            self.restore(info[0])

    def _spill(self, oid: int) -> None:
        self._spill_segment(oid, self.store.location(oid), self.store.size(oid))

    def _spill_segment(self, oid: int, name: str, size: int) -> None:
        """Copy segment ``name`` to a spill file (the caller unlinks it)."""
        import shutil
        import tempfile

        if self._spill_dir is None:
            self._spill_dir = tempfile.mkdtemp(prefix=f"dpool-spill-{self.owner_pid}-")
        path = os.path.join(self._spill_dir, name.lstrip("/"))
        try:
            shutil.copyfile(_owners.SHM_DIR + name, path)
        except OSError:
            _remove(path)  # a partial copy (disk full) is no spill file
            raise
        from dpool.objects import _mapping

        _mapping.forget([name])  # this process's cached mapping; workers are told
        self.forgotten.append(name)
        self._spilled[oid] = (path, name, size)
        log.debug("spilled object %d (%d bytes) to %s", oid, size, path)

    def clear(self) -> None:
        if self._store is not None:
            self._store.clear()
        if self._pool is not None:
            self._pool.purge(everything=True)
        self._spilled.clear()
        if self._spill_dir is not None:
            import shutil

            shutil.rmtree(self._spill_dir, ignore_errors=True)
            self._spill_dir = None


def _lost(oid: int, path: str, why: str) -> ObjectLostError:
    return ObjectLostError(
        f"object {oid:#x} was evicted from shared memory to disk and its spill file was "
        f"lost ({path}: {why})", object_id=oid)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
