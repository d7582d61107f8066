"""Cluster placement: which node a task or a placement group's bundle goes to.

- ``_policies``: placement policies behind one ``Protocol`` (``PlacementPolicy``: a
  node's keep-or-spill, ``keep``, and a global scheduler's choice of node, ``place``;
  the built-in ``LeastWait``, ``Spread``, ``load`` for ``--placement-policy``), what
  they decide over (``NodeLoad``, ``Demand``, ``LocalQueue``), and the strategies a task
  asks for (``NodeAffinity``, ``InBundle``) with their wire form.
- ``_bundles``: ``place_bundles``, gang placement's decision -- a node for every bundle
  of a group, or for none.
- ``_gangs``: ``GangTable``, placement groups' state at their owner (a global scheduler,
  or the embedded runtime for one host), reserved in two phases, all bundles or none.

Contract: pure bookkeeping over plain data -- no processes, threads, locks (the
caller's) or I/O; unit-tested with fake nodes (tests/placement/). It imports only the
layers below it (``dpool.errors``), never the local scheduler, the daemons or the
runtime, which all import it: a request is read through ``Amounts`` (its CPUs, GPUs,
memory and custom resources), which ``scheduling._resources.Request`` satisfies. What a
node holds for a bundle is the local scheduler's ledger (``scheduling._bundle_ledger``).

Other packages import the names below from here, not from the private modules. They
load on first use (PEP 562): importing this package loads none of its modules, nor
``typing``.
"""

from dpool._lazy import front_door

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.placement._bundles import STRATEGIES, place_bundles
    from dpool.placement._gangs import GangTable
    from dpool.placement._policies import (
        DEFAULT_BANDWIDTH,
        HERE,
        SPREAD,
        Amounts,
        Demand,
        InBundle,
        LeastWait,
        LocalQueue,
        NodeAffinity,
        NodeLoad,
        PlacementPolicy,
        Spread,
        load,
        missing_bytes,
        strategy_from_wire,
        strategy_to_wire,
        validate_strategy,
    )

_LAZY = {
    **dict.fromkeys(("STRATEGIES", "place_bundles"), "dpool.placement._bundles"),
    "GangTable": "dpool.placement._gangs",
    **dict.fromkeys(("DEFAULT_BANDWIDTH", "HERE", "SPREAD", "Amounts", "Demand", "InBundle",
                     "LeastWait", "LocalQueue", "NodeAffinity", "NodeLoad", "PlacementPolicy",
                     "Spread", "load", "missing_bytes", "strategy_from_wire",
                     "strategy_to_wire", "validate_strategy"), "dpool.placement._policies"),
}

__all__ = [
    "DEFAULT_BANDWIDTH",
    "HERE",
    "SPREAD",
    "STRATEGIES",
    "Amounts",
    "Demand",
    "GangTable",
    "InBundle",
    "LeastWait",
    "LocalQueue",
    "NodeAffinity",
    "NodeLoad",
    "PlacementPolicy",
    "Spread",
    "load",
    "missing_bytes",
    "place_bundles",
    "strategy_from_wire",
    "strategy_to_wire",
    "validate_strategy",
]


__getattr__, __dir__ = front_door(__name__, _LAZY)
