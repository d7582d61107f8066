"""The control store: all control state (task/lineage, function, object tables, event log).

``ControlStore`` is the interface (``_interface``, with ``ClusterControlStore``: what the
cluster's daemons share too; loaded on first use), ``TaskRecord`` a row of its task table
(``_task_record``); ``InProcessControlStore`` (``_local``) is the single-host
implementation used when ``DPOOL_ADDRESS`` is unset. A Redis-sharded implementation of the
same interface backs the cluster (``_redis``, ``_redis_batch``, ``_keys``; its pub/sub:
``_redis_pubsub``; its reads for people -- event log, task output, object table:
``_redis_observe``; the node table and global-scheduler registry with their heartbeats:
``_registry``; servers: ``_redis_server``). With replicas, ``_sentinel`` follows a
shard's failover through Redis Sentinel and puts back what it lost; ``_sentinel_server``
runs replicas and Sentinels.
``_fnname`` reads a function's name from its pickled payload without unpickling it.
"""

from dpool.control._local import InProcessControlStore
from dpool.control._task_record import TaskRecord

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.control._interface import ControlStore

__all__ = ["ControlStore", "TaskRecord", "InProcessControlStore"]


def __getattr__(name: str) -> object:
    # The interface is a typing.Protocol, which only type checkers and the cluster's
    # modules need: the embedded runtime does not import typing for it (issue 21).
    if name == "ControlStore":
        from dpool.control._interface import ControlStore

        return ControlStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
