"""mpire.WorkerPool with its defaults (fork, ``keep_alive=False``).

``keep_alive=True`` would reuse workers across calls, but in mpire 2.10 a
kept-alive pool that ran ``map`` then fails ``imap_unordered``/``apply`` with
argument-unpacking errors; without it each ``map``/``imap_unordered`` call
starts its workers again (a few ms with fork), which the figures include.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from mpire.pool import WorkerPool

from .base import Adapter, Fn, PoolPeer


class MpirePool(PoolPeer):
    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self._pool: WorkerPool | None = None

    def open(self) -> None:
        self._pool = WorkerPool(n_jobs=self.workers)

    def _p(self) -> WorkerPool:
        assert self._pool is not None
        return self._pool

    def map(self, fn: Fn, items: Sequence[Any]) -> list[Any]:
        return list(self._p().map(fn, items))

    def imap_unordered(self, fn: Fn, items: Iterable[Any], chunksize: int) -> Iterator[Any]:
        return iter(self._p().imap_unordered(fn, items, chunk_size=chunksize))

    def apply(self, fn: Fn, args: tuple[Any, ...]) -> Any:
        return self._p().apply(fn, args)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop_and_join()
            self._pool.terminate()
            self._pool = None


ADAPTERS: dict[str, type[Adapter]] = {"pool": MpirePool}


def version() -> str:
    return importlib.metadata.version("mpire")
