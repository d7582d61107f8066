"""multiprocessing.Pool: ``apply_async`` as an executor, and the pool reference."""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import platform
from typing import Any

from .base import Adapter, ExecutorPeer, Fn, MpStylePool


class MpExecutor(ExecutorPeer):
    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self._pool: multiprocessing.pool.Pool | None = None

    def open(self) -> None:
        self._pool = multiprocessing.Pool(self.workers)

    def submit(self, fn: Fn, /, *args: Any) -> Any:
        assert self._pool is not None
        return self._pool.apply_async(fn, args)

    def result(self, handle: Any) -> Any:
        return handle.get()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None


class MpPool(MpStylePool):
    def _create(self) -> Any:
        return multiprocessing.Pool(self.workers)


ADAPTERS: dict[str, type[Adapter]] = {"executor": MpExecutor, "objects": MpExecutor, "pool": MpPool}


def version() -> str:
    return f"stdlib (Python {platform.python_version()}, {multiprocessing.get_start_method()})"
