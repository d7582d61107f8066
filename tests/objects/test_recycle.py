"""Large segments: cached read mappings (_mapping) and recycled pages (_recycle).

Both are speed-ups that must never be observable as data changing under a reader: a
task's writes never reach the next task, and a freed object's pages are never rewritten
while anyone still holds a view of them.
"""

from __future__ import annotations

import gc
import os
import time

import numpy as np
import pytest

import dpool
from dpool import ProcessPoolExecutor
from dpool.objects import _mapping, _recycle
from dpool.objects import _segment as seg
from dpool.objects._serialization import serialize
from tests.objects._large import N, new_name, write

pytestmark = pytest.mark.skipif(not os.path.isdir(seg.SHM_DIR), reason="needs /dev/shm")


def exporter_mmap(arr: np.ndarray) -> object:
    """The mmap under a large segment's array (array -> memoryview -> ctypes -> mmap)."""
    base: object = arr
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview)
    (inner,) = base.obj._objects.values()
    return inner.obj


# ------------------------------------------------------------------ read mappings
def test_second_read_reuses_the_mapping_once_the_first_views_are_gone(names):
    name = write(names, 1.0)
    a = seg.read_object(name)
    first = exporter_mmap(a)
    assert float(a.sum()) == N
    del a
    gc.collect()
    assert name in _mapping.cached()
    b = seg.read_object(name)
    assert exporter_mmap(b) is first
    assert float(b.sum()) == N


def test_a_written_mapping_is_never_reused(names):
    name = write(names, 1.0)
    a = seg.read_object(name)
    a[123] = 99.0  # copy-on-write: a private page now
    first = exporter_mmap(a)
    del a
    gc.collect()
    b = seg.read_object(name)
    assert exporter_mmap(b) is not first
    assert b[123] == 1.0 and float(b.sum()) == N


def test_live_views_are_never_shared_between_reads(names):
    name = write(names, 1.0)
    a = seg.read_object(name)
    b = seg.read_object(name)
    assert exporter_mmap(a) is not exporter_mmap(b)
    a[:] = 3.0
    assert float(b.sum()) == N


def test_forget_and_prune_drop_mappings_whose_pages_are_gone(names):
    one, two = write(names, 1.0), write(names, 2.0)
    for name in (one, two):
        seg.read_object(name)
    gc.collect()
    assert {one, two} <= set(_mapping.cached())
    _mapping.forget([one])  # its pages still have a name: kept, they may be recycled
    assert one in _mapping.cached()
    seg.unlink(one)
    _mapping.forget([one])
    assert one not in _mapping.cached()
    seg.unlink(two)
    _mapping.prune()
    assert two not in _mapping.cached()


def test_a_mapping_serves_the_object_that_recycles_its_pages(names):
    pool = _recycle.SegmentPool(os.getpid(), 1 << 30, ttl_s=30)
    try:
        old = write(names, 1.0)
        first = exporter_mmap(seg.read_object(old))
        gc.collect()
        assert pool.retire(old, seg.segment_size(old))
        new = write(names, 2.0)  # same inode, same size, new contents
        got = seg.read_object(new)
        assert exporter_mmap(got) is first  # no page faulted in again
        assert float(got.sum()) == 2.0 * N
        got[7] = 9.0  # a private page now: this mapping must not serve the next one
        del got
        gc.collect()
        assert pool.retire(new, seg.segment_size(new))
        third = write(names, 3.0)
        got = seg.read_object(third)
        assert exporter_mmap(got) is not first
        assert float(got.sum()) == 3.0 * N
    finally:
        pool.purge()


def test_small_segments_bypass_the_cache(names):
    name = new_name(names)
    seg.write_object(name, serialize(np.ones(1000)))
    seg.read_object(name)
    gc.collect()
    assert name not in _mapping.cached()


