"""A SIGKILLed driver leaves nothing behind: its workers exit and remove its segments.

The checks look at ``/dev/shm`` and the process table directly: nothing here starts a
dpool runtime that could do the cleaning instead (except where that is the point).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import dpool
from dpool.objects import _recycle
from dpool.objects import _segment as seg
from dpool.objects._serialization import serialize
from dpool.runtime import _driver

# who removes a dead owner's segments, and when, is the point: no other test's runtime
# may reap them meanwhile (tests/_parallel.py)
pytestmark = pytest.mark.exclusive

DEAD_PID = 4_194_304 + 4244  # above Linux's PID_MAX_LIMIT: never a live process

_DRIVER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import psutil
    import dpool
    from dpool import ProcessPoolExecutor

    def big(i):
        return np.full(1 << 18, i, dtype=np.float64)  # 2 MiB: a shm segment

    def put_and_sleep(t):
        ref = dpool.put(np.ones(1 << 18))  # a worker's put: named after the driver
        time.sleep(t)
        return ref

    def sleeper(t):
        time.sleep(t)

    if __name__ == "__main__":
        ex = ProcessPoolExecutor(3)
        refs = [dpool.put(np.ones(1 << 18) * i) for i in range(3)]  # the driver's puts
        results = [ex.submit(big, i) for i in range(6)]
        kept = [f.result() for f in results[:3]]  # results still referenced
        for f in results[3:]:
            f.result()
        del results[3:]  # freed: their pages go to the recycling pool
        busy = [ex.submit(put_and_sleep, 120), ex.submit(sleeper, 120)]  # 2 workers busy
        deadline = time.monotonic() + 30  # both run, and the worker's put is made
        while not (all(f.running() for f in busy) and len(
                [n for n in os.listdir("/dev/shm") if n.startswith(f"dpool_{os.getpid()}_")]
                ) >= 1 + 3 + 3 + 1) and time.monotonic() < deadline:
            time.sleep(0.02)
        kids = psutil.Process().children(recursive=True)
        print(" ".join(f"{p.pid}:{p.name()}" for p in kids), flush=True)
        time.sleep(120)
""")


def _segments_of(pid: int) -> list[str]:
    return sorted(n for n in os.listdir(seg.SHM_DIR) if n.startswith(f"dpool_{pid}_"))


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("reap_driver", [True, False], ids=["reaped", "zombie"])
def test_killed_driver_segments_and_workers_are_gone(tmp_path, reap_driver):
    """Workers busy in long tasks and an idle one: all exit, and /dev/shm is clean,
    whether the dead driver was waited for or is still a zombie."""
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    env = {**os.environ, "DPOOL_SEGMENT_POOL_TTL": "600"}  # keep freed pages pooled
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        kids = dict(x.split(":", 1) for x in proc.stdout.readline().split())
        workers = [int(pid) for pid in kids]  # the fork server too, where there is one
        assert len([n for n in kids.values() if n != "dpool-zygote"]) == 3, kids
        before = _segments_of(proc.pid)
        assert f"dpool_{proc.pid}_pool" in before  # the recycling pool
        assert len(before) >= 1 + 3 + 3 + 1, before  # pool, puts, results, a worker's put
    finally:
        proc.send_signal(signal.SIGKILL)
        if reap_driver:
            proc.wait(10)
    try:
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and (
                _segments_of(proc.pid) or any(_running(p) for p in workers)):
            time.sleep(0.05)
        assert not [p for p in workers if _running(p)], "workers outlived their driver"
        assert not _segments_of(proc.pid), "the dead driver's segments were left behind"
    finally:
        proc.wait(10)
        proc.stdout.close()


