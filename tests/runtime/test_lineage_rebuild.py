"""Lineage rebuilds on one host: a value evicted to disk whose spill file is gone.

A small object store (``object_store_memory=``) spills results least-recently-used first
to ``dpool-spill-<pid>-*``; the tests delete those files and then read the values again
-- as inputs of later tasks, through a task's nested ``result()``, through ``dpool.get``.
Task results are made again by re-running their tasks (a file per call counts the runs);
``dpool.put`` values, ``@dpool.no_rebuild`` functions and tasks out of attempts give
``ObjectLostError`` instead. The executor keeps working afterwards, and the autouse
``no_leaks`` fixture (tests/conftest.py) checks that no segment or process is left.
"""

from __future__ import annotations

import gc
import glob
import os
import tempfile
import time

import numpy as np
import pytest

import dpool
from dpool import ProcessPoolExecutor

MB = 1 << 20
N = MB // 8  # float64 items of a 1 MiB array: stored in shared memory, three fit in 3 MiB


def _note(log: str, what: str) -> None:
    with open(log, "a") as fh:
        fh.write(what + "\n")


def make(i, log):
    _note(log, f"make {i}")
    return np.full(N, float(i))


def plus(a, k, log):
    _note(log, f"plus {k}")
    return a + k


def first(a):
    return float(a[0])


def first_nested(box):
    return float(dpool.get(box[0], timeout=30)[0])  # a nested get: the worker asks the scheduler


@dpool.no_rebuild
def make_once(i, log):
    _note(log, f"once {i}")
    return np.full(N, float(i))


def runs(log) -> list[str]:
    with open(log) as fh:
        return fh.read().split()[::2]


def spill_files() -> list[str]:
    pattern = os.path.join(tempfile.gettempdir(), f"dpool-spill-{os.getpid()}-*", "*")
    return glob.glob(pattern)


def lose_spill_files() -> int:
    files = spill_files()
    for path in files:
        os.unlink(path)
    return len(files)


def one_by_one(ex, fn, n, log):
    """n results made one after another (the earliest get evicted first)."""
    fs = []
    for i in range(n):
        fs.append(ex.submit(fn, i, log))
        fs[-1].result(30)
    return fs


@pytest.fixture
def log(tmp_path):
    path = str(tmp_path / "runs")
    open(path, "w").close()
    return path


def test_results_whose_spill_files_are_gone_are_rebuilt_for_later_tasks(log):
    with ProcessPoolExecutor(1, object_store_memory=3 * MB) as ex:
        fs = one_by_one(ex, make, 5, log)
        lost = lose_spill_files()
        assert lost >= 2  # the store holds at most two of the five
        assert [ex.submit(first, f).result(30) for f in fs] == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert runs(log).count("make") == 5 + lost  # each lost one ran once more
        assert ex.submit(first, fs[0]).result(30) == 0.0  # still there: not run again
        assert runs(log).count("make") == 5 + lost
        del fs
        gc.collect()
        ex.submit(int).result(30)  # the releases are applied at the next event
        assert spill_files() == []  # nothing is left on disk once the results are gone


def test_a_rebuild_runs_again_through_an_input_that_was_lost_too(log):
    with ProcessPoolExecutor(1, object_store_memory=3 * MB) as ex:
        a = ex.submit(make, 1, log)
        b = ex.submit(plus, a, 1, log)
        assert b.result(30)[0] == 2.0
        fill = one_by_one(ex, make, 3, log)  # a and b are evicted
        assert lose_spill_files() >= 2
        assert ex.submit(first, b).result(30) == 2.0
        assert runs(log) == ["make", "plus", "make", "make", "make", "make", "plus"]
        del fill


def test_a_rebuild_reaches_an_input_the_driver_already_released(log):
    with ProcessPoolExecutor(1, object_store_memory=3 * MB) as ex:
        a = ex.submit(make, 7, log)
        b = ex.submit(plus, a, 1, log)
        assert b.result(30)[0] == 8.0
        del a  # its value is freed: only b's lineage remembers how to make it
        gc.collect()
        fill = one_by_one(ex, make, 3, log)
        assert lose_spill_files() >= 1
        assert ex.submit(first, b).result(30) == 8.0
        assert runs(log)[-2:] == ["make", "plus"]
        del fill


def test_a_nested_get_of_a_lost_result_waits_for_its_rebuild(log):
    with ProcessPoolExecutor(1, object_store_memory=3 * MB) as ex:
        fs = one_by_one(ex, make, 4, log)
        assert lose_spill_files() >= 1
        assert ex.submit(first_nested, [fs[0]]).result(30) == 0.0
        assert runs(log).count("make") == 5


def test_a_lost_put_value_raises_object_lost_error_naming_it(log):
    with ProcessPoolExecutor(1, object_store_memory=3 * MB) as ex:
        refs = [dpool.put(np.full(N, float(i))) for i in range(4)]
        assert lose_spill_files() >= 1
        with pytest.raises(dpool.ObjectLostError, match="spill file was lost") as info:
            dpool.get(refs[0], timeout=30)
        assert info.value.object_id == refs[0].id
        assert f"{refs[0].id:#x}" in str(info.value) and "put it again" in str(info.value)
        with pytest.raises(dpool.ObjectLostError) as info:  # as a task's input: the same
            ex.submit(first, refs[0]).result(30)
        assert info.value.object_id == refs[0].id
        assert dpool.get(refs[3], timeout=30)[0] == 3.0  # the others are fine
        assert ex.submit(first, refs[3]).result(30) == 3.0


