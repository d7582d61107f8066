"""The errors of a task stopped by a limit: its timeout, or a memory limit.

``TaskTimeoutError`` is also the builtin/``concurrent.futures`` ``TimeoutError`` (dpool's
``errors.TimeoutError``) and ``multiprocessing.TimeoutError``, so code written for
``Future.result(timeout)`` or a ``Pool``'s ``get(timeout)`` catches a task stopped at its
own timeout too. Defining it imports ``multiprocessing.context``; ``dpool.errors`` loads
this module when one of the names is first looked up (PEP 562).
"""

from __future__ import annotations

from multiprocessing import TimeoutError as _MpTimeoutError

from dpool._errors_futures import TimeoutError as _TimeoutError
from dpool.errors import Error

__all__ = ["TaskTimeoutError", "OutOfMemoryError"]


class TaskTimeoutError(_TimeoutError, _MpTimeoutError):  # type: ignore[misc]
    """A task ran longer than its timeout (``task_timeout=``, ``options(timeout=)``): its
    worker was killed and replaced. ``timeout`` is the limit in seconds."""

    __module__ = "dpool.errors"

    def __init__(self, message: str, *, timeout: float = 0.0) -> None:
        super().__init__(message)
        self.timeout = timeout

    def __reduce__(self):  # keep the keyword field across pickling
        return (_rebuild_timeout, (str(self), self.timeout))


def _rebuild_timeout(message: str, timeout: float) -> TaskTimeoutError:
    return TaskTimeoutError(message, timeout=timeout)


class OutOfMemoryError(Error, MemoryError):
    """A task's worker went past a memory limit -- twice ``max_memory_per_worker``, or the
    host's memory in use rose above the node's threshold -- and was killed for it.
    ``limit`` and ``peak`` are bytes (0: not known). (A worker the kernel's own OOM killer
    ended raises ``WorkerCrashedError`` saying so, after its attempts.)"""

    __module__ = "dpool.errors"

    def __init__(self, message: str, *, limit: int = 0, peak: int = 0) -> None:
        super().__init__(message)
        self.limit = limit
        self.peak = peak

    def __reduce__(self):
        return (_rebuild_oom, (str(self), self.limit, self.peak))


def _rebuild_oom(message: str, limit: int, peak: int) -> OutOfMemoryError:
    return OutOfMemoryError(message, limit=limit, peak=peak)
