"""The autoscaler: nodes when work waits, none when it does not (``dpool start --head
--autoscale MIN:MAX --provider NAME``; ``python -m dpool.autoscaler``).

- ``_policy``: what it decides from what it sees -- ``ClusterView`` (the nodes' queued
  tasks and busy CPUs, the nodes it added and those still starting) in, ``Decision``
  (nodes to add, nodes to remove) out. ``AutoscalePolicy`` is the Protocol a replacement
  implements; ``QueueTarget`` is the built-in rule.
- ``_providers``: where nodes come from -- ``NodeProvider`` (create, terminate, list) and
  ``LocalProvider`` (node processes on this host, each on a loopback address of its own).
- ``_daemon``: the loop (``Autoscaler``) and the process around it.
"""

from dpool._lazy import front_door

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.autoscaler._policy import AutoscalePolicy, ClusterView, Decision, QueueTarget
    from dpool.autoscaler._daemon import parse_range
    from dpool.autoscaler._providers import LocalProvider, NodeProvider, load_provider

_MODULES: dict = {}
_LAZY = {
    **dict.fromkeys(("AutoscalePolicy", "ClusterView", "Decision", "QueueTarget"),
                    "dpool.autoscaler._policy"),
    **dict.fromkeys(("LocalProvider", "NodeProvider", "load_provider"),
                    "dpool.autoscaler._providers"),
    "parse_range": "dpool.autoscaler._daemon",
}

__all__ = [
    "AutoscalePolicy",
    "ClusterView",
    "Decision",
    "LocalProvider",
    "NodeProvider",
    "QueueTarget",
    "load_provider",
    "parse_range",
]

__getattr__, __dir__ = front_door(__name__, _LAZY, _MODULES)
