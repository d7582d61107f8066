"""The local scheduler: one per host (a driver's embedded runtime, or a node daemon).

It owns the host's worker groups and their worker processes, the tasks submitted to them,
the host store's object table and the runtime's (or node's) resource ledger. Other
packages use the names in ``__all__``; the modules are private:

- ``_scheduler``: ``LocalScheduler``, its public calls, admitting and finishing tasks,
  delivering completions; assembled from ``_workers`` (dispatch, worker processes,
  deaths), ``_handlers`` (what workers and attached drivers send), ``_group_calls``
  (cancel, close, wait for, terminate a group), ``_resource_dispatch`` (tasks with a
  resource request) and ``_object_table`` (results and put values, over ``_lineage``:
  rebuilding a lost value), over the state ``_core`` declares.
- ``_actors``: actor groups (one worker that keeps its state; calls in order, a log of
  them and restarts that replay it).
- ``_states``: task and worker states and their only legal transitions; ``_records``:
  ``Task``, ``ObjectEntry``, ``WorkerHandle``, ``WorkerGroup``, ``WorkerGroupConfig``;
  ``_exits``: reaping a worker process and saying how it died; ``_policy``: how many tasks
  a worker may hold (``BatchPolicy``).
- ``_limits``: per-task timeouts, memory limits, the host's memory threshold, forced
  cancels (the watch that kills a worker for its task).
- ``_resources``: resource requests, allocations, the ledger; ``_bundle_ledger``: the
  placement-group bundles held here; ``_detect``: this host's CPUs, GPUs and memory.
- ``_forkproc``: starting ``fork`` workers; ``_zygote``: the fork server that forks them.
- ``_api``: what the node's services may call (``SchedulerAPI``), what the scheduler calls
  on them, and the lock rule: a method whose name ends in ``_locked`` expects
  ``LocalScheduler.lock`` held; any other takes it itself if it needs it.

Whether a task runs on this host is the node's business (``node._spillback``); placement
policies and strategies are ``dpool.placement``'s, a layer below that imports nothing from
here.
"""

from dpool._lazy import front_door
from dpool.scheduling._policy import BatchPolicy
from dpool.scheduling._records import (
    ObjectEntry,
    Task,
    WorkerGroup,
    WorkerGroupConfig,
    WorkerHandle,
)
from dpool.scheduling._scheduler import LocalScheduler

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.scheduling import _detect as detect
    from dpool.scheduling import _limits as limits
    from dpool.scheduling._actors import ActorConfig, ActorState, proxy_group
    from dpool.scheduling import _resources as resources
    from dpool.scheduling._api import (
        ActorService,
        DriverService,
        Handler,
        LeaseService,
        SchedulerAPI,
        SpillbackService,
    )

# Importing this package loads the scheduler's modules that the embedded runtime's first
# task needs (the imports above). The rest load on first use (PEP 562): a name in
# ``_LAZY`` is its module's; one in ``_MODULES`` is the module itself, used as a namespace
# (``from dpool.scheduling import resources as _resources``). The services' interfaces
# (``_api``) are ``typing.Protocol`` classes, which only type checkers and the node's
# modules need: the embedded runtime does not import ``typing``.
_MODULES = {
    "detect": "dpool.scheduling._detect",
    "limits": "dpool.scheduling._limits",
    "resources": "dpool.scheduling._resources",
}
_LAZY = {
    "ActorConfig": "dpool.scheduling._actors",
    "ActorState": "dpool.scheduling._actors",
    "proxy_group": "dpool.scheduling._actors",
    **dict.fromkeys(("ActorService", "DriverService", "Handler", "LeaseService",
                     "SchedulerAPI", "SpillbackService"), "dpool.scheduling._api"),
}

__all__ = [
    "ActorConfig",
    "ActorService",
    "ActorState",
    "BatchPolicy",
    "DriverService",
    "Handler",
    "LeaseService",
    "LocalScheduler",
    "ObjectEntry",
    "SchedulerAPI",
    "SpillbackService",
    "Task",
    "WorkerGroup",
    "WorkerGroupConfig",
    "WorkerHandle",
    "detect",
    "limits",
    "proxy_group",
    "resources",
]


__getattr__, __dir__ = front_door(__name__, _LAZY, _MODULES)
