"""Limits on a real loopback cluster: a task's timeout is enforced by the node that runs
it -- the driver's own or the one it was sent to -- and an executor's ``task_timeout=`` and
``max_memory_per_worker=`` apply to its tasks there (its tasks then go through the node,
not to lent workers)."""

from __future__ import annotations

import textwrap

import pytest

from tests.cluster.conftest import start_cluster, stop_cluster


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("limits"), n_nodes=2, shards=1)
    try:
        yield c
    finally:
        stop_cluster(c)


_PROGRAM = textwrap.dedent("""
    import os, sys, time
    import dpool
    from dpool import ProcessPoolExecutor

    def spin():
        while True:
            pass

    def where():
        return os.environ.get("DPOOL_NODE_ID")

    def hog():
        b = bytearray(400 * 2**20)
        b[::4096] = b"x" * len(b[::4096])
        time.sleep(30)

    def outcome(f):
        try:
            return f"ok {f.result(timeout=60)}"
        except dpool.TaskTimeoutError as e:
            return "TaskTimeoutError"
        except dpool.OutOfMemoryError as e:
            return "OutOfMemoryError"

    if __name__ == "__main__":
        head, other = sys.argv[1], sys.argv[2]
        with ProcessPoolExecutor(2) as ex:
            here = ex.options(timeout=0.5, scheduling=dpool.NodeAffinity(head)).submit(spin)
            there = ex.options(timeout=0.5, scheduling=dpool.NodeAffinity(other)).submit(spin)
            print(outcome(here), outcome(there))
            print(ex.options(scheduling=dpool.NodeAffinity(other)).submit(where).result(60)
                  == other)
        with ProcessPoolExecutor(2, task_timeout=0.5) as ex:
            print(outcome(ex.submit(spin)), outcome(ex.submit(where)))
        with ProcessPoolExecutor(2, max_memory_per_worker=100 * 2**20) as ex:
            print(outcome(ex.submit(hog)), outcome(ex.submit(where)))
        ex = ProcessPoolExecutor(1)
        try:
            ex.shutdown(cancel_running=True)
        except dpool.Error as e:
            print("REFUSED", "timeout" in str(e))
        print(ex.submit(where).result(60) is not None)  # (still open: nothing half done)
        ex.shutdown()
""")


def test_timeouts_and_memory_limits_on_the_cluster(two_nodes, tmp_path):
    head, other = two_nodes.head.address, two_nodes.nodes[1].address
    out = two_nodes.run_script(_PROGRAM, tmp_path, head, other)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] == "TaskTimeoutError TaskTimeoutError", out.stdout + out.stderr
    assert lines[1] == "True"
    assert lines[2].startswith("TaskTimeoutError ok ")
    assert lines[3].startswith("OutOfMemoryError ok "), out.stdout + out.stderr
    assert lines[4:6] == ["REFUSED True", "True"], out.stdout + out.stderr
