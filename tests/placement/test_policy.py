"""Placement policies (``dpool.placement``) on fake nodes, no processes.

The built-in rule is one ``PlacementPolicy`` among others; a new one (``Pack`` below)
plugs in without touching the core: the global scheduler calls its ``place``, the node's
spillback its ``keep`` (``node._spillback`` over the fake scheduler of ``tests/node``).
"""

from __future__ import annotations

import pickle
from typing import Optional

import pytest

import dpool
from dpool.errors import PlacementError
from dpool.node._spillback import Spillback
from dpool.objects import _payload
from dpool.placement import (
    Demand,
    LeastWait,
    LocalQueue,
    NodeAffinity,
    NodeLoad,
    PlacementPolicy,
    Spread,
    load,
    strategy_from_wire,
    strategy_to_wire,
    validate_strategy,
)
from dpool.protocol import _messages as m
from dpool.scheduling._resources import Request
from tests.node._fake_scheduler import FakeScheduler
from tests.placement._policies import Broken, KeepAll, Pack

GS = "gs-1:7000"


def _nodes() -> list[NodeLoad]:
    return [NodeLoad("a:1", cpus=2, node_id="n-a"), NodeLoad("b:1", cpus=2, node_id="n-b"),
            NodeLoad("c:1", cpus=2, node_id="n-c")]


def _run(policy: PlacementPolicy, nodes: list[NodeLoad], n: int, demand: Demand) -> list:
    """Place ``n`` tasks as a global scheduler does: each placement is pending on its
    node until the next load report."""
    out = []
    for _ in range(n):
        best = policy.place(demand, nodes)
        if best is None:
            out.append(None)
            continue
        best.pending += 1
        out.append(best.address)
    return out


def test_a_new_policy_plugs_in_without_touching_the_core() -> None:
    pack = Pack()
    assert isinstance(pack, PlacementPolicy) and isinstance(LeastWait(), PlacementPolicy)
    picks = _run(pack, _nodes(), 7, Demand("o:1"))
    assert picks == ["a:1", "a:1", "b:1", "b:1", "c:1", "c:1", None]  # full: it waits
    # the built-in rule on the same nodes spreads by estimated wait instead
    assert sorted(_run(LeastWait(), _nodes(), 6, Demand("o:1"))) == \
        ["a:1", "a:1", "b:1", "b:1", "c:1", "c:1"]
    assert _run(LeastWait(), _nodes(), 1, Demand("o:1"))[0] == "a:1"


def test_load_names_builtins_and_module_classes_and_refuses_the_rest() -> None:
    assert type(load(None)) is LeastWait and type(load("default")) is LeastWait
    assert type(load("spread")) is Spread
    assert isinstance(load("tests.placement._policies:Pack"), Pack)
    with pytest.raises(ValueError, match="expected 'module:Class'"):
        load("nonsense")
    with pytest.raises(ValueError, match="cannot import"):
        load("no_such_module_xyz:Policy")
    with pytest.raises(ValueError, match="has no 'Nope'"):
        load("tests.placement._policies:Nope")
    with pytest.raises(TypeError, match="is not a PlacementPolicy"):
        load("tests.placement._policies:NotAPolicy")


def test_the_builtin_keep_rule_is_the_nodes_threshold() -> None:
    rule = LeastWait()
    # 4 CPUs, 1 free, 1 ms tasks, 5 ms threshold: 1 + 5 / 1 * 4 = 21 stay
    assert rule.keep(LocalQueue(100, 1, 4, 0.001, 0.005)) == 21
    assert rule.keep(LocalQueue(100, 3, 4, None, 0.005)) == 3  # never measured: free only


def test_spread_is_round_robin_over_the_nodes_that_fit() -> None:
    nodes = _nodes() + [NodeLoad("z:1", cpus=0), NodeLoad("g:1", cpus=4, resources={"GPU": 1},
                                                          free={"GPU": 1})]
    picks = _run(LeastWait(), nodes, 40, Demand("a:1", strategy="spread"))
    counts = {a: picks.count(a) for a in set(picks)}
    assert counts == {"a:1": 10, "b:1": 10, "c:1": 10, "g:1": 10}  # origin included
    gpu = Demand("a:1", req=Request(1, 1.0), strategy="spread")
    assert set(_run(LeastWait(), nodes, 5, gpu)) == {"g:1"}  # only it has a GPU
    # the cluster-wide policy spreads tasks that ask for nothing
    assert sorted(_run(Spread(), _nodes(), 6, Demand("o:1"))) == \
        ["a:1", "a:1", "b:1", "b:1", "c:1", "c:1"]
    assert Spread().place(Demand("o:1"), []) is None


