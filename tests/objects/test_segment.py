"""dpool.objects._segment: objects in POSIX shared memory, zero-copy and copy-on-write."""

from __future__ import annotations

import ctypes
import errno
import gc
import itertools
import mmap
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
try:
    import dpool.objects  # noqa: F401
except ImportError:  # running from a checkout without an installed dpool
    sys.path.insert(0, str(REPO))

from dpool.errors import ObjectStoreFullError
from dpool.objects import _segment as seg
from dpool.objects._serialization import serialize

pytestmark = pytest.mark.skipif(not os.path.isdir(seg.SHM_DIR), reason="needs /dev/shm")

DEAD_PID = 4_194_304 + 4242  # above Linux's PID_MAX_LIMIT: never a live process
_ids = itertools.count(1)



# (leaked segments: checked for every test by tests/conftest.py)


@pytest.fixture
def name() -> Iterator[str]:
    """A fresh segment name of this process, unlinked after the test."""
    segment = seg.segment_name(os.getpid(), next(_ids))
    yield segment
    seg.unlink(segment)


def store_and_read(name: str, obj: object) -> object:
    size = seg.write_object(name, serialize(obj))
    assert size == seg.segment_size(name)
    return seg.read_object(name)


def mapping_of(arr: np.ndarray) -> object:
    """The object at the end of an array's base chain (past the memoryview)."""
    base: object = arr
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview)
    obj = base.obj
    if isinstance(obj, ctypes.Array):  # a large segment's lending exporter over the mmap
        (inner,) = obj._objects.values()
        obj = inner.obj
    return obj


def reported_size(exc: BaseException) -> int:
    """The object size named in an ObjectStoreFullError's message."""
    match = re.search(r"of (\d+) bytes", str(exc))
    assert match, str(exc)
    return int(match.group(1))


def anon_rss() -> int:
    """Anonymous (private, non-file) resident memory of this process in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no RssAnon in /proc/self/status")


# ----------------------------------------------------------------------- naming
def test_segment_name_format() -> None:
    assert seg.segment_name(1234, 255) == "/dpool_1234_ff"
    assert seg.owner_of(seg.segment_name(99, 2**64 - 1)) == 99
    with pytest.raises(ValueError):
        seg.segment_name(0, 1)
    with pytest.raises(ValueError):
        seg.segment_name(1, -1)


# ------------------------------------------------------------------- round trips
@pytest.mark.parametrize(
    "arr",
    [
        np.arange(100_000, dtype=np.float64),
        np.arange(100_000, dtype=np.int8),
        np.arange(50_000, dtype=np.uint32).reshape(250, 200),
        np.asfortranarray(np.arange(60_000, dtype=np.float32).reshape(200, 300)),
        np.arange(200_000, dtype=np.int64).reshape(400, 500)[::3, ::2],  # non-contiguous
        np.ones(20_000, dtype=np.complex128),
        np.zeros(100_000, dtype=bool),
        np.array(42.0),  # 0-d
        np.zeros((0, 3)),
    ],
    ids=["f8", "i1", "u4-2d", "fortran", "strided", "c16", "bool", "0d", "empty"],
)
def test_array_roundtrip(name: str, arr: np.ndarray) -> None:
    got = store_and_read(name, arr)
    assert isinstance(got, np.ndarray)
    assert got.dtype == arr.dtype and got.shape == arr.shape
    np.testing.assert_array_equal(got, arr)
    assert got.flags.writeable


def test_buffers_are_64_byte_aligned(name: str) -> None:
    obj = [np.arange(70_001, dtype=np.uint8), np.arange(30_000, dtype=np.float64)]
    got = store_and_read(name, obj)
    for arr in got:
        assert arr.ctypes.data % 64 == 0
        assert isinstance(mapping_of(arr), mmap.mmap)
    assert mapping_of(got[0]) is mapping_of(got[1])


def test_objects_without_buffers_and_bytes(name: str) -> None:
    obj = {"a": [1, 2, (3, "x")], "b": b"\x00" * 200_000, "c": None}
    assert store_and_read(name, obj) == obj


def test_nested_structure_with_arrays(name: str) -> None:
    a = np.random.default_rng(0).random((300, 300))
    obj = {"data": [a, {"b": a.T.copy()}], "label": "x", "small": np.arange(3)}
    got = store_and_read(name, obj)
    np.testing.assert_array_equal(got["data"][0], a)
    np.testing.assert_array_equal(got["data"][1]["b"], a.T)
    np.testing.assert_array_equal(got["small"], np.arange(3))
    assert got["label"] == "x"


# ------------------------------------------------------------ zero copy, CoW
def test_reading_a_large_array_allocates_nothing(name: str) -> None:
    source = np.zeros(200 * 2**20 // 8)  # zero pages: cheap to make and to write out
    source[[0, source.size // 2, -1]] = [1.5, 2.5, 3.5]  # touch few pages
    seg.write_object(name, serialize(source))
    markers = float(source.sum())
    del source
    gc.collect()
    before = anon_rss()
    arr = seg.read_object(name)
    total = float(arr.sum())  # touches every page
    grown = anon_rss() - before
    assert total == markers
    assert grown < 40 * 2**20, f"reading grew private memory by {grown} bytes"
    assert isinstance(mapping_of(arr), mmap.mmap)


def test_writes_are_private_to_the_reader(name: str) -> None:
    seg.write_object(name, serialize(np.arange(100_000, dtype=np.int64)))
    first = seg.read_object(name)
    second = seg.read_object(name)
    first[:10] = -1
    assert (second[:10] == np.arange(10)).all()
    assert (seg.read_object(name)[:10] == np.arange(10)).all()


def test_child_process_writes_do_not_change_the_object(name: str) -> None:
    original = np.arange(300_000, dtype=np.float64)
    seg.write_object(name, serialize(original))
    mine = seg.read_object(name)
    child = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        import numpy as np
        from dpool.objects._segment import read_object
        arr = read_object({name!r})
        assert arr.flags.writeable
        arr[:] = -7.0
        assert (arr == -7.0).all()
        """
    )
    subprocess.run([sys.executable, "-c", child], check=True, timeout=30)
    np.testing.assert_array_equal(mine, original)  # a mapping made before the write
    np.testing.assert_array_equal(seg.read_object(name), original)  # and a new one


