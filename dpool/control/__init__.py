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

from dpool._lazy import front_door
from dpool.control._local import InProcessControlStore
from dpool.control._task_record import TaskRecord

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.control import _keys as keys
    from dpool.control._fnname import function_name
    from dpool.control._interface import ClusterControlStore, ControlStore, Subscription
    from dpool.control._redis import RedisControlStore
    from dpool.control._redis_server import RedisServer
    from dpool.control._registry import BEAT_S, next_read_s
    from dpool.control._sentinel import parse_spec
    from dpool.control._sentinel_server import sentinel_address, start_replicated

# What other packages use, loaded on first use (PEP 562): importing this package
# loads none of its modules. A name in ``_LAZY`` is its module's; one in ``_MODULES``
# is the module itself, used as a namespace (``from dpool.control import keys as K``).
# The interface is a typing.Protocol, which only type checkers and the cluster's
# modules need: the embedded runtime does not import typing for it (issue 21).
_MODULES = {
    "keys": "dpool.control._keys",
}
_LAZY = {
    "function_name": "dpool.control._fnname",
    **dict.fromkeys(("ClusterControlStore", "ControlStore", "Subscription"),
                    "dpool.control._interface"),
    "RedisControlStore": "dpool.control._redis",
    "RedisServer": "dpool.control._redis_server",
    **dict.fromkeys(("BEAT_S", "next_read_s"), "dpool.control._registry"),
    "parse_spec": "dpool.control._sentinel",
    **dict.fromkeys(("sentinel_address", "start_replicated"), "dpool.control._sentinel_server"),
}

__all__ = [
    "BEAT_S",
    "ClusterControlStore",
    "ControlStore",
    "InProcessControlStore",
    "RedisControlStore",
    "RedisServer",
    "Subscription",
    "TaskRecord",
    "function_name",
    "keys",
    "next_read_s",
    "parse_spec",
    "sentinel_address",
    "start_replicated",
]


__getattr__, __dir__ = front_door(__name__, _LAZY, _MODULES)
