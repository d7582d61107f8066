"""dpool's exceptions.

Every exception dpool raises on its own account derives from :class:`Error`. Where the
standard library already has an exception that names the failure, dpool's class also
subclasses it, so an existing ``except BrokenProcessPool:`` or ``except TimeoutError:``
keeps working after the import swap.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know the name)
if TYPE_CHECKING:
    from dpool._errors_broken import DeserializationError, NodeLostError, WorkerCrashedError
    from dpool._errors_futures import CancelledError, TimeoutError
    from dpool._errors_limits import OutOfMemoryError, TaskTimeoutError

__all__ = [
    "Error",
    "WorkerCrashedError",
    "ObjectStoreFullError",
    "ObjectLostError",
    "ActorDiedError",
    "CollectiveError",
    "SerializationError",
    "DeserializationError",
    "ProtocolError",
    "ResourceError",
    "PlacementError",
    "AuthenticationError",
    "ControlStoreError",
    "NodeLostError",
    "CancelledError",
    "TimeoutError",
    "TaskTimeoutError",
    "OutOfMemoryError",
]


class Error(Exception):
    """Base class of every exception dpool raises on its own account."""


class ObjectStoreFullError(Error, MemoryError):
    """The shared-memory object store cannot make room for an object.

    Raised where the space was needed -- ``put``, the ``result()`` of a task whose return
    value or large argument block did not fit, a ``result()`` or ``dpool.get`` of a value
    that cannot come back from disk -- when every unpinned object has been evicted and the
    pinned ones leave too little room, or at once when the object is bigger than the whole
    store. Pinned are the stored inputs of tasks running on workers (a task pins them when
    it is sent to a worker, not while it is queued) and the argument blocks of submitted
    tasks. A task whose inputs find no room waits for it; it fails with this error only
    when they could never fit together, or when every pin is held by waiting tasks.
    """


class ObjectLostError(Error):
    """An object's value is gone and cannot be rebuilt (its lineage is unavailable).

    Raised where the value is needed -- ``result()``, ``dpool.get``, or the task that
    takes it as an input -- when every copy was on a node that died (also part-way
    through copying it: a partial copy is never used) or was evicted without lineage.
    ``object_id`` and ``node`` (the address of the node that held it) are set when known.
    """

    def __init__(self, message: str, *, object_id: int | None = None,
                 node: str | None = None):
        super().__init__(message)
        self.object_id = object_id
        self.node = node

    def __reduce__(self):  # keep the keyword fields across pickling
        return (_rebuild_lost, (str(self), self.object_id, self.node))


def _rebuild_lost(message: str, object_id: int | None, node: str | None) -> ObjectLostError:
    return ObjectLostError(message, object_id=object_id, node=node)


class ActorDiedError(Error):
    """An actor's process is gone for good (``dpool.actor``): its constructor raised, it
    died with no restarts left, it was killed (``dpool.kill``), or its executor was shut
    down. Raised by its pending and later calls; ``actor`` names it (its class and id, or
    its ``name=``), ``reason`` says why it died."""

    def __init__(self, message: str, *, actor: str = "", reason: str = ""):
        super().__init__(message)
        self.actor = actor
        self.reason = reason

    def __reduce__(self):  # keep the keyword fields across pickling
        return (_rebuild_actor_died, (str(self), self.actor, self.reason))


def _rebuild_actor_died(message: str, actor: str, reason: str) -> ActorDiedError:
    return ActorDiedError(message, actor=actor, reason=reason)


def actor_died(actor: str, reason: str) -> ActorDiedError:
    """The error the calls of actor ``actor`` raise once it died for ``reason``."""
    return ActorDiedError(f"actor {actor} died: {reason}", actor=actor, reason=reason)


class CollectiveError(Error):
    """A collective operation (``dpool.collective``) failed in this member: another
    member died or left the group mid-operation (``rank`` names it, -1 when unknown),
    the members disagree on the call (shapes, dtypes, the operation), the group does
    not exist here, or the operation ran past its timeout. The group is unusable after
    it: ``destroy_group`` it, and form it again."""

    def __init__(self, message: str, *, group: str = "", rank: int = -1):
        super().__init__(message)
        self.group = group
        self.rank = rank

    def __reduce__(self):  # keep the keyword fields across pickling
        return (_rebuild_collective, (str(self), self.group, self.rank))


def _rebuild_collective(message: str, group: str, rank: int) -> CollectiveError:
    return CollectiveError(message, group=group, rank=rank)


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


class ResourceError(Error, ValueError):
    """A task asks for resources that no node can ever give it: more CPUs than its
    executor's ``max_workers`` or its node has, more GPUs, memory or of a custom resource
    than any node offers, or a resource nobody offers at all.

    Raised by that task's ``result()`` -- at once on the embedded runtime; in a cluster
    once no node that has it joined within the grace period (``DPOOL_RESOURCE_GRACE_S``).
    The message says what was asked and what is offered. (A request that is merely busy
    waits; bad values -- a negative amount, 1.5 GPUs -- raise ``ValueError``/``TypeError``
    at the call that made them.)
    """


class PlacementError(ResourceError):
    """A task, or a placement group, can never be placed as it asks: a hard
    ``NodeAffinity`` to a node that is not in the cluster (or died, or is not this host
    on the embedded runtime), a bundle of a placement group that was removed or whose
    node died, a ``strict_spread`` group with more bundles than nodes.

    Raised by that task's ``result()`` (or the group's ``ready()``), with what was asked
    and what the cluster has. A placement that is only busy waits instead. It is a
    ``ResourceError``, so code that handles impossible requests handles it too.
    """


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``; before Python 3.11, where tracebacks show no notes, the note
    is kept in ``exc.__notes__`` all the same (code and tests that read it find it)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        notes = getattr(exc, "__notes__", None)
        if notes is None:
            notes = exc.__notes__ = []  # type: ignore[attr-defined]
        notes.append(note)


def broken_pool(reason: str) -> Exception:
    """The stdlib's own ``BrokenProcessPool(reason)``: what a broken or shut-down pool's
    calls raise, as the stdlib's would."""
    return stdlib_broken_pool()(reason)


