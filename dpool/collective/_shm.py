"""Collectives through shared memory (every member on one node).

Each member has a data segment (POSIX shared memory, ``/dpool_<pid>_c...``, so that the
reaper of a dead process's segments finds it) that the others map; rank 0's control
segment holds a barrier counter and a metadata slot per member, and an abort flag with
its reason. An allreduce: each member copies its array into its segment and says what it
holds (dtype, shape, operation); a barrier; each reduces its own chunk of every member's
array in place (its own values first, then the others' in rank order); a barrier; each
copies every reduced chunk out. Every member reduces at once, and no byte crosses a
socket. Segments are double-buffered (operations alternate halves), so that the next
operation's first barrier also says everyone is done reading this one's.

A member waiting at a barrier spins briefly, then yields, then sleeps in short steps;
every ``_CHECK_S`` it checks the abort flag and that the others' processes live: a dead
one aborts the group (its reason in the control segment: every member fails with it).
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
import time
import zlib
from typing import Any, Optional

import numpy as np

from dpool.collective import _arrays
from dpool.errors import CollectiveError

_SLOT = 512  # bytes of metadata per member
_REASON = 1024
_CHECK_S = 0.2
# A barrier's tight spins (more when every member has a CPU of its own; fewer when they
# outnumber the CPUs, where a spinning member keeps a late one off its CPU), then yields,
# then short sleeps.
_SPIN_ALONE, _SPIN_SHARED = 200, 5
_YIELD = 20000
_SMALL = 64 << 10  # an allreduce this small: one barrier, each member reduces it all
_PIECE = 64 << 20  # the most one round moves per member (larger arrays: several rounds)
_LEN = struct.Struct("!I")


def _segment(name: str, size: int, create: bool) -> tuple[mmap.mmap, Any]:
    import posix_ipc

    flags = posix_ipc.O_CREX if create else 0
    shm = posix_ipc.SharedMemory(name, flags, size=size if create else 0)
    try:
        mm = mmap.mmap(shm.fd, shm.size)
    finally:
        shm.close_fd()
    return mm, shm


def _unlink(name: str) -> None:
    import posix_ipc

    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        pass


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # (a zombie answers kill(0): it died, its parent has not reaped it yet)
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


class Arena:
    """This member's view of the group's shared memory."""

    def __init__(self, name: str, world: int, rank: int, pids: list, token: str) -> None:
        self.name = name
        self.world = world
        self.rank = rank
        self.pids = pids
        self.token = token
        self._ctl_name = f"/dpool_{pids[0]}_c{token}x"
        size = 64 + 16 * world + _SLOT * 2 * world + _REASON
        if rank == 0:
            self._ctl, _ = _segment(self._ctl_name, size, create=True)
        else:
            self._ctl = _wait_open(self._ctl_name, pids[0])
        base = 64
        self._counts = memoryview(self._ctl)[base:base + 8 * world].cast("q")
        self._aborted_flag = memoryview(self._ctl)[0:8].cast("q")
        # (then, per member: 1 once it left the group: the last to leave frees it all)
        self._left = np.frombuffer(self._ctl, dtype=np.int64, count=world,
                                   offset=base + 8 * world)
        self._meta_at = base + 16 * world
        self._slots = np.frombuffer(self._ctl, dtype=np.int64, count=world * 2 * _SLOT // 8,
                                    offset=self._meta_at).reshape(world, 2, _SLOT // 8)
        self._known: dict[tuple, tuple[int, bytes]] = {}  # meta -> (checksum, pickle)
        self._decoded: dict[int, tuple] = {}  # checksum -> meta
        self._reason_at = self._meta_at + _SLOT * 2 * world
        self.epoch = 0
        self._spin = _SPIN_ALONE if world <= (os.cpu_count() or 1) else _SPIN_SHARED
        self.op = 0  # operations done (their parity picks the half of the segments)
        self.cap = 0  # bytes per half of this member's data segment
        self.gen = 0
        self._mine: Optional[mmap.mmap] = None
        self._theirs: dict[int, tuple[int, mmap.mmap]] = {}  # rank -> (gen, map)
        self._views: dict[tuple, np.ndarray] = {}  # (rank, gen, dtype, count, half) -> view
        self._retired: list = []  # (name, map) of this member's outgrown segments

    # -- segments ------------------------------------------------------------------------
    def _data_name(self, rank: int, gen: int) -> str:
        return f"/dpool_{self.pids[rank]}_c{self.token}r{rank}g{gen}"

    def ensure(self, nbytes: int) -> None:
        """This member's segment holds ``nbytes`` per half (before the barrier that
        publishes its generation)."""
        if nbytes <= self.cap and self._mine is not None:
            return
        cap = max(nbytes, 4096, self.cap * 2)
        self.gen += 1
        old = self._mine
        self._forget_views(self.rank)
        self._mine, _ = _segment(self._data_name(self.rank, self.gen), 2 * cap, create=True)
        if old is not None:  # (a member still in the last operation may map it yet:
            # unlinked after the next barrier, which every member passes after it)
            self._retired.append((self._data_name(self.rank, self.gen - 1), old))
        self.cap = cap

    def view(self, rank: int, gen: int, dtype: Any, count: int) -> np.ndarray:
        """``count`` items of ``dtype`` in the current half of ``rank``'s segment."""
        key = (rank, gen, dtype, count, self.op % 2)
        v = self._views.get(key)
        if v is not None:
            return v
        if rank == self.rank:
            mm = self._mine
        else:
            have = self._theirs.get(rank)
            if have is None or have[0] != gen:
                self._forget_views(rank)
                if have is not None:
                    _close(have[1])
                mm, _ = _segment(self._data_name(rank, gen), 0, create=False)
                self._theirs[rank] = (gen, mm)
            else:
                mm = have[1]
        half = len(mm) // 2  # type: ignore[arg-type]
        v = np.frombuffer(mm, dtype=dtype, count=count,  # type: ignore[arg-type]
                          offset=half * (self.op % 2))
        if len(self._views) > 64:  # (a program cycling through many shapes)
            self._views.clear()
        self._views[key] = v
        return v

    def _forget_views(self, rank: int) -> None:
        for key in [k for k in self._views if k[0] == rank]:
            del self._views[key]

    # -- metadata ------------------------------------------------------------------------
    # A member's slot (one per operation parity): its segment's generation, a checksum of
    # its metadata, then the metadata pickled -- written only when the checksum changes,
    # and read only when another member's differs (a loop of one operation compares two
    # integers per member).
    def publish(self, meta: tuple) -> None:
        known = self._known.get(meta)
        if known is None:
            body = pickle.dumps(meta)
            if len(body) + 20 > _SLOT:
                raise ValueError("the array's shape is too long for a collective")
            known = self._known[meta] = (zlib.crc32(body) | 1 << 32, body)
            self._decoded[known[0]] = meta
        crc, body = known
        p = self.op % 2
        head = self._slots[self.rank, p]
        if head[1] != crc:
            at = self._meta_at + _SLOT * (2 * self.rank + p) + 16
            self._ctl[at:at + 4 + len(body)] = _LEN.pack(len(body)) + body
            head[1] = crc
        head[0] = self.gen

    def heads(self) -> list:
        """[generation, checksum] of every member's slot, in rank order."""
        return self._slots[:, self.op % 2, :2].tolist()

    def mine(self, meta: tuple) -> int:
        return self._known[meta][0]

    def metas(self, heads: Optional[list] = None) -> list:
        """(generation, meta) of every member, in rank order."""
        p = self.op % 2
        out = []
        for r, (gen, crc) in enumerate(heads if heads is not None else self.heads()):
            meta = self._decoded.get(crc)
            if meta is None:
                at = self._meta_at + _SLOT * (2 * r + p) + 16
                (n,) = _LEN.unpack(self._ctl[at:at + 4])
                meta = self._decoded[crc] = pickle.loads(self._ctl[at + 4:at + 4 + n])
            out.append((gen, meta))
        return out

    # -- the barrier ---------------------------------------------------------------------
    def barrier(self, timeout: Optional[float]) -> None:
        """Wait until every member reached this barrier (``timeout``: at most so long,
        then the group aborts)."""
        self.epoch += 1
        e = self.epoch
        count = self._counts  # (a memoryview of int64: cheaper than numpy at this size)
        count[self.rank] = e
        if min(count) >= e:  # (the last to arrive: no wait)
            if self._retired:
                self._free_retired()
            return
        spins = 0
        now = time.monotonic()
        next_check = now + _CHECK_S
        deadline = None if timeout is None else now + timeout
        abort = self._aborted_flag
        while True:
            if min(count) >= e:
                if self._retired:
                    self._free_retired()
                return
            if abort[0]:
                raise self._aborted()
            spins += 1
            if spins < self._spin:
                continue
            if spins < _YIELD:  # (more members than CPUs: let the late one run)
                os.sched_yield()
            else:
                time.sleep(0.00005 if spins < 4 * _YIELD else 0.001)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + _CHECK_S
                self._check(now, deadline, e)

    def _free_retired(self) -> None:
        for name, mm in self._retired:
            _unlink(name)
            _close(mm)
        self._retired.clear()

    def _check(self, now: float, deadline: Optional[float], e: int) -> None:
        for r, pid in enumerate(self.pids):
            if r != self.rank and self._counts[r] < e and not alive(pid):
                self.abort(f"collective group {self.name!r}: the member of rank {r} (pid "
                           f"{pid}) died mid-operation", r)
        if deadline is not None and now >= deadline:
            self.abort(f"collective group {self.name!r}: the operation ran past its "
                       "timeout (a member never called it, or is stuck)", -1)

    def abort(self, reason: str, rank: int) -> None:
        """Fail the group in every member, with ``reason``; raises it here."""
        if not self._aborted_flag[0]:
            body = reason.encode("utf-8", "replace")[:_REASON - 4]
            at = self._reason_at
            self._ctl[at:at + 4 + len(body)] = _LEN.pack(len(body)) + body
            self._aborted_flag[0] = rank + 2  # (nonzero; the rank it names, plus 2)
        raise self._aborted()

    def _aborted(self) -> CollectiveError:
        at = self._reason_at
        (n,) = _LEN.unpack(self._ctl[at:at + 4])
        reason = bytes(self._ctl[at + 4:at + 4 + n]).decode("utf-8", "replace")
        return CollectiveError(reason or f"collective group {self.name!r} was aborted",
                               group=self.name, rank=self._aborted_flag[0] - 2)

    def close(self) -> None:
        """Unmap everything. The segments stay until every member left the group or
        died (a member may still be reading this one's, for the operation it just
        finished): the last one to leave unlinks them all, and the control segment."""
        self._views.clear()
        self._free_retired()
        for _gen, mm in self._theirs.values():
            _close(mm)
        self._theirs.clear()
        if self._mine is not None:
            _close(self._mine)
            self._mine = None
        self._left[self.rank] = 1
        last = all(r == self.rank or self._left[r] or not alive(pid)
                   for r, pid in enumerate(self.pids))
        self._counts.release()
        self._aborted_flag.release()
        self._slots = self._left = None  # type: ignore[assignment]
        _close(self._ctl)
        if last:
            for r in range(self.world):
                for gen in range(1, max(self.gen, 63) + 1):
                    _unlink(self._data_name(r, gen))
            _unlink(self._ctl_name)


