"""dask.distributed: a LocalCluster of worker processes, one thread each,
with its scratch space in a temp dir removed on close."""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

from distributed import Client, LocalCluster

from .base import Adapter, ExecutorPeer, Fn


class DaskExecutor(ExecutorPeer):
    heavy_startup = True

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self._cluster: LocalCluster | None = None
        self._client: Client | None = None
        self._tmp: str | None = None

    def open(self) -> None:
        self._tmp = tempfile.mkdtemp(prefix="dask")
        self._cluster = LocalCluster(  # type: ignore[no-untyped-call]
            local_directory=self._tmp,
            n_workers=self.workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        )
        self._client = Client(self._cluster)  # type: ignore[no-untyped-call]

    def submit(self, fn: Fn, /, *args: Any) -> Any:
        assert self._client is not None
        return self._client.submit(fn, *args, pure=False)

    def result(self, handle: Any) -> Any:
        return handle.result()

    def results(self, handles: Sequence[Any]) -> list[Any]:
        assert self._client is not None
        return list(self._client.gather(list(handles)))  # type: ignore[no-untyped-call]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()  # type: ignore[no-untyped-call]
            self._client = None
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


ADAPTERS: dict[str, type[Adapter]] = {"executor": DaskExecutor}


def version() -> str:
    return importlib.metadata.version("distributed")