# ------------------------------------------------------------------------ recycling
def test_a_freed_segment_is_reused_for_the_next_large_write(names):
    pool = _recycle.SegmentPool(os.getpid(), 1 << 30, ttl_s=30)
    try:
        old = write(names, 1.0)
        inode = os.stat(seg.SHM_DIR + old).st_ino
        assert pool.retire(old, seg.segment_size(old))
        assert not os.path.exists(seg.SHM_DIR + old)
        new = write(names, 2.0)
        assert os.stat(seg.SHM_DIR + new).st_ino == inode  # same pages, new name
        got = seg.read_object(new)
        assert float(got.sum()) == 2.0 * N
    finally:
        pool.purge()


def test_recycling_never_rewrites_pages_a_reader_still_sees(names):
    pool = _recycle.SegmentPool(os.getpid(), 1 << 30, ttl_s=30)
    try:
        old = write(names, 1.0)
        held = seg.read_object(old)  # e.g. an array the user got back from dpool.get
        inode = os.stat(seg.SHM_DIR + old).st_ino
        assert pool.retire(old, seg.segment_size(old))
        new = write(names, 2.0)
        assert os.stat(seg.SHM_DIR + new).st_ino != inode  # fresh pages, not held's
        assert float(held.sum()) == N
        assert float(seg.read_object(new).sum()) == 2.0 * N
        assert pool.purge() == 0  # the held segment was unlinked, not put back
    finally:
        pool.purge()


