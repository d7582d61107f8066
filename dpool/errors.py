"""dpool's exceptions.

Every exception dpool raises on its own account derives from :class:`Error`. Where the
standard library already has an exception that names the failure, dpool's class also
subclasses it, so an existing ``except BrokenProcessPool:`` or ``except TimeoutError:``
keeps working after the import swap.
"""

from __future__ import annotations

from concurrent.futures import CancelledError as _StdCancelledError
from concurrent.futures import TimeoutError as _StdTimeoutError
from concurrent.futures.process import BrokenProcessPool as _StdBrokenProcessPool

__all__ = [
    "Error",
    "WorkerCrashedError",
    "ObjectStoreFullError",
    "ObjectLostError",
    "SerializationError",
    "ProtocolError",
    "AuthenticationError",
    "ControlStoreError",
    "CancelledError",
    "TimeoutError",
]


class Error(Exception):
    """Base class of every exception dpool raises on its own account."""


class WorkerCrashedError(Error, _StdBrokenProcessPool):
    """A task's worker process died (exit code or signal in the message) on every attempt.

    Raised by ``result()`` of that task's future once its retries are used up. Unlike the
    stdlib, the executor itself stays usable: only the futures whose workers died fail.
    """

    def __init__(self, message: str, *, exitcode: int | None = None, attempts: int = 0):
        super().__init__(message)
        self.exitcode = exitcode
        self.attempts = attempts

    def __reduce__(self):  # keep the keyword fields across pickling
        return (_rebuild_crashed, (str(self), self.exitcode, self.attempts))


def _rebuild_crashed(message: str, exitcode: int | None, attempts: int) -> WorkerCrashedError:
    return WorkerCrashedError(message, exitcode=exitcode, attempts=attempts)


class ObjectStoreFullError(Error, MemoryError):
    """The shared-memory object store cannot make room for an object.

    Raised at the call that needed the space (``put``, or the ``result()`` of the task
    whose return value did not fit) when evicting every object nobody is reading still
    does not free enough, or at once when the object is bigger than the whole store.
    """


class ObjectLostError(Error):
    """An object's value is gone and cannot be rebuilt (its lineage is unavailable)."""


class SerializationError(Error, TypeError):
    """A function, argument or result could not be pickled or unpickled.

    Subclasses ``TypeError`` because that is what ``pickle`` raises for most unpicklable
    objects; the original exception is chained as ``__cause__``.
    """


class ProtocolError(Error):
    """A peer sent a message this process does not understand (wrong version or code)."""


class AuthenticationError(Error):
    """A peer did not prove it knows the cluster token (or this process used a wrong one).

    Raised when connecting to a node or global scheduler with a missing or wrong
    ``DPOOL_TOKEN``; the server logs the refusal and keeps serving others.
    """


class ControlStoreError(Error):
    """The cluster's control store (its Redis shards) failed a request, or could not be run.

    Raised at the call that needed the store: a shard unreachable or not answering within
    its timeout, a wrong password, an error reply; also when a ``redis-server`` cannot be
    found or started (port in use, no binary). The message names the shard's address or
    the port; the redis-py exception, if any, is chained as ``__cause__``.
    """


class CancelledError(Error, _StdCancelledError):
    """The future was cancelled (also a ``concurrent.futures.CancelledError``)."""


class TimeoutError(Error, _StdTimeoutError):  # noqa: A001 - mirrors the stdlib name
    """A wait ran past its timeout (also the builtin/``concurrent.futures`` ``TimeoutError``)."""
