"""Per-call strategies on a real loopback cluster (a head and two nodes, one global
scheduler): ``"spread"`` lands round-robin on every node, a hard ``NodeAffinity`` runs
where it says (also on the driver's own node), a soft one to a node that does not exist
falls back, a hard one to it fails with ``dpool.PlacementError``."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest

from tests.cluster.conftest import Cluster, start_cluster, stop_cluster


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("strategies"), head_cpus=2, shards=1)
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.mark.timeout(180)
def test_strategies_place_tasks_on_a_cluster(three_nodes, tmp_path):
    c: Cluster = three_nodes
    other = c.nodes[2].address
    code = textwrap.dedent("""
        import collections, json, os, sys
        import dpool
        from dpool import NodeAffinity

        def where(x):
            return x, os.environ.get("DPOOL_NODE_ID")

        if __name__ == "__main__":
            other, head = sys.argv[1], sys.argv[2]
            out = {}
            with dpool.ProcessPoolExecutor(6) as ex:
                spread = list(ex.options(scheduling="spread").map(where, range(12)))
                out["spread_values"] = [v for v, _ in spread]
                out["spread"] = collections.Counter(n for _, n in spread)
                fs = [ex.options(scheduling=NodeAffinity(other)).submit(where, i)
                      for i in range(4)]
                out["hard"] = sorted({f.result(60)[1] for f in fs})
                fs = [ex.options(scheduling=NodeAffinity(head)).submit(where, i)
                      for i in range(3)]
                out["home"] = sorted({f.result(60)[1] for f in fs})
                soft = NodeAffinity("127.9.9.9:1", soft=True)
                out["soft"] = ex.options(scheduling=soft).submit(where, 7).result(60)[0]
                try:
                    ex.options(scheduling=NodeAffinity("127.9.9.9:1")).submit(
                        where, 8).result(60)
                    out["missing"] = "ran"
                except dpool.PlacementError as exc:
                    out["missing"] = str(exc)
                with dpool.ProcessPoolExecutor(2, scheduling=NodeAffinity(other)) as ex2:
                    out["executor"] = sorted({n for _, n in ex2.map(where, range(4))})
            print(json.dumps(out))
    """)
    res = c.run_script(code, tmp_path, other, c.head.address)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.splitlines()[-1])
    assert out["spread_values"] == list(range(12))
    # round-robin over the three nodes that fit: four tasks each
    assert sorted(out["spread"]) == sorted(n.address for n in c.nodes), out
    assert sorted(out["spread"].values()) == [4, 4, 4], out
    assert out["hard"] == [other]
    assert out["home"] == [c.head.address]
    assert out["soft"] == 7
    assert "127.9.9.9:1" in out["missing"] and "no such node" in out["missing"], out
    assert out["executor"] == [other]


@pytest.mark.timeout(180)
def test_the_example_spreads_over_the_cluster(three_nodes, tmp_path):
    c: Cluster = three_nodes
    example = Path(__file__).resolve().parents[2] / "examples" / "scheduling_strategies.py"
    res = c.run_script(example.read_text(), tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    spread = ast.literal_eval(lines[0].removeprefix("spread: "))
    assert sorted(spread) == sorted(n.address for n in c.nodes), lines
    assert lines[1].endswith(": True"), lines
    assert "PlacementError" in lines[3] and "no such node" in lines[3], lines
    assert lines[4] == "executor-wide spread over 3 node(s) (a cluster)", lines
