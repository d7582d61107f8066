"""Which task each forked worker is running, in memory the scheduler shares with them.

A worker that dies takes the task it was running with it: that task is charged an
attempt. The other tasks it held -- sent and not started, or finished with their results
not yet sent (a worker sends results in batches) -- did not cause the death and go back
to the queue uncharged. Messages cannot tell these apart (the worker reports no start:
one message fewer per task), so each worker has a slot here: it writes the id of the task
it starts, and 0 once the call returned; the scheduler reads the slot of a worker that
died.

The board is a memory file of ``SLOTS`` 8-byte slots (``memfd_create``: in memory, no
path), made by the scheduler before it forks any process (the fork server included), so
every forked worker shares its descriptor; ``WorkerConfig.slot`` says which slot is a
worker's (-1: none, e.g. a spawned worker, whose death charges the first task it held).
A slot is written with one ``pwrite``, not through a shared mapping: the ``mmap``
module (an extension module) stays off the import path (tests/test_import_cost.py).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Callable

SLOTS = 4096
_SIZE = 8

_board = -1  # the memory file's descriptor; -1: none
_pid = 0  # the process it is this process's board in (a fork makes its own)
_free: list[int] = []  # its free slots (every scheduler of the process takes from them)


def create() -> None:
    """Make this process's board, once (a scheduler, before it forks)."""
    global _board, _pid, _free
    if _board >= 0 and _pid == os.getpid():
        return
    if not hasattr(os, "memfd_create"):
        return  # (deaths charge the first task a worker held)
    fd = os.memfd_create("dpool-running", os.MFD_CLOEXEC)
    os.ftruncate(fd, SLOTS * _SIZE)
    _board, _pid, _free = fd, os.getpid(), list(range(SLOTS - 1, -1, -1))


def take() -> int:
    """A free slot for a new forked worker, cleared; -1 if there is none (or no board)."""
    if _board < 0 or _pid != os.getpid() or not _free:
        return -1
    slot = _free.pop()
    os.pwrite(_board, bytes(_SIZE), slot * _SIZE)
    return slot


def give(slot: int) -> None:
    """``slot``'s worker is gone (after ``read``)."""
    if slot >= 0 and _pid == os.getpid():
        _free.append(slot)


def writer(slot: int) -> Callable[[int], None] | None:
    """In a new worker: what it calls with the id of each task it starts, and with 0 once
    the call returned; None without a slot. Bound to the board the worker was forked
    with: a runtime a task starts in the worker makes a board of its own."""
    board = _board
    if board < 0 or slot < 0:
        return None
    pwrite, offset = os.pwrite, slot * _SIZE

    def write(task_id: int) -> None:
        pwrite(board, task_id.to_bytes(_SIZE, "little"), offset)

    return write


def read(slot: int) -> int:
    """The task the worker with ``slot`` runs, or ran when it died (0: none)."""
    if _board < 0 or slot < 0:
        return 0
    return int.from_bytes(os.pread(_board, _SIZE, slot * _SIZE), "little")
