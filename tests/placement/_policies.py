"""Placement policies written outside dpool's core, for the tests (loaded by
``module:Class`` name, as ``dpool start --placement-policy`` does)."""

from __future__ import annotations

from typing import Optional, Sequence

from dpool.placement import Demand, LeastWait, LocalQueue, NodeLoad


class Pack:
    """A policy written outside the core: fill nodes in address order (each up to its
    CPUs) before using the next -- the opposite of spreading -- and keep nothing queued
    at home that cannot start at once."""

    def keep(self, q: LocalQueue) -> int:
        return q.free

    def place(self, demand: Demand, nodes: Sequence[NodeLoad]) -> Optional[NodeLoad]:
        for n in sorted(nodes, key=lambda n: n.address):
            if n.address != demand.origin and n.can_hold(demand.req) and n.has_free(demand.req):
                return n
        return None  # all full: wait


class NotAPolicy:
    def place(self, demand: Demand, nodes: Sequence[NodeLoad]) -> None:
        return None


class KeepAll(LeastWait):
    def keep(self, q: LocalQueue) -> int:
        return q.queued


class Last(LeastWait):
    """Every spilled task goes to the node with the greatest address that can hold it;
    a task no node can hold can never be placed (``PlacementError``)."""

    def place(self, demand: Demand, nodes: Sequence[NodeLoad]) -> Optional[NodeLoad]:
        from dpool.errors import PlacementError

        fit = [n for n in nodes if n.can_hold(demand.req)]
        if not fit:
            raise PlacementError(f"policy Last: no node can hold {demand.req}")
        return max(fit, key=lambda n: n.address)


class Broken(LeastWait):
    """A policy with a bug: the node and the global scheduler log it and use the
    built-in rule."""

    def keep(self, q: LocalQueue) -> int:
        raise RuntimeError("bug in keep")
