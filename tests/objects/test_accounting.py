"""dpool.objects._accounting: capacity, LRU eviction, pins and reference counts."""

from __future__ import annotations

import itertools
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    import dpool.objects  # noqa: F401
except ImportError:  # running from a checkout without an installed dpool
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dpool.errors import ObjectStoreFullError
from dpool.objects import _segment as seg
from dpool.objects._accounting import ObjectStore
from dpool.objects._hoststore import ENV_CAPACITY, default_capacity, parse_size
from dpool.objects._serialization import serialize

pytestmark = pytest.mark.skipif(not os.path.isdir(seg.SHM_DIR), reason="needs /dev/shm")

_ids = itertools.count(1)
PID = os.getpid()



# (leaked segments: checked for every test by tests/conftest.py)


class Recorder:
    def __init__(self) -> None:
        self.evicted: list[int] = []

    def __call__(self, oid: int) -> None:
        self.evicted.append(oid)


@pytest.fixture
def evicted() -> Recorder:
    return Recorder()


@pytest.fixture
def store(evicted: Recorder) -> Iterator[ObjectStore]:
    """A store of 3000 bytes; objects are real (tiny) segments accounted as 1000 bytes."""
    s = ObjectStore(3000, PID, on_evict=evicted)
    yield s
    s.clear()


def put(store: ObjectStore, oid: int, size: int = 1000) -> str:
    """Write a real segment for ``oid`` and add it to the store as ``size`` bytes."""
    name = seg.segment_name(PID, next(_ids) << 16 | oid)
    seg.write_object(name, serialize(oid))
    store.add(oid, name, size)
    return name


def exists(name: str) -> bool:
    try:
        seg.segment_size(name)
    except FileNotFoundError:
        return False
    return True


# -------------------------------------------------------------------- basics
def test_add_and_lookup(store: ObjectStore) -> None:
    name = put(store, 1, 700)
    assert store.contains(1) and 1 in store and 2 not in store
    assert store.location(1) == name
    assert store.size(1) == 700
    assert store.used == 700 and store.capacity == 3000 and len(store) == 1
    assert seg.read_object(store.location(1)) == 1
    with pytest.raises(KeyError):
        store.location(2)
    with pytest.raises(ValueError):
        store.add(1, name, 700)


def test_remove_and_clear_unlink(store: ObjectStore) -> None:
    a, b, c = put(store, 1), put(store, 2), put(store, 3)
    assert store.remove(1)
    assert not store.remove(1)
    assert not exists(a) and store.used == 2000
    store.clear()
    assert not exists(b) and not exists(c)
    assert store.used == 0 and len(store) == 0


def test_segment_name_uses_owner_pid(store: ObjectStore) -> None:
    assert store.segment_name(255) == seg.segment_name(PID, 255) == f"/dpool_{PID}_ff"


# ------------------------------------------------------------------- eviction
def test_lru_eviction_order(store: ObjectStore, evicted: Recorder) -> None:
    names = {oid: put(store, oid) for oid in (1, 2, 3)}
    store.touch(1)  # LRU order is now 2, 3, 1
    put(store, 4)
    assert evicted.evicted == [2]
    assert not exists(names[2]) and 2 not in store
    put(store, 5, 2000)
    assert evicted.evicted == [2, 3, 1]
    assert list(store) == [4, 5] and store.used == 3000


def test_pinned_objects_are_not_evicted(store: ObjectStore, evicted: Recorder) -> None:
    for oid in (1, 2, 3):
        put(store, oid)
    store.pin(1)
    put(store, 4)
    assert evicted.evicted == [2]
    assert 1 in store


def test_full_when_everything_is_pinned(store: ObjectStore, evicted: Recorder) -> None:
    names = [put(store, oid) for oid in (1, 2, 3)]
    for oid in (1, 2, 3):
        store.pin(oid)
    name = seg.segment_name(PID, next(_ids))
    seg.write_object(name, serialize("new"))
    with pytest.raises(ObjectStoreFullError, match="object of 1000 bytes.*3000 bytes"):
        store.add(4, name, 1000)
    assert not exists(name)  # the rejected segment was unlinked
    assert evicted.evicted == [] and all(exists(n) for n in names)
    assert store.used == 3000 and 4 not in store


def test_partial_eviction_is_not_done_when_it_cannot_help(
    store: ObjectStore, evicted: Recorder
) -> None:
    put(store, 1)
    put(store, 2)
    store.pin(2)
    with pytest.raises(ObjectStoreFullError):
        store.reserve(2500)
    assert evicted.evicted == [] and 1 in store  # nothing evicted in vain


