"""The node daemon: one per host, the local scheduler of a cluster (``python -m dpool.node``).

- ``_daemon``: ``NodeDaemon``, which builds the services below around one
  ``scheduling.LocalScheduler`` and runs them; ``_process``: what the node and global
  scheduler daemons share as processes (token, readiness, signals, logging).
- Services plugged into the scheduler (``scheduling.SchedulerAPI``): ``_attach``
  (drivers attached over the unix socket or TCP), ``_leases`` (workers lent to drivers
  of this host), ``_spillback`` (tasks sent to other nodes through a global scheduler;
  with ``_spillback_waits``: tasks asking for resources this node lacks, and the safety
  nets; ``_spillback_results``: outcomes and lent results coming back; ``_spillback_base``:
  what those parts share), ``_remote`` (tasks other nodes sent here), ``_placement_groups``
  (placement groups: its drivers' groups relayed to a global scheduler, bundles held).
- Connections: ``_server`` (the listeners: authentication, hand-off, object transfers;
  used by the global scheduler too), ``_links`` (outgoing links to global schedulers and
  other nodes).
- ``_agent``: heartbeats and load reports, discovery of global schedulers, dead nodes.
- ``_ids``: cluster-unique id prefixes; ``_workdirs``: the cache of drivers' shipped code.
"""

from typing import TYPE_CHECKING

from dpool._lazy import front_door

if TYPE_CHECKING:
    from dpool.node import _metrics as metrics
    from dpool.node import _process as process
    from dpool.node._attach import PeerHandle
    from dpool.node._links import dial, peer_hello, welcome_message
    from dpool.node._server import NodeServer

# What other packages use, loaded on first use (PEP 562): importing this package
# loads none of its modules. A name in ``_LAZY`` is its module's; one in ``_MODULES``
# is the module itself, used as a namespace (``from dpool.node import process as _process``).
_MODULES = {
    "process": "dpool.node._process",
    "metrics": "dpool.node._metrics",
}
_LAZY = {
    "PeerHandle": "dpool.node._attach",
    **dict.fromkeys(("dial", "peer_hello", "welcome_message"), "dpool.node._links"),
    "NodeServer": "dpool.node._server",
}

__all__ = [
    "NodeServer",
    "PeerHandle",
    "dial",
    "metrics",
    "peer_hello",
    "process",
    "welcome_message",
]


__getattr__, __dir__ = front_door(__name__, _LAZY, _MODULES)
