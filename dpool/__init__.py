"""dpool: a faster drop-in ``ProcessPoolExecutor`` that grows into a cluster.

    from dpool import ProcessPoolExecutor   # instead of concurrent.futures'

Beyond the stdlib: futures as task arguments (dataflow), tasks that submit tasks
(``get_executor``), ``wait(fs, num_returns, timeout)``, ``put``/``get``, retries when a
worker dies, per-task resources (``executor.options(num_gpus=1)``, ``@resources``).
"""

from dpool.errors import (
    AuthenticationError,
    CancelledError,
    ControlStoreError,
    DeserializationError,
    Error,
    NodeLostError,
    ObjectLostError,
    ObjectStoreFullError,
    ProtocolError,
    ResourceError,
    SerializationError,
    TimeoutError,
    WorkerCrashedError,
)
from dpool._resources_api import get_gpu_ids, resources
from dpool.executor import Executor, ProcessPoolExecutor, ResourceOptions, get_executor
from dpool.futures import Future, ObjectRef, get, put, wait
from dpool.pool import Pool, cpu_count
from dpool.runtime._current import node_id

__version__ = "0.1.0"

__all__ = [
    "ProcessPoolExecutor",
    "Pool",
    "cpu_count",
    "node_id",
    "Executor",
    "Future",
    "ObjectRef",
    "get_executor",
    "resources",
    "get_gpu_ids",
    "ResourceOptions",
    "wait",
    "get",
    "put",
    "Error",
    "WorkerCrashedError",
    "ObjectStoreFullError",
    "ObjectLostError",
    "SerializationError",
    "DeserializationError",
    "AuthenticationError",
    "NodeLostError",
    "ControlStoreError",
    "ProtocolError",
    "ResourceError",
    "CancelledError",
    "TimeoutError",
]
