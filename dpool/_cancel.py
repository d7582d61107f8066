"""``dpool.cancel``: cancel a future, also -- with ``force=True`` -- a task that already runs.

``Future.cancel()`` keeps the stdlib's meaning (only a call not started is cancelled).
``dpool.cancel(future, force=True)`` also stops a started one: the future is cancelled at
once (``cancelled()`` is true, ``result()`` raises ``CancelledError``, its waiters and
callbacks are told, as for a cancel before the start), and the scheduler kills the worker
running it, which a new worker replaces (``scheduling._limits``); with ``recursive=True``
the tasks it submitted are cancelled too.
"""

from __future__ import annotations

from dpool._task_future import CANCELLED_AND_NOTIFIED, RUNNING, TaskFuture
from dpool.runtime import current as _current

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["cancel"]


def cancel(future: Any, *, force: bool = False, recursive: bool = False) -> bool:
    """Cancel ``future``; True if it is cancelled now.

    Without ``force``: ``future.cancel()`` (a call not started). With ``force``: a
    started task is stopped too -- its worker process killed and replaced -- and its
    future cancelled; with ``recursive``, also the tasks that task submitted. A task
    that has finished cannot be cancelled (False)."""
    if not isinstance(future, TaskFuture):
        if hasattr(future, "cancel") and not force:
            return bool(future.cancel())  # (any concurrent.futures.Future)
        raise TypeError(f"cancel() takes a dpool future, got {type(future).__name__}")
    if future.cancel():
        return True
    if not force or future.done():
        return future.cancelled()
    client: Any = future._client
    if client is None or _current.in_worker():
        raise TypeError("cancel(force=True) stops tasks of this driver's executors; "
                        "call it in the driver")
    if not client.cancel_running(future._oid, recursive):
        return future.cancelled()  # (done meanwhile, or not a task: an actor's call)
    return _stop_cancelled(future) or future.cancelled()


def cancel_group_running(driver: Any, group: Any) -> None:
    """``shutdown(cancel_running=True)``: stop every running task of ``group``."""
    for fut in driver.cancel_group_running(group):
        _stop_cancelled(fut)


def _stop_cancelled(future: TaskFuture) -> bool:
    """Move a started ``future`` to cancelled, telling its waiters and callbacks (the
    scheduler drops its task's result). False if it is done already."""
    with future._condition:
        if future._state != RUNNING:
            return False
        future._state = CANCELLED_AND_NOTIFIED
        for waiter in future._waiters:
            waiter.add_cancelled(future)
        future._condition.notify_all()
    future._invoke_callbacks()
    return True
