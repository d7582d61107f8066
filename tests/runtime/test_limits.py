"""Control over running work: per-task timeouts, forced cancels, memory limits per worker,
the host's memory threshold and deaths by the kernel's OOM killer -- with real processes."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import dpool
from dpool import Pool, ProcessPoolExecutor


def spin_forever(pid_file=None):
    if pid_file:
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
    while True:
        pass


def square(x):
    return x * x


def pid_after(s):
    time.sleep(s)
    return os.getpid()


def slow_first_time(marker, s):
    """Sleeps ``s`` the first time (marker absent), returns at once on the retry."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(s)
    return "retried"


def _gone(pid, within=10.0):
    """Whether process ``pid`` is gone (polled: a hang guard, not a timing check)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.01)
    return False


def _read_pid(path, within=20.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if os.path.exists(path) and open(path).read():
            return int(open(path).read())
        time.sleep(0.01)
    raise AssertionError(f"{path} never written")


# -- timeouts -------------------------------------------------------------------------
def test_infinite_loop_stopped_at_its_timeout_while_others_run(tmp_path):
    with ProcessPoolExecutor(2) as ex:
        pid_file = str(tmp_path / "pid")
        f = ex.options(timeout=0.5).submit(spin_forever, pid_file)
        others = [ex.submit(square, i) for i in range(20)]
        assert [o.result(30) for o in others] == [i * i for i in range(20)]
        with pytest.raises(dpool.TaskTimeoutError) as info:
            f.result(30)
        err = info.value
        assert isinstance(err, TimeoutError) and isinstance(err, cf.TimeoutError)
        assert isinstance(err, multiprocessing.TimeoutError)
        assert err.timeout == 0.5 and "0.5 s" in str(err)
        assert _gone(_read_pid(pid_file))  # its worker was killed...
        assert ex.submit(square, 9).result(30) == 81  # ...and replaced


def test_executor_task_timeout_applies_to_every_task_and_options_override():
    with ProcessPoolExecutor(2, task_timeout=0.3) as ex:
        fast, stuck = ex.submit(pid_after, 0.01), ex.submit(pid_after, 60)
        longer = ex.options(timeout=30).submit(pid_after, 0.6)  # its own, longer limit
        assert isinstance(fast.result(30), int)
        with pytest.raises(dpool.TaskTimeoutError):
            stuck.result(30)
        assert isinstance(longer.result(30), int)
        assert list(ex.map(square, range(5))) == [0, 1, 4, 9, 16]


def test_timeout_not_retried_unless_asked(tmp_path):
    with ProcessPoolExecutor(1) as ex:
        marker = str(tmp_path / "m")
        with pytest.raises(dpool.TaskTimeoutError):
            ex.options(timeout=0.3).submit(slow_first_time, marker, 60).result(30)
        marker2 = str(tmp_path / "m2")
        f = ex.options(timeout=0.3, retry_on_timeout=True).submit(slow_first_time, marker2, 60)
        assert f.result(30) == "retried"


def test_pool_task_timeout_is_a_multiprocessing_timeout_and_get_timeout_keeps_its_meaning():
    with Pool(2, task_timeout=0.4) as pool:
        r = pool.apply_async(pid_after, (60,))
        with pytest.raises(multiprocessing.TimeoutError) as info:
            r.get(30)
        assert isinstance(info.value, dpool.TaskTimeoutError)
        r2 = pool.apply_async(pid_after, (0.2,))
        with pytest.raises(multiprocessing.TimeoutError) as info2:
            r2.get(timeout=0.001)  # how long to wait: the task goes on
        assert not isinstance(info2.value, dpool.TaskTimeoutError)
        assert isinstance(r2.get(30), int)
        assert pool.map(square, range(6)) == [0, 1, 4, 9, 16, 25]


def test_bad_limits_are_clear_errors():
    with pytest.raises(ValueError, match="task_timeout"):
        ProcessPoolExecutor(1, task_timeout=0)
    with pytest.raises(TypeError, match="task_timeout"):
        ProcessPoolExecutor(1, task_timeout="1")
    with pytest.raises(ValueError, match="max_memory_per_worker"):
        Pool(1, max_memory_per_worker=-5)
    with ProcessPoolExecutor(1) as ex:
        with pytest.raises(ValueError, match="timeout"):
            ex.options(timeout=-1)
        with pytest.raises(TypeError, match="retry_on_timeout"):
            ex.options(retry_on_timeout=True)

        class A:
            def f(self):
                return 1

        with pytest.raises(TypeError, match="actor"):
            ex.options(timeout=1).actor(A)


# -- cancelling running tasks ------------------------------------------------------------
def test_force_cancel_stops_a_running_task_and_replaces_its_worker(tmp_path):
    with ProcessPoolExecutor(2) as ex:
        pid_file = str(tmp_path / "pid")
        f = ex.submit(spin_forever, pid_file)
        pid = _read_pid(pid_file)
        assert f.running() and not f.cancel()  # the stdlib's cancel() keeps its meaning
        done_cb = []
        f.add_done_callback(done_cb.append)
        waiter = cf.ThreadPoolExecutor(1).submit(cf.wait, [f], 30)
        assert dpool.cancel(f, force=True) is True
        assert f.cancelled() and f.done() and done_cb == [f]
        with pytest.raises(cf.CancelledError):
            f.result(1)
        assert f in waiter.result(30).done
        assert _gone(pid)
        assert ex.submit(square, 4).result(30) == 16
        done = ex.submit(square, 2)
        done.result(30)
        assert dpool.cancel(done, force=True) is False  # finished: nothing to cancel


def spawn_child_and_spin(pid_file):
    ex = dpool.get_executor()
    child = ex.submit(spin_forever, pid_file)
    child.result()


def test_recursive_force_cancel_stops_the_tasks_it_submitted(tmp_path):
    with ProcessPoolExecutor(2) as ex:
        pid_file = str(tmp_path / "child")
        parent = ex.submit(spawn_child_and_spin, pid_file)
        child_pid = _read_pid(pid_file)
        assert dpool.cancel(parent, force=True, recursive=True)
        assert parent.cancelled()
        assert _gone(child_pid)
        assert ex.submit(square, 5).result(30) == 25


def test_shutdown_cancel_running_stops_running_tasks(tmp_path):
    ex = ProcessPoolExecutor(2)
    files = [str(tmp_path / f"p{i}") for i in range(2)]
    fs = [ex.submit(spin_forever, p) for p in files]
    pids = [_read_pid(p) for p in files]
    queued = ex.submit(square, 3)
    ex.shutdown(wait=True, cancel_futures=True, cancel_running=True)
    assert all(f.cancelled() for f in fs)
    assert queued.cancelled()
    assert all(_gone(p) for p in pids)


def test_cancel_rejects_what_is_not_a_future():
    with pytest.raises(TypeError):
        dpool.cancel(42, force=True)


# -- memory ------------------------------------------------------------------------------
_leak: list = []


def leak_50mb(i):
    b = bytearray(50 * 2**20)
    b[:: 4096] = b"x" * len(b[:: 4096])  # touched: resident
    _leak.append(b)
    with open("/proc/self/statm") as f:
        return os.getpid(), int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def hog(mb):
    b = bytearray(mb * 2**20)
    b[:: 4096] = b"x" * len(b[:: 4096])
    time.sleep(30)
    return len(b)


def test_leaking_task_rotates_workers_under_the_memory_limit():
    limit = 300 * 2**20
    with ProcessPoolExecutor(2, max_memory_per_worker=limit) as ex:
        out = list(ex.map(leak_50mb, range(50)))
    assert len(out) == 50
    assert len({pid for pid, _ in out}) >= 6  # replaced as they grew
    assert max(rss for _, rss in out) <= limit + 60 * 2**20  # the limit plus one task's growth


def test_task_past_twice_the_limit_fails_with_out_of_memory_and_the_rest_work():
    limit = 150 * 2**20
    with ProcessPoolExecutor(2, max_memory_per_worker=limit) as ex:
        f = ex.submit(hog, 500)
        others = [ex.submit(square, i) for i in range(10)]
        with pytest.raises(dpool.OutOfMemoryError) as info:
            f.result(60)
        err = info.value
        assert isinstance(err, MemoryError)
        assert err.limit == limit and err.peak > 2 * limit
        assert "max_memory_per_worker" in str(err)
        assert [o.result(30) for o in others] == [i * i for i in range(10)]


_PROGRAM = textwrap.dedent("""
    import sys, time, dpool
    from dpool import ProcessPoolExecutor

    def slow(s):
        time.sleep(s)
        return s

    if __name__ == "__main__":
        with ProcessPoolExecutor(1) as ex:
            try:
                ex.submit(slow, 30).result(60)
                print("FINISHED")
            except dpool.OutOfMemoryError as e:
                print("OOM", e)
