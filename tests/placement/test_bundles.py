"""Gang placement's decision (``placement.place_bundles``) over fake nodes:
all bundles or none, pack / spread / strict_spread, and two gangs that together do not
fit -- the first is placed whole, the second waits (holds nothing)."""

from __future__ import annotations

import pytest

from dpool.errors import PlacementError
from dpool.placement import NodeLoad, place_bundles
from dpool.scheduling._resources import Request

GPU1 = Request(1, 1.0)


def nodes(n: int = 3, cpus: int = 2, gpus: int = 2) -> list[NodeLoad]:
    return [NodeLoad(f"10.0.0.{i + 2}:6380", cpus, resources={"GPU": gpus},
                     free={"GPU": gpus}) for i in range(n)]


def addresses(placed):
    return [n.address for n in placed]


def reserve(placed, bundles):
    """What a reservation does to the nodes' view (pending CPUs, free GPUs)."""
    for n, b in zip(placed, bundles, strict=True):
        n.pending += b.cpus
        n.free["GPU"] -= b.gpus


def test_pack_uses_one_node_when_one_has_room():
    ns = nodes()
    assert addresses(place_bundles([GPU1] * 2, "pack", ns)) == ["10.0.0.2:6380"] * 2


def test_pack_fills_nodes_one_after_the_other_when_none_has_room_for_all():
    placed = addresses(place_bundles([GPU1] * 4, "pack", nodes()))
    assert placed.count("10.0.0.2:6380") == 2 and placed.count("10.0.0.3:6380") == 2


def test_spread_uses_every_node_before_doubling_up():
    placed = addresses(place_bundles([GPU1] * 4, "spread", nodes()))
    assert sorted(set(placed)) == [f"10.0.0.{i}:6380" for i in (2, 3, 4)]
    assert sorted(placed.count(a) for a in set(placed)) == [1, 1, 2]


def test_strict_spread_needs_distinct_nodes():
    assert len(set(addresses(place_bundles([GPU1] * 3, "strict_spread", nodes())))) == 3
    with pytest.raises(PlacementError, match="3 can hold"):
        place_bundles([GPU1] * 4, "strict_spread", nodes())


def test_all_or_nothing_and_two_gangs_that_do_not_fit_together():
    ns = nodes()  # 6 CPUs and 6 GPUs in all
    gang = [GPU1] * 4
    first = place_bundles(gang, "spread", ns)
    assert first is not None
    reserve(first, gang)
    # the second gang of four does not fit beside the first: nothing of it is placed
    assert place_bundles(gang, "spread", ns) is None
    assert place_bundles(gang, "pack", ns) is None
    # the first one freed: the second fits whole
    for n, b in zip(first, gang, strict=True):
        n.pending -= b.cpus
        n.free["GPU"] += b.gpus
    assert place_bundles(gang, "pack", ns) is not None


def test_a_bundle_no_node_can_hold_is_never_placed():
    with pytest.raises(PlacementError, match="fits no node"):
        place_bundles([Request(1, 4.0)], "pack", nodes())
    with pytest.raises(ValueError, match="strategy 'tight'"):
        place_bundles([GPU1], "tight", nodes())
    with pytest.raises(ValueError, match="at least one bundle"):
        place_bundles([], "pack", nodes())
