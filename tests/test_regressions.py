"""Failure scenarios found in review, each held in place by a test (runtime internals)."""

from __future__ import annotations

import gc
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import pytest

import dpool
from dpool import ProcessPoolExecutor


def put_only():
    dpool.put(123)  # a nested call that needs no reply
    return "put ok"


def answer():
    return 42


def test_task_that_only_puts_leaves_its_worker_usable():
    with ProcessPoolExecutor(1) as ex:
        assert ex.submit(put_only).result(10) == "put ok"
        assert ex.submit(answer).result(10) == 42


def leaf(i):
    return i


def parent_from_threads():
    barrier = threading.Barrier(8)

    def one(i):
        barrier.wait()
        return dpool.get_executor().submit(leaf, i).result(timeout=10)

    with ThreadPoolExecutor(8) as tp:
        return [f.result() for f in [tp.submit(one, i) for i in range(8)]]


def test_first_nested_calls_from_many_threads_at_once():
    with ProcessPoolExecutor(2) as ex:
        for _ in range(3):
            assert ex.submit(parent_from_threads).result(30) == list(range(8))


def slow_leaf():
    time.sleep(0.3)
    return 7


def get_by_ref_and_future():
    f = dpool.get_executor().submit(slow_leaf)
    return dpool.get(f.object_ref), f.result(timeout=10)


def test_waiting_on_a_ref_and_its_future_in_a_task():
    with ProcessPoolExecutor(2) as ex:
        assert ex.submit(get_by_ref_and_future).result(30) == (7, 7)


def ident(*a):
    return a


def test_a_failed_submit_does_not_release_its_other_arguments():
    with ProcessPoolExecutor(1) as ex:
        keep = dpool.put("precious")
        dead = ex.submit(ident, 1).object_ref  # its future is dropped at once
        time.sleep(0.3)
        gc.collect()
        time.sleep(0.2)
        with pytest.raises(dpool.ObjectLostError):
            ex.submit(ident, keep, dead).result(10)
        assert ex.submit(ident, keep).result(10) == ("precious",)


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


def _boom():
    raise RuntimeError("cannot unpickle here")


class _Unpicklable:
    def __reduce__(self):
        return (_boom, ())


def make_unpicklable():
    time.sleep(0.3)
    return _Unpicklable()


def test_get_of_a_value_that_cannot_be_unpickled_fails_cleanly():
    with ProcessPoolExecutor(1) as ex:
        f = ex.submit(make_unpicklable)
        with pytest.raises(dpool.SerializationError):
            dpool.get(f.object_ref, timeout=10)
        assert isinstance(f.exception(timeout=10), dpool.SerializationError)
        assert ex.submit(answer).result(10) == 42  # the worker was not blamed


def sum_leaf(a):
    return int(a.sum())


def nested_large_argument():
    return dpool.get_executor().submit(sum_leaf, np.ones(4 << 20, "u1")).result()


def test_nested_task_large_argument_is_freed():
    with ProcessPoolExecutor(2) as ex:
        assert ex.submit(nested_large_argument).result(30) == 4 << 20
    # the no_leaks fixture checks that no segment is left behind


def test_worker_handles_are_released_when_the_task_ends():
    with ProcessPoolExecutor(1) as ex:
        ex.submit(put_only).result(10)
        sched = ex._runtime.scheduler
        deadline = time.monotonic() + 5
        while sched.stats()["objects"] > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sched.stats()["objects"] == 0


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
        other.shutdown(cancel_futures=True)
