"""Which runtime this process talks to: the driver runtime, or (in a worker) its client."""

from __future__ import annotations

import os
import threading
from typing import Any

_lock = threading.Lock()
_driver: Any = None
_worker: Any = None  # the _Worker of this process when it is a dpool worker
_worker_client: Any = None
_client_class: Any = None  # the worker's client class, given by the worker at start
_inherited: list = []  # a forked worker's copy of the parent's runtime, kept unreachable


def driver() -> Any:
    """The driver runtime of this process, started on first use."""
    global _driver
    d = _driver
    if d is not None and d.pid == os.getpid():
        return d
    with _lock:
        if _driver is None or _driver.pid != os.getpid():
            if _driver is not None:
                # A fork of a driver (the user's own child process): the parent's threads
                # and sockets are not ours. Keep the copy alive so its sockets are never
                # closed from here, and start afresh.
                _inherited.append(_driver)
            address = os.environ.get("DPOOL_ADDRESS")
            if address:
                from dpool.runtime._address import resolve
                from dpool.runtime._cluster import ClusterRuntime

                _driver = ClusterRuntime(resolve(address))
            else:
                from dpool.runtime._driver import DriverRuntime

                _driver = DriverRuntime()
        return _driver


def cluster_cpus() -> int:
    """CPUs the pools of this driver can use: the cluster's when ``DPOOL_ADDRESS`` is
    set (``max_workers=None``, ``cpu_count()``), else this machine's (as the stdlib)."""
    if os.environ.get("DPOOL_ADDRESS") and _worker is None:
        return driver().cluster_cpus
    if os.environ.get("DPOOL_NUM_CPUS"):
        from dpool.scheduling._detect import embedded_cpus

        return embedded_cpus() or 1
    return os.cpu_count() or 1


def node_id() -> str:
    """The cluster node this process runs on or is attached to (``$DPOOL_NODE_ID`` inside
    a task); ``"local"`` on the embedded runtime, which is no cluster's node."""
    here = os.environ.get("DPOOL_NODE_ID")
    if here:
        return here
    if os.environ.get("DPOOL_ADDRESS") and _worker is None:
        return driver().node_id
    return "local"


def in_worker() -> bool:
    return _worker is not None


def gpu_ids() -> list:
    """The GPUs given to the task running in this process (``dpool.get_gpu_ids``)."""
    if _worker is None:
        return []
    return [int(n) if n.isdigit() else n for n in _worker.cfg.gpu_ids]


def client() -> Any:
    """The runtime API for this process: the worker client inside a task, else the driver."""
    if _worker is not None:
        return worker_client()
    return driver()


def worker_client() -> Any:
    global _worker_client
    if _worker_client is None:
        with _lock:  # task code may make its first nested call from several threads
            if _worker_client is None:
                _worker_client = _client_class(_worker)
    return _worker_client


def enter_worker(cfg: Any) -> None:
    """Called first thing in a worker process: forget the driver state a fork copied."""
    global _driver, _worker_client
    if _driver is not None:
        _inherited.append(_driver)
        _driver = None
    _worker_client = None


def set_worker(worker: Any, client_class: Any) -> None:
    """This process is a worker: ``client_class(worker)`` is its runtime API (the worker
    hands it over, so the runtime never imports worker code)."""
    global _worker, _client_class
    _worker = worker
    _client_class = client_class
