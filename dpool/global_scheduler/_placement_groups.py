"""Placement groups in a global scheduler: the replica a node sends a group to owns it.

    node (origin) ──PlacementGroupReserve──▶ PlacementGroupTable ──BundleHold──▶ each chosen node
                  ◀──PlacementGroupState──            ▲          ◀──BundleHeld──
    node ──RemoteTask (InBundle)──▶ forwarded to the node holding the bundle

It sees every linked node's free resources (their load reports), so it decides a whole
group at once (``placement.GangTable`` over ``placement.place_bundles``). Waiting
groups are tried again on each load report and after each removal. A task in a bundle
held by another node than its origin comes through here (the origin spills it) and goes
to that node; one whose group this replica does not know (removed, lost, another
replica's) fails with ``PlacementFailed``.

A node links to every replica but sends a group's messages to one (the first by
address): if that replica dies, the groups it owned are lost with it (their nodes free
the bundles when the link closes, ``node._placement_groups``), and their drivers are told.

Runs on the replica's IO thread with its lock held (``_daemon``), like placement.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, Optional

from dpool.placement import GangTable, InBundle, NodeLoad
from dpool.protocol import messages as m
from dpool.scheduling import resources as _resources

__all__ = ["PlacementGroupTable"]


class PlacementGroupTable:
    """The placement groups a global scheduler owns."""

    def __init__(self, send: Callable[[str, list], None]) -> None:
        self._send = send  # (node address, messages): over that node's link, if linked
        self.table = GangTable(self._hold, self._free, self._report)
        self._rr = itertools.count()

    def _hold(self, node: str, pg_id: int, index: int, req: Any, attempt: int) -> None:
        self._send(node, [m.BundleHold(pg_id, index, _resources.to_wire(req) or (), True,
                                       attempt)])

    def _free(self, node: str, pg_id: int, index: int) -> None:
        self._send(node, [m.BundleHold(pg_id, index, (), False, 0)])

    def _report(self, origin: str, pg_id: int, state: str, nodes: tuple,
                reason: str) -> None:
        self._send(origin, [m.PlacementGroupState(pg_id, state, nodes, reason)])

    # -- messages (lock held) ----------------------------------------------------------------
    def on_message(self, msg: Any, loads: Sequence[NodeLoad]) -> None:
        t = self.table
        if isinstance(msg, m.PlacementGroupReserve):
            bundles = [_resources.Request(b[0], b[1], b[2], tuple(tuple(x) for x in b[3]))
                       for b in msg.bundles]
            t.reserve(msg.pg_id, msg.origin, bundles, msg.strategy, loads)
        elif isinstance(msg, m.PlacementGroupRemove):
            t.remove(msg.pg_id, loads)
        elif isinstance(msg, m.BundleHeld):
            t.held(msg.pg_id, msg.index, msg.ok, msg.reason, msg.attempt, loads)

    def on_load(self, loads: Sequence[NodeLoad]) -> None:
        if self.table.gangs and self.table.waiting:
            self.table.retry(loads)

    def node_lost(self, address: str, loads: Sequence[NodeLoad]) -> None:
        if self.table.gangs:
            self.table.node_lost(address, loads)

    def place(self, s: InBundle, origin: str) -> tuple[Optional[str], str]:
        """(the node to run a task of bundle ``s`` on, or None and why not)."""
        g = self.table.gangs.get(s.pg_id)
        if g is None or g.state != "ready":
            state = "not known to this global scheduler (removed?)" if g is None else g.state
            return None, (f"the task asks to run in placement group {s.pg_id:#x}, which is "
                          f"{state}")
        if s.index >= len(g.nodes):
            return None, (f"placement group {s.pg_id:#x} has {len(g.nodes)} bundles; the "
                          f"task asks for bundle {s.index}")
        if s.index >= 0:
            return g.nodes[s.index], ""
        others = sorted(set(g.nodes) - {origin}) or list(g.nodes)
        return others[next(self._rr) % len(others)], ""
