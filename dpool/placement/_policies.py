"""Placement policies: where a task runs, behind one small ``Protocol``.

    node's queue ──keep(LocalQueue)──▶ policy: how many queued tasks stay here
          │ the rest spill (node._spillback)
          ▼
    global scheduler ──place(Demand, [NodeLoad])──▶ policy: a node, or None (wait),
                                                    or raise PlacementError (never)

Both halves of bottom-up scheduling ask one object: the node's ``Spillback`` calls
``keep``, the global scheduler (``global_scheduler._daemon``) calls ``place``. The
built-in rule is ``LeastWait``; ``dpool start --head --placement-policy module:Class``
loads another (``load``), which implements the two methods (or subclasses ``LeastWait``).

``place`` gets a task's demands (``Demand``: its resource request, its large inputs by
reference -- holder, segment and size --, the bytes that travel inline, and its
strategy) and the nodes' loads and resources (``NodeLoad``, from their reports). It
returns a node, or ``None``: not now (the origin keeps the task and offers it again). It
raises ``PlacementError`` when the task can never be placed as asked (a hard
``NodeAffinity`` to a node not in the cluster); the task fails with it.

Strategies (``Demand.strategy``): ``None`` (the default rule), ``"spread"`` (round-robin
over the nodes that fit) and ``NodeAffinity(node, soft)``. A task in a placement group's
bundle (``InBundle``) never reaches a policy (``global_scheduler._placement_groups``).

Pure functions and small classes over plain data: no processes, threads or I/O.
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple, Optional, Protocol, Sequence, runtime_checkable

from dpool.errors import PlacementError

__all__ = [
    "BUNDLE", "DEFAULT_BANDWIDTH", "HERE", "SPREAD", "Amounts", "Demand", "InBundle",
    "LeastWait", "LocalQueue", "NodeAffinity", "NodeLoad", "PlacementPolicy", "Spread",
    "load", "missing_bytes", "strategy_from_wire", "strategy_to_wire", "validate_strategy",
]

DEFAULT_BANDWIDTH = 1e9  # bytes/s, until transfers are measured


class Amounts(Protocol):
    """What placement reads of a request -- a task's or a bundle's -- the amounts it asks
    for. ``scheduling._resources.Request`` is one; placement needs nothing else of it (and
    so imports nothing of the local scheduler)."""

    @property
    def cpus(self) -> int: ...
    @property
    def gpus(self) -> float: ...
    @property
    def memory(self) -> int: ...
    @property
    def custom(self) -> tuple: ...  # ((name, amount), ...)


@dataclass
class NodeLoad:
    """One node as a global scheduler sees it (from its link and load reports)."""

    address: str
    cpus: int
    busy: int = 0
    queued: int = 0
    avg_task_s: float = 0.002
    pending: int = 0  # tasks placed there since its last load report
    holds: frozenset = frozenset()  # "holder|segment" of the inputs it has copies of
    resources: dict = field(default_factory=dict)  # GPU, memory, custom: what it has
    free: dict = field(default_factory=dict)  # the same, free at its last load report
    node_id: str = ""

    def offers(self) -> dict:
        return {"CPU": self.cpus, **self.resources}

    def describe(self) -> str:
        """What it offers as users name it: ``{CPU: 4, GPU: 1}`` (as a request prints)."""
        return "{" + ", ".join(f"{k}: {v:g}" if isinstance(v, float) else f"{k}: {v}"
                               for k, v in self.offers().items()) + "}"

    def can_hold(self, req: Any) -> bool:
        """Whether ``req`` fits this node at all (whatever runs there now)."""
        if req is None:
            return self.cpus > 0
        res = self.resources
        return (req.cpus <= self.cpus and req.gpus <= res.get("GPU", 0) + 1e-9
                and req.memory <= res.get("memory", 0)
                and all(a <= res.get(k, 0.0) + 1e-9 for k, a in req.custom))

    def has_free(self, req: Any) -> bool:
        if req is None:
            return self.busy + self.pending < self.cpus
        free = self.free
        return (req.cpus <= self.cpus - self.busy - self.pending
                and req.gpus <= free.get("GPU", 0) + 1e-9
                and req.memory <= free.get("memory", 0)
                and all(a <= free.get(k, 0.0) + 1e-9 for k, a in req.custom))

    def estimated_wait(self, input_bytes: int = 0,
                       bandwidth: float = DEFAULT_BANDWIDTH) -> float:
        ahead = max(0, self.queued + self.pending + self.busy - self.cpus + 1)
        return ahead * self.avg_task_s / max(1, self.cpus) + input_bytes / bandwidth

    def named(self, name: str) -> bool:
        """Whether ``name`` is this node's address or id."""
        return name == self.address or (bool(self.node_id) and name == self.node_id)


