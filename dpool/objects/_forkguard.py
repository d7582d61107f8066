"""Keep ``fork()`` out of the moments a thread holds a segment descriptor in flight.

Workers are forked from the driver, from whichever thread starts them. A child forked
while another thread writes a segment would inherit that writer's descriptor -- and
with it the writer's exclusive ``flock`` (locks belong to the open file description,
which fork shares), so every later reader of that object would block for as long as the
child lives; a reader's descriptor caught between open and registration would pin the
segment's pages in the child. :func:`no_fork` marks such sections: they run concurrently
with each other, a fork (``os.register_at_fork``) waits until none is running, and new
sections wait until the fork is done. Sections must not nest.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["no_fork"]

_cond = threading.Condition()
_active = 0  # sections running
_forking = 0  # forks waiting or in progress


@contextmanager
def no_fork() -> Iterator[None]:
    global _active
    with _cond:
        while _forking:
            _cond.wait()
        _active += 1
    try:
        yield
    finally:
        with _cond:
            _active -= 1
            if not _active:
                _cond.notify_all()


def _before_fork() -> None:
    global _forking
    with _cond:
        _forking += 1
        while _active:
            _cond.wait()


def _after_fork_in_parent() -> None:
    global _forking
    with _cond:
        _forking -= 1
        _cond.notify_all()


def _after_fork_in_child() -> None:
    global _cond, _active, _forking
    _cond = threading.Condition()  # the parent's may have been held by another thread
    _active = 0
    _forking = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


def hold(timeout: float) -> bool:
    """Stop new sections for good and wait up to ``timeout`` s for running ones to end.

    For a process about to exit that must not create segments any more (a worker
    removing its dead driver's segments). Returns whether none is running.
    """
    global _forking
    with _cond:
        _forking += 1
        return _cond.wait_for(lambda: not _active, timeout)
