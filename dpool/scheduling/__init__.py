"""The local scheduler: one per host (a driver's embedded runtime, or a node daemon).

- ``_scheduler``: ``LocalScheduler``, its public calls, the accept/finish path, delivery;
  built from ``_workers`` (dispatch, worker processes, deaths; under the ``fork`` start
  method forked by ``_forkproc``, from the fork server ``_zygote``), ``_handlers`` (what
  workers and attached drivers send), ``_group_calls`` (cancel, close, wait for,
  terminate a group), ``_resource_dispatch`` (tasks with resource requests)
  and ``_object_table`` (the object table, with ``_lineage``: values whose spill file was
  lost are made again), over the state ``_core`` declares.
- ``_api``: what the node's services (``dpool.node``) may call (``SchedulerAPI``) and
  what the scheduler calls on them (``DriverService``, ``SpillbackService``,
  ``LeaseService``), and the lock rule (``_locked`` names expect the lock held). Its
  names load from this package on first use: they are ``typing.Protocol`` classes, and
  the embedded runtime does not import ``typing``.
- ``_records``: tasks, object table entries, worker handles, worker groups
  (``Task``, ``ObjectEntry``, ``WorkerHandle``, ``WorkerGroup``); ``_policy``: how many
  tasks a worker may hold (``BatchPolicy``).
- ``_resources``: resource requests and a runtime's ledger; ``_detect``: CPUs, GPUs
  and memory of this host.
- ``_bundle_ledger``: the placement-group bundles this scheduler holds, and what of them
  its tasks use.

Whether a task runs on this host at all is the node's business (``node._spillback``), and
where a spilled one goes, the global scheduler's (``dpool.global_scheduler``). The
policies both ask, strategies' wire form and placement groups' reservation are
``dpool.placement``'s: a layer below this package, which imports nothing from here.
"""

from dpool.scheduling._policy import BatchPolicy
from dpool.scheduling._records import ObjectEntry, Task, WorkerGroup, WorkerHandle
from dpool.scheduling._scheduler import LocalScheduler, WorkerGroupConfig

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.scheduling import _detect as detect
    from dpool.scheduling import _resources as resources
    from dpool.scheduling._api import (
        DriverService,
        Handler,
        LeaseService,
        SchedulerAPI,
        SpillbackService,
    )

# What other packages use, loaded on first use (PEP 562): importing this package
# loads none of its modules. A name in ``_LAZY`` is its module's; one in ``_MODULES``
# is the module itself, used as a namespace
# (``from dpool.scheduling import resources as _resources``).
# The services' interfaces are typing.Protocols, which only type checkers and the
# node's modules need: the embedded runtime does not import typing for them (issue 21).
_MODULES = {
    "detect": "dpool.scheduling._detect",
    "resources": "dpool.scheduling._resources",
}
_LAZY = {
    **dict.fromkeys(("DriverService", "Handler", "LeaseService", "SchedulerAPI",
                     "SpillbackService"), "dpool.scheduling._api"),
}

__all__ = [
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
    "resources",
]


def __getattr__(name: str) -> object:
    import importlib

    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted({*globals(), *_MODULES, *_LAZY})
