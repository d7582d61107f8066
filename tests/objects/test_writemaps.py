"""Kept writable mappings of recycled segments (_writemaps): reused for the next write
into the same pages, never holding a lock or pages longer than the segment lives, never
inherited by a fork. Real segments in /dev/shm, a real fork."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np
import pytest

from dpool.objects import _mapping, _recycle, _writemaps
from dpool.objects import _segment as seg
from dpool.objects._serialization import serialize
from dpool.transfer import _pull
from tests.objects._large import N, new_name, write

pytestmark = pytest.mark.skipif(not os.path.isdir(seg.SHM_DIR), reason="needs /dev/shm")


@pytest.fixture
def pool() -> Iterator[_recycle.SegmentPool]:
    p = _recycle.SegmentPool(os.getpid(), 1 << 30, ttl_s=30)
    yield p
    p.purge(everything=True)


def ino(name: str) -> int:
    return os.stat(seg.SHM_DIR + name).st_ino


def test_the_next_write_into_the_same_pages_reuses_the_mapping(names, pool):
    first = write(names, 1.0)
    pages = ino(first)
    assert _writemaps.kept() == 0  # fresh pages: written with pwrite, nothing mapped
    assert pool.retire(first, seg.segment_size(first))
    second = write(names, 2.0)  # the pool's pages, through a mapping, kept
    assert _writemaps.kept() == 1
    (entry,) = _writemaps._entries.values()
    assert pool.retire(second, seg.segment_size(second))
    third = write(names, 3.0)
    assert ino(third) == pages
    assert list(_writemaps._entries.values()) == [entry]  # the same mapping, again
    assert float(seg.read_object(third).sum()) == 3.0 * N


def test_a_kept_mapping_holds_no_lock_on_the_segment(names, pool):
    """A mapping keeps the file description it was made from, and with it that
    description's flock: made from the claim's descriptor, it held the claim's exclusive
    lock -- every holder's send and every later claim found the segment busy."""
    first = write(names, 1.0)
    assert pool.retire(first, seg.segment_size(first))
    second = write(names, 2.0)
    assert _writemaps.kept() == 1
    fd = _pull._open_held(seg.SHM_DIR + second, 0)  # a holder about to send it
    assert fd is not None
    os.close(fd)
    assert float(seg.read_object(second).sum()) == 2.0 * N
    _mapping.clear()
    pages = ino(second)
    assert pool.retire(second, seg.segment_size(second))
    third = write(names, 3.0)
    assert ino(third) == pages  # claimed: nobody held it


def test_a_mapping_goes_once_its_segment_has_no_name(names, pool):
    first = write(names, 1.0)
    assert pool.retire(first, seg.segment_size(first))
    second = write(names, 2.0)
    assert _writemaps.kept() == 1
    assert _writemaps.prune() == 0  # still named: kept
    seg.unlink(second)  # freed, not pooled
    _writemaps.prune()  # (or the timer, if it looked in between: either lets go)
    assert _writemaps.kept() == 0


def test_the_timer_lets_go_of_an_unlinked_segment(names, pool):
    first = write(names, 1.0)
    assert pool.retire(first, seg.segment_size(first))
    second = write(names, 2.0)
    assert _writemaps.kept() == 1
    seg.unlink(second)
    deadline = time.monotonic() + 30
    while _writemaps.kept() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _writemaps.kept() == 0


def test_a_grown_segment_is_mapped_again(names, pool):
    first = write(names, 1.0)
    pages = ino(first)
    assert pool.retire(first, seg.segment_size(first))
    second = write(names, 2.0)
    assert pool.retire(second, seg.segment_size(second))
    name = new_name(names)
    seg.write_object(name, serialize(np.full(N + N // 2, 4.0)))  # the same pages, grown
    assert ino(name) == pages
    assert float(seg.read_object(name).sum()) == 4.0 * (N + N // 2)
    (entry,) = _writemaps._entries.values()
    assert entry.length >= seg.segment_size(name)


def _mapped_inodes() -> set[int]:
    with open("/proc/self/maps") as f:
        return {int(parts[4]) for parts in (line.split() for line in f) if len(parts) > 5}


def _open_inodes() -> set[int]:
    out = set()
    for f in os.listdir("/proc/self/fd"):
        try:
            out.add(os.stat(f"/proc/self/fd/{f}").st_ino)
        except OSError:
            pass
    return out


def test_a_forked_child_inherits_no_mapping_and_no_descriptor(names, pool):
    first = write(names, 1.0)
    assert pool.retire(first, seg.segment_size(first))
    second = write(names, 2.0)
    assert _writemaps.kept() == 1
    pages = ino(second)
    assert pages in _mapped_inodes() and pages in _open_inodes()  # kept here
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.write(w, f"{_writemaps.kept()} {int(pages in _mapped_inodes())} "
                        f"{int(pages in _open_inodes())}".encode())
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 100).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert got == "0 0 0", got  # kept entries, mapped, open -- none in the child
    assert pages in _mapped_inodes()  # the parent keeps it


def test_a_kept_mapping_of_a_segment_that_shrank_gives_only_its_bytes(names):
    """A pool segment cut down for a smaller value keeps the inode: the kept mapping is
    reused, but what the writer gets ends where the segment now ends (a store past it
    would be a SIGBUS)."""
    path = seg.SHM_DIR + f"/dpool_writemaps_test_{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, 8 << 20)
        with _writemaps.mapped(fd, 8 << 20) as mem:
            assert mem.nbytes == 8 << 20
            mem[:4] = b"abcd"
        (entry,) = _writemaps._entries.values()
        os.ftruncate(fd, 2 << 20)
        with _writemaps.mapped(fd, 2 << 20) as mem:
            assert mem.nbytes == 2 << 20 and bytes(mem[:4]) == b"abcd"
            mem[-1:] = b"z"
        assert list(_writemaps._entries.values()) == [entry]  # the same mapping, reused
        assert os.pread(fd, 1, (2 << 20) - 1) == b"z"
    finally:
        os.close(fd)
        os.unlink(path)
    _writemaps.prune()  # no name left: let go (here, or by the timer meanwhile)
    assert _writemaps.kept() == 0