def test_mapping_outlives_unlink(name: str) -> None:
    seg.write_object(name, serialize(np.arange(100_000, dtype=np.int32)))
    arr = seg.read_object(name)
    assert seg.unlink(name)
    assert not seg.unlink(name)  # missing: ignored
    assert int(arr[-1]) == 99_999
    arr[0] = 5  # still writable (privately)
    with pytest.raises(FileNotFoundError):
        seg.read_object(name)


# ----------------------------------------------------------------- failures
def test_missing_segment(name: str) -> None:
    with pytest.raises(FileNotFoundError):
        seg.read_object(name)
    with pytest.raises(FileNotFoundError):
        seg.segment_size(name)


def test_name_taken(name: str) -> None:
    seg.write_object(name, serialize(1))
    with pytest.raises(FileExistsError):
        seg.write_object(name, serialize(2))
    assert seg.read_object(name) == 1


def test_not_enough_free_space(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seg, "shm_free_bytes", lambda: 1000)
    ser = serialize(np.zeros(200_000, dtype=np.uint8))
    with pytest.raises(ObjectStoreFullError) as info:
        seg.write_object(name, ser)
    assert reported_size(info.value) >= ser.nbytes
    with pytest.raises(FileNotFoundError):
        seg.segment_size(name)


def test_allocation_failure_leaves_nothing(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    ser = serialize(np.zeros(100_000, dtype=np.uint8))
    with pytest.raises(ObjectStoreFullError) as info:
        seg.write_object(name, ser)
    assert reported_size(info.value) >= ser.nbytes
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(FileNotFoundError):
        seg.segment_size(name)


def test_foreign_segment_is_rejected(name: str) -> None:
    import posix_ipc

    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=4096)
    shm.close_fd()
    with pytest.raises(ValueError, match="not a dpool object segment"):
        seg.read_object(name)


# ------------------------------------------------------------------ reaping
@pytest.mark.exclusive  # no other runtime may reap them first (tests/_parallel.py)
def test_reap_orphans_unlinks_only_dead_owners() -> None:
    dead = [seg.segment_name(DEAD_PID, i) for i in (1, 2, 0xABC)]
    alive = seg.segment_name(os.getpid(), next(_ids))
    try:
        for segment in [*dead, alive]:
            seg.write_object(segment, serialize(segment))
        reaped = seg.reap_orphans()
        assert set(dead) <= set(reaped)
        assert alive not in reaped
        assert seg.read_object(alive) == alive
        for segment in dead:
            with pytest.raises(FileNotFoundError):
                seg.segment_size(segment)
    finally:
        for segment in [*dead, alive]:
            seg.unlink(segment)


def test_only_dpool_segment_names_have_an_owner() -> None:
    """``dpool_<pid>_<id>`` (ASCII digits, then ASCII letters and digits) names its owner;
    anything else, 0 (the reaper leaves it alone)."""
    from dpool.objects._owners import owner_of as _owner_of

    assert _owner_of(seg.segment_name(4321, 0xBEEF)) == 4321
    assert _owner_of("dpool_12_ab") == _owner_of("/dpool_12_ab") == 12
    for other in ("dpool_12_", "dpool__ab", "dpool_1x_ab", "dpool_12_a-b", "dpool_12_ab_c",
                  "dpool_١٢_ab", "dpool_12_ä", "xdpool_12_ab", "dpool_12", "dpool_12_ab\n",
                  "psm_12345", ""):
        assert _owner_of(other) == 0, other
