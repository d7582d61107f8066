"""dpool.Pool beyond the stdlib's contract (the shared contract is tested in compat/).

Lazy, bounded ``imap``; ``terminate`` that never hangs and fails what was cut off;
callbacks that raise; collection and interpreter exit; large arrays through the object
store. The leak check of tests/conftest.py applies to every test.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import pytest

import dpool
from dpool._pool_core import _MAX_BATCH
from dpool.pool import Pool

OK_S = 30


def square(x):
    return x * x


def sleep_return(seconds, value=None):
    time.sleep(seconds)
    return value


def _counting(source, counter):
    for x in source:
        counter[0] += 1
        yield x


def test_exports():
    assert dpool.Pool is Pool and "Pool" in dpool.__all__ and "cpu_count" in dpool.__all__
    assert dpool.cpu_count() == os.cpu_count()


# -- lazy imap --------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["imap", "imap_unordered"])
@pytest.mark.parametrize("chunksize", [1, 5])
def test_imap_reads_input_lazily_and_boundedly(method, chunksize):
    pulled = [0]
    with Pool(2) as p:
        it = getattr(p, method)(square, _counting(itertools.count(), pulled), chunksize)
        assert len([next(it) for _ in range(10)]) == 10
        time.sleep(0.3)  # let the feeder run as far as it may
        first = pulled[0]
        core = p._core
        # chunksize=1 calls of a fast function travel in automatic batches of up to
        # _MAX_BATCH items (still a constant bound on what is read ahead)
        per_task = chunksize if chunksize > 1 else _MAX_BATCH
        bound = core.max_inflight * per_task + core.max_buffered * chunksize + 10 + per_task
        assert first <= bound
        time.sleep(0.2)
        assert pulled[0] == first  # stalled until the consumer reads on
        consumed = 0
        deadline = time.monotonic() + 20
        while pulled[0] == first and time.monotonic() < deadline:  # reading on frees room
            next(it)
            consumed += 1
        time.sleep(0.2)
        assert pulled[0] > first and pulled[0] <= bound + consumed + per_task


def test_join_drains_unread_imap():
    """join() promises all submitted work ran: the unread rest of the input is fed."""
    pulled = [0]
    p = Pool(2)
    n = (p._core.max_inflight + p._core.max_buffered) * 2 + 50
    it = p.imap(square, _counting(range(n), pulled))
    p.close()
    p.join()
    assert pulled[0] == n
    assert list(it) == [x * x for x in range(n)]


def test_close_alone_shuts_down_after_imap_finishes():
    p = Pool(2)
    it = p.imap_unordered(square, range(40))
    p.close()
    assert sorted(it) == sorted(x * x for x in range(40))
    p.join()


def test_generator_blocked_forever_does_not_block_the_pool_or_terminate():
    release = threading.Event()

    def stuck():
        yield 1
        release.wait()
        yield 2

    p = Pool(2)
    it = p.imap(square, stuck())
    assert next(it) == 1
    assert p.apply(square, (4,)) == 16  # other work is not stuck behind the generator
    t0 = time.monotonic()
    p.terminate()
    assert time.monotonic() - t0 < 5
    assert list(it) == []  # the iteration ends: nothing more will come
    release.set()
    p.join()


def test_chunked_imap_error_drops_rest_but_still_runs_input():
    pulled = [0]

    def boom(x):
        if x == 5:
            raise ValueError("five")
        return x

    with Pool(2) as p:
        it = p.imap(boom, _counting(range(40), pulled), chunksize=4)
        assert [next(it) for _ in range(4)] == [0, 1, 2, 3]  # the failed chunk is 4..7
        with pytest.raises(ValueError):
            next(it)
        assert list(it) == []
        p.close()
        p.join()
    assert pulled[0] == 40  # as the stdlib, the rest of the input is still processed


# -- terminate, collection, exit ------------------------------------------------------------------
def test_terminate_fails_unfinished_results_without_callbacks():
    calls = []
    p = Pool(1)
    r = p.apply_async(sleep_return, (10,), callback=calls.append, error_callback=calls.append)
    m = p.map_async(square, range(5), callback=calls.append, error_callback=calls.append)
    it = p.imap(sleep_return, [10, 10])
    time.sleep(0.1)
    t0 = time.monotonic()
    p.terminate()
    assert time.monotonic() - t0 < 5
    for res in (r, m):
        assert res.ready() and not res.successful()
        with pytest.raises(BrokenProcessPool):
            res.get(0)
    with pytest.raises(BrokenProcessPool):
        next(it)
    assert calls == []
    p.join()


def test_unreferenced_running_pool_is_terminated_with_a_warning():
    p = Pool(2)
    assert p.map(square, range(4)) == [0, 1, 4, 9]
    with pytest.warns(ResourceWarning, match="unclosed running multiprocessing pool"):
        del p  # the last reference: collected at once
    # tests/conftest.py checks that its workers are gone.


def test_exit_terminates_pools_left_running(tmp_path):
    script = tmp_path / "left_running.py"
    script.write_text(textwrap.dedent("""
        import dpool, time
        def slow(x):
            time.sleep(60)
        p = dpool.Pool(2)
        r = p.apply_async(slow, (1,))
        print(p.apply(__import__("os").getpid))
    """))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - t0 < 20  # did not wait for the 60 s task
    worker = int(out.stdout.strip())
    deadline = time.monotonic() + 5
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


# -- callbacks --------------------------------------------------------------------------
def test_callback_that_raises_is_logged_and_the_pool_goes_on(caplog):
    def bad(_):
        raise RuntimeError("callback bug")

    with caplog.at_level(logging.ERROR, logger="dpool.pool"), Pool(1) as p:
        r = p.apply_async(square, (3,), callback=bad)
        assert r.get(OK_S) == 9 and r.successful()
        m = p.map_async(square, range(3), callback=bad)
        assert m.get(OK_S) == [0, 1, 4]
        assert p.apply(square, (5,)) == 25
    logged = [r for r in caplog.records
              if r.exc_info and isinstance(r.exc_info[1], RuntimeError)
              and "callback" in r.getMessage()]
    assert len(logged) == 2


def test_join_from_a_callback_raises():
    errors = []
    p = Pool(1)
    r = p.apply_async(sleep_return, (0.2, 1), callback=lambda _: _join_into(p, errors))
    p.close()
    r.get(OK_S)
    p.join()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError)  # stdlib: deadlock


def _join_into(pool, errors):
    try:
        pool.join()
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        errors.append(exc)


# -- inputs -----------------------------------------------------------------------------
def test_explicit_chunksize_below_one_is_an_error():
    with Pool(1) as p:
        with pytest.raises(ValueError, match="Chunksize must be 1\\+"):
            p.map(square, [1, 2], chunksize=0)
        assert p.map(square, [], chunksize=0) == []


def test_lambdas_closures_and_local_functions():
    k = 3
    with Pool(2) as p:
        assert p.map(lambda x: x + k, range(4)) == [3, 4, 5, 6]
        assert list(p.imap(lambda x: x * k, range(3), chunksize=2)) == [0, 3, 6]
        assert p.starmap(lambda a, b: a * b + k, [(1, 2)]) == [5]


def test_chunk_runner_is_reused_for_the_same_function():
    with Pool(1) as p:
        core = p._core
        assert core.runner(square, False) is core.runner(square, False)
        assert core.runner(square, True) is not core.runner(square, False)
        assert p.map(square, range(10), 3) == p.map(square, range(10), 3)


def test_concurrent_submitters():
    with Pool(2) as p:
        out = {}

        def client(i):
            out[i] = [p.apply_async(square, (i * 10 + j,)).get(OK_S) for j in range(10)]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert out == {i: [(i * 10 + j) ** 2 for j in range(10)] for i in range(4)}


def test_maxtasksperchild_with_fork_and_imap():
    with Pool(2, maxtasksperchild=2) as p:
        pids = list(p.imap(_pid, range(8)))
    assert len(set(pids)) >= 4


def _pid(_):
    return os.getpid()


# -- large values -----------------------------------------------------------------------
def _sum_and_segments(arr):
    owner = f"dpool_{multiprocessing.parent_process().pid}_"  # the driver's segments
    return float(arr.sum()), any(n.startswith(owner) for n in os.listdir("/dev/shm"))


def test_large_arrays_travel_through_the_object_store():
    arrays = [np.full(512 * 1024, i, dtype=np.float64) for i in range(4)]  # 4 MiB each
    with Pool(2) as p:
        out = p.map(_sum_and_segments, arrays, chunksize=1)
        assert [s for s, _ in out] == [float(a.sum()) for a in arrays]
        assert all(in_store for _, in_store in out)
        back = p.apply(np.ones, (1 << 20,))
        assert back.shape == (1 << 20,) and back.sum() == float(1 << 20)
