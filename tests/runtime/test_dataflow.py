"""Beyond the stdlib: futures as arguments, tasks that submit tasks, dpool.wait/get/put."""

from __future__ import annotations

import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import dpool
from dpool import ProcessPoolExecutor


def add(a, b):
    return a + b


def inc(x):
    return x + 1


def fail(msg):
    raise KeyError(msg)


def slow(t, v):
    time.sleep(t)
    return v


def fib(n):
    if n < 2:
        return n
    ex = dpool.get_executor()
    a = ex.submit(fib, n - 1)
    b = ex.submit(fib, n - 2)
    return a.result() + b.result()


def fan_out(n):
    ex = dpool.get_executor()
    fs = [ex.submit(inc, i) for i in range(n)]
    done, not_done = dpool.wait(fs, num_returns=n, timeout=30)
    assert not not_done
    return sum(dpool.get(fs))


def nested_chain(depth):
    if depth == 0:
        return 0
    return dpool.get_executor().submit(nested_chain, depth - 1).result() + 1


def test_future_as_argument_is_a_dependency():
    with ProcessPoolExecutor(2) as ex:
        a = ex.submit(slow, 0.3, 1)
        b = ex.submit(inc, a)  # waits for a, receives its value
        c = ex.submit(add, a, b)
        assert c.result(10) == 3 and b.result(10) == 2


def test_long_chain_of_dependencies():
    with ProcessPoolExecutor(2) as ex:
        f = ex.submit(inc, 0)
        for _ in range(50):
            f = ex.submit(inc, f)
        assert f.result(30) == 51


def test_failed_dependency_propagates_its_exception():
    with ProcessPoolExecutor(2) as ex:
        bad = ex.submit(fail, "missing")
        child = ex.submit(inc, bad)
        with pytest.raises(KeyError, match="missing"):
            child.result(10)


def test_futures_pass_between_executors():
    with ProcessPoolExecutor(1) as ex1, ProcessPoolExecutor(1) as ex2:
        a = ex1.submit(inc, 10)
        b = ex2.submit(inc, a)
        assert b.result(10) == 12


def test_put_get_and_refs_as_arguments():
    ref = dpool.put({"k": [1, 2, 3]})
    assert dpool.get(ref) == {"k": [1, 2, 3]}
    with ProcessPoolExecutor(2) as ex:
        f = ex.submit(len, ref)
        assert f.result(10) == 1
        assert dpool.get([f, ref]) == [1, {"k": [1, 2, 3]}]


def test_tasks_submit_tasks_with_one_worker():
    # every level blocks on its child: only works if blocked workers give their slot back
    with ProcessPoolExecutor(1) as ex:
        assert ex.submit(nested_chain, 4).result(60) == 4


def test_recursive_fib():
    with ProcessPoolExecutor(2) as ex:
        assert ex.submit(fib, 6).result(120) == 8


def test_wait_inside_task():
    with ProcessPoolExecutor(2) as ex:
        assert ex.submit(fan_out, 20).result(60) == sum(range(1, 21))


def test_dpool_wait_num_returns_and_timeout():
    with ProcessPoolExecutor(2) as ex:
        fs = [ex.submit(slow, 0.05, 1), ex.submit(slow, 3, 2), ex.submit(slow, 0.05, 3)]
        t0 = time.monotonic()
        done, not_done = dpool.wait(fs, num_returns=2, timeout=2)
        assert done == [fs[0], fs[2]] and not_done == [fs[1]]
        assert time.monotonic() - t0 < 1.5
        done, not_done = dpool.wait(fs, num_returns=3, timeout=0.1)
        assert fs[1] in not_done
        with pytest.raises(ValueError):
            dpool.wait(fs, num_returns=4)
        with pytest.raises(TimeoutError):
            dpool.get(fs[1], timeout=0.1)
        ex._terminate("the test is done")  # (not waiting for the 3 s task)


# -- found in review: puts and gets in tasks, references' lifetimes ----------------------
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


def total(refs):
    return sum(dpool.get(refs))


def test_refs_inside_an_argument_live_until_the_task_reads_them():
    """Only the handle keeps an object: ``[dpool.put(1), ex.submit(...)]`` is a temporary
    that goes right after ``submit``, and the task (queued behind a slow one) reads the
    objects by id later. The submitting client keeps them until the task ends."""
    with ProcessPoolExecutor(1) as ex:
        ex.submit(time.sleep, 0.5)  # the next task waits behind it
        fut = ex.submit(total, [dpool.put(1), ex.submit(inc, 1), {"x": dpool.put(3)}["x"]])
        gc.collect()
        assert fut.result(30) == 6
        assert fut._pins is None  # let go once the task ended: only its result is left
        sched = ex._runtime.scheduler
        deadline = time.monotonic() + 5
        while sched.stats()["objects"] > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sched.stats()["objects"] == 1