""")


def test_host_memory_threshold_stops_the_newest_task(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(_PROGRAM)
    env = {**os.environ, "DPOOL_MEMORY_THRESHOLD": "0.001"}  # always above: stop it
    out = subprocess.run([sys.executable, str(prog)], env=env, capture_output=True,
                         text=True, timeout=90)
    assert "OOM" in out.stdout and "threshold" in out.stdout, out.stdout + out.stderr


_OOM_PROGRAM = textwrap.dedent("""
    import os, sys
    with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    import dpool
    from dpool import ProcessPoolExecutor

    def hog():
        b = bytearray(600 * 2**20)
        b[::4096] = b"x" * len(b[::4096])
        return 1

    if __name__ == "__main__":
        with ProcessPoolExecutor(1, max_attempts=1) as ex:
            try:
                ex.submit(hog).result(60)
                print("NO-OOM")
            except dpool.WorkerCrashedError as e:
                print("CRASH", e)
""")


def _memory_cgroup():
    """A fresh child of this process's memory cgroup (v1), or None."""
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return None
    for line in lines:
        _h, ctl, path = line.split(":", 2)
        if "memory" in ctl.split(","):
            d = f"/sys/fs/cgroup/memory{path}/dpool-oom-{os.getpid()}"
            try:
                os.mkdir(d)
                with open(os.path.join(d, "memory.limit_in_bytes"), "w") as f:
                    f.write(str(200 * 2**20))
            except OSError:
                return None
            return d
    return None