def test_a_no_rebuild_function_is_not_run_again(log):
    with ProcessPoolExecutor(1, object_store_memory=3 * MB) as ex:
        fs = one_by_one(ex, make_once, 4, log)
        assert lose_spill_files() >= 1
        with pytest.raises(dpool.ObjectLostError, match="no_rebuild") as info:
            ex.submit(first, fs[0]).result(30)
        assert info.value.object_id is not None
        assert runs(log) == ["once"] * 4  # never a second time
        assert ex.submit(first, fs[3]).result(30) == 3.0


def test_a_no_rebuild_closure_travelling_by_value_is_not_run_again(log):
    @dpool.no_rebuild
    def closure(i, log):
        _note(log, f"closure {i}")
        return np.full(N, float(i))

    with ProcessPoolExecutor(1, object_store_memory=3 * MB) as ex:
        fs = one_by_one(ex, closure, 4, log)
        assert lose_spill_files() >= 1
        with pytest.raises(dpool.ObjectLostError, match="no_rebuild"):
            ex.submit(first, fs[0]).result(30)
        assert runs(log) == ["closure"] * 4


def test_a_rebuild_is_charged_against_max_attempts(log):
    with ProcessPoolExecutor(1, object_store_memory=3 * MB, max_attempts=1) as ex:
        fs = one_by_one(ex, make, 4, log)
        assert lose_spill_files() >= 1
        with pytest.raises(dpool.ObjectLostError, match="attempts") as info:
            ex.submit(first, fs[0]).result(30)
        assert "1 of max_attempts=1" in str(info.value)
        assert runs(log) == ["make"] * 4
    with ProcessPoolExecutor(1, object_store_memory=3 * MB, max_attempts=2) as ex:
        fs = one_by_one(ex, make, 4, log)
        assert lose_spill_files() >= 1
        assert ex.submit(first, fs[0]).result(30) == 0.0  # attempt 2 of 2
        one_by_one(ex, make, 3, log)  # evicted once more
        assert lose_spill_files() >= 1
        with pytest.raises(dpool.ObjectLostError, match="2 of max_attempts=2"):
            ex.submit(first, fs[0]).result(30)


def test_a_result_of_a_shut_down_executor_is_not_rebuilt(log):
    with ProcessPoolExecutor(1, object_store_memory=3 * MB) as ex:
        fs = one_by_one(ex, make, 4, log)
    assert lose_spill_files() >= 1
    with ProcessPoolExecutor(1) as other:
        with pytest.raises(dpool.ObjectLostError, match="shut down"):
            other.submit(first, fs[0]).result(30)
        assert other.submit(first, fs[3]).result(30) == 3.0


def test_results_evicted_before_the_driver_maps_them_still_arrive(log):
    # A burst of large results into a store that holds two: a result is often spilled
    # (its segment unlinked) between its task's finish and the driver's future mapping
    # it; that future used to fail with DeserializationError (FileNotFoundError), about
    # one result in four here. The future reads it back from disk instead.
    with ProcessPoolExecutor(2, object_store_memory=3 * MB) as ex:
        for _ in range(10):
            fs = [ex.submit(make, i, log) for i in range(8)]
            assert [f.result(30)[0] for f in fs] == [float(i) for i in range(8)]


def test_a_queued_tasks_large_argument_block_is_not_evicted_before_it_runs():
    # a strided view is not a contiguous array the argument cache stores: the task's
    # arguments go to the store as one block, which later puts would evict (spill) while
    # the task waits behind a slow one; the worker then found no segment
    # (DeserializationError). A pending task's argument block is pinned like its inputs.
    with ProcessPoolExecutor(1, object_store_memory=3 * MB) as ex:
        slow = ex.submit(time.sleep, 0.5)
        f = ex.submit(first, np.arange(MB // 4, dtype=np.float64)[::2])  # a 1 MiB block
        refs = [dpool.put(np.full(N, float(i))) for i in range(3)]
        assert f.result(30) == 0.0 and slow.result(30) is None
        assert [float(dpool.get(r)[0]) for r in refs] == [0.0, 1.0, 2.0]


def _settle(ex):
    gc.collect()
    ex.submit(int).result(30)  # released handles are applied at the next event


def test_lineage_records_live_as_long_as_a_result_that_needs_them(log):
    with ProcessPoolExecutor(1, object_store_memory=3 * MB) as ex:
        lineage = ex._runtime.scheduler._lineage
        a = ex.submit(make, 1, log)
        b = ex.submit(plus, a, 1, log)
        c = ex.submit(plus, b, 1, log)
        ids = [a._oid, b._oid, c._oid]
        assert c.result(30)[0] == 3.0
        del a, b
        _settle(ex)
        assert all(i in lineage for i in ids)  # c's record holds b's, b's holds a's
        fill = one_by_one(ex, make, 3, log)
        assert lose_spill_files() >= 2  # c's file (a's and b's values were freed)
        assert ex.submit(first, c).result(30) == 3.0  # c, b and a made again
        assert runs(log)[-3:] == ["make", "plus", "plus"]
        del c, fill
        _settle(ex)
        assert not any(i in lineage for i in ids)


def test_past_the_lineage_cap_a_released_input_cannot_be_rebuilt(log, monkeypatch):
    from dpool.scheduling import _lineage

    monkeypatch.setattr(_lineage, "MAX_KEPT", 0)  # keep no record of a released value
    with ProcessPoolExecutor(1, object_store_memory=3 * MB) as ex:
        a = ex.submit(make, 1, log)
        a_id = a._oid
        b = ex.submit(plus, a, 1, log)
        assert b.result(30)[0] == 2.0
        del a
        _settle(ex)
        fill = one_by_one(ex, make, 3, log)
        assert lose_spill_files() >= 2
        with pytest.raises(dpool.ObjectLostError, match=f"{a_id:#x}"):
            ex.submit(first, b).result(30)
        assert ex.submit(first, fill[2]).result(30) == 2.0
