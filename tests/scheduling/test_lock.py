"""The scheduler's lock writes what a locked region decided to send as the region ends."""

from __future__ import annotations

import threading

import pytest

from dpool.protocol import _messages as m
from dpool.scheduling._lock import SchedulerLock

from tests.scheduling._sim import SimScheduler

pytestmark = pytest.mark.timeout(30)


def _recording_lock() -> tuple[SchedulerLock, list]:
    lock = SchedulerLock()
    flushed: list = []

    def flush(outbox: list) -> None:
        assert lock.locked()  # written before the region lets another in
        flushed.append(list(outbox))
        outbox.clear()

    lock.set_flush(flush)
    return lock, flushed


def test_a_region_flushes_its_sends_once_as_it_releases() -> None:
    lock, flushed = _recording_lock()
    with lock:
        lock.outbox.append(("w1", [1]))
        lock.outbox.append(("w2", [3]))
        lock.outbox.append(("w1", [2]))
        assert flushed == []  # nothing written inside the region
    assert flushed == [[("w1", [1]), ("w2", [3]), ("w1", [2])]]
    assert not lock.locked()
    with lock:  # a region that sends nothing writes nothing
        pass
    assert len(flushed) == 1


def test_a_condition_wait_flushes_before_it_lets_others_in() -> None:
    lock, flushed = _recording_lock()
    cond = threading.Condition(lock)  # type: ignore[arg-type]
    with cond:
        lock.outbox.append(("w", [1]))
        cond.wait(0.01)
        assert flushed == [[("w", [1])]]
        assert lock.locked()  # held again after the wait


def test_a_failing_flush_still_releases_the_lock() -> None:
    lock = SchedulerLock()

    def flush(outbox: list) -> None:
        outbox.clear()
        raise OSError("boom")

    lock.set_flush(flush)
    with pytest.raises(OSError):
        with lock:
            lock.outbox.append(("w", [1]))
    assert not lock.locked()
    assert lock.acquire(timeout=1)
    lock.release()


def test_sends_to_one_worker_in_one_region_arrive_in_order_as_one_frame() -> None:
    sim = SimScheduler()
    g = sim.group(max_workers=1)
    tid, _ = sim.task(g)
    (w,) = sim.started
    w.hello()
    assert w.tasks() == [tid]
    with sim.lock:
        sim.send_locked(w.handle, [m.CancelTask((tid,))])
        sim.send_locked(w.handle, [m.Shutdown()])
        assert w.chan.recv_ready() == []  # not written while the region runs
    frames = w.chan.recv_ready()
    assert len(frames) == 1
    from dpool.protocol._codec import decode_batch

    assert [type(x) for x in decode_batch(frames[0])] == [m.CancelTask, m.Shutdown]
    sim.shutdown()