_broken_pool_class: type | None = None


def stdlib_broken_pool() -> type:
    """``concurrent.futures.process.BrokenProcessPool``, imported on first use: its module
    brings most of ``multiprocessing`` with it (see ``dpool._errors_broken``).

    That module cannot be imported once the interpreter is exiting (it registers a
    threading exit hook, refused after threading's shutdown). Then, when nothing imported
    it earlier -- so no code can be holding the class -- its base,
    ``concurrent.futures.BrokenExecutor``, stands in for it."""
    global _broken_pool_class
    if _broken_pool_class is None:
        try:
            from concurrent.futures.process import BrokenProcessPool

            _broken_pool_class = BrokenProcessPool
        except RuntimeError:  # "can't register atexit after shutdown"
            from concurrent.futures import BrokenExecutor  # (imports at exit: no hook)

            _broken_pool_class = BrokenExecutor
    return _broken_pool_class


# The errors that are also ``BrokenProcessPool`` load with it, when first looked up (see
# ``dpool._errors_broken``); those that are also ``concurrent.futures``' with that
# package (``dpool._errors_futures``).
_BROKEN = frozenset(("WorkerCrashedError", "DeserializationError", "NodeLostError"))
_FUTURES = frozenset(("CancelledError", "TimeoutError"))
_LIMITS = frozenset(("TaskTimeoutError", "OutOfMemoryError"))


def __getattr__(name: str) -> type:
    if name in _BROKEN:
        from dpool import _errors_broken as defined
    elif name in _FUTURES:
        from dpool import _errors_futures as defined  # type: ignore[no-redef]
    elif name in _LIMITS:
        from dpool import _errors_limits as defined  # type: ignore[no-redef]
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = getattr(defined, name)
    globals()[name] = cls  # looked up once
    return cls
