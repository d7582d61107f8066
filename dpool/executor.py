"""``dpool.ProcessPoolExecutor``: the ``concurrent.futures`` surface, nothing more.

The executor itself is ``dpool._executor_core.ExecutorCore`` (how it reaches the runtime
is told there); this module adds ``concurrent.futures.Executor`` as a base, the futures
that are ``concurrent.futures.Future`` instances, and ``get_executor()``.
"""

from __future__ import annotations

import concurrent.futures as _cf
import threading

from dpool._executor_core import ExecutorCore, ResourceOptions
from dpool.futures import Future
from dpool.runtime import current as _current

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

__all__ = ["ProcessPoolExecutor", "Executor", "ResourceOptions", "get_executor"]


class ProcessPoolExecutor(ExecutorCore, _cf.Executor):
    """A drop-in ``concurrent.futures.ProcessPoolExecutor`` on dpool's runtime.

    Same signature and behaviour as the stdlib's, plus keyword-only options:

    - ``max_attempts`` (default 3): how many times a task runs when its worker process
      dies under it (``os._exit``, a signal, a segfault) before its future raises
      ``dpool.WorkerCrashedError`` (a ``BrokenProcessPool``). The executor stays usable.
    - ``working_dir`` (cluster mode): the directory whose code is shipped to the nodes
      for this executor's tasks (default ``$DPOOL_WORKING_DIR``, else the current
      directory; ``"off"``: nothing). Ignored on the embedded runtime.
    - ``object_store_memory``: bytes of shared memory the host's object store may hold
      (default: ``$DPOOL_OBJECT_STORE_MEMORY``, else 30% of RAM capped by /dev/shm). The
      store is shared by every executor of the process; the last value given applies.
    - ``resources``: what every task of this executor needs, e.g. ``{"GPU": 1}`` or
      ``{"CPU": 2, "memory": 2**30, "TPU": 1}`` (default: one CPU). ``options()`` and
      ``@dpool.resources`` refine it per call or per function. ``max_workers`` is the
      executor's CPU budget: a task asking 2 CPUs takes 2 of it. See README, "Resources".
    - ``runtime_resources``: what the embedded runtime offers to every executor of this
      process, e.g. ``{"GPU": 2, "TPU": 4}`` (default: ``$DPOOL_NUM_GPUS`` and
      ``$DPOOL_RESOURCES``, else detected). Declaring GPUs the host lacks makes *fake*
      ones: tasks get ids and ``CUDA_VISIBLE_DEVICES`` as with real ones. The last value
      given applies; ignored in cluster mode (each node says what it has).
    - ``scheduling``: where every task of this executor runs in a cluster: ``"default"``
      (the cluster's placement policy), ``"spread"`` (round-robin over the nodes that
      fit) or ``dpool.NodeAffinity(node, soft=...)``; ``options(scheduling=...)``
      overrides it per call. On the embedded runtime (one host) there is nothing to
      place: a hard affinity to another node fails with ``dpool.PlacementError``. A
      task with a strategy runs alone on a worker, like one with a resource request.
      See README, "Placement policies".
    - ``task_timeout``: seconds a task may run from its start; past it, its worker is
      killed and replaced, the others undisturbed, and its future raises
      ``dpool.TaskTimeoutError`` (a ``TimeoutError``), not retried unless
      ``retry_on_timeout``. ``options(timeout=...)`` sets it per call.
    - ``max_memory_per_worker``: bytes of resident memory. A worker above it after a task
      is replaced before its next one; one above twice it while a task runs is killed,
      and the task fails with ``dpool.OutOfMemoryError`` (run again if ``retry_on_oom``).
    - ``shutdown(cancel_running=True)`` and ``dpool.cancel(future, force=True)`` stop
      tasks that already run. See README, "Control over running work".
    """

    _future_type = Future

    if TYPE_CHECKING:  # what it returns, for type checkers: a concurrent.futures.Future
        def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
            ...

Executor = ProcessPoolExecutor

_default: Optional[ProcessPoolExecutor] = None
_default_lock = threading.Lock()


def get_executor() -> ProcessPoolExecutor:
    """An executor of the current runtime.

    In a driver: a process-wide default executor (``max_workers`` = CPU count), started on
    first use. Inside a task: a view onto the worker group running the task, so task code
    can submit, wait and get; waiting gives the worker's slot back, so nesting never
    deadlocks.
    """
    global _default
    if _current.in_worker():
        return ProcessPoolExecutor._worker_view(_current.worker_client(), _current.group_id())
    with _default_lock:
        if _default is None or _default._shutdown_thread or \
                _default._runtime is not _current.driver():
            _default = ProcessPoolExecutor()
        return _default


def __getattr__(name: str) -> object:
    if name == "WorkerProcess":  # what ``_processes`` holds (documented here), on first use
        from dpool._process_views import WorkerProcess

        return WorkerProcess
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