def test_kernel_oom_kill_is_named_as_such(tmp_path):
    cg = _memory_cgroup()
    if cg is None:
        pytest.skip("cannot create a memory cgroup with a limit here (needs cgroup v1 "
                    "memory controller write access)")
    try:
        prog = tmp_path / "prog.py"
        prog.write_text(_OOM_PROGRAM)
        out = subprocess.run([sys.executable, str(prog), cg], capture_output=True,
                             text=True, timeout=90)
        assert "CRASH" in out.stdout, out.stdout + out.stderr
        assert "out-of-memory killer" in out.stdout
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                os.rmdir(cg)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def test_memory_threshold_flag_refuses_a_bad_share():
    out = subprocess.run([sys.executable, "-m", "dpool", "start", "--head",
                          "--memory-threshold", "1.5"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0
    assert "--memory-threshold" in out.stderr and "(0, 1]" in out.stderr


def test_memory_limit_with_max_tasks_per_child_does_not_bounce_tasks():
    # (a worker past its memory hands back what it holds; with max_tasks_per_child the
    # requeue must not make it take them again)
    with ProcessPoolExecutor(2, max_tasks_per_child=50,
                             max_memory_per_worker=150 * 2**20) as ex:
        out = list(ex.map(leak_50mb, range(12)))
    assert len(out) == 12 and len({pid for pid, _ in out}) >= 4


class Sleeper:
    def nap(self, s):
        time.sleep(s)
        return s


def test_force_cancel_does_not_claim_an_actor_call():
    with ProcessPoolExecutor(1) as ex:
        a = ex.actor(Sleeper)
        f = a.nap.submit(0.5)
        time.sleep(0.2)
        assert dpool.cancel(f, force=True) is False  # (dpool.kill ends an actor)
        assert not f.cancelled() and f.result(30) == 0.5