def test_node_affinity_hard_and_soft() -> None:
    nodes = _nodes()
    nodes[1].busy, nodes[1].queued = 2, 50  # the busiest: affinity goes there anyway
    rule = LeastWait()
    for name in ("b:1", "n-b"):  # by address or by node id
        for soft in (False, True):
            assert rule.place(Demand("a:1", strategy=NodeAffinity(name, soft)), nodes) \
                is nodes[1]
    # its own origin is fine too (a spilled task may go home)
    assert rule.place(Demand("a:1", strategy=NodeAffinity("a:1")), nodes) is nodes[0]
    with pytest.raises(PlacementError, match="'gone:1'.*no such node is alive") as info:
        rule.place(Demand("a:1", strategy=NodeAffinity("gone:1")), nodes)
    assert isinstance(info.value, dpool.ResourceError)  # a typed, catchable error
    assert "n-a, n-b, n-c" in str(info.value)
    # soft: falls back to the least wait (the origin may be it)
    assert rule.place(Demand("b:1", strategy=NodeAffinity("gone:1", soft=True)), nodes) \
        is nodes[0]
    with pytest.raises(PlacementError, match="cannot hold the task"):
        rule.place(Demand("a:1", Request(1, 1.0), strategy=NodeAffinity("b:1")), nodes)


def test_strategies_are_validated_and_travel() -> None:
    assert validate_strategy(None) is None and validate_strategy("default") is None
    assert validate_strategy("spread") == "spread"
    aff = NodeAffinity("b:1", soft=True)
    assert validate_strategy(aff) is aff
    with pytest.raises(ValueError, match="'default', 'spread'"):
        validate_strategy("packed")
    with pytest.raises(TypeError, match="got int 3"):
        validate_strategy(3)
    with pytest.raises(TypeError, match="non-empty str"):
        NodeAffinity("")
    with pytest.raises(TypeError, match="bool"):
        NodeAffinity("b:1", soft="yes")  # type: ignore[arg-type]
    for s in (None, "spread", aff, NodeAffinity("n-b")):
        assert strategy_from_wire(strategy_to_wire(s)) == s
    assert pickle.loads(pickle.dumps(aff)) == aff


# -- the node's half: the spillback asks the policy what to keep ---------------------------
class Sent:
    def __init__(self) -> None:
        self.msgs: dict[str, list] = {}

    def __call__(self, address: str, msgs: list) -> None:
        self.msgs.setdefault(address, []).extend(msgs)


def _spillback(policy: Optional[PlacementPolicy]) -> tuple[FakeScheduler, Sent, Spillback, list]:
    s, sent = FakeScheduler(cpu_limit=4), Sent()
    s.busy = 4
    s.batch.observe(7, 0.001)
    sp = Spillback(s, "node-a:6000", sent, lambda: [GS], threshold_s=0.005, policy=policy)
    g = s.new_group(max_workers=64)
    tasks = s.queue_tasks(g, range(100, 130))
    sp.consider_locked(g)
    return s, sent, sp, tasks


def test_the_spillback_keeps_what_the_policy_says() -> None:
    _, sent, sp, _ = _spillback(None)  # the built-in rule: 20 stay, 10 go
    assert isinstance(sp.policy, LeastWait) and len(sent.msgs[GS]) == 10
    _, sent, _, _ = _spillback(KeepAll())
    assert sent.msgs == {}
    _, sent, _, _ = _spillback(Pack())  # keeps what can start now: no CPU free, all go
    assert len(sent.msgs[GS]) == 30
    _, sent, _, _ = _spillback(Broken())  # a policy that raises: logged, the built-in rule
    assert len(sent.msgs[GS]) == 10


def test_the_spillback_takes_its_policy_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("DPOOL_PLACEMENT_POLICY", "tests.placement._policies:KeepAll")
    _, sent, sp, _ = _spillback(None)
    assert isinstance(sp.policy, KeepAll) and sent.msgs == {}
    monkeypatch.setenv("DPOOL_PLACEMENT_POLICY", "broken")
    _, sent, sp, _ = _spillback(None)  # said in the log; the built-in rule
    assert type(sp.policy) is LeastWait and len(sent.msgs[GS]) == 10


def test_a_task_that_can_never_be_placed_fails_with_placement_error() -> None:
    s, _, sp, tasks = _spillback(None)
    t = tasks[-1]
    assert t.task_id in sp.away
    s.handlers[m.PlacementFailed.CODE](None, m.PlacementFailed(t.task_id, "no node x"))
    assert t.task_id not in sp.away
    (done, ok, payload), = s.finished
    assert done is t and not ok
    with pytest.raises(PlacementError, match="no node x"):
        raise _payload.loads_error(payload)


def test_the_example_runs_on_the_embedded_runtime() -> None:
    import pathlib
    import subprocess
    import sys

    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "placement_policy.py"
    out = subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert "FillFirst places 5 tasks on 2 nodes of 2 CPUs: ['10.0.0.2:6380', " \
        "'10.0.0.2:6380', '10.0.0.3:6380', '10.0.0.3:6380', '10.0.0.2:6380']" in out.stdout
    assert "12 tasks ran on: {'local': 12}" in out.stdout
