"""What a worker process is told when it starts (picklable, for spawn-style starts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(slots=True)
class WorkerConfig:
    worker_id: int
    group_id: int
    parent_pid: int
    initializer: Optional[bytes] = None  # cloudpickled (initializer, initargs)
    max_tasks: Optional[int] = None
    cwd: str = ""
    sys_path: list = field(default_factory=list)
    store_capacity: Optional[int] = None
    capture_output: bool = False  # on a node daemon: stdout/stderr go to the task's driver
    id_base: int = 0  # first id of the worker's own (cluster-unique on a node); 0: per host
