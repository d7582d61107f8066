"""The three errors of :mod:`dpool.errors` that are also the stdlib's ``BrokenProcessPool``.

They live here, not in ``errors``, because ``BrokenProcessPool`` is defined in
``concurrent.futures.process``, whose import brings most of ``multiprocessing`` with it
(``connection``, ``queues``, ``util`` and ``subprocess``: ~30 M instructions, more than a
third of the stdlib executor's whole import). A program that never meets one of these
errors should not pay for that: ``dpool.errors`` loads this module when one of the three
names is first looked up (PEP 562), and each class says it is ``dpool.errors``'s, which is
where users, tracebacks and pickle find it. (At interpreter exit, where that module can no
longer be imported, they are made on ``BrokenProcessPool``'s base: ``errors.stdlib_broken_pool``.)
"""

from __future__ import annotations

from dpool.errors import Error, SerializationError, stdlib_broken_pool

TYPE_CHECKING = False
if TYPE_CHECKING:
    from concurrent.futures.process import BrokenProcessPool
else:
    BrokenProcessPool = stdlib_broken_pool()

__all__ = ["WorkerCrashedError", "DeserializationError", "NodeLostError"]


class WorkerCrashedError(Error, BrokenProcessPool):
    """A task's worker process died (exit code or signal in the message) on every attempt.

    Raised by ``result()`` of that task's future once its retries are used up. Unlike the
    stdlib, the executor itself stays usable: only the futures whose workers died fail.
    """

    __module__ = "dpool.errors"

    def __init__(self, message: str, *, exitcode: int | None = None, attempts: int = 0):
        super().__init__(message)
        self.exitcode = exitcode
        self.attempts = attempts

    def __reduce__(self):  # keep the keyword fields across pickling
        return (_rebuild_crashed, (str(self), self.exitcode, self.attempts))


def _rebuild_crashed(message: str, exitcode: int | None, attempts: int) -> WorkerCrashedError:
    return WorkerCrashedError(message, exitcode=exitcode, attempts=attempts)


class DeserializationError(SerializationError, BrokenProcessPool):
    """A call's function or arguments could not be unpickled in the worker, or its
    result (or exception) could not be unpickled in the caller.

    The stdlib's executor raises ``BrokenProcessPool`` for exactly these failures, so this
    error *is* a ``concurrent.futures.process.BrokenProcessPool`` (and a
    :class:`SerializationError`, hence a ``TypeError``). Unlike the stdlib, only the call
    whose data failed fails; the executor or ``Pool`` stays usable. Whatever unpickling
    raised -- even ``SystemExit`` from a ``sys.exit()`` in a ``__reduce__`` -- becomes this
    error, chained as ``__cause__``.
    """

    __module__ = "dpool.errors"

    @classmethod
    def wrap(cls, what: str, exc: BaseException) -> "DeserializationError":
        """``DeserializationError("could not unpickle <what>: ...")`` caused by ``exc``."""
        if isinstance(exc, SerializationError) and exc.__cause__ is not None:
            detail = str(exc)  # already names the original error
        else:
            detail = f"{type(exc).__name__}: {exc}"
        err = cls(f"could not unpickle {what}: {detail}")
        err.__cause__ = exc
        return err


class NodeLostError(Error, BrokenProcessPool):
    """This driver lost the node it is attached to (the node died or was stopped); a
    ``BrokenProcessPool``, as the stdlib's pools report a lost worker.

    A driver attached over the node's unix socket fails every unfinished future with it,
    and later submits raise it. A driver over TCP moves to a live node instead and
    replays its work; it raises this for a task lost with its node ``max_attempts`` times
    (or whose pool was already broken or shut down), for an upload that broke while the
    driver did not move, and for everything when no node answers within the move's
    timeout. (A node that dies while running tasks *for* a live node is not this error:
    those tasks are retried elsewhere.)"""

    __module__ = "dpool.errors"
