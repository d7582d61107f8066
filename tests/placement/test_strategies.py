"""Per-call and per-executor placement strategies (``options(scheduling=...)``,
``ProcessPoolExecutor(scheduling=...)``): the request they travel in, bad values at the
call, and what they mean on the embedded runtime (one host: nothing to place, but a
hard ``NodeAffinity`` to another node can never be met)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import dpool
from dpool import NodeAffinity, ProcessPoolExecutor
from dpool.scheduling import _resources


def where(x):
    return x, os.getpid()


# -- the request ------------------------------------------------------------------------
def test_a_strategy_alone_is_a_request_and_travels_on_the_wire():
    req = _resources.build(_resources.with_strategy(None, "spread"))
    assert req is not None and req.cpus == 1 and req.strategy == ("spread",)
    wire = _resources.to_wire(req)
    assert len(wire) == 5 and _resources.from_wire(wire) == req
    # what the cluster driver sends (``tuple(req)``) reads back the same
    assert _resources.from_wire(tuple(req)) == req
    aff = _resources.build({"GPU": 1}, _resources.with_strategy(None, NodeAffinity("n1")))
    assert aff.gpus == 1.0 and aff.strategy == ("node", "n1", False)
    assert _resources.from_wire(_resources.to_wire(aff)) == aff


def test_no_strategy_keeps_the_four_field_wire_and_the_default_is_no_request():
    assert _resources.build(_resources.with_strategy(None, "default")) is None
    assert _resources.to_wire(_resources.Request(2)) == (2, 0.0, 0, ())
    assert _resources.from_wire((2, 0.0, 0, (), None)) == _resources.Request(2)
    # a later "default" overrides an earlier strategy, as a later amount does
    spread = _resources.with_strategy(None, "spread")
    assert _resources.build(spread, _resources.with_strategy(None, "default")) is None


def test_a_resource_named_like_the_option_does_not_collide():
    req = _resources.build(_resources.with_strategy(
        _resources.spec(resources={"scheduling": 2}), "spread"))
    assert req.custom == (("scheduling", 2.0),) and req.strategy == ("spread",)


@pytest.mark.parametrize("bad, exc, words", [
    ("sprd", ValueError, "is not a strategy"),
    (3, TypeError, "scheduling must be"),
    (("spread",), TypeError, "scheduling must be"),
])
def test_bad_strategies_raise_at_the_call(bad, exc, words):
    with ProcessPoolExecutor(1) as ex:
        with pytest.raises(exc, match=words):
            ex.options(scheduling=bad)
        with pytest.raises(exc, match=words):
            ex.options(num_cpus=1).options(scheduling=bad)
    with pytest.raises(exc, match=words):
        ProcessPoolExecutor(1, scheduling=bad)


def test_node_affinity_checks_its_arguments():
    with pytest.raises(TypeError, match="non-empty str"):
        NodeAffinity("")
    with pytest.raises(TypeError, match="must be a bool"):
        NodeAffinity("n", soft="yes")  # type: ignore[arg-type]


# -- the embedded runtime ---------------------------------------------------------------
def test_embedded_runs_spread_and_affinities_to_this_host():
    with ProcessPoolExecutor(2, scheduling="spread") as ex:
        assert [v for v, _ in ex.map(where, range(6))] == list(range(6))
        here = dpool.node_id()
        assert here == "local"
        assert ex.options(scheduling=NodeAffinity(here)).submit(where, 1).result(30)[0] == 1
        soft = ex.options(scheduling=NodeAffinity("10.9.9.9:1", soft=True))
        assert soft.submit(where, 2).result(30)[0] == 2
        assert ex.options(scheduling="default").submit(where, 3).result(30)[0] == 3


def test_embedded_hard_affinity_elsewhere_fails_with_placement_error():
    with ProcessPoolExecutor(1) as ex:
        fut = ex.options(scheduling=NodeAffinity("10.9.9.9:1")).submit(where, 1)
        with pytest.raises(dpool.PlacementError, match="embedded runtime") as info:
            fut.result(30)
        assert isinstance(info.value, dpool.ResourceError)
        assert "10.9.9.9:1" in str(info.value)
        # the executor keeps working
        assert ex.submit(where, 2).result(30)[0] == 2


def test_a_strategy_combines_with_a_resource_request():
    with ProcessPoolExecutor(2, resources={"CPU": 2}) as ex:
        view = ex.options(scheduling="spread")
        assert view.submit(where, 1).result(30)[0] == 1
        with pytest.raises(dpool.ResourceError, match="CPU: 3 asked"):
            view.options(num_cpus=3).submit(where, 1).result(30)


def test_the_example_runs_on_the_embedded_runtime():
    example = Path(__file__).resolve().parents[2] / "examples" / "scheduling_strategies.py"
    env = {k: v for k, v in os.environ.items() if k not in ("DPOOL_ADDRESS", "DPOOL_NODE_ID")}
    out = subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "spread: {'local': 12}" in out.stdout
    assert "hard affinity to a missing node: PlacementError" in out.stdout
