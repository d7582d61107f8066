"""Gang placement, the decision only: where each bundle of a placement group goes, all
of them at once or none.

    bundles [{CPU: 1, GPU: 1}] * 4, strategy ──place_bundles(nodes)──▶ [node per bundle]
                                                                    or None: not now
                                                                    or PlacementError

``pack`` puts the bundles on as few nodes as it can (one, when one has room for all);
``spread`` on as many as it can (a node gets a second bundle only when every node that
has room already has one); ``strict_spread`` on distinct nodes or not at all. The answer
is for every bundle or for none: it counts what each bundle takes from its node before
placing the next, and returns ``None`` -- hold nothing, ask again when the load changed
-- when the whole group does not fit now. So two groups that together do not fit never
each hold part of what they need: the first placed holds all of it, the second waits.
It raises ``PlacementError`` when the group can never fit as asked (a bundle no node can
hold, ``strict_spread`` with more bundles than such nodes).

Pure function over ``NodeLoad`` (free amounts from the nodes' load reports, minus what
was placed since) and the bundles' ``Amounts``: unit-tested with fake nodes. Its caller:
``_gangs.GangTable``, for the embedded runtime's reservations
(``runtime._placement_groups_local``) and a global scheduler's
(``global_scheduler._placement_groups``), behind ``dpool.placement_group``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from dpool.errors import PlacementError
from dpool.placement._policies import Amounts, NodeLoad

__all__ = ["STRATEGIES", "place_bundles"]

STRATEGIES = ("pack", "spread", "strict_spread")


class _Room:
    """What one node has free, as bundles are tentatively placed on it."""

    __slots__ = ("node", "cpus", "free", "placed")

    def __init__(self, n: NodeLoad) -> None:
        self.node = n
        self.cpus = n.cpus - n.busy - n.pending
        self.free = dict(n.free)
        self.placed = 0

    def fits(self, r: Amounts) -> bool:
        f = self.free
        return (r.cpus <= self.cpus and r.gpus <= f.get("GPU", 0) + 1e-9
                and r.memory <= f.get("memory", 0)
                and all(a <= f.get(k, 0.0) + 1e-9 for k, a in r.custom))

    def take(self, r: Amounts) -> None:
        self.cpus -= r.cpus
        f = self.free
        f["GPU"] = f.get("GPU", 0) - r.gpus
        f["memory"] = f.get("memory", 0) - r.memory
        for k, a in r.custom:
            f[k] = f.get(k, 0.0) - a
        self.placed += 1


def place_bundles(bundles: Sequence[Amounts], strategy: str,
                  nodes: Sequence[NodeLoad]) -> Optional[list[NodeLoad]]:
    """The node of each bundle (in order), or None: not all fit now. Raises
    ``PlacementError`` if they never can, ``ValueError`` for an unknown strategy."""
    if strategy not in STRATEGIES:
        raise ValueError(f"placement group strategy {strategy!r}: use one of "
                         f"{', '.join(STRATEGIES)}")
    if not bundles:
        raise ValueError("a placement group needs at least one bundle")
    live = sorted((n for n in nodes if n.cpus > 0), key=lambda n: n.address)
    for i, b in enumerate(bundles):
        if not any(n.can_hold(b) for n in live):
            raise PlacementError(f"bundle {i} ({b}) fits no node of the cluster (the "
                                 f"nodes: {', '.join(n.address for n in live) or 'none'})")
    if strategy == "strict_spread":
        holders = [n for n in live if any(n.can_hold(b) for b in bundles)]
        if len(bundles) > len(holders):
            raise PlacementError(f"strict_spread needs {len(bundles)} distinct nodes; "
                                 f"{len(holders)} can hold its bundles")
    rooms = [_Room(n) for n in live]
    if strategy == "pack":
        for room in rooms:  # one node with room for all of them, when there is one
            if _holds_all(room.node, bundles):
                return [room.node] * len(bundles)
    # biggest first, so that a large bundle is not left without a node by small ones
    order = sorted(range(len(bundles)), key=lambda i: -bundles[i].cpus)
    chosen: dict[int, _Room] = {}
    for i in order:
        b = bundles[i]
        fit = [r for r in rooms if r.fits(b)]
        if strategy == "strict_spread":
            fit = [r for r in fit if r.placed == 0]
        if not fit:
            return None  # not now: nothing is held
        if strategy == "pack":  # the most used node that has room
            room = min(fit, key=lambda r: (-r.placed, r.node.address))
        else:  # the least used
            room = min(fit, key=lambda r: (r.placed, r.node.address))
        room.take(b)
        chosen[i] = room
    return [chosen[i].node for i in range(len(bundles))]


def _holds_all(n: NodeLoad, bundles: Sequence[Amounts]) -> bool:
    trial = _Room(n)
    for b in bundles:
        if not trial.fits(b):
            return False
        trial.take(b)
    return True
