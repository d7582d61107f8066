"""Ray: ``@ray.remote`` tasks and ``ray.util.multiprocessing.Pool``.

Every session gets its own temp dir (removed on close) and is shut down with
``ray.shutdown()``; ``num_cpus`` caps concurrency at the worker count.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.multiprocessing import Pool as RayMpPool

from .base import Adapter, ExecutorPeer, Fn, MpStylePool


class _RaySession:
    def __init__(self) -> None:
        self._tmp: str | None = None

    def start(self, workers: int) -> None:
        self._tmp = tempfile.mkdtemp(prefix="r")  # short: AF_UNIX paths live below
        ray.init(
            num_cpus=workers,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            _temp_dir=self._tmp,
        )

    def stop(self) -> None:
        if ray.is_initialized():
            ray.shutdown()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


class RayExecutor(ExecutorPeer):
    heavy_startup = True
    supports_put = True

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self._session = _RaySession()
        self._remote: dict[Fn, Any] = {}

    def open(self) -> None:
        self._session.start(self.workers)

    def submit(self, fn: Fn, /, *args: Any) -> Any:
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = ray.remote(fn)
        return remote.remote(*args)

    def result(self, handle: Any) -> Any:
        return ray.get(handle)

    def results(self, handles: Sequence[Any]) -> list[Any]:
        return list(ray.get(list(handles)))

    def put(self, obj: Any) -> Any:
        return ray.put(obj)

    def close(self) -> None:
        self._remote.clear()
        self._session.stop()


class RayPool(MpStylePool):
    heavy_startup = True

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self._session = _RaySession()

    def _create(self) -> Any:
        self._session.start(self.workers)
        return RayMpPool(processes=self.workers)

    def close(self) -> None:
        try:
            if self._pool is not None:
                self._pool.terminate()
                self._pool = None
        finally:
            self._session.stop()


ADAPTERS: dict[str, type[Adapter]] = {"executor": RayExecutor, "objects": RayExecutor, "pool": RayPool}


def version() -> str:
    return str(ray.__version__)