def test_object_larger_than_capacity(store: ObjectStore, evicted: Recorder) -> None:
    put(store, 1)
    with pytest.raises(ObjectStoreFullError) as info:
        store.reserve(5000)
    assert "5000" in str(info.value) and "3000" in str(info.value)
    name = seg.segment_name(PID, next(_ids))
    seg.write_object(name, serialize("big"))
    with pytest.raises(ObjectStoreFullError, match="5000.*3000"):
        store.add(2, name, 5000)
    assert not exists(name)
    assert evicted.evicted == [] and 1 in store


def test_reserve_makes_room_without_booking(store: ObjectStore, evicted: Recorder) -> None:
    for oid in (1, 2, 3):
        put(store, oid)
    store.reserve(1500)
    assert evicted.evicted == [1, 2] and store.used == 1000
    store.reserve(2000)  # fits already: nothing more to do
    assert evicted.evicted == [1, 2]


def test_failing_eviction_callback_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    def boom(oid: int) -> None:
        raise RuntimeError("callback failed")

    store = ObjectStore(1000, PID, on_evict=boom)
    try:
        first = put(store, 1)
        with caplog.at_level(logging.ERROR, logger="dpool.objects"):
            put(store, 2)
        assert 1 not in store and 2 in store and not exists(first)
        assert "callback failed" in caplog.text
    finally:
        store.clear()


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ObjectStore(0, PID)


# ---------------------------------------------------------------- ref counts
def test_decref_to_zero_frees(store: ObjectStore, evicted: Recorder) -> None:
    name = put(store, 1)
    store.incref(1, 2)
    assert not store.decref(1)
    assert exists(name) and store.refcount(1) == 1
    assert store.decref(1)
    assert not exists(name) and 1 not in store and store.used == 0
    assert evicted.evicted == []  # freed, not evicted


def test_pins_keep_unreferenced_objects_until_unpinned(store: ObjectStore) -> None:
    name = put(store, 1)
    store.incref(1)
    store.pin(1, 2)
    assert not store.decref(1)  # a pending task still needs it
    assert exists(name)
    assert not store.unpin(1)
    assert store.unpin(1)
    assert not exists(name)


def test_unreferenced_object_is_kept_until_evicted(store: ObjectStore) -> None:
    put(store, 1)  # no handle counted yet (its incref may still be in flight)
    assert 1 in store and store.refcount(1) == 0
    store.incref(1)
    assert store.decref(1)


def test_counts_before_add_and_across_eviction(store: ObjectStore) -> None:
    store.incref(7)  # a future's handle, before its result exists
    store.pin(8)  # a queued task's argument, not produced yet
    put(store, 7)
    put(store, 8)
    assert store.refcount(7) == 1 and store.pincount(8) == 1
    put(store, 9, 2000)  # evicts 7 (unpinned), not 8
    assert 7 not in store and 8 in store
    assert store.refcount(7) == 1  # handles outlive the value: it can be rebuilt
    put(store, 7)  # rebuilt
    assert store.decref(7)
    assert not store.decref(10, 0)


def test_negative_counts_are_rejected(store: ObjectStore) -> None:
    put(store, 1)
    store.incref(1)
    with pytest.raises(ValueError):
        store.decref(1, 2)
    with pytest.raises(ValueError):
        store.unpin(1)
    with pytest.raises(ValueError):
        store.incref(1, -1)
    assert store.refcount(1) == 1 and 1 in store


# ----------------------------------------------------------------- capacity
@pytest.mark.parametrize(
    ("text", "expected"),
    [("1048576", 1 << 20), (" 1_000 ", 1000), ("512M", 512 << 20), ("2g", 2 << 30),
     ("2GiB", 2 << 30), ("64KB", 64 << 10), ("1T", 1 << 40)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["abc", "-5", "0", "1.5G", "10 X", "G"])
def test_bad_env_value(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(ENV_CAPACITY, text)
    with pytest.raises(ValueError, match=ENV_CAPACITY) as info:
        default_capacity()
    assert repr(text) in str(info.value)


def test_env_value_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CAPACITY, "123456789")
    assert default_capacity() == 123456789


def test_default_capacity_without_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    monkeypatch.delenv(ENV_CAPACITY, raising=False)
    shm = os.statvfs(seg.SHM_DIR)
    expected = min(
        int(psutil.virtual_memory().total * 0.30), int(shm.f_blocks * shm.f_frsize * 0.90)
    )
    assert default_capacity() == expected
    monkeypatch.setenv(ENV_CAPACITY, "  ")  # empty counts as unset
    assert default_capacity() == expected
