"""A driver killed with SIGKILL: what its executor's and Pool's workers do.

The driver runs in a subprocess with an executor and a Pool, each with one worker busy in
a long task and one idle; then it is SIGKILLed and its workers (no longer children of
this process) are watched directly, as is ``/dev/shm``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

# who removes the killed driver's segments is the point: no other test's runtime may
# reap them meanwhile (tests/_parallel.py)
pytestmark = pytest.mark.exclusive

_DRIVER = textwrap.dedent("""
    import sys, time
    import psutil
    if sys.argv[1] == "stdlib":
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing.pool import Pool
    else:
        from dpool import Pool, ProcessPoolExecutor

    def big_array(n):
        import numpy as np
        return np.ones(n)

    def sleep_for(t):
        time.sleep(t)

    if __name__ == "__main__":
        ex = ProcessPoolExecutor(2)
        held = [ex.submit(big_array, 1 << 18) for _ in range(3)]  # 2 MiB results
        kept = [f.result() for f in held]
        del held[0]  # freed (with dpool: its pages wait in the recycling pool)
        busy = ex.submit(sleep_for, 60)
        pool = Pool(2)
        kept += pool.map(big_array, [1 << 18] * 2, chunksize=1)
        busy_too = pool.apply_async(sleep_for, (60,))
        time.sleep(1.0)
        print(" ".join(str(p.pid) for p in psutil.Process().children(recursive=True)
                       if "resource_tracker" not in " ".join(p.cmdline())), flush=True)
        time.sleep(60)
""")


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _segments_of(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"dpool_{pid}_")]


def test_killed_driver_leaves_no_workers_and_no_shared_memory(impl, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    env = {**os.environ, "DPOOL_SEGMENT_POOL_TTL": "600"}  # keep freed pages pooled
    proc = subprocess.Popen([sys.executable, str(script), impl], stdout=subprocess.PIPE,
                            text=True, env=env)
    workers: list[int] = []
    try:
        workers = [int(x) for x in proc.stdout.readline().split()]
        assert len(workers) >= 3, workers  # dpool starts workers on demand
        if impl == "dpool":  # results held, and the pool of freed pages
            assert len(_segments_of(proc.pid)) >= 3, _segments_of(proc.pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
    try:
        if impl == "stdlib":
            # DIFFERENCES.md: its workers outlive the driver
            time.sleep(2.0)
            assert any(_running(p) for p in workers)
        else:  # DIFFERENCES.md: "a killed driver leaves nothing behind"
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and (
                    any(_running(p) for p in workers) or _segments_of(proc.pid)):
                time.sleep(0.05)
            assert not [p for p in workers if _running(p)]
            assert not _segments_of(proc.pid)
    finally:
        for p in workers:  # the stdlib's are not our children: stop them here
            with contextlib.suppress(psutil.Error):
                psutil.Process(p).kill()
