"""The driver's latency path: a thread blocked in result() reads its worker's socket
itself (``LocalScheduler.lead``). What it must keep: callbacks on the IO thread, timeouts,
worker deaths, many waiting threads at once, and the IO thread serving the others."""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time

import pytest

from dpool import ProcessPoolExecutor


def noop(x=None):
    return x


def sleepy(s):
    time.sleep(s)
    return s


def die_once(marker):
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)
    return "second attempt"


def wait_for(marker, x):
    while not os.path.exists(marker):
        time.sleep(0.001)
    return x


def test_results_are_read_by_the_waiting_thread(tmp_path, monkeypatch):
    """Each task ends only once the thread waiting for it leads (holds ``_leading``), so
    the result can only be read by the IO thread if the leader does not read it -- not
    because a loaded machine kept the waiting thread off a CPU until the task was done
    (seen in CI with no-op tasks)."""
    from dpool.protocol import _ioloop
    from dpool.runtime import _current

    assert _ioloop.SPIN_S < _ioloop.LEAD_S
    monkeypatch.setattr(_ioloop, "LEAD_S", 30.0)  # (the helper below may be slow to run)
    with ProcessPoolExecutor(2) as ex:
        for _ in range(20):
            ex.submit(noop).result()
        sched = _current.driver().scheduler
        led = []
        orig = sched._deliver_leading

        def spy(out):
            led.append(len(out))
            return orig(out)

        def release_when_led(marker):
            deadline = time.monotonic() + 60
            while not sched._leading.locked() and time.monotonic() < deadline:
                time.sleep(0.001)
            open(marker, "w").close()

        sched._deliver_leading = spy
        try:
            for i in range(3):
                marker = str(tmp_path / f"go-{i}")
                f = ex.submit(wait_for, marker, i)
                helper = threading.Thread(target=release_when_led, args=(marker,),
                                          daemon=True)
                helper.start()
                assert f.result(timeout=60) == i
                helper.join(60)
        finally:
            del sched._deliver_leading
        assert led, "no result was delivered by the thread waiting for it"


def test_done_callbacks_still_run_on_the_io_thread():
    with ProcessPoolExecutor(2) as ex:
        ex.submit(noop).result()
        names = []
        for i in range(20):
            f = ex.submit(noop, i)
            f.add_done_callback(lambda _f: names.append(threading.current_thread().name))
            assert f.result() == i
        deadline = time.monotonic() + 5
        while len(names) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert names == ["dpool-scheduler-io"] * 20


def test_timeout_while_leading():
    with ProcessPoolExecutor(1) as ex:
        ex.submit(noop).result()
        f = ex.submit(sleepy, 0.5)
        t0 = time.monotonic()
        with pytest.raises(cf.TimeoutError):
            f.result(timeout=0.05)
        assert time.monotonic() - t0 < 0.4
        assert f.result() == 0.5


def test_many_threads_waiting_at_once():
    with ProcessPoolExecutor(2) as ex:
        ex.submit(noop).result()

        def client(k):
            return [ex.submit(noop, (k, i)).result() for i in range(100)]

        with cf.ThreadPoolExecutor(4) as threads:
            outs = list(threads.map(client, range(4)))
        assert outs == [[(k, i) for i in range(100)] for k in range(4)]


def test_worker_death_while_the_waiter_reads(tmp_path):
    with ProcessPoolExecutor(1) as ex:
        ex.submit(noop).result()
        assert ex.submit(die_once, str(tmp_path / "m")).result(timeout=30) == "second attempt"
        assert ex.submit(noop, 7).result() == 7


def test_pool_apply_results_are_read_by_the_waiting_thread():
    """``Pool.apply`` (no callback) leads as ``result()`` does: the outcome is applied on
    the calling thread, with no hop from the IO thread."""
    from dpool import Pool
    from dpool.runtime import _current

    with Pool(2) as pool:
        for _ in range(20):
            pool.apply(noop)
        sched = _current.driver().scheduler
        led = []
        orig = sched._deliver_leading

        def spy(out):
            led.append(threading.current_thread().name)
            return orig(out)

        sched._deliver_leading = spy
        try:
            assert [pool.apply(noop, (i,)) for i in range(50)] == list(range(50))
        finally:
            del sched._deliver_leading
        assert "MainThread" in led, "no result was delivered by the thread waiting for it"


def test_pool_callbacks_still_run_on_the_pools_result_thread():
    """With a callback, the result is not led: callbacks run, in order, on the pool's
    one result thread, as the stdlib's do."""
    from dpool import Pool

    with Pool(2) as pool:
        pool.apply(noop)
        names = []
        for i in range(20):
            r = pool.apply_async(noop, (i,),
                                 callback=lambda _v: names.append(threading.current_thread().name))
            assert r.get(10) == i
        pool.close()
        pool.join()
        assert names == ["dpool-pool-results"] * 20
