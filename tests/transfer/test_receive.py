"""How a range's bytes reach the segment (``transfer._ranges.receive``), and which pages
a copy lands in (``objects._recycle``): real sockets, real segments, a real holder."""

from __future__ import annotations

import errno
import itertools
import os
import time

import numpy as np
import pytest

import dpool
from dpool.node import _server
from dpool.objects import _recycle, _segment, _values
from dpool.objects._serialization import serialize
from dpool.transfer import _conns, _pull, _push, _ranges
from tests.transfer.conftest import exists, stored

pytestmark = pytest.mark.skipif(not os.path.isdir(_segment.SHM_DIR), reason="needs /dev/shm")

TOKEN = b"r" * 32
_ids = itertools.count(1 << 20)


@pytest.fixture
def holder():
    """The address of a holder serving this host's store (``_pull.serve``)."""
    srv = _server.NodeServer(TOKEN, "127.0.0.1", 0, None, None, lambda c, h: c.close(),
                             on_fetch=lambda s, r: _pull.serve(s, r.name, r.offset,
                                                               r.length))
    srv.start()
    try:
        yield f"127.0.0.1:{srv.address[1]}"
    finally:
        _conns.close_all()
        srv.close()


def _stored(value, segments: list) -> str:
    return stored(value, segments, next(_ids))


def _fetch(address: str, name: str, segments: list):
    oid = next(_ids)
    segments.append(_segment.segment_name(os.getpid(), oid))
    return _pull.fetch(address, TOKEN, name, oid, os.getpid(), _segment.segment_size(name),
                       timeout=10)


def _value(payload: bytes):
    return _segment.read_object(_values.stored(payload)[1])


needs_splice = pytest.mark.skipif(not _ranges._splice_ok, reason="no splice(2) here")


@needs_splice
def test_a_range_is_spliced_into_the_segment_not_copied_through_a_buffer(
        holder, segments, monkeypatch):
    def buffered(*args: object) -> None:
        raise AssertionError("received through a buffer")

    monkeypatch.setattr(_ranges, "_buffered", buffered)
    value = np.random.default_rng(1).random(3 << 20)  # 24 MB: two ranges
    got = _value(_fetch(holder, _stored(value, segments), segments))
    assert np.array_equal(got, value)


@needs_splice
def test_a_kernel_that_cannot_splice_from_the_socket_falls_back_to_a_buffer(
        holder, segments, monkeypatch):
    calls = []

    def refuses(*args: object, **kwargs: object) -> int:
        calls.append(args)
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(_ranges, "_splice_ok", True)  # (restored after the test)
    monkeypatch.setattr(_ranges.os, "splice", refuses)
    value = np.arange(1 << 20, dtype=np.float64)
    got = _value(_fetch(holder, _stored(value, segments), segments))
    assert np.array_equal(got, value)
    assert len(calls) == 1 and not _ranges._splice_ok  # tried once, then not again
    got = _value(_fetch(holder, _stored(value, segments), segments))
    assert np.array_equal(got, value) and len(calls) == 1