def _close(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:  # a view of it is still alive: the mapping goes with it
        pass


def _wait_open(name: str, owner: int, timeout: float = 30.0) -> mmap.mmap:
    import posix_ipc

    end = time.monotonic() + timeout
    while True:
        try:
            return _segment(name, 0, create=False)[0]
        except posix_ipc.ExistentialError:
            if time.monotonic() > end or not alive(owner):
                raise CollectiveError(f"the control segment of the group ({name}) never "
                                      "appeared: its rank 0 is gone") from None
            time.sleep(0.001)


# -- the operations --------------------------------------------------------------------------
def _pieces(count: int, itemsize: int) -> list[tuple[int, int]]:
    per = max(1, _PIECE // max(1, itemsize))
    return [(lo, min(count, lo + per)) for lo in range(0, max(count, 1), per)]


def _agree(a: Arena, meta: tuple, timeout: Optional[float], same: bool = True) -> list:
    """Publish this member's ``meta`` (its first item: the operation), wait for every
    member's, and check that all called the same operation (``same``: with the same
    metadata). Returns every member's (generation, meta)."""
    a.publish(meta)
    a.barrier(timeout)
    heads = a.heads()
    if same:
        crc = a.mine(meta)
        if all(h[1] == crc for h in heads):  # (the common case: two integers a member)
            return [(h[0], meta) for h in heads]
    metas = a.metas(heads)
    first = metas[0][1]
    for r, (_gen, m) in enumerate(metas):
        if m[0] != first[0] or (same and m != first):
            a.op += 1  # (everyone fails here alike; the halves stay in step)
            raise CollectiveError(
                f"collective group {a.name!r}: the members disagree -- rank 0 called "
                f"{_say(first)}, rank {r} called {_say(m)}", group=a.name, rank=r)
    return metas


def _say(meta: tuple) -> str:
    return f"{meta[0]}{meta[1:]!r}"


def allreduce(a: Arena, arr: np.ndarray, ufunc: Any, out: np.ndarray, opname: str,
              timeout: Optional[float], rows: bool = False) -> None:
    """``out`` (flat view or array) gets the reduction; ``rows``: chunks follow axis 0
    (``reducescatter``, which reads only its own chunk after it)."""
    flat_in = arr.reshape(-1)
    flat_out = out.reshape(-1)
    dtype, n = arr.dtype, flat_in.size
    if not rows and arr.nbytes <= _SMALL:  # one barrier: each reduces all of it itself
        a.ensure(arr.nbytes)
        np.copyto(a.view(a.rank, a.gen, dtype, n), flat_in)
        metas = _agree(a, ("allreduce", dtype.str, arr.shape, opname), timeout)
        if a.world == 1:
            np.copyto(flat_out, a.view(0, metas[0][0], dtype, n))
        else:  # (rank order: the same bits in every member)
            ufunc(a.view(0, metas[0][0], dtype, n), a.view(1, metas[1][0], dtype, n),
                  out=flat_out)
            for r in range(2, a.world):
                ufunc(flat_out, a.view(r, metas[r][0], dtype, n), out=flat_out)
        a.op += 1
        return
    for plo, phi in _pieces(n, dtype.itemsize) if not rows else [(0, n)]:
        count = phi - plo
        a.ensure(count * dtype.itemsize)
        mine = a.view(a.rank, a.gen, dtype, count)
        np.copyto(mine, flat_in[plo:phi])
        metas = _agree(a, ("allreduce" if not rows else "reducescatter", dtype.str,
                           arr.shape, opname), timeout)
        gens = [g for g, _m in metas]
        bounds = _arrays.row_chunks(arr.shape, a.world) if rows else \
            _arrays.chunks(count, a.world)
        lo, hi = bounds[a.rank]
        if hi > lo:
            acc = mine[lo:hi]
            for r in range(a.world):
                if r != a.rank:
                    ufunc(acc, a.view(r, gens[r], dtype, count)[lo:hi], out=acc)
        a.barrier(timeout)
        if rows:
            np.copyto(flat_out, mine[lo:hi])
        else:
            for r, (clo, chi) in enumerate(bounds):
                if chi > clo:
                    np.copyto(flat_out[plo + clo:plo + chi],
                              a.view(r, gens[r], dtype, count)[clo:chi])
        a.op += 1


def broadcast(a: Arena, arr: Optional[np.ndarray], root: int,
              timeout: Optional[float]) -> np.ndarray:
    held = None
    if a.rank == root:
        assert arr is not None
        a.ensure(arr.nbytes)
        np.copyto(a.view(a.rank, a.gen, arr.dtype, arr.size), arr.reshape(-1))
        held = (arr.dtype.str, arr.shape)
    metas = _agree(a, ("broadcast", root, held), timeout, same=False)
    for r, (_gen, m) in enumerate(metas):
        if m[1] != root:
            a.op += 1
            raise CollectiveError(f"collective group {a.name!r}: the members disagree on "
                                  f"the root of broadcast (rank {a.rank} said {root}, rank "
                                  f"{r} said {m[1]})", group=a.name, rank=r)
    gen, (_what, _root, (dtype_s, shape)) = metas[root]
    dtype = np.dtype(dtype_s)
    count = int(np.prod(shape, dtype=np.int64))
    out = arr.copy() if arr is not None and a.rank == root else \
        a.view(root, gen, dtype, count).copy().reshape(shape)
    a.op += 1
    return out


def allgather(a: Arena, arr: np.ndarray, timeout: Optional[float]) -> list:
    a.ensure(arr.nbytes)
    np.copyto(a.view(a.rank, a.gen, arr.dtype, arr.size), arr.reshape(-1))
    metas = _agree(a, ("allgather", arr.dtype.str, arr.shape), timeout, same=False)
    out = []
    for r, (gen, (_what, dtype_s, shape)) in enumerate(metas):
        dtype = np.dtype(dtype_s)
        count = int(np.prod(shape, dtype=np.int64))
        out.append(arr.copy() if r == a.rank else
                   a.view(r, gen, dtype, count).copy().reshape(shape))
    a.op += 1
    return out


def barrier(a: Arena, timeout: Optional[float]) -> None:
    _agree(a, ("barrier",), timeout)
    a.op += 1
