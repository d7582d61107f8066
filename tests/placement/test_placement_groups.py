"""Placement groups (``dpool.placement_group``): bundles reserved together, all or none.

On the embedded runtime (one host, this process): pack/spread put every bundle here,
strict_spread with two bundles can never be met, a group that does not fit beside one
held waits until it is removed, bundle tasks run on what the bundle reserved (fake
GPUs), resources a bundle holds are kept from tasks outside it. On a real loopback
cluster (a head and two nodes, 2 CPUs each, one global scheduler): the bundles land as
the strategy says and tasks in bundle ``i`` run on its node; two groups that together
do not fit: one ready, the other waits until the first is removed; impossible groups
fail with ``PlacementError``; a node holding a bundle is killed: the group reports it
lost, and a new group is reserved on the nodes left.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dpool
from dpool import PlacementError, ProcessPoolExecutor
from tests.cluster.conftest import Cluster, base_env, start_cluster, stop_cluster


def where(x):
    import os

    import dpool as d

    return x, os.environ.get("DPOOL_NODE_ID", "local"), d.get_gpu_ids()


# -- bad input, at the call ------------------------------------------------------------------
def test_bad_bundles_and_strategies_raise_at_the_call():
    with pytest.raises(TypeError, match="non-empty list"):
        dpool.placement_group([])
    with pytest.raises(TypeError, match="non-empty list"):
        dpool.placement_group({"CPU": 1})
    with pytest.raises(TypeError, match="bundle 1 must be a mapping"):
        dpool.placement_group([{"CPU": 1}, 2])
    with pytest.raises(ValueError, match="reserves nothing"):
        dpool.placement_group([{"CPU": 0}])
    with pytest.raises(ValueError, match="num_cpus must be a whole number"):
        dpool.placement_group([{"CPU": 1.5}])
    with pytest.raises(ValueError, match="strategy 'packed'"):
        dpool.placement_group([{"CPU": 1}], strategy="packed")


def test_bad_options_raise_at_the_call():
    with dpool.placement_group([{"CPU": 1}]) as pg, ProcessPoolExecutor(1) as ex:
        with pytest.raises(TypeError, match="must be a dpool.PlacementGroup"):
            ex.options(placement_group="pg")
        with pytest.raises(ValueError, match="has bundles 0..0"):
            ex.options(placement_group=pg, bundle=1)
        with pytest.raises(TypeError, match="bundle must be an int"):
            ex.options(placement_group=pg, bundle="0")
        with pytest.raises(ValueError, match="not both"):
            ex.options(placement_group=pg, scheduling="spread")


# -- the embedded runtime -----------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_embedded_groups_reserve_this_host_and_wait_for_room():
    n = dpool.cpu_count()
    with ProcessPoolExecutor(2) as ex:
        a = dpool.placement_group([{"CPU": n}], strategy="pack")
        assert a.ready().result(10) is a
        assert a.state == "ready" and a.bundle_nodes == ["local"]
        b = dpool.placement_group([{"CPU": 1}], strategy="spread")  # no room beside a
        assert not b.wait(0.5) and b.state == "pending" and b.bundle_nodes is None
        assert ex.options(placement_group=a, bundle=0).submit(where, 1).result(30)[:2] == \
            (1, "local")
        a.remove()
        assert b.ready().result(10) is b and b.bundle_nodes == ["local"]
        assert [v for v, _, _ in ex.options(placement_group=b).map(where, range(5))] == \
            list(range(5))
        # a removed group takes no more tasks
        with pytest.raises(PlacementError, match="was removed"):
            ex.options(placement_group=a).submit(where, 2)
        b.remove()
        b.remove()  # idempotent
        assert b.state == "removed"


@pytest.mark.timeout(60)
def test_embedded_groups_that_can_never_fit_fail():
    n = dpool.cpu_count()
    cases = [([{"CPU": 1}] * 2, "strict_spread", "strict_spread needs 2 distinct nodes"),
             ([{"CPU": n + 1}], "pack", "fits no node"),
             ([{"CPU": n}, {"CPU": 1}], "spread", "do not fit the nodes together"),
             ([{"TPU": 1}], "pack", "fits no node")]
    for bundles, strategy, text in cases:
        pg = dpool.placement_group(bundles, strategy=strategy)
        with pytest.raises(PlacementError, match=text):
            pg.ready().result(10)
        assert pg.state == "failed" and text in str(pg.error)
    one = dpool.placement_group([{"CPU": 1}], strategy="strict_spread")  # one bundle: fine
    try:
        assert one.wait(10)
    finally:
        one.remove()


@pytest.mark.timeout(90)
def test_embedded_bundle_gpus_are_the_bundles_and_kept_from_other_tasks():
    ex = ProcessPoolExecutor(2, runtime_resources={"GPU": 2})
    try:
        pg = dpool.placement_group([{"CPU": 1, "GPU": 1}], strategy="pack")
        assert pg.wait(10)
        _, _, gpus = ex.options(placement_group=pg, bundle=0, num_gpus=1).submit(
            where, 0).result(30)
        assert len(gpus) == 1
        # a task outside the group gets the other GPU, never the bundle's
        _, _, other = ex.options(num_gpus=1).submit(where, 1).result(30)
        assert other != gpus
        # a task asking more than its bundle holds can never run in it
        with pytest.raises(PlacementError, match="reserved"):
            ex.options(placement_group=pg, num_gpus=2).submit(where, 2).result(30)
        # a second group asking both GPUs waits for the first
        two = dpool.placement_group([{"CPU": 1, "GPU": 2}], strategy="pack")
        assert not two.wait(0.5)
        pg.remove()
        assert two.wait(10)
        two.remove()
        assert ex.options(num_gpus=2).submit(where, 3).result(30)[0] == 3
    finally:
        ex.shutdown()


# -- a loopback cluster ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("placement_groups"), head_cpus=2, shards=1)
    try:
        yield c
    finally:
        stop_cluster(c)


_GANGS = textwrap.dedent("""
    import collections, json, os, sys, time
    import dpool

    def where(i):
        return i, os.environ.get("DPOOL_NODE_ID")

    if __name__ == "__main__":
        out = {}
        with dpool.ProcessPoolExecutor(6) as ex:
            a = dpool.placement_group([{"CPU": 1}] * 4, strategy="spread")
            a.ready().result(30)
            out["a_nodes"] = a.bundle_nodes
            fs = [ex.options(placement_group=a, bundle=i).submit(where, i) for i in range(4)]
            out["a_ran"] = [f.result(60)[1] for f in fs]
            out["a_any"] = sorted({n for _, n in ex.options(placement_group=a).map(
                where, range(8))})
            # 4 of the 6 CPUs are held: a group of 3 waits, neither holds part of it
            b = dpool.placement_group([{"CPU": 1}] * 3, strategy="spread")
            out["b_waits"] = not b.wait(2.0) and b.state == "pending"
            a.remove()
            out["b_ready_after_remove"] = b.wait(30)
            out["b_nodes"] = b.bundle_nodes
            fs = [ex.options(placement_group=b, bundle=i).submit(where, i) for i in range(3)]
            out["b_ran"] = [f.result(60)[1] for f in fs]
            b.remove()
            c = dpool.placement_group([{"CPU": 2}, {"CPU": 1}], strategy="pack")
            c.ready().result(30)
            out["c_nodes"] = c.bundle_nodes
            c.remove()
            for name, bundles, strategy in (
                    ("strict4", [{"CPU": 1}] * 4, "strict_spread"),
                    ("big", [{"CPU": 3}], "pack"),
                    ("together", [{"CPU": 2}] * 4, "spread")):
                pg = dpool.placement_group(bundles, strategy=strategy)
                try:
                    pg.ready().result(30)
                    out[name] = "ready"
                except dpool.PlacementError as exc:
                    out[name] = str(exc)
            strict = dpool.placement_group([{"CPU": 1}] * 3, strategy="strict_spread")
            strict.ready().result(30)
            out["strict3"] = strict.bundle_nodes
            strict.remove()
            # every CPU of the cluster held: a task outside the group waits for one
            full = dpool.placement_group([{"CPU": 2}] * 3, strategy="spread")
            full.ready().result(30)
            f = ex.submit(where, 99)
            time.sleep(1.5)
            out["outside_waited"] = not f.done()
            full.remove()
            out["outside_ran"] = f.result(60)[0]
        print(json.dumps(out))
