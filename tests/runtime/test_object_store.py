"""The shared-memory object store seen from the Executor: zero-copy, COW, limits, leaks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import dpool
from dpool import ProcessPoolExecutor

MB = 1 << 20


def describe(a):
    """Where the task's array lives and whether it may write to it."""
    base = a
    while getattr(base, "base", None) is not None:
        base = base.base
    return type(base).__name__, bool(a.flags.writeable), float(a.sum())


def mutate_and_sum(a):
    a[:] = 5.0
    return float(a.sum())


def make_array(n, value):
    return np.full(n, value, dtype=np.float64)


def total(a):
    return float(a.sum())


def hold(a, seconds):
    time.sleep(seconds)
    return float(a[0])


def test_large_argument_is_mapped_not_copied_and_writable():
    arr = np.arange(2 * MB, dtype=np.float64)
    with ProcessPoolExecutor(2) as ex:
        kind, writable, s = ex.submit(describe, arr).result(30)
        assert kind in ("mmap", "memoryview")  # a view of the shared mapping, not a copy
        assert writable and s == float(arr.sum())


def test_writes_in_a_task_never_change_the_shared_object():
    arr = np.ones(MB, dtype=np.float64)
    ref = dpool.put(arr)
    with ProcessPoolExecutor(2) as ex:
        assert ex.submit(mutate_and_sum, ref).result(30) == 5.0 * MB
        assert ex.submit(total, ref).result(30) == float(MB)
        assert ex.submit(mutate_and_sum, arr).result(30) == 5.0 * MB
        assert ex.submit(total, arr).result(30) == float(MB)
    assert arr.sum() == MB and dpool.get(ref).sum() == MB


def test_large_result_is_writable_in_the_driver():
    with ProcessPoolExecutor(1) as ex:
        out = ex.submit(make_array, MB, 2.0).result(30)
    assert out.sum() == 2.0 * MB
    out[:10] = 0  # copy-on-write: only the written pages are copied
    assert out.sum() == 2.0 * (MB - 10)


def test_same_array_submitted_many_times_is_stored_once_and_rechecked():
    arr = np.zeros(MB, dtype=np.float64)
    with ProcessPoolExecutor(2) as ex:
        sched = ex._runtime.scheduler
        used0 = sched.store.store.used
        fs = [ex.submit(total, arr) for _ in range(8)]
        assert [f.result(30) for f in fs] == [0.0] * 8
        assert sched.store.store.used - used0 < 2 * arr.nbytes
        arr[123] = 1.0  # drop-in code refills buffers between submits: never stale
        assert ex.submit(total, arr).result(30) == 1.0


def test_object_bigger_than_the_store_fails_at_once_with_sizes():
    with ProcessPoolExecutor(1, object_store_memory=4 * MB) as ex:
        big = np.ones(8 * MB // 8 + 1000)
        with pytest.raises(dpool.ObjectStoreFullError, match=str(4 * MB)):
            dpool.put(big)
        f = ex.submit(total, big)
        with pytest.raises(dpool.ObjectStoreFullError) as info:
            f.result(30)
        assert isinstance(info.value, dpool.Error) and str(big.nbytes) in str(info.value)
        assert ex.submit(total, np.ones(10)).result(30) == 10.0
        ex._runtime.scheduler.set_store_capacity(1 << 40)


def test_full_store_spills_lru_objects_and_brings_them_back():
    with ProcessPoolExecutor(1, object_store_memory=6 * MB) as ex:
        refs = [dpool.put(np.full(MB // 8 * 2, float(i))) for i in range(6)]  # 2 MB each
        assert ex._runtime.scheduler.store.store.used <= 6 * MB
        # every object is still readable, in the driver and in tasks
        assert [float(dpool.get(r)[0]) for r in refs] == [float(i) for i in range(6)]
        assert ex.submit(total, refs[0]).result(30) == 0.0
        assert ex.submit(hold, refs[5], 0).result(30) == 5.0
        ex._runtime.scheduler.set_store_capacity(1 << 40)


def test_store_full_of_pinned_inputs_raises_clearly():
    with ProcessPoolExecutor(1, object_store_memory=5 * MB) as ex:
        a = dpool.put(np.ones(3 * MB // 8))
        f = ex.submit(hold, a, 1.5)  # a is pinned while its task is pending
        time.sleep(0.3)
        with pytest.raises(dpool.ObjectStoreFullError, match="pinned"):
            dpool.put(np.ones(3 * MB // 8))
        assert f.result(30) == 1.0
        ex._runtime.scheduler.set_store_capacity(1 << 40)


def kill_me(a):
    os.kill(os.getpid(), signal.SIGKILL)


def test_worker_killed_while_mapping_leaks_nothing():
    arr = np.ones(MB)
    with ProcessPoolExecutor(1, max_attempts=1) as ex:
        with pytest.raises(dpool.WorkerCrashedError):
            ex.submit(kill_me, arr).result(30)
    del arr
    # the no_leaks fixture checks /dev/shm after the test


_DRIVER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import dpool
    ref = dpool.put(np.ones(1 << 18))
    print(os.getpid(), flush=True)
    time.sleep(60)
""")


@pytest.mark.exclusive  # no other runtime may reap them first (tests/_parallel.py)
def test_segments_of_a_killed_driver_are_reaped_by_the_next_start(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pid = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    mine = [n for n in os.listdir("/dev/shm") if n.startswith(f"dpool_{pid}_")]
    assert mine, "the killed driver should have left its segment behind"
    subprocess.run([sys.executable, "-c", "import dpool; dpool.put(1)"], check=True, timeout=60)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"dpool_{pid}_")]
