"""The per-function opt-out of re-running tasks whose node was lost: ``no_rebuild``.

A driver connected over TCP whose node dies moves to a live node and runs its
unfinished tasks again there, and rebuilds results it had not received by running their
tasks again (``_move``). A function with side effects that must not happen twice (it
sends a mail, appends to a file, charges a card) can say no: its tasks that were on the
lost node are not run again, and their futures fail with ``dpool.ObjectLostError``
naming the result and the node. The same holds on one host for a large result whose
spill file was lost (``scheduling._lineage``, which reads the same mark). The decorator
only marks the function; nothing is checked on the submit path (the mark is read when a
node or a value is lost).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, TypeVar

    F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__dpool_no_rebuild__"


def no_rebuild(fn: F) -> F:
    """Mark ``fn``: its tasks are never run again because the node running them (or
    holding their result) was lost, or their result's spill file was; their futures (and
    the readers of their results) fail with ``ObjectLostError`` instead.

    Retries after a *worker* crash are governed by the executor's ``max_attempts`` as
    before."""
    if not callable(fn):
        raise TypeError(f"no_rebuild() takes a function, not {type(fn).__name__}")
    try:
        setattr(fn, _MARK, True)
    except (AttributeError, TypeError) as exc:  # a builtin, a bound method
        raise TypeError(f"no_rebuild() cannot mark {fn!r} (it takes no attributes): wrap "
                        "it in a def of your own") from exc
    return fn


def rebuilds(fn: Any) -> bool:
    """Whether tasks of ``fn`` may run again after their node was lost."""
    return not getattr(fn, _MARK, False)