def missing_bytes(n: NodeLoad, inputs: Iterable[tuple[str, str, int]]) -> int:
    """Bytes of ``inputs`` ((holder, segment, size) of a task's large inputs held on other
    nodes) that node ``n`` would have to pull: those it neither holds nor has a copy of."""
    return sum(size for holder, name, size in inputs
               if holder != n.address and f"{holder}|{name}" not in n.holds)


# -- strategies a task asks for -------------------------------------------------------------
@dataclass(frozen=True)
class NodeAffinity:
    """Run on one node (its address ``host:port`` or its node id, as
    ``dpool.node_id()`` names it). ``soft=True``: prefer it, run elsewhere when it is
    not in the cluster or cannot hold the task; ``soft=False``: there or not at all
    (``PlacementError``)."""

    node: str
    soft: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.node, str) or not self.node:
            raise TypeError(f"NodeAffinity needs a node address or id (a non-empty str), "
                            f"got {self.node!r}")
        if not isinstance(self.soft, bool):
            raise TypeError(f"NodeAffinity(soft=...) must be a bool, got {self.soft!r}")


@dataclass(frozen=True)
class InBundle:
    """Run in a bundle of a placement group (``options(placement_group=pg, bundle=i)``):
    on the node that holds bundle ``index`` of group ``pg_id`` (-1: any of its bundles),
    from what the bundle reserved. Never soft: a bundle that is gone fails the task
    with ``PlacementError``."""

    pg_id: int
    index: int = -1
    soft: bool = False  # (read by the node's spillback as for every strategy)


SPREAD = "spread"
DEFAULT = "default"
# Wire tags that the local scheduler reads on every task with a request, without loading
# this module: ``scheduling._resources`` declares the same values for it (a test pins them).
BUNDLE = "bundle"  # (BUNDLE, pg_id, index): run in a placement group's bundle
HERE: tuple = ("here",)  # set by a node on its own placed tasks: run here, never spill


def validate_strategy(value: Any) -> Any:
    """``None`` for the default rule, ``"spread"``, or a ``NodeAffinity``; anything else
    raises ``ValueError``/``TypeError`` saying what is accepted."""
    if value is None or value == DEFAULT:
        return None
    if value == SPREAD or isinstance(value, NodeAffinity):
        return value
    if isinstance(value, str):
        raise ValueError(f"scheduling={value!r} is not a strategy: use 'default', 'spread' "
                         "or dpool.NodeAffinity(node, soft=...)")
    raise TypeError(f"scheduling must be 'default', 'spread' or a dpool.NodeAffinity, got "
                    f"{type(value).__name__} {value!r}")


def strategy_to_wire(s: Any) -> Optional[tuple]:
    if s is None:
        return None
    if s == SPREAD:
        return (SPREAD,)
    if isinstance(s, InBundle):
        return (BUNDLE, s.pg_id, s.index)
    return ("node", s.node, s.soft)


def strategy_from_wire(t: Any) -> Any:
    if not t or t[0] == HERE[0]:
        return None
    if t[0] == SPREAD:
        return SPREAD
    if t[0] == "node":
        return NodeAffinity(str(t[1]), bool(t[2]))
    if t[0] == BUNDLE:
        return InBundle(int(t[1]), int(t[2]))
    raise ValueError(f"unknown placement strategy on the wire: {t!r}")


# -- the interface --------------------------------------------------------------------------
class Demand(NamedTuple):
    """What a task needs, as the global scheduler sees it."""

    origin: str  # the node that spilled it (its home)
    req: Any = None  # scheduling._resources.Request, or None: one CPU, nothing else
    inputs: tuple = ()  # its large inputs by reference: (holder, segment, size)
    inline_bytes: int = 0  # the rest of its inputs, which travel inside the message
    strategy: Any = None  # None, "spread" or NodeAffinity


class LocalQueue(NamedTuple):
    """A node's view of one queue when it decides what to keep (``PlacementPolicy.keep``)."""

    queued: int  # tasks waiting in the queue
    free: int  # CPUs idle now
    cpus: int  # CPUs of the node
    est_s: Optional[float]  # estimated duration of its head task (None: never measured)
    threshold_s: float  # the longest a task should wait here (the node's setting)


@runtime_checkable
class PlacementPolicy(Protocol):
    """Where tasks run: the node's keep-or-spill (``keep``) and the global scheduler's
    placement (``place``). Implement both (or subclass ``LeastWait``) and load it with
    ``dpool start --head --placement-policy module:Class``."""

    def keep(self, q: LocalQueue) -> int:
        """How many of ``q``'s tasks (from its head) stay on this node; the rest spill."""
        ...

    def place(self, demand: Demand, nodes: Sequence[NodeLoad]) -> Optional[NodeLoad]:
        """The node for a spilled task, or None: not now. Raises ``PlacementError`` if
        it can never be placed as asked. ``nodes``: those alive and linked."""
        ...


