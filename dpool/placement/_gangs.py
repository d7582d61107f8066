"""Placement groups' state, owned by whoever reserves them: a global scheduler (in a
cluster) or the embedded runtime (one host). All bundles or none, in two phases.

    reserve(pg) ──place_bundles──▶ None: waits (tried again when the load changes)
         │                         PlacementError: "failed" (it can never fit)
         ▼ a node per bundle
    hold(node, pg, i) for every bundle ──▶ held(pg, i, ok) from each node
         all ok: "ready" (nodes reported)    one refused: free all, wait again
    remove(pg): free every bundle            node_lost: "lost" (others freed)

The decision (``_bundles.place_bundles``) counts what the bundles take before any is
held; this table takes it off the loads it decided on (``pending`` CPUs, ``free``
resources) until the nodes' next reports show it, and gives back what it frees at once.
So two groups that together do not fit never both start holding, and a group waiting for
a removed one is placed without waiting for the next reports. A node checks each hold
against what it really has: a refusal frees what the attempt holds elsewhere and the
group waits again, so no partial hold stays. ``attempt`` numbers each try; a late answer
to an abandoned try is ignored.

A node lost while holding a bundle of a ready group makes the group "lost" (reported to
its origin, its other bundles freed) until it is removed; one lost while the group is
still holding makes it try again. Groups whose origin node is lost are removed.

A plain state machine over callbacks (``hold``, ``free``, ``report``): no processes, no
locks of its own (the caller's), unit-tested with fake nodes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Optional

from dpool.errors import PlacementError
from dpool.placement._bundles import place_bundles
from dpool.placement._policies import Amounts, NodeLoad

__all__ = ["Gang", "GangTable"]

WAITING, HOLDING, READY, LOST = "waiting", "holding", "ready", "lost"

# (node address, pg_id, index, the bundle's request, attempt)
HoldFn = Callable[[str, int, int, Amounts, int], None]
FreeFn = Callable[[str, int, int], None]
# (origin, pg_id, state, nodes, reason)
ReportFn = Callable[[str, int, str, tuple, str], None]


class Gang:
    __slots__ = ("attempt", "bundles", "held", "nodes", "origin", "pg_id", "seq", "state",
                 "strategy")

    def __init__(self, pg_id: int, origin: str, bundles: list, strategy: str,
                 seq: int) -> None:
        self.pg_id = pg_id
        self.origin = origin
        self.bundles: list[Amounts] = bundles
        self.strategy = strategy
        self.seq = seq  # arrival order: waiting groups are tried first come, first served
        self.state = WAITING
        self.nodes: tuple = ()  # the node of each bundle (holding, ready or lost)
        self.held: set[int] = set()
        self.attempt = 0


class GangTable:
    def __init__(self, hold: HoldFn, free: FreeFn, report: ReportFn) -> None:
        self._hold = hold
        self._free = free
        self._report = report
        self.gangs: dict[int, Gang] = {}
        self._seq = itertools.count()

    @property
    def waiting(self) -> bool:
        """Whether some group waits to be placed (cheap: callers ask on every load)."""
        return any(g.state == WAITING for g in self.gangs.values())

    def reserve(self, pg_id: int, origin: str, bundles: Sequence[Amounts], strategy: str,
                loads: Sequence[NodeLoad]) -> None:
        """A new group: failed at once if it can never fit, else held or waiting."""
        if pg_id in self.gangs:
            return  # (sent again by a driver that moved)
        try:  # can it ever fit: on these nodes, were nothing else running or held?
            if place_bundles(list(bundles), strategy, _empty(loads)) is None:
                raise PlacementError(
                    f"the {len(bundles)} bundles ({', '.join(map(str, bundles))}) do not "
                    f"fit the nodes together ({_offers(loads)}), even with nothing else "
                    "running or reserved")
        except (PlacementError, ValueError) as exc:
            self._report(origin, pg_id, "failed", (), str(exc))
            return
        self.gangs[pg_id] = Gang(pg_id, origin, list(bundles), strategy, next(self._seq))
        self.retry(loads)

    def retry(self, loads: Sequence[NodeLoad]) -> None:
        """Try the waiting groups, first come first: each that fits now starts holding
        (and takes what it holds off ``loads``)."""
        for g in sorted((g for g in self.gangs.values() if g.state == WAITING),
                        key=lambda g: g.seq):
            try:
                chosen = place_bundles(g.bundles, g.strategy, loads)
            except PlacementError:
                continue  # no longer fits the cluster (a node left): wait for one to join
            if chosen is None:
                continue
            g.state, g.held = HOLDING, set()
            g.attempt += 1
            g.nodes = tuple(n.address for n in chosen)
            for i, (b, n) in enumerate(zip(g.bundles, chosen, strict=True)):
                _take(n, b)
                self._hold(n.address, g.pg_id, i, b, g.attempt)

    def held(self, pg_id: int, index: int, ok: bool, reason: str, attempt: int,
             loads: Sequence[NodeLoad]) -> None:
        """A node's answer to a hold."""
        g = self.gangs.get(pg_id)
        if g is None or g.state != HOLDING or attempt != g.attempt:
            return  # removed meanwhile (freed already), or an abandoned try's answer
        if ok:
            g.held.add(index)
            if len(g.held) == len(g.bundles):
                g.state = READY
                self._report(g.origin, pg_id, READY, g.nodes, "")
            return
        refused = g.nodes[index]
        self._abandon(g, loads)
        self.retry([n for n in loads if n.address != refused])

    def _abandon(self, g: Gang, loads: Sequence[NodeLoad]) -> None:
        """Free what the current try holds (or will: frees follow holds on each link)."""
        self._free_all(g, loads)
        g.state, g.held, g.nodes = WAITING, set(), ()

    def _free_all(self, g: Gang, loads: Sequence[NodeLoad], but: str = "") -> None:
        """Free every bundle of ``g`` (on every node but ``but``), and give what they
        took back to ``loads`` until the nodes' next reports say so."""
        by_address = {n.address: n for n in loads}
        for i, node in enumerate(g.nodes):
            if node == but:
                continue
            self._free(node, g.pg_id, i)
            n = by_address.get(node)
            if n is not None:
                _take(n, g.bundles[i], -1)

    def remove(self, pg_id: int, loads: Sequence[NodeLoad]) -> bool:
        """Free the group's bundles (or stop waiting for them). False: not known here."""
        g = self.gangs.pop(pg_id, None)
        if g is None:
            return False
        if g.state in (HOLDING, READY):
            self._free_all(g, loads)
        self.retry(loads)
        return True

    def node_lost(self, address: str, loads: Sequence[NodeLoad]) -> None:
        """Node ``address`` is gone: its groups (as origin) are removed, those holding a
        bundle there are lost (ready) or try again (holding)."""
        for g in list(self.gangs.values()):
            if g.origin == address:  # (freed into ``loads``: the retry below may use them)
                self.gangs.pop(g.pg_id, None)
                if g.state in (HOLDING, READY):
                    self._free_all(g, loads, but=address)
            elif address in g.nodes and g.state == HOLDING:
                self._abandon(g, loads)
            elif address in g.nodes and g.state == READY:
                lost = [i for i, n in enumerate(g.nodes) if n == address]
                self._free_all(g, loads, but=address)
                g.state = LOST
                self._report(g.origin, g.pg_id, LOST, g.nodes,
                             f"node {address}, which held bundle(s) "
                             f"{', '.join(map(str, lost))}, is gone: remove the group and "
                             "reserve a new one")
        self.retry(loads)

    def node_of(self, pg_id: int, index: int) -> Optional[str]:
        """Where bundle ``index`` (-1: the group's first) of a ready group is held."""
        g = self.gangs.get(pg_id)
        if g is None or g.state != READY or not g.nodes:
            return None
        if index < 0:
            return g.nodes[0]
        return g.nodes[index] if index < len(g.nodes) else None


def _take(n: NodeLoad, b: Amounts, sign: int = 1) -> None:
    """What bundle ``b`` takes from node ``n`` (``sign`` -1: gives back), until the
    node's next load report says so (``pending`` below 0: CPUs freed since it)."""
    n.pending += sign * b.cpus
    free = n.free
    if b.gpus:
        free["GPU"] = free.get("GPU", 0) - sign * b.gpus
    if b.memory:
        free["memory"] = free.get("memory", 0) - sign * b.memory
    for k, a in b.custom:
        free[k] = free.get(k, 0.0) - sign * a


def _empty(loads: Sequence[NodeLoad]) -> list:
    """The nodes with nothing running or reserved: what could ever fit."""
    return [NodeLoad(n.address, n.cpus, resources=dict(n.resources), free=dict(n.resources),
                     node_id=n.node_id) for n in loads]


def _offers(loads: Sequence[NodeLoad]) -> str:
    return "; ".join(f"{n.address} {n.describe()}"
                     for n in sorted(loads, key=lambda n: n.address)) or "no nodes"
