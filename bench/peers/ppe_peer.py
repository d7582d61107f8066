"""concurrent.futures.ProcessPoolExecutor (the executor/objects reference)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import platform
from typing import Any

from .base import Adapter, FuturesExecutorPeer


class PPE(FuturesExecutorPeer):
    def _create(self) -> Any:
        return concurrent.futures.ProcessPoolExecutor(max_workers=self.workers)


ADAPTERS: dict[str, type[Adapter]] = {"executor": PPE, "objects": PPE}


def version() -> str:
    return f"stdlib (Python {platform.python_version()}, {multiprocessing.get_start_method()})"
