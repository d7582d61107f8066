"""A row of the task table (``TaskRecord``), apart from the interfaces (``_interface``):
the embedded runtime's store uses it at run time, the interfaces only type checkers do.
"""

from __future__ import annotations

from dpool.protocol import record

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Optional

__all__ = ["TaskRecord"]


@record(slots=True)
class TaskRecord:
    """One row of the task table: enough lineage to run the task again. ``state`` is
    ``PENDING`` when recorded, ``FINISHED`` or ``FAILED`` when done; no other state is
    written (a cancelled task is recorded ``FAILED``)."""

    task_id: int
    fn_id: int
    args: Optional[bytes]
    dep_ids: tuple
    group_id: int
    state: str = "PENDING"  # PENDING -> FINISHED | FAILED (a cancelled task: FAILED)
    attempts: int = 0
    result_ids: tuple = ()
    # an actor's call: the call of the same actor before it (the chain of *stateful
    # edges* a restart replays in order); 0: none (a task, or an actor's first call)
    after: int = 0
