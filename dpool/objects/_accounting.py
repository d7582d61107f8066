"""The per-host object store's bookkeeping (``ObjectStore``): sizes, counts, LRU order.

Counts. Each object id has two, kept while the object is not (or no longer) stored, so a
handle may be counted before its value exists and across eviction:

- ``refcount`` (``incref``/``decref``): handles; ``HostStore`` holds one per entry of
  the scheduler's object table.
- ``pins`` (``pin``/``unpin``): readers that must find the segment: a task on a worker
  pins each stored input, a queued task its own argument block. Pinned is never evicted.

Processes that have mapped a segment are not counted: unlinking removes the name and
existing mappings stay valid (POSIX), so freeing or evicting never pulls memory from a
reader. An object is freed (``on_free`` may take its segment for reuse, else it is
unlinked; ``on_evict`` is not called) when ``decref`` or ``unpin`` leaves both counts at
zero. One added while both are zero stays until evicted or removed: its first incref may
still be on the way.

Capacity. ``used`` is the sum of the stored segments' sizes. When ``add`` or ``reserve``
would pass ``capacity``, unpinned objects are evicted least-recently-used first (order
of ``add``/``touch``): ``on_evict(oid)`` runs (a failure is logged), then the segment is
unlinked; the counts stay. When the pinned objects leave no room, or the object alone
exceeds the capacity, ``ObjectStoreFullError`` is raised, nothing is evicted, and ``add``
unlinks the segment it was given.

A plain data structure: no threads, no I/O but unlinking; its caller holds the lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from dpool import _log
from dpool.errors import ObjectStoreFullError
from dpool.objects import _owners

__all__ = ["ObjectStore"]

logger = _log.getLogger("dpool.objects")

class _Entry:
    __slots__ = ("name", "size")

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size


class ObjectStore:
    """Which objects are in this host's shared memory, their sizes, counts and LRU order."""

    def __init__(
        self,
        capacity: int,
        owner_pid: int,
        *,
        on_evict: Callable[[int], None] | None = None,
        on_free: Callable[[str, int], bool] | None = None,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"object store capacity must be positive, not {capacity}")
        self._capacity = capacity
        self._owner_pid = owner_pid
        self._on_evict = on_evict
        self._on_free = on_free  # takes a freed segment (True) instead of it being unlinked
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # LRU first
        self._used = 0
        self._refs: dict[int, int] = {}  # only non-zero counts are kept
        self._pins: dict[int, int] = {}

    # ----------------------------------------------------------------- properties
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def used(self) -> int:
        return self._used

    @property
    def owner_pid(self) -> int:
        return self._owner_pid

    def segment_name(self, object_id: int) -> str:
        """The name under which this store's owner writes object ``object_id``."""
        return _owners.segment_name(self._owner_pid, object_id)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, object_id: object) -> bool:
        return object_id in self._entries

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._entries))

    def contains(self, object_id: int) -> bool:
        return object_id in self._entries

    def location(self, object_id: int) -> str:
        """Segment name of a stored object (KeyError if it is not stored)."""
        return self._entries[object_id].name

    def size(self, object_id: int) -> int:
        """Size in bytes of a stored object (KeyError if it is not stored)."""
        return self._entries[object_id].size

    def refcount(self, object_id: int) -> int:
        return self._refs.get(object_id, 0)

    def pincount(self, object_id: int) -> int:
        return self._pins.get(object_id, 0)

    # ------------------------------------------------------------------ contents
    def add(self, object_id: int, name: str, size: int) -> None:
        """Account segment ``name`` (``size`` bytes) as object ``object_id``, most recent.

        Evicts unpinned objects, LRU first, when needed. If room cannot be made, raises
        :class:`ObjectStoreFullError` and unlinks ``name``: the object was not added.
        """
        if object_id in self._entries:
            raise ValueError(f"object {object_id} is already stored")
        if size < 0:
            raise ValueError(f"negative size {size} for object {object_id}")
        try:
            self.reserve(size)
        except ObjectStoreFullError:
            _owners.unlink(name)
            raise
        self._entries[object_id] = _Entry(name, size)
        self._used += size

    def reserve(self, size: int) -> None:
        """Make sure ``size`` more bytes fit, evicting unpinned objects LRU first.

        Books nothing: call it right before writing a segment and then :meth:`add` it.
        Raises :class:`ObjectStoreFullError` when the pinned objects alone leave too little
        room, or at once when ``size`` exceeds the whole capacity.
        """
        if size > self._capacity:
            from dpool.objects._hoststore import ENV_CAPACITY

            raise ObjectStoreFullError(
                f"object of {size} bytes is larger than the object store's capacity of "
                f"{self._capacity} bytes (set ${ENV_CAPACITY} to raise it)"
            )
        if self._used + size <= self._capacity:
            return
        victims: list[int] = []
        freed = 0
        for oid, entry in self._entries.items():
            if self._used - freed + size <= self._capacity:
                break
            if self._pins.get(oid, 0) == 0:
                victims.append(oid)
                freed += entry.size
        if self._used - freed + size > self._capacity:
            raise ObjectStoreFullError(
                f"no room for an object of {size} bytes: {self._used} of "
                f"{self._capacity} bytes are used and only {freed} bytes can be evicted "
                f"(the rest is pinned: inputs of tasks sent to workers, argument blocks "
                f"of submitted tasks)"
            )
        for oid in victims:
            self._evict(oid)

    def touch(self, object_id: int) -> None:
        """Mark a stored object as just used (moves it to the LRU end). No-op if absent."""
        if object_id in self._entries:
            self._entries.move_to_end(object_id)

    def remove(self, object_id: int, *, freed: bool = False) -> bool:
        """Unlink a stored object's segment and forget its value; counts are kept.

        ``freed``: nobody needs the object any more, so ``on_free`` may take the segment
        (to reuse its pages) instead. Returns False if it was not stored.
        """
        entry = self._entries.pop(object_id, None)
        if entry is None:
            return False
        self._used -= entry.size
        if not (freed and self._on_free is not None and self._on_free(entry.name, entry.size)):
            _owners.unlink(entry.name)
        return True

    def clear(self) -> None:
        """Unlink every stored segment and forget all objects and counts (shutdown)."""
        for entry in self._entries.values():
            _owners.unlink(entry.name)
        self._entries.clear()
        self._refs.clear()
        self._pins.clear()
        self._used = 0

    def _evict(self, object_id: int) -> None:
        entry = self._entries.get(object_id)
        if entry is None:  # an earlier on_evict callback removed it already
            return
        logger.debug("evicting object %d (%s, %d bytes)", object_id, entry.name, entry.size)
        if self._on_evict is not None:
            try:
                self._on_evict(object_id)
            except Exception:  # the store must stay consistent whatever the callback does
                logger.exception("on_evict callback failed for object %d", object_id)
        self.remove(object_id)

    # -------------------------------------------------------------------- counts
    def incref(self, object_id: int, n: int = 1) -> None:
        """Count ``n`` more live handles of ``object_id`` (it need not be stored yet)."""
        if n < 0:
            raise ValueError(f"incref by a negative count {n}")
        if n:
            self._refs[object_id] = self._refs.get(object_id, 0) + n

    def decref(self, object_id: int, n: int = 1) -> bool:
        """Count ``n`` fewer handles; True if that freed the object (segment unlinked).

        Raises ValueError (changing nothing) if the count would go below zero.
        """
        return self._lower(self._refs, object_id, n, "decref", "count")

    def pin(self, object_id: int, n: int = 1) -> None:
        """Protect ``object_id`` from eviction for ``n`` more readers (tasks on workers)."""
        if n < 0:
            raise ValueError(f"pin by a negative count {n}")
        if n:
            self._pins[object_id] = self._pins.get(object_id, 0) + n

    def unpin(self, object_id: int, n: int = 1) -> bool:
        """Release ``n`` pins; True if that freed the object (no handles left either).

        Raises ValueError (changing nothing) if the pin count would go below zero.
        """
        return self._lower(self._pins, object_id, n, "unpin", "pin count")

    def _lower(self, counts: dict[int, int], object_id: int, n: int, op: str,
               what: str) -> bool:
        if n == 0:
            return False
        count = counts.get(object_id, 0) - n
        if n < 0 or count < 0:
            raise ValueError(
                f"{op} of object {object_id} by {n} but its {what} is "
                f"{counts.get(object_id, 0)}"
            )
        if count:
            counts[object_id] = count
            return False
        counts.pop(object_id, None)
        return self._free_if_unused(object_id)

    def _free_if_unused(self, object_id: int) -> bool:
        if self._refs.get(object_id, 0) or self._pins.get(object_id, 0):
            return False
        if self.remove(object_id, freed=True):
            logger.debug("freed object %d (no handles, no pins)", object_id)
            return True
        return False
