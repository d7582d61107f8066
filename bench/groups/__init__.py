"""One module per benchmark group; each exposes ``run(cls, params, rec)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from params import Params
from recorder import Recorder

from . import executor, objects, pool

Runner = Callable[[Any, Params, Recorder], None]

RUNNERS: dict[str, Runner] = {
    "executor": executor.run,
    "objects": objects.run,
    "pool": pool.run,
}
