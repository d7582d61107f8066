"""This process's runtime, as the public API (executor, Pool, ``dpool.wait``) reaches it.

Every process that runs user code has one client of its runtime (``_current``): a driver
has a ``Driver``, started on first use -- the embedded runtime, or a connection to a
cluster node -- and a worker has the client of the scheduler that runs its tasks.

- ``_client``: the interface the public API calls: ``Client`` (submit, put, get, release)
  and ``Driver`` (adds the worker groups and the runtime's settings).
- ``_current``: which client this process has; starts the driver's on first use.
- ``_api``: ``dpool.wait``, ``dpool.get``, ``dpool.put`` on the current client.
- ``_driver``: ``DriverRuntime``, the embedded runtime (scheduler, store, control store).
- ``_cluster``: ``ClusterRuntime``, a driver attached to a node (``DPOOL_ADDRESS``), with
  ``_remote_group`` (its record of a group), ``_output`` (what its tasks print),
  ``_channel_client`` (what it shares with ``dpool.worker._client``), ``_lease`` (leased
  workers), ``_tcp_objects`` (large values over TCP), ``_move`` (moving to a live node
  when its node dies) and ``_address`` (where the cluster is).
- ``_rebuild``: ``no_rebuild``, the per-function opt-out of running a task again.
- ``_placement_groups``: ``dpool.placement_group`` and ``PlacementGroup``;
  ``_placement_groups_local``: ``LocalPlacementGroups``, their reservations on the
  embedded runtime.
- ``_calls``, ``_functions``, ``_argcache``: turning a ``submit`` into what the scheduler
  takes: the argument payload and dependencies, function ids, large arguments stored
  once.
"""

from dpool._lazy import front_door

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.runtime import _address as address
    from dpool.runtime import _calls as calls
    from dpool.runtime import _current as current
    from dpool.runtime._api import get, put, wait
    from dpool.runtime._channel_client import ChannelClient
    from dpool.runtime._client import Client as Client
    from dpool.runtime._client import Driver as Driver
    from dpool.runtime._connect import connect
    from dpool.runtime._current import node_id
    from dpool.runtime._driver import DriverRuntime
    from dpool.runtime._placement_groups import PlacementGroup, placement_group
    from dpool.runtime._rebuild import no_rebuild

# What other packages use, loaded on first use (PEP 562): importing this package
# loads none of its modules. A name in ``_LAZY`` is its module's; one in ``_MODULES``
# is the module itself, used as a namespace (``from dpool.runtime import current as _current``).
# (The runtime's own modules import this package: it imports none of them.) The names in
# ``_TYPES`` are for type checkers only (``typing.Protocol`` interfaces whose module is never
# imported at run time): import them under ``TYPE_CHECKING``.
_TYPES = ("Client", "Driver")
_MODULES = {
    "address": "dpool.runtime._address",
    "calls": "dpool.runtime._calls",
    "current": "dpool.runtime._current",
}
_LAZY = {
    **dict.fromkeys(("get", "put", "wait"), "dpool.runtime._api"),
    "ChannelClient": "dpool.runtime._channel_client",
    "connect": "dpool.runtime._connect",
    "node_id": "dpool.runtime._current",
    "DriverRuntime": "dpool.runtime._driver",
    **dict.fromkeys(("PlacementGroup", "placement_group"), "dpool.runtime._placement_groups"),
    "no_rebuild": "dpool.runtime._rebuild",
}

__all__ = [
    "ChannelClient",
    "DriverRuntime",
    "PlacementGroup",
    "address",
    "calls",
    "connect",
    "current",
    "get",
    "no_rebuild",
    "node_id",
    "placement_group",
    "put",
    "wait",
]


__getattr__, __dir__ = front_door(__name__, _LAZY, _MODULES)
