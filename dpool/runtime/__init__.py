"""This process's runtime, as the public API (executor, Pool, ``dpool.wait``) reaches it.

Every process that runs user code has one client of its runtime (``_current``): a driver
has a ``Driver``, started on first use -- the embedded runtime, or a connection to a
cluster node -- and a worker has the client of the scheduler that runs its tasks.

- ``_client``: the interface the public API calls: ``Client`` (submit, put, get, release)
  and ``Driver`` (adds the worker groups and the runtime's settings).
- ``_current``: which client this process has; starts the driver's on first use.
- ``_api``: ``dpool.wait``, ``dpool.get``, ``dpool.put`` on the current client.
- ``_driver``: ``DriverRuntime``, the embedded runtime (local scheduler, store, control
  store in this process).
- ``_cluster``: ``ClusterRuntime``, a driver attached to a node (``DPOOL_ADDRESS``).
- ``_output``: what the tasks of a cluster driver print, written whole-line on its stdout/stderr.
- ``_remote_group``: a cluster driver's record of one of its groups, which lives on the node.
- ``_channel_client``: what the cluster driver and a worker's client
  (``dpool.worker._client``) share: ids, gets by message, the release queue.
- ``_lease``: a cluster driver's leased workers (tasks straight to a lent worker).
- ``_tcp_objects``: a cluster driver's large values over TCP (no shared store).
- ``_move``: a TCP driver whose node dies moves to a live node and resubmits its
  unfinished tasks from its own records; ``_rebuild``: ``no_rebuild``, the per-function
  opt-out of running a task again after its node was lost.
- ``_placement_groups``: ``dpool.placement_group`` and ``PlacementGroup`` (bundles of
  resources reserved together, all or none); ``_pgroups``: ``LocalGroups``, their
  reservations on the embedded runtime, against this host.
- ``_address``: where the cluster is (``DPOOL_ADDRESS``, this host's record).
- ``_calls``, ``_functions``, ``_argcache``: turning a ``submit`` into what the scheduler
  takes: the argument payload and dependencies, function ids, large arguments stored
  once.
"""

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.runtime._rebuild import no_rebuild

__all__ = ["no_rebuild"]


def __getattr__(name: str) -> object:
    """``no_rebuild`` loads on first use: the runtime's own modules import this package."""
    if name == "no_rebuild":
        from dpool.runtime._rebuild import no_rebuild

        return no_rebuild
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
