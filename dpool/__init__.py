"""dpool: a faster drop-in ``ProcessPoolExecutor`` that grows into a cluster.

    from dpool import ProcessPoolExecutor   # instead of concurrent.futures'

Beyond the stdlib: futures as task arguments (dataflow), tasks that submit tasks
(``get_executor``), ``wait(fs, num_returns, timeout)``, ``put``/``get``, retries when a
worker dies, per-task resources (``executor.options(num_gpus=1)``, ``@resources``),
placement groups (``placement_group``: bundles reserved together, all or none), joblib's
``"dpool"`` backend (``register_joblib``), actors (``executor.actor(cls, ...)``: a
stateful worker whose method calls return futures; ``get_actor``, ``kill``, ``readonly``).
"""

# The public names load on first use (PEP 562), so ``import dpool`` -- and importing one of
# its submodules, such as the pytest plugin that pytest loads on every run through its
# entry point (dpool.testing._plugin) -- costs next to nothing. ``from dpool import
# ProcessPoolExecutor`` loads the runtime then, as before.
TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)

if TYPE_CHECKING:  # what type checkers and IDEs see: the names, as if imported here
    from dpool._cancel import cancel
    from dpool._resources_api import get_gpu_ids, request_resources, resources
    from dpool.actors import ActorHandle, ActorMethod, get_actor, kill, readonly
    from dpool.errors import (
        ActorDiedError,
        AuthenticationError,
        CancelledError,
        CollectiveError,
        ControlStoreError,
        DeserializationError,
        Error,
        NodeLostError,
        ObjectLostError,
        OutOfMemoryError,
        ObjectStoreFullError,
        PlacementError,
        ProtocolError,
        ResourceError,
        SerializationError,
        TaskTimeoutError,
        TimeoutError,
        WorkerCrashedError,
    )
    from dpool.executor import Executor, ProcessPoolExecutor, ResourceOptions, get_executor
    from dpool.futures import Future, ObjectRef
    from dpool.integrations import register_joblib
    from dpool.managers import Manager
    from dpool.observe import progress, timeline
    from dpool.placement import (
        Demand,
        LeastWait,
        LocalQueue,
        NodeAffinity,
        NodeLoad,
        PlacementPolicy,
    )
    from dpool.pool import Pool, cpu_count
    from dpool.runtime import PlacementGroup, get, no_rebuild, node_id, placement_group, put, wait

_LAZY = {
    **dict.fromkeys(
        ("ActorDiedError", "AuthenticationError", "CancelledError", "CollectiveError",
         "ControlStoreError",
         "DeserializationError",
         "Error", "NodeLostError", "ObjectLostError", "ObjectStoreFullError", "PlacementError",
         "ProtocolError", "ResourceError", "SerializationError", "TimeoutError",
         "WorkerCrashedError", "TaskTimeoutError", "OutOfMemoryError"),
        "dpool.errors"),
    **dict.fromkeys(("ActorHandle", "ActorMethod", "get_actor", "kill", "readonly"),
                    "dpool.actors"),
    **dict.fromkeys(("Executor", "ProcessPoolExecutor", "ResourceOptions", "get_executor"),
                    "dpool.executor"),
    **dict.fromkeys(("get_gpu_ids", "resources", "request_resources"),
                    "dpool._resources_api"),
    **dict.fromkeys(("Future", "ObjectRef"), "dpool.futures"),
    **dict.fromkeys(("get", "put", "wait"), "dpool.runtime"),
    **dict.fromkeys(("Pool", "cpu_count"), "dpool.pool"),
    "node_id": "dpool.runtime",
    **dict.fromkeys(("PlacementGroup", "placement_group"), "dpool.runtime"),
    "no_rebuild": "dpool.runtime",
    "register_joblib": "dpool.integrations",
    "Manager": "dpool.managers",
    "cancel": "dpool._cancel",
    **dict.fromkeys(("Demand", "LeastWait", "LocalQueue", "NodeAffinity", "NodeLoad",
                     "PlacementPolicy"), "dpool.placement"),
    **dict.fromkeys(("progress", "timeline"), "dpool.observe"),
}


def __getattr__(name: str) -> object:
    import importlib

    module = _LAZY.get(name)
    if module is None:
        # a submodule (``dpool.pool``), or one named by ``from dpool import _log``
        # before it is loaded: imported at once (without a ``find_spec`` first, which
        # would search the package twice)
        if name.startswith("__"):
            raise AttributeError(f"module 'dpool' has no attribute {name!r}")
        try:
            return importlib.import_module(f"dpool.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"dpool.{name}":  # the submodule exists; what it imports not
                raise
            raise AttributeError(f"module 'dpool' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted({*globals(), *_LAZY})


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
    "request_resources",
    "ResourceOptions",
    "wait",
    "get",
    "put",
    "register_joblib",
    "no_rebuild",
    "NodeAffinity",
    "placement_group",
    "PlacementGroup",
    "PlacementPolicy",
    "LeastWait",
    "Demand",
    "LocalQueue",
    "NodeLoad",
    "PlacementError",
    "timeline",
    "progress",
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
    "TaskTimeoutError",
    "OutOfMemoryError",
    "cancel",
    "ActorHandle",
    "ActorMethod",
    "ActorDiedError",
    "CollectiveError",
    "get_actor",
    "kill",
    "readonly",
    "Manager",
]
