"""Turning a submit() call into what the scheduler needs: fn id, args payload, deps.

Shared by the runtime's clients (embedded, cluster driver, worker), so a task submitted
from a task is prepared exactly like one submitted from the driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from dpool.futures import Future, ObjectRef
from dpool.objects import _payload

if TYPE_CHECKING:
    from dpool.runtime._client import Client

_PLAIN = frozenset((int, float, str, bytes, bool, type(None)))


def dependency_ids(args: tuple, kwargs: dict) -> Optional[tuple]:
    """Object ids of the top-level Future/ObjectRef arguments (None if there are none)."""
    deps: Optional[tuple] = None
    for a in args:
        if type(a) in _PLAIN:
            continue
        if isinstance(a, Future):
            deps = (deps or ()) + (a._oid,)
        elif isinstance(a, ObjectRef):
            deps = (deps or ()) + (a.id,)
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, Future):
                deps = (deps or ()) + (a._oid,)
            elif isinstance(a, ObjectRef):
                deps = (deps or ()) + (a.id,)
    return deps


def serialize_args(client: Client, args: tuple, kwargs: dict) -> Optional[bytes]:
    """The call's arguments as bytes; pickling errors propagate with a note saying where."""
    try:
        return _payload.dumps_call(args, kwargs, client.new_id, client.owner_pid)
    except Exception as exc:
        if hasattr(exc, "add_note"):
            exc.add_note("dpool: this happened while pickling the task's arguments")
        raise


def failed_future(future: Future, exc: BaseException) -> Future:
    future.set_exception(exc)
    return future


def submit_prepared(client: Client, fn: Any, args: tuple, kwargs: dict) -> tuple[Any, ...]:
    """(fn_id, payload, dep_ids) or raises what serializing raised."""
    fn_id = client.functions.fn_id(fn)
    return fn_id, serialize_args(client, args, kwargs), dependency_ids(args, kwargs)
