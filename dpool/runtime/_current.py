"""Which runtime this process talks to: the driver runtime, or (in a worker) its client."""

from __future__ import annotations

import os
import threading

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from dpool.runtime._client import Client, Driver
    from dpool.runtime._cluster import ClusterRuntime

_lock = threading.Lock()
_driver: Optional[Driver] = None
_worker: Any = None  # the _Worker of this process when it is a dpool worker
_worker_client: Optional[Client] = None
_client_class: Optional[Callable[[Any], Client]] = None  # given by the worker at start
_inherited: list = []  # a forked worker's copy of the parent's runtime, kept unreachable
_exits: list = []  # what a worker runs as it ends (``at_worker_exit``)


def driver() -> Driver:
    """The driver runtime of this process, started on first use."""
    global _driver
    d = _driver
    if d is not None and d.pid == os.getpid():
        return d
    with _lock:
        d = _driver
        if d is None or d.pid != os.getpid():
            if d is not None:
                # A fork of a driver (the user's own child process): the parent's threads
                # and sockets are not ours. Keep the copy alive so its sockets are never
                # closed from here, and start afresh.
                _inherited.append(d)
            address = os.environ.get("DPOOL_ADDRESS")
            if address:
                from dpool.runtime._address import resolve
                from dpool.runtime._cluster import ClusterRuntime

                d = _driver = ClusterRuntime(resolve(address))
            else:
                from dpool.runtime._driver import DriverRuntime

                d = _driver = DriverRuntime()
        return d


def cluster_cpus() -> int:
    """CPUs the pools of this driver can use: the cluster's when ``DPOOL_ADDRESS`` is
    set (``max_workers=None``, ``cpu_count()``), else this machine's (as the stdlib)."""
    if os.environ.get("DPOOL_ADDRESS") and _worker is None:
        # never 0: a 0-CPU head that has not yet seen a node that just joined says 0
        # (a pool of 0 workers would keep its tasks queued for good)
        return max(1, _cluster_driver().cluster_cpus)
    if os.environ.get("DPOOL_NUM_CPUS"):
        from dpool.scheduling import detect as _detect

        return _detect.embedded_cpus() or 1
    return os.cpu_count() or 1


def node_id() -> str:
    """The cluster node this process runs on or is attached to (``$DPOOL_NODE_ID`` inside
    a task); ``"local"`` on the embedded runtime, which is no cluster's node."""
    here = os.environ.get("DPOOL_NODE_ID")
    if here:
        return here
    if os.environ.get("DPOOL_ADDRESS") and _worker is None:
        return _cluster_driver().node_id
    return "local"


def _cluster_driver() -> ClusterRuntime:
    d: Any = driver()  # where DPOOL_ADDRESS is set (and not in a worker): a ClusterRuntime
    return d


def in_worker() -> bool:
    return _worker is not None


def this_worker() -> Any:
    """This worker process's main loop (``dpool.worker._main._Worker``), None in a driver."""
    return _worker


def gpu_ids() -> list:
    """The GPUs given to the task running in this process (``dpool.get_gpu_ids``)."""
    if _worker is None:
        return []
    return [int(n) if n.isdigit() else n for n in _worker.cfg.gpu_ids]


def client() -> Client:
    """The runtime API for this process: the worker client inside a task, else the driver."""
    if _worker is not None:
        return worker_client()
    return driver()


def worker_client() -> Client:
    global _worker_client
    c = _worker_client
    if c is None:
        with _lock:  # task code may make its first nested call from several threads
            c = _worker_client
            if c is None:
                assert _client_class is not None, "not a worker"
                c = _worker_client = _client_class(_worker)
    return c


def group_id() -> int:
    """The worker group that runs the task in this process (``in_worker()`` only)."""
    return _worker.cfg.group_id  # type: ignore[no-any-return]


def enter_worker(cfg: Any) -> None:
    """Called first thing in a worker process: forget the driver state a fork copied."""
    global _driver, _worker_client
    if _driver is not None:
        _inherited.append(_driver)
        _driver = None
    _worker_client = None
    _exits.clear()  # (the parent's)


def at_worker_exit(fn: Callable[[], None]) -> None:
    """Run ``fn()`` when this worker process ends its loop (a worker exits without
    running ``atexit``'s handlers): e.g. free the shared memory of its collective
    groups. Once per function."""
    if fn not in _exits:
        _exits.append(fn)


def run_worker_exits() -> None:
    """(The worker's last act.) Every ``at_worker_exit`` function, errors logged."""
    while _exits:
        fn = _exits.pop()
        try:
            fn()
        except Exception:  # noqa: BLE001 - the others still run
            import logging

            logging.getLogger("dpool.worker").exception("a worker exit hook failed")


def set_worker(worker: Any, client_class: Callable[[Any], Client]) -> None:
    """This process is a worker: ``client_class(worker)`` is its runtime API (the worker
    hands it over, so the runtime never imports worker code)."""
    global _worker, _client_class
    _worker = worker
    _client_class = client_class
