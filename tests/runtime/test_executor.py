"""The ProcessPoolExecutor surface: results, map, errors, initializer, shutdown."""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

import dpool
from dpool import ProcessPoolExecutor


def square(x):
    return x * x


def add(a, b=0, *, c=0):
    return a + b + c


def fail(msg):
    raise ValueError(msg)


def getpid(_=None):
    return os.getpid()


def sleep_return(t, value=None):
    time.sleep(t)
    return value


_init_value = None


def set_init(value):
    global _init_value
    _init_value = value


def get_init(_=None):
    return _init_value


def test_submit_result_and_future_types():
    with ProcessPoolExecutor(2) as ex:
        f = ex.submit(add, 1, 2, c=3)
        assert isinstance(f, cf.Future) and isinstance(f, dpool.Future)
        assert f.result(timeout=10) == 6
        assert f.done() and not f.cancelled() and f.exception() is None


def test_lambdas_closures_and_local_functions():
    k = 7

    def local(x):
        return x + k

    with ProcessPoolExecutor(2) as ex:
        assert ex.submit(lambda x: x * 3, 5).result(10) == 15
        assert ex.submit(local, 1).result(10) == 8
        assert list(ex.map(lambda x: -x, range(5))) == [0, -1, -2, -3, -4]


def test_map_orders_results_and_chunks():
    with ProcessPoolExecutor(2) as ex:
        assert list(ex.map(square, range(100))) == [x * x for x in range(100)]
        assert list(ex.map(add, range(50), range(50), chunksize=7)) == [2 * x for x in range(50)]
        assert list(ex.map(square, [])) == []
        with pytest.raises(ValueError):
            ex.map(square, range(3), chunksize=0)


def test_map_timeout_counts_from_the_call():
    with ProcessPoolExecutor(1) as ex:
        it = ex.map(sleep_return, [0.0, 2.0, 2.0], timeout=0.5)
        assert next(it) is None
        t0 = time.monotonic()
        with pytest.raises(cf.TimeoutError):
            next(it)
        assert time.monotonic() - t0 < 1.5
        ex._terminate("the test is done")  # (not waiting for the 2 s tasks)


def test_exception_carries_remote_traceback():
    with ProcessPoolExecutor(1) as ex:
        f = ex.submit(fail, "boom")
        with pytest.raises(ValueError, match="boom") as info:
            f.result(10)
        cause = info.value.__cause__
        assert cause is not None and "fail" in str(cause) and "raise ValueError" in str(cause)
        assert isinstance(f.exception(), ValueError)
        # the executor keeps working after a task raised
        assert ex.submit(square, 4).result(10) == 16


def test_stdlib_wait_and_as_completed_with_timeouts():
    with ProcessPoolExecutor(2) as ex:
        fast = ex.submit(sleep_return, 0.0, "fast")
        slow = ex.submit(sleep_return, 3.0, "slow")
        done, not_done = cf.wait([fast, slow], timeout=1.0, return_when=cf.FIRST_COMPLETED)
        assert fast in done and slow in not_done
        with pytest.raises(cf.TimeoutError):
            for _ in cf.as_completed([slow], timeout=0.2):
                pass
        with pytest.raises(cf.TimeoutError):
            slow.result(timeout=0.1)
        ex._terminate("the test is done")  # (not waiting for the 3 s task)


def test_cancel_pending_but_not_running():
    with ProcessPoolExecutor(1) as ex:
        running = ex.submit(sleep_return, 1.0, 1)
        time.sleep(0.3)
        queued = [ex.submit(square, i) for i in range(5)]
        assert not running.cancel()
        # like the stdlib's call queue, at most one task per worker may already be
        # handed to it (RUNNING) behind the running one; the rest cancel
        cancelled = [f.cancel() for f in queued]
        assert sum(cancelled) >= len(queued) - 1 and all(cancelled[1:])
        assert running.result(10) == 1
        assert all(f.cancelled() for f in queued[1:])
        with pytest.raises(cf.CancelledError):
            queued[-1].result()


def test_shutdown_cancel_futures_and_submit_after_shutdown():
    ex = ProcessPoolExecutor(1)
    first = ex.submit(sleep_return, 0.5, "done")
    time.sleep(0.2)
    rest = [ex.submit(square, i) for i in range(10)]
    ex.shutdown(wait=True, cancel_futures=True)
    assert first.result() == "done"
    assert all(f.cancelled() for f in rest)
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(square, 1)
    ex.shutdown()  # idempotent


def test_shutdown_without_wait_still_finishes_work():
    ex = ProcessPoolExecutor(2)
    fs = [ex.submit(sleep_return, 0.1, i) for i in range(4)]
    ex.shutdown(wait=False)
    assert [f.result(10) for f in fs] == [0, 1, 2, 3]


