"""What the autoscaler decides from what it sees.

The rule of ``QueueTarget``, the built-in policy, every round (``Autoscaler.period_s``):

- **Up.** The cluster lacks ``short = queued - free CPUs`` CPUs (queued: tasks waiting on
  every node, free: CPUs of live nodes not running a task), or, with a standing
  ``dpool.request_resources(num_cpus=R)``, ``R - its CPUs``, whichever is more. Nodes
  still starting count as coming CPUs. If it lacks some, it adds ``ceil(short / cpus_per_node)`` nodes, but at most
  as many as it has now (doubling per round; at least one), and never past ``max_nodes``.
  An impossible request is not its business: a node shape offers CPUs only, and a task
  asking what no node has fails by itself (``PlacementError``).
- **Down.** A node it added that ran nothing and had nothing queued for ``idle_timeout_s``
  (seen idle in every round since), while the cluster has nothing queued, is removed, down
  to ``min_nodes`` and never below a standing request's CPUs. Removing is draining (the node's SIGTERM): what it
  still runs goes elsewhere uncharged.

A replacement implements ``AutoscalePolicy.decide``; the loop applies what it returns
within ``min_nodes``/``max_nodes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class NodeSeen:
    """One live node, as the last status said."""

    node_id: str
    cpus_total: int
    cpus_used: int
    queued: int
    ours: bool = False  # added by this autoscaler (only those are ever removed)
    idle_since: float | None = None  # (monotonic) idle in every round since; None: busy


@dataclass
class ClusterView:
    nodes: list[NodeSeen]
    pending: int  # nodes being started, not yet live
    ours: int  # live or pending nodes this autoscaler added
    now: float
    requested_cpus: int = 0  # ``dpool.request_resources``: CPUs to have, whatever is queued

    @property
    def queued(self) -> int:
        return sum(n.queued for n in self.nodes)

    @property
    def free_cpus(self) -> int:
        return sum(max(0, n.cpus_total - n.cpus_used) for n in self.nodes)

    @property
    def total_cpus(self) -> int:
        return sum(n.cpus_total for n in self.nodes)


@dataclass
class Decision:
    add: int = 0
    remove: list[str] = field(default_factory=list)  # node ids, of nodes it added
    why: str = ""


class AutoscalePolicy(Protocol):
    """How many nodes to add, which to remove, given the cluster as seen now."""

    def decide(self, view: ClusterView) -> Decision: ...


class QueueTarget:
    """The built-in rule (see the module's doc)."""

    def __init__(self, min_nodes: int, max_nodes: int, cpus_per_node: int,
                 idle_timeout_s: float) -> None:
        if not 0 <= min_nodes <= max_nodes:
            raise ValueError(f"--autoscale MIN:MAX needs 0 <= MIN <= MAX, got "
                             f"{min_nodes}:{max_nodes}")
        if cpus_per_node < 1:
            raise ValueError(f"a new node's CPUs must be >= 1, got {cpus_per_node}")
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.cpus_per_node = cpus_per_node
        self.idle_timeout_s = idle_timeout_s

    def decide(self, view: ClusterView) -> Decision:
        if view.ours < self.min_nodes:
            return Decision(add=self.min_nodes - view.ours, why="below the minimum")
        coming = view.pending * self.cpus_per_node
        short = max(view.queued - view.free_cpus - coming,
                    view.requested_cpus - view.total_cpus - coming)
        if short > 0 and view.ours < self.max_nodes:
            want = math.ceil(short / self.cpus_per_node)
            add = min(want, max(1, view.ours), self.max_nodes - view.ours)
            return Decision(add=add, why=f"{view.queued} queued, {view.free_cpus} CPUs free, "
                                         f"{view.requested_cpus} requested")
        if view.queued or view.pending:
            return Decision()
        idle = [n for n in view.nodes if n.ours and n.idle_since is not None
                and view.now - n.idle_since >= self.idle_timeout_s]
        spare = view.ours - self.min_nodes
        if view.requested_cpus:  # (what was asked for stays)
            extra = view.total_cpus - view.requested_cpus
            spare = min(spare, max(0, extra // self.cpus_per_node))
        if idle and spare > 0:
            idle.sort(key=lambda n: n.idle_since or 0.0, reverse=True)
            return Decision(remove=[n.node_id for n in idle[:spare]],
                            why=f"idle for {self.idle_timeout_s:g} s")
        return Decision()
