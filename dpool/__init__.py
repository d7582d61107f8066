"""dpool: a faster drop-in ``ProcessPoolExecutor`` that grows into a cluster.

    from dpool import ProcessPoolExecutor   # instead of concurrent.futures'

Beyond the stdlib: futures as task arguments (dataflow), tasks that submit tasks
(``get_executor``), ``wait(fs, num_returns, timeout)``, ``put``/``get``, retries when a
worker dies.
"""

from dpool.errors import (
    CancelledError,
    Error,
    ObjectLostError,
    ObjectStoreFullError,
    ProtocolError,
    SerializationError,
    TimeoutError,
    WorkerCrashedError,
)
from dpool.executor import Executor, ProcessPoolExecutor, get_executor
from dpool.futures import Future, ObjectRef, get, put, wait
from dpool.pool import Pool, cpu_count

__version__ = "0.1.0"

__all__ = [
    "ProcessPoolExecutor",
    "Pool",
    "cpu_count",
    "Executor",
    "Future",
    "ObjectRef",
    "get_executor",
    "wait",
    "get",
    "put",
    "Error",
    "WorkerCrashedError",
    "ObjectStoreFullError",
    "ObjectLostError",
    "SerializationError",
    "ProtocolError",
    "CancelledError",
    "TimeoutError",
]