def test_a_smaller_or_larger_write_reuses_and_resizes(names):
    pool = _recycle.SegmentPool(os.getpid(), 1 << 30, ttl_s=30)
    try:
        for n in (N // 2, 2 * N):
            old = write(names, 1.0)
            assert pool.retire(old, seg.segment_size(old))
            new = new_name(names)
            size = seg.write_object(new, serialize(np.full(n, 4.0)))
            assert seg.segment_size(new) == size
            got = seg.read_object(new)
            assert got.shape == (n,) and float(got.sum()) == 4.0 * n
            del got
            gc.collect()
            seg.unlink(new)
    finally:
        pool.purge()


def test_pool_segments_expire(names):
    pool = _recycle.SegmentPool(os.getpid(), 1 << 30, ttl_s=0.2)
    old = write(names, 1.0)
    assert pool.retire(old, seg.segment_size(old))
    assert pool.bytes > 0
    deadline = time.monotonic() + 5
    while pool.bytes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.bytes == 0
    assert not os.path.exists(_recycle.pool_dir(os.getpid()))  # emptied and removed


def test_pool_refuses_small_segments_and_respects_its_budget(names):
    pool = _recycle.SegmentPool(os.getpid(), max_bytes=N * 8 + (1 << 16), ttl_s=30)
    try:
        small = new_name(names)
        seg.write_object(small, serialize(np.ones(1000)))
        assert not pool.retire(small, seg.segment_size(small))
        one, two = write(names, 1.0), write(names, 1.0)
        assert pool.retire(one, seg.segment_size(one))
        assert not pool.retire(two, seg.segment_size(two))  # over budget: caller unlinks
    finally:
        pool.purge()


def test_a_claimed_segment_leaves_the_budget_to_the_next_freed_one(names):
    """A pool with room for one segment: once a write claimed it, the segment that
    write's object leaves when freed is pooled in turn, not unlinked. (The claimed one
    used to count until its expiry: every other large write got fresh pages.)"""
    pool = _recycle.SegmentPool(os.getpid(), max_bytes=N * 8 + (1 << 16), ttl_s=30)
    try:
        inodes = set()
        name = write(names, 1.0)
        for value in (2.0, 3.0, 4.0):
            inodes.add(os.stat(seg.SHM_DIR + name).st_ino)
            assert pool.retire(name, seg.segment_size(name))
            name = write(names, value)  # claims the pooled one
            assert os.stat(seg.SHM_DIR + name).st_ino in inodes
            assert float(seg.read_object(name).sum()) == value * N  # written over, whole
            assert pool.bytes == 0  # (the claimed one is the new object's, not the pool's)
        assert len(inodes) == 1
    finally:
        pool.purge()


# ------------------------------------------------------------- through the executor
def mutate_and_sum(a):
    a[:] = 5.0
    return float(a.sum())


def total(a):
    return float(a.sum())


_stash: list = []


def stash(a):
    _stash.append(a)
    return float(a.sum())


def stashed_total():
    return float(_stash[-1].sum())


def cached_here():
    gc.collect()
    return _mapping.cached()


STORE = 256 << 20  # the runtime's store is shared: set a cap that leaves room for a pool


def test_freed_pages_are_reused_by_the_next_put():
    with ProcessPoolExecutor(1, object_store_memory=STORE) as ex:
        ref = dpool.put(np.ones(N))
        assert ex.submit(total, ref).result(30) == N
        del ref
        wait_pooled()
        ref2 = dpool.put(np.full(N, 3.0))
        assert not pooled()  # claimed by the put
        assert ex.submit(total, ref2).result(30) == 3.0 * N
        del ref2


def test_a_task_write_never_reaches_the_next_task_on_the_same_worker():
    with ProcessPoolExecutor(1) as ex:
        ref = dpool.put(np.ones(N))
        assert ex.submit(total, ref).result(30) == N
        assert ex.submit(total, ref).result(30) == N  # served from the cached mapping
        assert ex.submit(mutate_and_sum, ref).result(30) == 5.0 * N
        assert ex.submit(total, ref).result(30) == N
        assert ex.submit(total, np.ones(N)).result(30) == N
        del ref


def pooled() -> list[str]:
    try:
        return os.listdir(_recycle.pool_dir(os.getpid()))
    except FileNotFoundError:
        return []


def wait_pooled() -> None:
    """Wait until a freed segment of this driver sits in the recycling pool."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if pooled():
            return
        time.sleep(0.005)
    raise AssertionError("the freed segment never reached the pool")


def test_freed_objects_pages_are_not_reused_under_a_live_view():
    with ProcessPoolExecutor(1, object_store_memory=STORE) as ex:
        for _ in range(3):  # a few rounds, so recycled pages come into play
            ref = dpool.put(np.ones(N))
            held = dpool.get(ref)  # the driver keeps a view
            assert ex.submit(stash, ref).result(30) == N  # and so does the worker
            del ref  # freed: its segment goes to the pool
            wait_pooled()
            ref2 = dpool.put(np.full(N, 7.0))
            assert ex.submit(total, ref2).result(30) == 7.0 * N
            assert float(held.sum()) == N
            assert ex.submit(stashed_total).result(30) == N
            del ref2, held


def test_workers_unmap_cached_mappings_of_freed_objects():
    with ProcessPoolExecutor(1) as ex:
        ref = dpool.put(np.ones(N))
        ex.submit(total, ref).result(30)
        assert len(ex.submit(cached_here).result(30)) == 1
        del ref
        deadline = time.monotonic() + 5
        while ex.submit(cached_here).result(30) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ex.submit(cached_here).result(30) == []


@pytest.mark.exclusive  # no other runtime may reap it first (tests/_parallel.py)
def test_a_dead_owners_pool_is_reaped():
    dead_pid = 4_194_304 + 4243  # above Linux's PID_MAX_LIMIT: never a live process
    pool = _recycle.pool_dir(dead_pid)
    os.makedirs(pool)
    with open(f"{pool}/0", "wb") as fh:
        fh.write(b"x" * 4096)
    assert "/" + os.path.basename(pool) in seg.reap_orphans()
    assert not os.path.exists(pool)


# ------------------------------------------------------- found in review (regressions)
def deleted_shm_fds() -> list[str]:
    """Descriptors of this process on dpool segments that no longer have a name."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(seg.SHM_DIR + "/dpool") and target.endswith("(deleted)"):
            out.append(target)
    return out


def test_a_forked_childs_inherited_view_keeps_its_pages(names):
    pool = _recycle.SegmentPool(os.getpid(), 1 << 30, ttl_s=30)
    old, new = new_name(names), new_name(names)
    try:
        seg.write_object(old, serialize(np.full(N, 1.0)))
        held = seg.read_object(old)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                os.close(w)
                os.read(r, 1)  # the parent dropped its view and wrote a new object
                os._exit(0 if float(held.sum()) == N else 1)
            finally:
                os._exit(2)
        os.close(r)
        del held
        gc.collect()  # the parent's unlock must not drop the child's protection
        assert pool.retire(old, seg.segment_size(old))
        seg.write_object(new, serialize(np.full(N // 2, 2.0)))  # smaller: would SIGBUS
        os.write(w, b"x")
        os.close(w)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        pool.purge()


def test_freed_results_leave_no_descriptor_or_pages_behind():
    with ProcessPoolExecutor(2) as ex:
        futures = [ex.submit(np.full, N, 3.0) for _ in range(4)]
        results = [f.result(30) for f in futures]
        del futures
        gc.collect()
        assert sum(float(r.sum()) for r in results) == 4 * 3.0 * N
        del results
        gc.collect()
        deadline = time.monotonic() + 5  # handles are released on the scheduler's tick
        while (deleted_shm_fds() or _mapping.cached()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert deleted_shm_fds() == []
        assert _mapping.cached() == []


def worker_deleted_shm_fds():
    gc.collect()
    return deleted_shm_fds()


def test_spilling_tells_workers_to_unmap():
    with ProcessPoolExecutor(1, object_store_memory=5 * N * 8 // 2) as ex:
        a = dpool.put(np.ones(N))
        assert ex.submit(total, a).result(30) == N  # the worker caches a's mapping
        b = dpool.put(np.ones(N))
        c = dpool.put(np.ones(N))  # over the cap: a is spilled to disk
        deadline = time.monotonic() + 5
        while ex.submit(worker_deleted_shm_fds).result(30) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ex.submit(worker_deleted_shm_fds).result(30) == []
        assert ex.submit(total, a).result(30) == N  # brought back from disk
        del a, b, c


def test_writing_an_existing_name_fails_with_or_without_a_pool(names):
    pool = _recycle.SegmentPool(os.getpid(), 1 << 30, ttl_s=30)
    try:
        taken = write(names, 5.0)
        with pytest.raises(FileExistsError):
            seg.write_object(taken, serialize(np.full(N, 6.0)))
        spare = write(names, 1.0)
        assert pool.retire(spare, seg.segment_size(spare))
        with pytest.raises(FileExistsError):
            seg.write_object(taken, serialize(np.full(N, 6.0)))
        assert float(seg.read_object(taken).sum()) == 5.0 * N
    finally:
        pool.purge()


@pytest.mark.parametrize("error", [OSError(24, "Too many open files"), KeyboardInterrupt()])
def test_a_failed_claim_leaves_nothing_behind(names, monkeypatch, error):
    pool = _recycle.SegmentPool(os.getpid(), 1 << 30, ttl_s=30)
    try:
        spare = write(names, 1.0)
        assert pool.retire(spare, seg.segment_size(spare))
        target = new_name(names)
        real_open = os.open

        def failing_open(path, *args, **kwargs):
            if "/claim-" in str(path):
                raise error
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(_recycle.os, "open", failing_open)
        with pytest.raises(type(error)):
            seg.write_object(target, serialize(np.full(N, 2.0)))
        monkeypatch.undo()
        assert not os.path.exists(seg.SHM_DIR + target)
        assert pooled() == []  # the claimed segment is gone, not left under a temp name
    finally:
        pool.purge()


def test_release_gives_the_pool_back_from_any_process(names):
    pool = _recycle.SegmentPool(os.getpid(), 1 << 30, ttl_s=30)
    try:
        olds = [write(names, 1.0) for _ in range(2)]
        for old in olds:
            assert pool.retire(old, seg.segment_size(old))
        assert len(pooled()) == 2
        assert _recycle.release(os.getpid()) == 2
        assert pooled() == []
    finally:
        pool.purge()


def test_workers_let_go_of_pooled_pages_once_the_pool_expires():
    with ProcessPoolExecutor(1, object_store_memory=STORE) as ex:
        ref = dpool.put(np.ones(N))
        assert ex.submit(total, ref).result(30) == N
        del ref
        wait_pooled()  # the worker may keep its mapping: the pages can serve a new object
        deadline = time.monotonic() + 5
        while (pooled() or ex.submit(worker_deleted_shm_fds).result(30)) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pooled() == []
        assert ex.submit(worker_deleted_shm_fds).result(30) == []
        assert ex.submit(cached_here).result(30) == []


def test_fork_waits_for_a_segment_write_in_flight():
    """A child forked mid-write would inherit the writer's exclusive lock (readers of
    that object would block for the child's life): fork waits for the write."""
    import threading

    from dpool.objects import _forkguard

    entered, release = threading.Event(), threading.Event()
    ended = []

    def writer():
        with _forkguard.no_fork():
            entered.set()
            release.wait(5)
            time.sleep(0.2)
            ended.append(time.monotonic())

    t = threading.Thread(target=writer)
    t.start()
    assert entered.wait(5)
    release.set()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os._exit(0)
    forked = time.monotonic()
    os.waitpid(pid, 0)
    t.join(5)
    assert ended and forked >= ended[0]


def worker_deleted_shm_maps():
    gc.collect()
    with open("/proc/self/maps") as fh:
        return [line.split(None, 5)[-1].strip() for line in fh
                if "/dev/shm/dpool" in line and "(deleted)" in line]


def test_a_claim_that_finds_its_segment_still_read_does_not_leave_pages_pinned():
    with ProcessPoolExecutor(1, object_store_memory=STORE) as ex:
        a = dpool.put(np.ones(N))
        assert ex.submit(total, a).result(30) == N  # the worker keeps a's mapping
        view = dpool.get(a)  # and the driver a live view
        del a
        wait_pooled()
        b = dpool.put(np.full(N, 2.0))  # the claim finds a still read: a is unlinked
        del view
        gc.collect()
        deadline = time.monotonic() + 5  # the owner announces it within a pool lifetime
        while (ex.submit(worker_deleted_shm_fds).result(30)
               or ex.submit(worker_deleted_shm_maps).result(30)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ex.submit(worker_deleted_shm_fds).result(30) == []
        assert ex.submit(worker_deleted_shm_maps).result(30) == []
        assert float(dpool.get(b).sum()) == 2.0 * N
        del b


def test_recycling_can_be_turned_off(names, monkeypatch):
    monkeypatch.setenv("DPOOL_SEGMENT_POOL_TTL", "0")
    assert _recycle.pool_ttl() == 0.0
    pool = _recycle.SegmentPool(os.getpid(), 1 << 30)
    old = write(names, 1.0)
    assert not pool.retire(old, seg.segment_size(old))  # the caller unlinks it
    monkeypatch.setenv("DPOOL_SEGMENT_POOL_TTL", "not a number")
    assert _recycle.pool_ttl() == 0.5


def test_a_childs_locks_are_taken_before_the_fork(names):
    """The parent locks a description per live view *before* forking, so the child holds
    its lock from its first instant: the parent dropping its own views right after the
    fork can no longer let a writer recycle the pages under the child (the order that
    raced: parent unlocks, a writer takes the exclusive lock, the child had not run yet).
    Driven without a fork: the hooks themselves, in the order a fork runs them."""
    import fcntl

    old = new_name(names)
    seg.write_object(old, serialize(np.full(N, 1.0)))
    held = seg.read_object(old)
    _mapping._before_fork()  # (what os.fork runs first, in the parent)
    try:
        assert len(_mapping._for_child) >= 1
        kept = [fd for _entry, fd in _mapping._for_child]
    finally:
        _mapping._for_child.clear()  # (the child's copies: here, this test's)
    del held
    gc.collect()  # the parent's views are gone: its own lock with them
    probe = os.open(seg.SHM_DIR + old, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):  # still locked, for the "child"
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for fd in kept:
            os.close(fd)  # the child's views went
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # now a writer may reuse it
    finally:
        os.close(probe)
