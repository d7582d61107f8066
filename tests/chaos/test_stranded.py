"""Issue 17's "queued forever", made deterministic on a loopback cluster.

The race: a fresh 0-CPU head, a 2-CPU node that joins a moment before a driver attaches
to the head. The head's agent had not yet read the node table since the node joined,
so it told the driver the cluster had 0 CPUs; ``ProcessPoolExecutor()`` took that as
its ``max_workers``, and the head's spillback, which keeps each pool's tasks away within
``max_workers``, never sent one: the task sat on the head, the node idle, for good.
Here the driver sizes its pool *before* the node joins (the race's outcome, every time),
then submits once the node is up; and a driver that attaches just after the node joined
is told the node's CPUs (the head reads the node table for each attaching driver).

And what a 0-CPU node does with a task no node can take: after the grace period
(``DPOOL_RESOURCE_GRACE_S``), ``ResourceError`` -- not a future that never completes.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests._parallel import host
from tests.cluster.conftest import Cluster, start_node, stop_cluster, wait_for_nodes

SIZED_EARLY = """
import sys, dpool
def total(a):
    return float(a[::1024].sum())
if __name__ == "__main__":
    import numpy as np
    with dpool.ProcessPoolExecutor() as ex:
        print("SIZED", ex._max_workers, flush=True)
        sys.stdin.readline()                       # the node has joined
        ref = dpool.put(np.ones(1 << 20))          # 8 MB, as the issue's large put
        print("RESULT", ex.submit(total, ref).result(timeout=60), flush=True)
"""

SIZED_NOW = """
import dpool
if __name__ == "__main__":
    print("SIZED", dpool.ProcessPoolExecutor()._max_workers)
"""

NOBODY = """
import time, dpool
from dpool.errors import ResourceError
if __name__ == "__main__":
    t0 = time.monotonic()
    with dpool.ProcessPoolExecutor() as ex:
        try:
            ex.submit(abs, -1).result(timeout=60)
        except ResourceError as exc:
            print("RESOURCE", "no CPUs" in str(exc), round(time.monotonic() - t0, 1),
                  flush=True)
"""


def _head(tmp_path) -> Cluster:
    head, token = start_node(tmp_path, host(2), head=True, num_cpus=0,
                             extra=("--shards", "1"))
    return Cluster(head, token, [head])


@pytest.mark.timeout(120)
def test_a_pool_sized_before_the_node_joined_still_runs_its_task(tmp_path):
    c = _head(tmp_path)
    try:
        script = tmp_path / "sized_early.py"
        script.write_text(SIZED_EARLY)
        driver = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path,
                                  env=c.driver_env(), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert driver.stdout is not None and driver.stdin is not None
            sized = driver.stdout.readline()
            if not sized.startswith("SIZED "):
                driver.kill()
                pytest.fail(f"the driver said {sized!r}: {driver.communicate()[1][-3000:]}")
            assert int(sized.split()[1]) >= 1  # never a pool of 0 workers
            node, _ = start_node(tmp_path, host(3), head=False, address=c.address,
                                 token=c.token)
            c.nodes.append(node)
            wait_for_nodes(c, 2)
            # a driver attaching now is told the node's CPUs, though the head's agent may
            # not have read the node table since the node joined: the head reads it for
            # each attaching driver
            fresh = c.run_script(SIZED_NOW, tmp_path)
            assert fresh.stdout.split() == ["SIZED", "2"], (fresh.stdout, fresh.stderr[-3000:])
            driver.stdin.write("go\n")
            driver.stdin.flush()
            out, err = driver.communicate(timeout=90)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.communicate()
        assert driver.returncode == 0, err[-3000:]
        assert "RESULT 1024.0" in out.splitlines(), out
    finally:
        stop_cluster(c)


@pytest.mark.timeout(120)
def test_a_task_no_node_can_run_fails_with_resource_error_after_the_grace(
        tmp_path, monkeypatch):
    monkeypatch.setenv("DPOOL_RESOURCE_GRACE_S", "1")  # (the head's, from its env)
    c = _head(tmp_path)
    try:
        t0 = time.monotonic()
        out = c.run_script(NOBODY, tmp_path, timeout=90)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.startswith("RESOURCE True"), (out.stdout, out.stderr[-3000:])
        print(f"ResourceError after {out.stdout.split()[-1]} s "
              f"(script {time.monotonic() - t0:.1f} s)")
    finally:
        stop_cluster(c)