class LeastWait:
    """The built-in rule. Keep what can start within the node's threshold; place a
    spilled task on the node with the least estimated wait (queue ahead of it, plus the
    transfer of the inputs it lacks), among those that have what it asks -- free ones
    first -- and never back on its origin. Honours per-task strategies."""

    bandwidth = DEFAULT_BANDWIDTH

    def __init__(self) -> None:
        self._rr = itertools.count()

    def keep(self, q: LocalQueue) -> int:
        if q.cpus and q.est_s is not None:
            return q.free + int(q.threshold_s / max(q.est_s, 1e-6) * q.cpus)
        return q.free  # never measured: it may be long, so what cannot start now goes

    def place(self, demand: Demand, nodes: Sequence[NodeLoad]) -> Optional[NodeLoad]:
        s = demand.strategy
        if s is None:
            return self.least_wait(demand, nodes)
        if s == SPREAD:
            return self.spread(demand, nodes)
        return self.affinity(demand, nodes, s)

    def least_wait(self, demand: Demand, nodes: Iterable[NodeLoad],
                   exclude_origin: bool = True) -> Optional[NodeLoad]:
        req, extra = demand.req, demand.inline_bytes
        best: Optional[NodeLoad] = None
        best_key: tuple = ()
        for n in nodes:
            if n.cpus <= 0 or (exclude_origin and n.address == demand.origin):
                continue
            busy_now = 0
            if req is not None:
                if not n.can_hold(req):
                    continue
                busy_now = 0 if n.has_free(req) else 1
            key = (busy_now,
                   n.estimated_wait(extra + missing_bytes(n, demand.inputs), self.bandwidth),
                   n.busy + n.pending + n.queued, n.address)
            if best is None or key < best_key:
                best, best_key = n, key
        return best

    def spread(self, demand: Demand, nodes: Sequence[NodeLoad]) -> Optional[NodeLoad]:
        """Round-robin over the nodes that can hold the task (its origin included), in
        address order, so a run of such tasks lands evenly."""
        fit = sorted((n for n in nodes if n.cpus > 0 and n.can_hold(demand.req)),
                     key=lambda n: n.address)
        if not fit:
            return None
        return fit[next(self._rr) % len(fit)]

    def affinity(self, demand: Demand, nodes: Sequence[NodeLoad],
                 s: NodeAffinity) -> Optional[NodeLoad]:
        target = next((n for n in nodes if n.named(s.node)), None)
        if target is not None and target.cpus > 0 and target.can_hold(demand.req):
            return target
        if s.soft:  # falls back to the default rule, over every node
            return self.least_wait(demand, nodes, exclude_origin=False)
        names = ", ".join(sorted(n.node_id or n.address for n in nodes)) or "none"
        if target is None:
            why = "no such node is alive in the cluster"
        else:
            why = (f"it cannot hold the task (it offers {target.describe()}, "
                   f"the task asks for {demand.req or '{CPU: 1}'})")
        raise PlacementError(f"the task must run on node {s.node!r} (NodeAffinity, "
                             f"soft=False) but {why}; the nodes are: {names}")


class Spread(LeastWait):
    """Every spilled task that asks for no strategy of its own is spread round-robin
    over the nodes that can hold it (``dpool start --head --placement-policy spread``)."""

    def place(self, demand: Demand, nodes: Sequence[NodeLoad]) -> Optional[NodeLoad]:
        if demand.strategy is None:
            return self.spread(demand, nodes)
        return super().place(demand, nodes)


_BUILTIN = {"default": LeastWait, "least-wait": LeastWait, "spread": Spread}


def load(spec: Optional[str]) -> PlacementPolicy:
    """The policy ``spec`` names: ``None``/``""``/``"default"``, ``"spread"``, or
    ``"module:Class"`` (a class built with no arguments, or an object with ``keep`` and
    ``place``). Raises ``ValueError`` (malformed, not found) or ``TypeError`` (not a
    policy), saying which."""
    if not spec:
        return LeastWait()
    builtin = _BUILTIN.get(spec)
    if builtin is not None:
        return builtin()
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"placement policy {spec!r}: expected 'module:Class' or one of "
                         f"{', '.join(sorted(_BUILTIN))}")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ValueError(f"placement policy {spec!r}: cannot import {mod_name!r}: {exc}") \
            from exc
    obj: Any = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"placement policy {spec!r}: {mod_name!r} has no "
                             f"{attr!r}") from None
    policy = obj() if isinstance(obj, type) else obj
    if not isinstance(policy, PlacementPolicy):
        raise TypeError(f"placement policy {spec!r} is not a PlacementPolicy (it needs "
                        f"keep(LocalQueue) -> int and place(Demand, nodes) -> node or None)")
    return policy
