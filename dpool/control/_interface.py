"""The control-store interface every implementation provides.

Writes are *fire and forget* from the caller's point of view: an implementation queues
them and applies them in batches (``flush``), so recording lineage and events never sits
on a task's critical path. Reads see everything flushed so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol


@dataclass(slots=True)
class TaskRecord:
    """One row of the task table: enough lineage to run the task again."""

    task_id: int
    fn_id: int
    args: Optional[bytes]
    dep_ids: tuple
    group_id: int
    state: str = "PENDING"  # PENDING -> RUNNING -> FINISHED | FAILED | CANCELLED
    attempts: int = 0
    result_ids: tuple = field(default=())


class ControlStore(Protocol):
    # -- writes (batched) ----------------------------------------------------------------
    def register_function(self, fn_id: int, name: str, payload: bytes) -> None: ...
    # ``at``: also log the task's "submit" (add_task) or "end"/"error" (set_task_state)
    # event at that time -- one write instead of two on the task's path.
    def add_task(self, task_id: int, fn_id: int, args: Optional[bytes], dep_ids: tuple,
                 group_id: int, at: Optional[float] = None, worker_id: int = 0) -> None: ...
    def set_task_state(self, task_id: int, state: str, attempts: int,
                       at: Optional[float] = None) -> None: ...
    def add_object(self, object_id: int, size: int, location: str) -> None: ...
    def remove_object(self, object_id: int) -> None: ...
    def log_event(self, task_id: int, kind: str, t: float, worker_id: int) -> None: ...
    def flush(self) -> None: ...

    # -- reads ---------------------------------------------------------------------------
    def get_task(self, task_id: int) -> Optional[TaskRecord]: ...
    def get_function(self, fn_id: int) -> Optional[bytes]: ...
    def get_object(self, object_id: int) -> Optional[tuple[int, str]]: ...
    def events(self) -> list[tuple[int, str, float, int]]: ...