def test_a_new_executor_reaps_dead_owners_segments(monkeypatch):
    """Not only a process's first runtime start: a new executor in a running driver."""
    with dpool.ProcessPoolExecutor(1) as ex:  # the runtime is up (and reaped at start)
        assert ex.submit(abs, -1).result(30) == 1
    name = seg.segment_name(DEAD_PID, 0x5EED)
    pool = _recycle.pool_dir(DEAD_PID)
    seg.write_object(name, serialize(b"x" * 100))
    os.makedirs(pool)
    with open(f"{pool}/0", "wb") as fh:
        fh.write(b"x" * 4096)
    try:
        monkeypatch.setattr(_driver, "_REAP_EVERY_S", 0.0)
        with dpool.ProcessPoolExecutor(1):
            assert not os.path.exists(seg.SHM_DIR + name)
            assert not os.path.exists(pool)
    finally:
        seg.unlink(name)
        seg.reap_owner(DEAD_PID)


def test_reap_owner_leaves_live_owners_and_reused_pids_alone():
    mine = seg.segment_name(os.getpid(), 0xFEED01)
    seg.write_object(mine, serialize(b"mine"))
    try:
        assert seg.reap_owner(os.getpid()) == []  # alive
        started = seg.owner_started(os.getpid())
        assert started is not None
        # this pid, but a different process than the recorded owner: a reused pid
        assert not seg.owner_dead(os.getpid(), started - 100.0)
        assert seg.reap_owner(os.getpid(), started - 100.0) == []
        assert os.path.exists(seg.SHM_DIR + mine)
    finally:
        seg.unlink(mine)


def test_reap_owner_races_are_harmless():
    """Several workers of a dead driver clean up at once: each name goes exactly once."""
    names = [seg.segment_name(DEAD_PID, i) for i in range(1, 6)]
    for n in names:
        seg.write_object(n, serialize(n))
    try:
        code = ("import sys; from dpool.objects import _segment as s; "
                f"print(len(s.reap_owner({DEAD_PID})))")
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  text=True) for _ in range(3)]
        counts = [int(p.communicate(timeout=60)[0]) for p in procs]
        assert sum(counts) == len(names)
        assert not _segments_of(DEAD_PID)
    finally:
        for n in names:
            seg.unlink(n)


def test_a_zombie_owners_segments_are_orphans():
    """A driver killed but not yet waited for by its parent is dead all the same."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    name = seg.segment_name(child.pid, 0x20B)
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        seg.write_object(name, serialize(b"left behind"))
        assert seg.owner_dead(child.pid)
        assert name in seg.reap_orphans()
        assert not os.path.exists(seg.SHM_DIR + name)
    finally:
        seg.unlink(name)
        child.wait(10)


_FORKSERVER_DRIVER = textwrap.dedent("""
    import multiprocessing as mp, os, time
    from dpool import ProcessPoolExecutor

    def sleep_pid(t):
        time.sleep(t)
        return os.getpid()

    if __name__ == "__main__":
        ex = ProcessPoolExecutor(2, mp_context=mp.get_context("forkserver"))
        pids = set(ex.map(sleep_pid, [0.6] * 4))  # longer than the watchdog's poll
        busy = [ex.submit(sleep_pid, 120) for _ in range(2)]
        print(" ".join(map(str, sorted(pids))), flush=True)
        time.sleep(120)
""")


def test_forkserver_workers_serve_and_die_with_their_driver(tmp_path):
    """A forkserver worker's parent is the fork server, not the driver: it watches the
    driver itself (tasks longer than a poll run; a killed driver's workers exit)."""
    script = tmp_path / "driver.py"
    script.write_text(_FORKSERVER_DRIVER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        workers = [int(x) for x in line.split()]
        assert workers and all(_running(p) for p in workers), line
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(_running(p) for p in workers):
        time.sleep(0.05)
    assert not [p for p in workers if _running(p)], "workers outlived their driver"
    for p in psutil.process_iter(["cmdline"]):  # the driver's fork server goes too
        try:
            if p.info["cmdline"] and "forkserver" in " ".join(p.info["cmdline"]) \
                    and p.ppid() == proc.pid:
                p.kill()
        except psutil.Error:
            pass