""")


@pytest.mark.timeout(240)
def test_groups_on_a_cluster_are_atomic_and_wait_for_each_other(three_nodes, tmp_path):
    c: Cluster = three_nodes
    res = c.run_script(_GANGS, tmp_path, timeout=200)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.splitlines()[-1])
    nodes = sorted(n.address for n in c.nodes)
    # spread: every node holds a bundle, none more than two
    assert sorted(set(out["a_nodes"])) == nodes, out
    assert max(out["a_nodes"].count(n) for n in nodes) == 2, out
    assert out["a_ran"] == out["a_nodes"], out  # each bundle's task ran on its node
    assert set(out["a_any"]) <= set(nodes), out
    assert out["b_waits"] is True and out["b_ready_after_remove"] is True, out
    # (spread over the nodes with room when it is placed: a node whose report of the
    # freed CPUs has not come in yet may get none)
    assert set(out["b_nodes"]) <= set(nodes) and len(set(out["b_nodes"])) >= 2, out
    assert out["b_ran"] == out["b_nodes"], out
    assert len(set(out["c_nodes"])) == 2, out  # 2 + 1 CPUs: no 2-CPU node holds both
    assert "strict_spread needs 4 distinct nodes" in out["strict4"], out
    assert "fits no node" in out["big"], out
    assert "do not fit the nodes together" in out["together"], out
    assert sorted(out["strict3"]) == nodes, out
    assert out["outside_waited"] is True and out["outside_ran"] == 99, out


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "placement_groups.py"


@pytest.mark.timeout(120)
def test_the_example_runs_on_a_cluster_and_embedded(three_nodes, tmp_path):
    c: Cluster = three_nodes
    res = c.run_script(EXAMPLE.read_text(), tmp_path, timeout=100)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "gang of 3 ready on" in res.stdout, res.stdout
    for node in c.nodes:  # spread: one rank per node
        assert f"on {node.address}" in res.stdout, res.stdout
    assert "while the first holds its CPUs: False" in res.stdout
    assert "after the first was removed: True" in res.stdout
    assert "strict_spread of 4: PlacementError" in res.stdout
    env = base_env()
    local = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True,
                           text=True, timeout=100, check=False)
    assert local.returncode == 0, local.stderr[-3000:]
    assert "ready on ['local'" in local.stdout and "1 can hold" in local.stdout, local.stdout


_DEATH = textwrap.dedent("""
    import json, os, signal, sys, time
    import dpool

    def where(i):
        return i, os.environ.get("DPOOL_NODE_ID")

    if __name__ == "__main__":
        victim, victim_pid = sys.argv[1], int(sys.argv[2])
        out = {}
        with dpool.ProcessPoolExecutor(4) as ex:
            pg = dpool.placement_group([{"CPU": 1}] * 3, strategy="strict_spread")
            pg.ready().result(30)
            out["nodes"] = pg.bundle_nodes
            os.kill(victim_pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while pg.state != "lost" and time.monotonic() < deadline:
                time.sleep(0.1)
            out["state"] = pg.state
            out["error"] = str(pg.error)
            try:
                pg.ready().result(1)
                out["ready_after_loss"] = "ok"
            except dpool.PlacementError as exc:
                out["ready_after_loss"] = str(exc)
            pg.remove()
            again = dpool.placement_group([{"CPU": 1}] * 2, strategy="strict_spread")
            again.ready().result(30)
            out["again"] = again.bundle_nodes
            fs = [ex.options(placement_group=again, bundle=i).submit(where, i)
                  for i in range(2)]
            out["again_ran"] = [f.result(60)[1] for f in fs]
            again.remove()
        print(json.dumps(out))
""")


@pytest.mark.timeout(240)
def test_a_node_holding_a_bundle_dies_the_group_is_lost_and_reserved_again(three_nodes,
                                                                         tmp_path):
    c: Cluster = three_nodes
    victim = c.nodes[2]
    res = c.run_script(_DEATH, tmp_path, victim.address, str(victim.pid), timeout=200)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.splitlines()[-1])
    assert victim.address in out["nodes"], out
    assert out["state"] == "lost", out
    assert victim.address in out["error"] and "is lost" in out["error"], out
    assert "is lost" in out["ready_after_loss"], out
    alive = sorted(n.address for n in c.nodes if n is not victim)
    assert sorted(out["again"]) == alive and out["again_ran"] == out["again"], out
