"""Turning a submit() call into what the scheduler needs: fn id, args payload, deps.

Shared by the runtime's clients (embedded, cluster driver, worker), so a task submitted
from a task is prepared exactly like one submitted from the driver.
"""

from __future__ import annotations

from collections.abc import Callable

from dpool import errors
from dpool._task_future import ObjectRef, TaskFuture, collect_refs
from dpool.objects import payload as _payload

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Optional, TypeVar

    F = TypeVar("F", bound=TaskFuture)

    from dpool.runtime._client import Client

_PLAIN = frozenset((int, float, str, bytes, bool, type(None)))


def dependency_ids(args: tuple, kwargs: dict) -> Optional[tuple]:
    """Object ids of the top-level Future/ObjectRef arguments (None if there are none)."""
    deps: Optional[tuple] = None
    for a in args:
        if type(a) in _PLAIN:
            continue
        if isinstance(a, TaskFuture):
            deps = (deps or ()) + (a._oid,)
        elif isinstance(a, ObjectRef):
            deps = (deps or ()) + (a.id,)
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, TaskFuture):
                deps = (deps or ()) + (a._oid,)
            elif isinstance(a, ObjectRef):
                deps = (deps or ()) + (a.id,)
    return deps


def serialize_args(client: Client, args: tuple, kwargs: dict) -> Optional[bytes]:
    """The call's arguments as bytes; pickling errors propagate with a note saying where."""
    try:
        return _payload.dumps_call(args, kwargs, client.new_id, client.owner_pid)
    except Exception as exc:
        errors.add_note(exc, "dpool: this happened while pickling the task's arguments")
        raise


def failed_future(future: F, exc: BaseException) -> F:
    future.set_exception(exc)
    return future


def submit_prepared(client: Client, fn: Any, args: tuple, kwargs: dict,
                    fut: TaskFuture) -> tuple[Any, ...]:
    """(fn_id, payload, dep_ids) or raises what serializing raised. Handles pickled inside
    the arguments are kept on ``fut`` until the task ends (``pinned_payload``)."""
    fn_id = client.functions.fn_id(fn)
    if not kwargs:
        for a in args:
            if type(a) not in _PLAIN:
                break
        else:  # (the common case: nothing in them can hold a handle)
            return fn_id, serialize_args(client, args, kwargs), None
    payload = pinned_payload(fut, args, kwargs, serialize_args, client, args, kwargs)
    return fn_id, payload, dependency_ids(args, kwargs)


def pinned_payload(fut: TaskFuture, args: tuple, kwargs: dict,
                   serialize: Callable[..., Optional[bytes]], *how: Any) -> Optional[bytes]:
    """``serialize(*how)``, the arguments' payload; the handles of objects it pickled
    *inside* the arguments (``[ref, future]``) are kept alive on the task's future until
    it is done. Only an argument itself is a dependency the scheduler holds for the task;
    a handle inside one the task reads by id, and the caller's own handle may be dropped
    right after ``submit`` (a temporary list), which released the object while the task
    was queued: the task got ``ObjectLostError``."""
    payload, refs = collect_refs(serialize, *how)
    if not refs:
        return payload
    top = [a for a in (*args, *kwargs.values()) if type(a) not in _PLAIN]
    refs = [r for r in refs if not any(r is a for a in top)]
    if refs:
        fut._pins = refs  # type: ignore[attr-defined]
        fut.add_done_callback(_unpin)
    return payload


def _unpin(fut: Any) -> None:
    fut._pins = None
