"""An actor whose node dies (issue 33, item 3): with restarts left it is placed again on
a live node and its state rebuilt from the copy its driver's node keeps (the latest
checkpoint, then the calls after it, replayed); calls in flight complete once; without
restarts left, its calls fail with ``ActorDiedError`` naming the lost node.

A head on ``host(2)`` (the driver's node: no "X") and two nodes with one "X" each: the
actor asks for "X", so a global scheduler places it on one of them; the driver SIGKILLs
that node's daemon and its workers (the host is lost).
"""

from __future__ import annotations

import os
import textwrap

import pytest

from tests.cluster.conftest import TIMEOUT, Cluster, daemon_env, start_cluster, stop_cluster

pytestmark = pytest.mark.timeout(4 * TIMEOUT)


def _cluster(tmp) -> Cluster:
    with daemon_env(DPOOL_RESOURCE_GRACE_S="10"):
        return start_cluster(tmp, n_nodes=3, shards=1,
                             node_extra=("--resources", '{"X": 1}'))


COMMON = textwrap.dedent("""
    import os, sys, time
    import psutil
    import dpool
    from dpool import ProcessPoolExecutor

    class Counter:
        def __init__(self):
            self.n = 0
            self.seen = []

        def add(self, k):
            self.n += k
            self.seen.append(k)
            return self.n

        def slow_add(self, k, secs):
            time.sleep(secs)
            return self.add(k)

        def state(self):
            return self.n, self.seen

        def node(self):
            return os.environ.get("DPOOL_NODE_ID")

    def add_from_task(counter, k):
        return counter.add(k)

    def lose(node):  # the node's daemon and its workers, SIGKILLed
        pids = dict(x.split("=") for x in sys.argv[1].split(","))
        p = psutil.Process(int(pids[node]))
        family = [p, *p.children(recursive=True)]
        for x in family:
            x.kill()
        psutil.wait_procs(family, timeout=10)
""")


def _run(c: Cluster, tmp_path, body: str) -> list[str]:
    pids = ",".join(f"{n.address}={n.pid}" for n in c.nodes[1:])
    out = c.run_script(COMMON + textwrap.dedent(body), tmp_path, pids, timeout=3 * TIMEOUT)
    assert out.returncode == 0, out.stderr[-4000:]
    return [line for line in out.stdout.splitlines() if line]


@pytest.fixture
def three_nodes(tmp_path_factory):
    c = _cluster(tmp_path_factory.mktemp("actor-node-loss"))
    try:
        yield c
    finally:
        stop_cluster(c)
    for n in c.nodes[1:]:  # nothing of the lost node (nor of the other) is left in /dev/shm
        assert not [s for s in os.listdir("/dev/shm") if s.startswith(f"dpool_{n.pid}_")]


@pytest.mark.parametrize("every", [0, 3], ids=["replay-all", "checkpoint-every-3"])
def test_an_actor_whose_node_dies_is_rebuilt_on_another_with_calls_in_flight_run_once(
        three_nodes, tmp_path, every):
    lines = _run(three_nodes, tmp_path, """
        if __name__ == "__main__":
            with ProcessPoolExecutor(2) as ex:
                c = ex.options(resources={"X": 1}, max_restarts=1,
                               checkpoint_every=%d).actor(Counter)
                for k in range(1, 8):
                    c.add(k)
                first = c.node()
                # a task on the other "X" node calls it (through the head's proxy)
                other = [n for n in sys.argv[1].split(",") if not n.startswith(first)]
                there = ex.options(scheduling=dpool.NodeAffinity(other[0].split("=")[0]))
                print(there.submit(add_from_task, c, 100).result(timeout=60))
                slow = c.slow_add.submit(1000, 3.0)  # in flight when its node dies
                after = [c.add.submit(k) for k in (10000, 20000)]
                time.sleep(1.0)
                lose(first)
                print(slow.result(timeout=90), [f.result(timeout=90) for f in after])
                n, seen = c.state()
                print(n, seen)
                print("moved", c.node() not in (first, None))
                print(there.submit(add_from_task, c, 5).result(timeout=60))  # (now its own)
    """ % every)
    assert lines == [
        "128",
        "1128 [11128, 31128]",
        "31128 [1, 2, 3, 4, 5, 6, 7, 100, 1000, 10000, 20000]",
        "moved True",
        "31133",
    ]


def test_an_actor_without_restarts_fails_its_calls_when_its_node_dies(three_nodes, tmp_path):
    lines = _run(three_nodes, tmp_path, """
        if __name__ == "__main__":
            with ProcessPoolExecutor(2) as ex:
                c = ex.options(resources={"X": 1}).actor(Counter)
                print(c.add(1))
                where = c.node()
                slow = c.slow_add.submit(1, 5.0)
                time.sleep(1.0)
                lose(where)
                for f in (slow, c.add.submit(2)):
                    try:
                        f.result(timeout=60)
                    except dpool.ActorDiedError as e:
                        print("ActorDiedError", where in str(e))
    """)
    assert lines == ["1", "ActorDiedError True", "ActorDiedError True"]
