"""loky.ProcessPoolExecutor (a fresh executor, not the reusable singleton,
so that start-up is measured from scratch)."""

from __future__ import annotations

from typing import Any

import loky

from .base import Adapter, FuturesExecutorPeer


class Loky(FuturesExecutorPeer):
    def _create(self) -> Any:
        return loky.ProcessPoolExecutor(max_workers=self.workers)


ADAPTERS: dict[str, type[Adapter]] = {"executor": Loky, "objects": Loky}


def version() -> str:
    return str(loky.__version__)
