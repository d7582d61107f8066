"""``dpool.wait``, ``dpool.get`` and ``dpool.put``: the paper's API on this process's client.

In a driver they go to the driver's runtime; inside a task, to the worker's client, so
waiting there gives the worker's slot back (see ``_client.Client.blocking``).
"""

from __future__ import annotations

import concurrent.futures as _cf
import time
from typing import Any, Iterable, Optional, Sequence, Union

from dpool._task_future import ObjectRef, TaskFuture
from dpool.futures import Future
from dpool.runtime._current import client

__all__ = ["wait", "get", "put"]

Waitable = Union[Future, ObjectRef, _cf.Future]


def _as_future(x: Any) -> Any:
    """A future (a dpool one, another executor's: ``_cf.wait`` takes both) for ``x``."""
    if isinstance(x, (TaskFuture, _cf.Future)):
        return x
    if isinstance(x, ObjectRef):
        return client().future_for(x)
    raise TypeError(f"expected a Future or ObjectRef, got {type(x).__name__}")


def wait(
    futures: Sequence[Waitable], num_returns: int = 1, timeout: Optional[float] = None
) -> tuple[list, list]:
    """Wait until ``num_returns`` of ``futures`` are done or ``timeout`` seconds pass.

    Returns ``(done, not_done)``: at most ``num_returns`` done items in input order, and
    the others in input order (the paper's ``ray.wait``). ``timeout=None`` waits forever;
    a timeout is not an error, you get what is done by then.
    """
    items = list(futures)
    if num_returns < 0 or num_returns > len(items):
        raise ValueError(
            f"num_returns must be between 0 and len(futures) ({len(items)}), got {num_returns}")
    fs = [_as_future(x) for x in items]

    def _wait() -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pending = [f for f in fs if not f.done()]
            if len(fs) - len(pending) >= num_returns or not pending:
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            _cf.wait(pending, timeout=remaining, return_when=_cf.FIRST_COMPLETED)

    c = client()
    if c.gives_back_slot:
        c.blocking(_wait)
    else:
        _wait()
    done: list = []
    not_done: list = []
    for x, f in zip(items, fs, strict=True):
        (done if f.done() and len(done) < num_returns else not_done).append(x)
    return done, not_done


def get(refs: Union[Waitable, Iterable[Waitable]], timeout: Optional[float] = None) -> Any:
    """The value of a Future/ObjectRef, or a list of values for a list of them.

    Raises the task's exception, or ``TimeoutError`` after ``timeout`` seconds (measured
    from the call, for the whole list): ``dpool.TimeoutError``, which is the builtin and
    ``concurrent.futures``' ``TimeoutError`` (two classes before Python 3.11) both.
    """
    single = isinstance(refs, (ObjectRef, TaskFuture, _cf.Future))
    items = [refs] if single else list(refs)  # type: ignore[arg-type]
    fs = [_as_future(x) for x in items]
    deadline = None if timeout is None else time.monotonic() + timeout
    out = []
    try:
        for f in fs:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            out.append(f.result(remaining))
    except _cf.TimeoutError as exc:
        if fs[len(out)].done():
            raise  # the task's own error, which happens to be a TimeoutError
        from dpool.errors import TimeoutError as Timeout

        raise Timeout(f"not done within {timeout} s") from exc
    return out[0] if single else out


def put(value: Any) -> ObjectRef:
    """Store ``value`` once in the runtime; pass the ref to any number of tasks."""
    return client().put(value)
