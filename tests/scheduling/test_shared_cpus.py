"""A node's CPUs are shared by every group on it (``LocalScheduler.cpu_limit``): a CPU
that one group's task frees goes to another group's queued tasks, not only to its own."""

from __future__ import annotations

import os
import time

from dpool import ProcessPoolExecutor


def hold(path: str) -> int:
    open(path, "w").close()
    time.sleep(0.5)
    return os.getpid()


def test_a_cpu_one_group_frees_starts_another_groups_queued_task(tmp_path):
    marker = str(tmp_path / "running")
    with ProcessPoolExecutor(1) as a, ProcessPoolExecutor(1) as b:
        scheduler = a._driver.scheduler
        old = scheduler.cpu_limit
        scheduler.cpu_limit = 1  # one CPU for both executors, as on a 1-CPU node
        try:
            held = a.submit(hold, marker)
            deadline = time.monotonic() + 30
            while not os.path.exists(marker):  # a's task holds the only CPU now
                assert time.monotonic() < deadline
                time.sleep(0.01)
            queued = b.submit(abs, -7)  # waits for that CPU
            assert held.result(30) > 0
            # nothing else happens on this scheduler: only the freed CPU can start it
            assert queued.result(10) == 7
        finally:
            scheduler.cpu_limit = old
