"""``dpool.collective`` across a real loopback cluster: members on three nodes (over
member-to-member TCP links, the ring for large arrays), groups formed from the driver
and in the members (the rendezvous through the control store), and a member SIGKILLed
mid-operation: the others fail with ``CollectiveError`` naming it."""

from __future__ import annotations

import textwrap

import pytest

from tests.cluster.conftest import TIMEOUT, start_cluster, stop_cluster

pytestmark = pytest.mark.timeout(3 * TIMEOUT)


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("collective"), n_nodes=3, shards=1)
    try:
        yield c
    finally:
        stop_cluster(c)


SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import dpool
    import dpool.collective as col
    from dpool import ProcessPoolExecutor

    class Member:
        def __init__(self, rank, world):
            self.rank, self.world = rank, world

        def where(self):
            return os.environ.get("DPOOL_NODE_ID"), os.getpid()

        def join(self, name):
            col.init_group(self.world, self.rank, name)
            return col.get_rank(name)

        def ops(self, name):
            r = self.rank
            big = np.arange(1_000_000, dtype=np.float64) * (r + 1)   # 8 MB: the ring
            s = col.allreduce(big, group_name=name)
            small = col.allreduce(np.array([r, 1]), group_name=name)
            g = col.allgather(np.full(2, r), group_name=name)
            b = col.broadcast(np.array([7, 8]) if r == 2 else None, root=2, group_name=name)
            rs = col.reducescatter(np.ones((6, 3)) * (r + 1), group_name=name)
            col.barrier(group_name=name)
            return (float(s[-1]), small.tolist(), [x.tolist() for x in g], b.tolist(),
                    rs.shape, float(rs.sum()))

        def loop(self, name):
            a = np.ones(300_000)
            try:
                while True:
                    col.allreduce(a, group_name=name)
            except dpool.CollectiveError as e:
                return e.rank, str(e)

    if __name__ == "__main__":
        nodes = sys.argv[1].split(",")
        with ProcessPoolExecutor(2) as ex:
            ms = [ex.options(scheduling=dpool.NodeAffinity(n)).actor(Member, r, 3)
                  for r, n in enumerate(nodes)]
            where = [m.where() for m in ms]
            print("nodes", [w[0] for w in where] == nodes)
            print("transport", col.create_group(ms, "d"))
            for line in [f.result(timeout=60) for f in [m.ops.submit("d") for m in ms]]:
                print(line)
            print("joined", [f.result(timeout=60) for f in [m.join.submit("m") for m in ms]])
            fs = [m.loop.submit("m") for m in ms]
            time.sleep(1.0)
            os.kill(where[1][1], signal.SIGKILL)
            for f in (fs[0], fs[2]):
                rank, why = f.result(timeout=60)
                print("CollectiveError", rank, "rank 1" in why)
""")


def test_members_on_three_nodes_reduce_over_tcp_and_fail_together(three_nodes, tmp_path):
    nodes = ",".join(n.address for n in three_nodes.nodes)
    out = three_nodes.run_script(SCRIPT, tmp_path, nodes)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [x for x in out.stdout.splitlines() if x]
    want_last = 999_999.0 * 6
    row = f"({want_last}, [3, 3], [[0, 0], [1, 1], [2, 2]], [7, 8], "
    assert lines[0] == "nodes True"
    assert lines[1] == "transport ['tcp', 'tcp', 'tcp']"
    assert lines[2] == row + "(2, 3), 36.0)"
    assert lines[3] == row + "(2, 3), 36.0)"
    assert lines[4] == row + "(2, 3), 36.0)"
    assert lines[5] == "joined [0, 1, 2]"
    assert lines[-2:] == ["CollectiveError 1 True", "CollectiveError 1 True"]