@pytest.mark.parametrize("late", [False, True], ids=["", "late-range"])
@pytest.mark.parametrize("path", ["spliced", "buffered"])
def test_an_upload_that_finds_the_store_full_part_way_is_refused_whole(
        segments, monkeypatch, path, late):
    """The node reads the rest of the upload and drops it, then answers "full": the
    driver gets ObjectStoreFullError (not a reset connection), nothing is left.
    ``late``: the other ranges ask only once the node has dropped the upload (a busy
    driver's threads start late): they hear "full" too, not "no upload under way"."""
    if path == "buffered":
        monkeypatch.setattr(_ranges, "_splice_ok", False)
    elif not _ranges._splice_ok:
        pytest.skip("no splice(2) here")
    real_drain, real_pwrite = _ranges._drain, _segment._pwrite_all
    written = [0]

    def fills_up(real):
        def write(*args, **kwargs):
            fd = args[1] if real is real_drain else args[0]
            if os.readlink(f"/proc/self/fd/{fd}") != os.devnull:
                written[0] += 1
                if written[0] > 2:  # a few chunks in, the store is full
                    raise OSError(errno.ENOSPC, "No space left on device")
            return real(*args, **kwargs)
        return write

    monkeypatch.setattr(_ranges, "_drain", fills_up(real_drain))
    monkeypatch.setattr(_segment, "_pwrite_all", fills_up(real_pwrite))
    oid = (0x5A6 << 40) | next(_ids)
    name = _segment.segment_name(os.getpid(), oid)
    segments.append(name)
    kept = []
    receiver = _push.Receiver(os.getpid(), lambda oid, size: None,
                              lambda n, s: kept.append(n) or True)
    srv = _server.NodeServer(TOKEN, "127.0.0.1", 0, None, None, lambda c, h: c.close(),
                             on_push=lambda s, r: receiver.serve(s, r.object_id, r.size,
                                                                 r.offset, r.length))
    if late:
        real_range = _push._Upload._range

        def late_range(self, offset, length):
            deadline = time.monotonic() + 10
            while name in receiver._incoming and time.monotonic() < deadline:
                time.sleep(0.01)  # until the first range's failure dropped the upload
            return real_range(self, offset, length)

        monkeypatch.setattr(_push._Upload, "_range", late_range)
    srv.start()
    try:
        with pytest.raises(dpool.ObjectStoreFullError):
            _push.push("127.0.0.1", srv.address[1], TOKEN, oid,
                       serialize(np.ones(6 << 20)), timeout=10)
        assert written[0] > 2 and not kept
        deadline = time.monotonic() + 10
        while exists(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not exists(name)
    finally:
        _conns.close_all()
        srv.close()


def test_a_pool_segment_over_twice_the_size_is_left_for_a_larger_value(segments):
    """Cutting most of a big freed segment for a small value costs more than fresh pages
    and takes the pages the next big value wants: such a write gets fresh pages."""
    pool = _recycle.SegmentPool(os.getpid(), 1 << 30, ttl_s=30)
    try:
        big = _stored(np.ones(2 << 20), segments)  # 16 MB
        big_ino = os.stat(_segment.SHM_DIR + big).st_ino
        assert pool.retire(big, _segment.segment_size(big))
        small = _stored(np.ones(1 << 19), segments)  # 4 MB: fresh pages
        assert os.stat(_segment.SHM_DIR + small).st_ino != big_ino
        assert pool.bytes > 0 and len(os.listdir(_recycle.pool_dir(os.getpid()))) == 1
        half = _stored(np.ones(1 << 20), segments)  # 8 MB: the big one's pages
        assert os.stat(_segment.SHM_DIR + half).st_ino == big_ino
        assert float(_segment.read_object(half).sum()) == 1 << 20
    finally:
        pool.purge(everything=True)


def test_a_larger_segment_stays_pooled_longer():
    """A pool segment lives the TTL plus ``LINGER_S_PER_GIB`` per GiB of its size: the
    next value of that size takes longer to make, and fresh pages cost more."""
    pool = _recycle.SegmentPool(os.getpid(), 1 << 31, ttl_s=0.25)
    names = []
    try:
        for mb in (1, 256):
            name = _segment.segment_name(os.getpid(), next(_ids))
            names.append(name)
            fd = _segment._create(name, mb << 20, allocate=False)
            os.close(fd)
            before = time.monotonic()
            assert pool.retire(name, mb << 20)
            path = max(pool._entries, key=lambda p: pool._entries[p][0] == mb << 20)
            expiry = pool._entries[path][1]
            assert expiry - before >= 0.25 + _recycle.LINGER_S_PER_GIB * mb / 1024
            assert expiry - before < 0.25 + _recycle.LINGER_S_PER_GIB * mb / 1024 + 5
    finally:
        pool.purge(everything=True)
        for n in names:
            _segment.unlink(n)


@needs_splice
def test_a_child_forked_during_a_spliced_receive_keeps_none_of_its_pipe():
    """Between its two splices a pipe holds pages of the transfer: a worker forked then
    must not keep them (the pipe's descriptors are closed in the child)."""
    pipe = _ranges._open_pipe()
    assert pipe is not None
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if both descriptors are closed here
            code = 0
            for fd in pipe:
                try:
                    os.fstat(fd)
                    code = 1
                except OSError:
                    pass
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        os.fstat(pipe[0])  # the parent's are open still
    finally:
        _ranges._close_pipe(pipe)
    assert pipe not in _ranges._pipes
