"""Differential conformance: ``concurrent.futures.ProcessPoolExecutor`` vs dpool's.

Every test runs once per implementation and asserts one expected observation for both
(see conftest.py); documented differences spell out both, citing compat/DIFFERENCES.md.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import sys
import threading
import time

import pytest
from compat_helpers import outcome, skip_stdlib_without_max_tasks_per_child
from compat_tasks import (
    add,
    fail_on,
    get_global,
    getpid,
    init_set_global,
    kw_echo,
    sleep_return,
    square,
)

OK_S = 30


# -- results and exceptions -----------------------------------------------------------------------
def test_submit_result_and_kwargs(Executor):
    with Executor(2) as ex:
        assert ex.submit(add, 1, 2).result(OK_S) == 3
        assert ex.submit(kw_echo, 1, b=2).result(OK_S) == ((1,), [("b", 2)])
        f = ex.submit(square, 4)
        assert f.result(OK_S) == 16 and f.done() and not f.cancelled() and not f.running()
        assert f.exception() is None


def test_exception_type_message_and_remote_traceback(Executor):
    with Executor(1) as ex:
        f = ex.submit(fail_on, 3)
        o = outcome(f.result, OK_S)
        assert o.raised(ValueError) and str(o.exc) == "bad item 3"
        assert "fail_on" in str(o.exc.__cause__)
        assert isinstance(f.exception(), ValueError)


@pytest.mark.parametrize("chunksize", [1, 3])
def test_map_order_several_iterables_and_errors(Executor, chunksize):
    with Executor(2) as ex:
        assert list(ex.map(square, range(20), chunksize=chunksize)) == \
            [x * x for x in range(20)]
        assert list(ex.map(add, [1, 2, 3], [10, 20], chunksize=chunksize)) == [11, 22]
        assert list(ex.map(square, [], chunksize=chunksize)) == []
        it = ex.map(fail_on, range(6), chunksize=chunksize)
        got = []
        o = outcome(lambda: [got.append(x) for x in it])
        assert o.raised(ValueError) and got == [0, 1, 2]
        assert outcome(ex.map, square, [1], chunksize=0).raised(ValueError)


def test_map_is_eager_and_timeout_counts_from_the_call(Executor):
    with Executor(1) as ex:
        it = ex.map(sleep_return, [0.0, 0.6], timeout=0.3)
        assert next(it) is None
        o = outcome(next, it)
        assert o.raised(cf.TimeoutError)


# -- timeouts, waiting ------------------------------------------------------------------
def test_result_timeout(Executor):
    with Executor(1) as ex:
        f = ex.submit(sleep_return, 0.5, "late")
        o = outcome(f.result, 0.05)
        assert o.raised(cf.TimeoutError)
        assert o.raised(TimeoutError) or sys.version_info < (3, 11)  # (one class from 3.11)
        assert outcome(f.exception, 0.01).raised(cf.TimeoutError)
        assert f.result(OK_S) == "late"


def test_wait_and_as_completed_with_timeouts(Executor):
    with Executor(2) as ex:
        fast = ex.submit(square, 2)
        slow = ex.submit(sleep_return, 0.6)
        done, not_done = cf.wait([fast, slow], timeout=0.3)
        assert done == {fast} and not_done == {slow}
        done, not_done = cf.wait([fast, slow], return_when=cf.FIRST_COMPLETED)
        assert fast in done
        o = outcome(lambda: [f.result() for f in cf.as_completed([slow], timeout=0.01)])
        if not slow.done():
            assert o.raised(cf.TimeoutError) and "(of 1) futures unfinished" in str(o.exc)
        done, not_done = cf.wait([fast, slow], return_when=cf.ALL_COMPLETED)
        assert not not_done
        failing = ex.submit(fail_on, 3)
        done, _ = cf.wait([failing, ex.submit(sleep_return, 0.5)],
                          return_when=cf.FIRST_EXCEPTION, timeout=OK_S)
        assert done == {failing}
        assert set(cf.as_completed([fast, slow])) == {fast, slow}


# -- cancel and shutdown ----------------------------------------------------------------
def test_cancel_queued_not_running(Executor):
    with Executor(1) as ex:
        running = ex.submit(sleep_return, 0.5, "r")
        time.sleep(0.2)
        # The stdlib's call queue holds max_workers + 1 calls besides the running one
        # (they are RUNNING and cannot be cancelled); dpool may send one more to a busy
        # worker. Compare from the fourth call on.
        ahead = [ex.submit(square, 1), ex.submit(square, 2)]
        queued = [ex.submit(square, i) for i in range(3)]
        assert running.running() and not running.cancel()
        assert all(f.cancel() for f in queued)
        assert all(f.cancelled() and f.done() for f in queued)
        assert outcome(queued[0].result).raised(cf.CancelledError)
        assert running.result(OK_S) == "r"
        assert [f.result(OK_S) for f in ahead] == [1, 4]


def test_submit_after_shutdown(Executor):
    ex = Executor(1)
    ex.shutdown()
    o = outcome(ex.submit, square, 1)
    assert o.raised(RuntimeError) and str(o.exc) == "cannot schedule new futures after shutdown"
    assert outcome(lambda: list(ex.map(square, [1]))).raised(RuntimeError)
    ex.shutdown()  # twice is fine


def test_shutdown_waits_for_running_and_queued(Executor):
    ex = Executor(1)
    fs = [ex.submit(sleep_return, 0.1, i) for i in range(3)]
    ex.shutdown(wait=True)
    assert all(f.done() for f in fs) and [f.result() for f in fs] == [0, 1, 2]


def test_shutdown_cancel_futures(Executor):
    ex = Executor(1)
    first = ex.submit(sleep_return, 0.4, "first")
    time.sleep(0.15)
    rest = [ex.submit(square, i) for i in range(2, 8)]
    ex.shutdown(wait=True, cancel_futures=True)
    assert first.result() == "first"
    # The stdlib has moved up to two calls to its call queue (they run); the rest are
    # cancelled.
    assert all(f.cancelled() for f in rest[2:])
    assert all(f.done() for f in rest)


def test_shutdown_without_wait(Executor):
    ex = Executor(1)
    f = ex.submit(sleep_return, 1.0, "done")
    t0 = time.monotonic()
    ex.shutdown(wait=False)
    assert time.monotonic() - t0 < 0.75  # returned without waiting for the 1 s task
    assert f.result(OK_S) == "done"
    ex.shutdown(wait=True)


def test_context_manager_waits(Executor):
    with Executor(2) as ex:
        fs = [ex.submit(sleep_return, 0.1, i) for i in range(4)]
    assert [f.result(0) for f in fs] == [0, 1, 2, 3]


# -- callbacks --------------------------------------------------------------------------
def test_done_callbacks_order_and_threads(Executor):
    calls = []

    def cb(tag):
        return lambda f: calls.append((tag, f.result(), threading.current_thread()))

    with Executor(1) as ex:
        f = ex.submit(sleep_return, 0.2, "v")
        f.add_done_callback(cb("a"))
        f.add_done_callback(cb("b"))
        f.result(OK_S)
        time.sleep(0.05)
        f.add_done_callback(cb("late"))  # already done: runs now, on this thread
    assert [(t, v) for t, v, _ in calls] == [("a", "v"), ("b", "v"), ("late", "v")]
    assert calls[0][2] is not threading.main_thread()
    assert calls[0][2] is calls[1][2]
    assert calls[2][2] is threading.main_thread()


def test_callback_that_raises_is_logged_not_fatal(Executor, caplog):
    with Executor(1) as ex:
        f = ex.submit(square, 3)
        f.add_done_callback(lambda f: 1 / 0)
        assert f.result(OK_S) == 9
        assert ex.submit(square, 4).result(OK_S) == 16
    time.sleep(0.05)
    assert any("exception calling callback" in r.getMessage() for r in caplog.records)


# -- construction -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, exc_type, message", [
    ({"max_workers": 0}, ValueError, "max_workers must be greater than 0"),
    ({"max_workers": -1}, ValueError, "max_workers must be greater than 0"),
    ({"initializer": 3}, TypeError, "initializer must be a callable"),
    ({"max_tasks_per_child": 0}, ValueError, "max_tasks_per_child must be >= 1"),
    ({"max_tasks_per_child": "1"}, TypeError, "max_tasks_per_child must be an integer"),
])
def test_constructor_validation(Executor, impl, kwargs, exc_type, message):
    if "max_tasks_per_child" in kwargs:
        skip_stdlib_without_max_tasks_per_child(impl)
    o = outcome(Executor, **kwargs)
    assert o.raised(exc_type) and str(o.exc) == message


def test_initializer_and_initargs(Executor):
    with Executor(2, initializer=init_set_global, initargs=("ready",)) as ex:
        assert set(ex.map(get_global, range(4))) == {"ready"}


def test_max_tasks_per_child(Executor, impl):
    skip_stdlib_without_max_tasks_per_child(impl)
    spawn = multiprocessing.get_context("spawn")
    with Executor(1, mp_context=spawn, max_tasks_per_child=1) as ex:
        pids = [ex.submit(getpid).result(OK_S) for _ in range(2)]
    assert len(set(pids)) == 2
    fork = multiprocessing.get_context("fork")
    o = outcome(Executor, 1, mp_context=fork, max_tasks_per_child=1)
    if impl == "stdlib":
        assert o.raised(ValueError) and "incompatible with the 'fork'" in str(o.exc)
    else:  # DIFFERENCES.md: "max_tasks_per_child works with fork"
        assert o.ok
        with o.value as ex:
            pids = [ex.submit(getpid).result(OK_S) for _ in range(2)]
        assert len(set(pids)) == 2


def test_lambdas_and_closures(Executor, impl):
    offset = 10
    with Executor(1) as ex:
        o = outcome(ex.submit(lambda x: x + offset, 1).result, OK_S)
    if impl == "stdlib":
        assert not o.ok  # PicklingError / AttributeError: functions go by reference
    else:  # DIFFERENCES.md: "lambdas, closures, __main__ functions work"
        assert o.ok and o.value == 11


def test_closure_captured_at_first_submit(Executor, impl):
    box = [1]

    def read():
        return box[0]

    with Executor(1) as ex:
        first = outcome(ex.submit(read).result, OK_S)
        box[0] = 2
        second = outcome(ex.submit(read).result, OK_S)
    if impl == "stdlib":
        assert not first.ok and not second.ok  # a local function does not pickle
    else:  # DIFFERENCES.md: "a function is pickled once per executor run"
        assert (first.value, second.value) == (1, 1)


def test_callbacks_never_run_inside_submit(Executor, impl, request, monkeypatch):
    """A done-callback runs on a pool thread, or inside add_done_callback of a done future --
    never on the submitting thread in the middle of ``submit()`` (where a callback taking a
    lock the submitter holds would deadlock).

    For dpool the scheduler's IO thread is slowed down between gathering completions and
    delivering them, which widens a window that otherwise opens only now and then under
    load (a thread preempted there), so the outcome does not depend on luck.
    """
    if impl == "dpool":
        from dpool.runtime import _current

        sched = _current.driver().scheduler
        deliver = sched.deliver

        def preempted_deliver(out):
            if sched.is_io_thread():
                time.sleep(0.002)
            deliver(out)

        monkeypatch.setattr(sched, "deliver", preempted_deliver)
    where = {"now": "other"}
    inside_submit = []

    def cb(f):
        if threading.current_thread() is threading.main_thread() and where["now"] == "submit":
            inside_submit.append(f)

    with Executor(2) as ex:
        ex.submit(square, 0).result(OK_S)  # workers up: completions flow while we submit
        fs = []
        for i in range(300):
            where["now"] = "submit"
            f = ex.submit(square, i)
            where["now"] = "add"
            f.add_done_callback(cb)
            where["now"] = "other"
            fs.append(f)
            time.sleep(0.0005)
        cf.wait(fs, timeout=OK_S)
    assert not inside_submit


def test_unreferenced_executor_releases_its_workers(Executor, impl, request):
    """The stdlib's manager thread notices a collected executor and stops its workers."""
    import gc

    import psutil

    def gone(pid):
        # The process can exit between any two psutil calls: treat that as gone.
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    pid = Executor(1).submit(getpid).result(OK_S)
    gc.collect()
    deadline = time.monotonic() + 2.5
    try:
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(pid)
    finally:
        if psutil.pid_exists(pid):  # do not leave it to the next tests
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
