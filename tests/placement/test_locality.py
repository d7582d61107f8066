"""Data locality by default (issue 19, item 3): a task whose large input sits on one node
runs there when that node can start it soon enough.

The policy half with fake nodes (``LeastWait`` weighs the transfer of the inputs a node
lacks); the data path on a real loopback cluster: an origin that pulled a spilled task's
large result points the tasks that take it at the node that lent it (``node._spillback``
``lent_copies``), which runs them on its own copy (``node._remote``), so a chain of
64 MB arrays never sends an input back out to a node. bench/LOCALITY.md has the figures.
"""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest

from dpool.placement import DEFAULT_BANDWIDTH, Demand, LeastWait, NodeLoad
from tests.cluster.conftest import start_cluster, stop_cluster

MB64 = 64 * 10**6


def _nodes(**queued: int) -> list[NodeLoad]:
    return [NodeLoad(addr, cpus=2, busy=2, queued=q, avg_task_s=0.05)
            for addr, q in queued.items()]


def test_a_task_goes_where_its_large_input_is():
    a, b = _nodes(a=0, b=0)
    demand = Demand("head", inputs=(("a", "seg", MB64),))
    assert LeastWait().place(demand, [b, a]) is a
    demand = Demand("head", inputs=(("b", "seg", MB64),))
    assert LeastWait().place(demand, [a, b]) is b


def test_a_copy_reported_in_heartbeats_counts_as_holding_it():
    a, b = _nodes(a=0, b=0)
    b.holds = frozenset({"head|seg"})
    demand = Demand("head", inputs=(("head", "seg", MB64),))
    assert LeastWait().place(demand, [a, b]) is b


def test_the_holder_is_passed_over_when_its_queue_is_longer_than_the_transfer():
    # holder "a": 20 tasks queued ahead at 50 ms on 2 CPUs (~0.5 s); pulling 64 MB to
    # "b" costs ~64 ms at the assumed bandwidth: "b" can start it sooner
    a, b = _nodes(a=20, b=0)
    assert MB64 / DEFAULT_BANDWIDTH < a.estimated_wait() - b.estimated_wait()
    demand = Demand("head", inputs=(("a", "seg", MB64),))
    assert LeastWait().place(demand, [a, b]) is b


def test_an_input_on_the_origin_favours_no_node():
    # (the origin is never chosen; both others lack the input: the least loaded wins)
    a, b = _nodes(a=1, b=0)
    demand = Demand("head", inputs=(("head", "seg", MB64),))
    assert LeastWait().place(demand, [a, b, NodeLoad("head", cpus=2)]) is b


# -- a loopback cluster --------------------------------------------------------------------
_FETCHED = re.compile(r"fetched \S+ from node \S+ in [\d.]+ ms \((\d+) bytes")


def _copies(node) -> int:
    """Large objects ``node`` copied from another node (its log says, one line each)."""
    path = os.path.join(node.state_dir, "node.log")
    return len(_FETCHED.findall(open(path, errors="replace").read())) \
        if os.path.exists(path) else 0


@pytest.fixture
def spill_cluster(tmp_path_factory):
    """A head without CPUs (every task spills) and two 2-CPU nodes, the default policy."""
    c = start_cluster(tmp_path_factory.mktemp("locality"), head_cpus=0, shards=1)
    try:
        yield c
    finally:
        stop_cluster(c)


CHAIN = """
    import json, os, signal, sys, time
    import numpy as np
    import dpool

    def first(seed):
        return np.full(8_000_000, float(seed))                 # 64 MB

    def link(a):
        return a + 1.0

    def where(a):
        return os.environ["DPOOL_NODE_ID"], float(a[0])
"""


@pytest.mark.timeout(180)
def test_a_chain_of_large_arrays_sends_no_input_back_out(spill_cluster, tmp_path):
    chains, links = 2, 4
    code = textwrap.dedent(CHAIN + f"""
    if __name__ == "__main__":
        with dpool.ProcessPoolExecutor() as ex:
            ends = []
            for c in range({chains}):
                f = ex.submit(first, c)
                for _ in range({links} - 1):
                    f = ex.submit(link, f)
                ends.append(f)
            print(json.dumps([float(f.result(timeout=120)[-1]) for f in ends]))
    """)
    workers = spill_cluster.nodes[1:]
    before = [_copies(n) for n in spill_cluster.nodes]
    out = spill_cluster.run_script(code, tmp_path, env=spill_cluster.driver_env(
        DPOOL_STATE_DIR=spill_cluster.head.state_dir), timeout=150)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == \
        [float(c + links - 1) for c in range(chains)]
    after = [_copies(n) for n in spill_cluster.nodes]
    to_head = after[0] - before[0]
    to_workers = sum(after[i] - before[i] for i in (1, 2))
    assert len(workers) == 2
    # Every result comes back to the head (its origin). Before data locality, every
    # link's input went back out too: chains * (links - 1) more copies (6 here).
    assert to_head == chains * links
    assert to_workers < chains * (links - 1) // 2, (to_head, to_workers)


@pytest.mark.timeout(180)
def test_a_task_whose_lender_died_runs_on_the_origins_copy(spill_cluster, tmp_path):
    pids = {n.address: n.pid for n in spill_cluster.nodes[1:]}
    code = textwrap.dedent(CHAIN + """
    if __name__ == "__main__":
        pids = json.loads(sys.argv[1])
        with dpool.ProcessPoolExecutor() as ex:
            node, v = ex.submit(where, ex.submit(first, 7)).result(timeout=60)
            a = ex.submit(first, 3)                 # pulled by the head, still lent
            lender, _ = ex.submit(where, a).result(timeout=60)
            os.kill(pids[lender], signal.SIGKILL)
            again = ex.submit(where, a).result(timeout=90)
            print(json.dumps([v, lender in pids, again[0] != lender, again[1]]))
    """)
    out = spill_cluster.run_script(code, tmp_path, json.dumps(pids),
                                   env=spill_cluster.driver_env(
                                       DPOOL_STATE_DIR=spill_cluster.head.state_dir),
                                   timeout=150)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [7.0, True, True, 3.0]
