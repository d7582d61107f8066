"""A worker outlives no driver, and leaves nothing of a dead one behind.

A watchdog thread polls the parent pid (or, when the worker's parent is not the driver --
a forkserver start -- the driver's own process): when the driver has died (SIGKILL sends no
``Shutdown``, and EOF on the socket may never come, as a forked sibling may hold its other
end open), the worker exits, even in the middle of a long task. Before exiting it removes
the dead driver's shared-memory segments and recycling pool (``_owners.reap_owner``),
so that ``/dev/shm`` is clean within a poll interval even if no dpool program starts
again. The main loop's EOF path (:func:`connection_lost`) does the same without waiting
for the next poll. Every worker of the dead driver does this; each name is unlinked by
whichever comes first, and a segment one of them writes after another's cleanup is
removed by its own, since writing stops before a worker cleans up.
"""

from __future__ import annotations

import _thread
import os
import time

from dpool import _log
from dpool.objects import owners as _owners

log = _log.getLogger("dpool.worker")

_POLL_S = 0.25
_LOST_WAIT_S = 1.0  # after EOF: how long to wait for a dying driver to be gone

_owner: tuple[int, float | None] | None = None  # (driver pid, its start time)


_child = True  # the driver is this process's parent (fork, spawn; not forkserver)


def start(parent_pid: int) -> None:
    """In a new worker: remember the driver (pid and start time), watch it."""
    global _owner, _child
    _child = os.getppid() == parent_pid
    # a child of the driver sees it die by being reparented; only another's needs to tell
    # the driver from a later process given the same pid, by its start time
    _owner = (parent_pid, None if _child else _owners.owner_started(parent_pid))
    # A bare thread, not a ``threading.Thread``: whose start() waits for the new thread
    # to run first (~0.4 ms here, in a freshly forked worker on its way to its first
    # task). It sleeps and polls only, takes no lock, and ends with the process, as a
    # daemon thread does; user code's ``threading.enumerate()`` does not list it.
    _thread.start_new_thread(_watch, ())


def driver_alive() -> bool:
    """Whether the driver still runs. Our parent: until we are reparented (one
    ``getppid``). Else (a forkserver's child) its process, told from a later process
    given the same pid by its start time; a zombie is dead."""
    if _owner is None:
        return True
    pid, started = _owner
    if _child:
        return os.getppid() == pid
    try:
        state = _owners.process_state(pid)
    except OSError:
        return False
    return state is not None and not state[0] and (started is None or state[1] == started)


def _watch() -> None:
    while True:
        time.sleep(_POLL_S)
        if not driver_alive():
            clean_up()
            os._exit(1)


def connection_lost() -> None:
    """The driver's socket closed without a ``Shutdown``: if the driver died (it may
    still be exiting: wait a little), remove what it left before this worker exits."""
    if _owner is None:
        return
    deadline = time.monotonic() + _LOST_WAIT_S
    while driver_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not driver_alive():
        clean_up()


def clean_up() -> None:
    """Remove the driver's segments if it is dead (this process writes none after)."""
    if _owner is None:
        return
    try:
        _owners.reap_owner(*_owner, exiting=True)
    except Exception:  # exiting anyway; the next runtime start reaps
        log.debug("cleaning up after dead driver %d failed", _owner[0], exc_info=True)