def test_initializer_runs_in_every_worker():
    with ProcessPoolExecutor(2, initializer=set_init, initargs=("ready",)) as ex:
        assert set(ex.map(get_init, range(10))) == {"ready"}


def test_initializer_failure_breaks_the_pool_like_stdlib():
    ex = ProcessPoolExecutor(1, initializer=fail, initargs=("init failed",))
    f = ex.submit(square, 2)
    with pytest.raises(BrokenProcessPool):
        f.result(timeout=20)
    with pytest.raises(BrokenProcessPool):
        ex.submit(square, 3)
    ex.shutdown()


def test_max_tasks_per_child_replaces_workers():
    with ProcessPoolExecutor(1, max_tasks_per_child=2) as ex:
        pids = [ex.submit(getpid).result(10) for _ in range(6)]
    assert len(set(pids)) == 3


def test_bad_arguments_are_rejected_like_stdlib():
    with pytest.raises(ValueError):
        ProcessPoolExecutor(0)
    with pytest.raises(TypeError):
        ProcessPoolExecutor(1, initializer=42)
    with pytest.raises(ValueError):
        ProcessPoolExecutor(1, max_tasks_per_child=0)
    with pytest.raises(ValueError):
        ProcessPoolExecutor(1, max_attempts=0)


def test_unpicklable_argument_fails_that_future_only():
    lock = threading.Lock()
    with ProcessPoolExecutor(1) as ex:
        f = ex.submit(square, lock)
        with pytest.raises(TypeError, match="pickle"):
            f.result(10)
        assert ex.submit(square, 3).result(10) == 9


def make_lock():
    return threading.Lock()


def test_unpicklable_result_fails_that_future_only():
    with ProcessPoolExecutor(1) as ex:
        f = ex.submit(make_lock)
        with pytest.raises(TypeError, match="pickle"):
            f.result(10)
        assert ex.submit(square, 3).result(10) == 9


def test_done_callbacks_fire():
    got = []
    ev = threading.Event()
    with ProcessPoolExecutor(1) as ex:
        f = ex.submit(square, 5)
        f.add_done_callback(lambda fut: (got.append(fut.result()), ev.set()))
        assert ev.wait(10)
    assert got == [25]


def test_callback_may_submit_more_work():
    results = []
    ev = threading.Event()
    with ProcessPoolExecutor(2) as ex:
        def chain(fut):
            results.append(fut.result())
            if len(results) < 5:
                ex.submit(square, len(results)).add_done_callback(chain)
            else:
                ev.set()
        ex.submit(square, 0).add_done_callback(chain)
        assert ev.wait(20)
    assert results == [0, 1, 4, 9, 16]


def test_workers_share_cwd_and_sys_path(tmp_path, monkeypatch):
    mod = tmp_path / "dpool_test_helper_mod.py"
    mod.write_text("def where():\n    import os\n    return os.getcwd()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import dpool_test_helper_mod

    spawn = __import__("multiprocessing").get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as ex:
        assert ex.submit(dpool_test_helper_mod.where).result(60) == str(tmp_path)


def test_executor_alias_and_get_executor():
    assert dpool.Executor is ProcessPoolExecutor
    ex = dpool.get_executor()
    assert ex.submit(square, 6).result(10) == 36
    assert dpool.get_executor() is ex
    ex.shutdown()


class _LockedCallable:
    def __init__(self):
        self.lock = threading.Lock()

    def __call__(self):
        return 1


def test_unpicklable_function_fails_that_future_only():
    with ProcessPoolExecutor(1) as ex:
        f = ex.submit(_LockedCallable())
        with pytest.raises(TypeError, match="pickle"):
            f.result(10)
        assert ex.submit(square, 2).result(10) == 4


# -- found in review: executors collected or terminated while others run ---------------
def ident(*a):
    return a


def test_executor_collected_while_the_scheduler_is_busy():
    ex = ProcessPoolExecutor(1)
    other = ProcessPoolExecutor(1)  # kept alive only by a done-callback below
    busy = ex.submit(time.sleep, 0.5)
    f = ex.submit(time.sleep, 0)
    f.add_done_callback(lambda _f, keep=other: None)
    f.cancel()
    del f, other
    busy.result(10)
    assert ex.submit(int, 3).result(10) == 3
    ex.shutdown()


def test_terminate_fails_tasks_waiting_on_another_executors_result():
    with ProcessPoolExecutor(1) as other:
        slow = other.submit(time.sleep, 3)
        ex = ProcessPoolExecutor(1)
        waiting = ex.submit(ident, slow)
        t0 = time.monotonic()
        ex._terminate("terminated")
        ex.shutdown(wait=True)
        assert time.monotonic() - t0 < 2.5
        with pytest.raises(BrokenProcessPool):
            waiting.result(1)
        other._terminate("the test is done")  # (not waiting for the 3 s task)
