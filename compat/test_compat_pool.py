"""Differential conformance: ``multiprocessing.Pool`` vs ``dpool.Pool``.

Every test runs once per implementation and asserts one expected observation for both
(see conftest.py); documented differences spell out both, citing compat/DIFFERENCES.md.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import pickle
import threading
import time

import pytest
from compat_helpers import outcome
from compat_tasks import (
    add,
    fail_on,
    get_global,
    getpid,
    identity,
    init_set_global,
    kw_echo,
    raise_error,
    sleep_return,
    sleep_square,
    slow_then_fast,
    square,
)

OK_S = 30


# -- results -----------------------------------------------------------------------------------
def test_apply_and_apply_async(Pool):
    with Pool(2) as p:
        assert p.apply(add, (2, 3)) == 5
        assert p.apply(kw_echo, (1,), {"k": 2}) == ((1,), [("k", 2)])
        r = p.apply_async(add, [4], {"b": 5})
        assert r.get(timeout=10) == 9
        assert r.ready() and r.successful()
        assert r.wait(0) is None


@pytest.mark.parametrize("chunksize", [None, 1, 3, 100])
def test_map_keeps_order(Pool, chunksize):
    with Pool(2) as p:
        assert p.map(square, range(37), chunksize) == [x * x for x in range(37)]
        assert p.map_async(square, range(9), chunksize).get(10) == [x * x for x in range(9)]


def test_map_accepts_any_iterable(Pool):
    with Pool(2) as p:
        assert p.map(square, (x for x in range(5))) == [0, 1, 4, 9, 16]
        assert sorted(p.map(square, {1, 2, 3})) == [1, 4, 9]
        assert p.map(square, []) == []
        assert p.starmap(add, []) == []


def test_empty_map_async_is_ready_and_skips_callback(Pool):
    calls = []
    with Pool(1) as p:
        r = p.map_async(square, [], callback=calls.append)
        assert r.ready() and r.successful() and r.get() == []
        time.sleep(0.05)
    assert calls == []  # the stdlib never calls it for an empty input


@pytest.mark.parametrize("chunksize", [None, 1, 2])
def test_starmap(Pool, chunksize):
    with Pool(2) as p:
        assert p.starmap(add, [(1, 2), [3, 4], (5,)], chunksize) == [3, 7, 5]
        assert p.starmap_async(pow, [(2, 5), (3, 2)], chunksize).get(10) == [32, 9]


def test_default_chunksize_matches_stdlib(Pool, impl):
    """Default chunksize = ceil(len / (4 * processes)): observed via pids per chunk."""
    with Pool(1) as p:
        pids = p.map(getpid, range(9))
    assert len(set(pids)) == 1
    if impl == "dpool":
        from dpool.pool import MapResult

        with Pool(2) as p:
            r = p.map_async(square, range(17))
            assert isinstance(r, MapResult) and r._chunksize == 3  # ceil(17 / 8)
            r.get(10)


# -- exceptions --------------------------------------------------------------------------------
def test_apply_exception_type_message_and_remote_traceback(Pool):
    with Pool(2) as p:
        o = outcome(p.apply, fail_on, (3,))
        assert o.raised(ValueError) and str(o.exc) == "bad item 3"
        assert "fail_on" in str(o.exc.__cause__)  # the worker's traceback, as text
        r = p.apply_async(raise_error, (KeyError, "k"))
        r.wait(10)
        assert r.ready() and not r.successful()
        assert outcome(r.get).raised(KeyError)


def test_map_raises_first_error_after_all_chunks(Pool):
    with Pool(2) as p:
        t0 = time.monotonic()
        o = outcome(p.map, fail_on, [3, 0, 1], 1)
        assert o.raised(ValueError) and str(o.exc) == "bad item 3"
        r = p.map_async(sleep_square, [0, 1, 2, 3])
        r.get(10)
        # Not ready before the slowest chunk, even though one failed at once.
        r2 = p.starmap_async(_sleep_or_fail, [(0.0, True), (0.4, False)], 1)
        time.sleep(0.15)
        assert not r2.ready()
        assert outcome(r2.get, 10).raised(ValueError)
        assert time.monotonic() - t0 >= 0.4


def _sleep_or_fail(seconds, fail):
    from compat_tasks import fail_on, sleep_return

    sleep_return(seconds)
    return fail_on(3) if fail else 0


def test_exceptions_are_raised_never_returned(Pool):
    with Pool(2) as p:
        assert outcome(p.map, fail_on, range(6)).raised(ValueError)
        it = p.imap(fail_on, range(6))
        seen = []
        while True:
            o = outcome(next, it)
            if o.raised(StopIteration):
                break
            seen.append(o.value if o.ok else type(o.exc).__name__)
        assert seen == [0, 1, 2, "ValueError", 4, 5]


def test_chunked_imap_stops_at_first_error(Pool):
    with Pool(2) as p:
        it = p.imap(fail_on, range(8), chunksize=2)
        got = [next(it), next(it)]
        assert got == [0, 1]
        assert outcome(next, it).raised(ValueError)
        assert outcome(next, it).raised(StopIteration)


def test_unpicklable_argument_fails_that_call_only(Pool):
    with Pool(2) as p:
        o = outcome(p.apply, identity, (threading.Lock(),))
        assert o.raised(TypeError, pickle.PicklingError)
        assert "pickle" in str(o.exc)
        assert p.apply(square, (3,)) == 9


def test_imap_iterable_that_raises(Pool):
    def items():
        yield 1
        yield 2
        raise ZeroDivisionError("the input broke")

    for chunksize in (1, 2):
        with Pool(2) as p:
            it = p.imap(square, items(), chunksize)
            assert [next(it), next(it)] == [1, 4]
            o = outcome(next, it)
            assert o.raised(ZeroDivisionError) and str(o.exc) == "the input broke"
            assert outcome(next, it).raised(StopIteration)


def test_map_iterable_that_raises_raises_in_caller(Pool):
    def items():
        yield 1
        raise ZeroDivisionError("the input broke")

    with Pool(1) as p:
        assert outcome(p.map, square, items()).raised(ZeroDivisionError)


# -- imap ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunksize", [1, 4])
def test_imap_order_and_generators(Pool, chunksize):
    with Pool(2) as p:
        assert list(p.imap(square, (x for x in range(25)), chunksize)) == \
            [x * x for x in range(25)]
        assert sorted(p.imap_unordered(square, iter(range(25)), chunksize)) == \
            sorted(x * x for x in range(25))
        assert list(p.imap(square, [])) == []
        assert list(p.imap_unordered(square, iter([]))) == []


def test_imap_unordered_yields_in_completion_order(Pool):
    with Pool(2) as p:
        out = list(p.imap_unordered(slow_then_fast, range(4)))
    assert sorted(out) == [0, 1, 2, 3] and out[-1] == 0


def test_imap_consumes_endless_generator(Pool):
    import itertools

    with Pool(2) as p:
        it = p.imap(square, itertools.count())
        assert [next(it) for _ in range(20)] == [x * x for x in range(20)]


def test_imap_next_timeout(Pool):
    with Pool(1) as p:
        it = p.imap(sleep_return, [0.5, 0.0])
        o = outcome(it.next, timeout=0.05)
        assert o.raised(multiprocessing.TimeoutError)
        assert it.next(timeout=10) is None
        assert next(it) is None
        assert outcome(it.next, 0.01).raised(StopIteration)
        it2 = p.imap_unordered(sleep_return, [0.3])
        assert outcome(it2.next, 0.01).raised(multiprocessing.TimeoutError)
        assert it2.next(10) is None


@pytest.mark.parametrize("method", ["imap", "imap_unordered"])
def test_imap_bad_chunksize(Pool, method):
    with Pool(1) as p:
        o = outcome(getattr(p, method), square, [1], 0)
        assert o.raised(ValueError) and str(o.exc).startswith("Chunksize must be 1+")


# -- AsyncResult ---------------------------------------------------------------------------------
def test_async_result_protocol(Pool):
    with Pool(1) as p:
        r = p.apply_async(sleep_return, (0.4, "v"))
        assert not r.ready()
        o = outcome(r.successful)
        assert o.raised(ValueError) and "not ready" in str(o.exc)
        assert outcome(r.get, 0.05).raised(multiprocessing.TimeoutError)
        t0 = time.monotonic()
        assert r.wait(0.05) is None and time.monotonic() - t0 < 0.3
        assert r.get(10) == "v" and r.successful()
        m = p.map_async(sleep_return, [0.3])
        assert outcome(m.get, 0.01).raised(multiprocessing.TimeoutError)
        assert m.get(10) == [None]


# -- callbacks -----------------------------------------------------------------------------------
def test_callbacks_run_on_one_result_thread_before_get_returns(Pool):
    seen = []

    def cb(value):
        time.sleep(0.05)  # get() must still wait for the callback
        seen.append((value, threading.current_thread()))

    with Pool(1) as p:
        results = [p.apply_async(square, (i,), callback=cb) for i in range(5)]
        assert results[-1].get(10) == 16
        assert [v for v, _ in seen] == [0, 1, 4, 9, 16]  # in completion order: FIFO here
        threads = {t for _, t in seen}
        assert len(threads) == 1 and threading.main_thread() not in threads


def test_error_callback_gets_the_exception(Pool):
    got = []
    with Pool(1) as p:
        r = p.apply_async(fail_on, (3,), callback=got.append, error_callback=got.append)
        assert outcome(r.get, 10).raised(ValueError)
        m = p.map_async(fail_on, range(5), 1, callback=got.append, error_callback=got.append)
        assert outcome(m.get, 10).raised(ValueError)
        ok = p.map_async(square, range(3), callback=got.append, error_callback=got.append)
        ok.get(10)
        s = p.starmap_async(add, [(1, 1)], callback=got.append)
        s.get(10)
    assert [type(x).__name__ for x in got[:2]] == ["ValueError", "ValueError"]
    assert got[2:] == [[0, 1, 4], [2]]


# -- lifetime ------------------------------------------------------------------------------------
def test_close_then_submit_raises(Pool):
    p = Pool(1)
    p.close()
    for call in (lambda: p.apply_async(square, (1,)), lambda: p.map(square, [1]),
                 lambda: p.imap(square, [1]), lambda: p.imap_unordered(square, [1]),
                 lambda: p.starmap_async(add, [(1, 2)]), lambda: p.apply(square, (1,))):
        o = outcome(call)
        assert o.raised(ValueError) and str(o.exc) == "Pool not running"
    o = outcome(p.__enter__)
    assert o.raised(ValueError) and str(o.exc) == "Pool not running"
    p.join()


def test_join_requires_close_or_terminate(Pool):
    p = Pool(1)
    o = outcome(p.join)
    assert o.raised(ValueError) and str(o.exc) == "Pool is still running"
    p.terminate()
    p.join()


def test_close_join_finishes_submitted_work(Pool):
    done = []
    p = Pool(2)
    rs = [p.apply_async(sleep_return, (0.1, i), callback=done.append) for i in range(4)]
    m = p.map_async(square, range(10))
    p.close()
    p.join()
    assert sorted(done) == [0, 1, 2, 3]  # callbacks have run when join returns
    assert [r.get(0) for r in rs] == [0, 1, 2, 3] and m.get(0) == [x * x for x in range(10)]


def test_close_then_iterate_imap(Pool):
    p = Pool(2)
    it = p.imap(square, range(30))
    p.close()
    assert list(it) == [x * x for x in range(30)]
    p.join()


def test_context_manager_terminates(Pool, impl):
    calls = []
    with Pool(1) as p:
        assert p.apply(square, (2,)) == 4
        r = p.apply_async(sleep_return, (5.0,), callback=calls.append,
                          error_callback=calls.append)
    assert p._state == "TERMINATE"
    t0 = time.monotonic()
    p.join()
    assert time.monotonic() - t0 < 3
    assert calls == []  # no callback for work cut off by terminate()
    if impl == "stdlib":
        assert outcome(r.get, 0.05).raised(multiprocessing.TimeoutError)  # never ready
    else:  # DIFFERENCES.md: "terminate() fails the unfinished results"
        from concurrent.futures.process import BrokenProcessPool

        assert r.ready() and outcome(r.get, 0).raised(BrokenProcessPool)


def test_terminate_twice_and_close_after_terminate(Pool):
    p = Pool(1)
    p.terminate()
    p.terminate()
    p.close()
    p.join()
    assert p._state == "TERMINATE"


def test_pool_cannot_be_pickled(Pool):
    with Pool(1) as p:
        o = outcome(pickle.dumps, p)
        assert o.raised(NotImplementedError) and "cannot be passed" in str(o.exc)
        assert repr(p).endswith("state=RUN pool_size=1>")


# -- construction ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, exc_type, message", [
    ({"processes": 0}, ValueError, "Number of processes must be at least 1"),
    ({"processes": -3}, ValueError, "Number of processes must be at least 1"),
    ({"maxtasksperchild": 0}, ValueError, "maxtasksperchild must be a positive int or None"),
    ({"maxtasksperchild": 1.5}, ValueError, "maxtasksperchild must be a positive int or None"),
    ({"initializer": 3}, TypeError, "initializer must be a callable"),
])
def test_constructor_validation(Pool, kwargs, exc_type, message):
    o = outcome(Pool, **kwargs)
    assert o.raised(exc_type) and str(o.exc) == message


def test_initializer_and_initargs(Pool):
    with Pool(2, init_set_global, ("ready",)) as p:
        assert set(p.map(get_global, range(4))) == {"ready"}


def test_maxtasksperchild_replaces_workers(Pool):
    with Pool(1, maxtasksperchild=1) as p:
        pids = [p.apply(getpid) for _ in range(3)]
    assert len(set(pids)) == 3


def test_processes_may_exceed_cpu_count(Pool):
    n = multiprocessing.cpu_count() + 2
    with Pool(n) as p:
        assert p.map(square, range(n), 1) == [x * x for x in range(n)]


def test_context_argument(Pool):
    ctx = multiprocessing.get_context("fork")
    with Pool(1, context=ctx) as p:
        assert p.apply(square, (5,)) == 25


# -- documented differences ------------------------------------------------------------------------
def test_explicit_chunksize_zero(Pool, impl):
    with Pool(1) as p:
        o = outcome(p.map, square, [1, 2], 0)
    if impl == "stdlib":
        assert o.ok and o.value == [None, None]  # silently wrong
    else:  # DIFFERENCES.md: "map with chunksize < 1"
        assert o.raised(ValueError) and "Chunksize must be 1+" in str(o.exc)


def test_workers_start_on_demand(Pool, impl, tmp_path):
    from compat_tasks import init_touch

    marker = tmp_path / "initialized"
    p = Pool(1, init_touch, (str(marker),))
    time.sleep(0.3)
    started_eagerly = marker.exists()
    assert p.apply(square, (2,)) == 4 and marker.exists()
    p.terminate()
    p.join()
    # DIFFERENCES.md: "workers start on demand"
    assert started_eagerly == (impl == "stdlib")


def test_chunked_imap_iterator_type(Pool, impl):
    with Pool(1) as p:
        it = p.imap(square, range(4), chunksize=2)
        if impl == "stdlib":
            assert not hasattr(it, "next")  # a plain generator
        else:  # DIFFERENCES.md: "chunked imap supports next(timeout)"
            assert it.next(timeout=10) == 0
        assert list(it)[-1] == 9


def test_isinstance_of_stdlib_pool(Pool, impl):
    with Pool(1) as p:
        # DIFFERENCES.md: "not a subclass" (``python -m dpool run`` binds the name instead)
        assert isinstance(p, multiprocessing.pool.Pool) == (impl == "stdlib")


def test_pending_results_keep_an_unreferenced_pool_alive(Pool):
    import gc
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # both warn: the pool is unclosed
        r = Pool(1).apply_async(sleep_return, (0.2, "kept"))
        gc.collect()
        assert r.get(OK_S) == "kept"
        assert list(Pool(2).imap(square, range(6))) == [0, 1, 4, 9, 16, 25]
        assert Pool(1).map_async(square, [3]).get(OK_S) == [9]
        gc.collect()
