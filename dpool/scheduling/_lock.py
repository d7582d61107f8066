"""The scheduler's lock, which also carries out the sends its locked regions decide on.

The scheduler's state changes only under this lock, and no state change writes to a
socket: a region that decides to send messages to a worker, a driver or a peer records
them (``send_locked`` appends ``(handle, messages)`` to ``outbox``), and the lock
writes them when the region releases it -- one frame per handle, the messages in the
order the region recorded them, still holding the lock so that the frames of successive
regions reach each handle in the order the regions ran. A ``threading.Condition`` over
this lock flushes the same way when it waits. Writes never block (a full socket buffer
is left to the IO loop: ``write_sends``), so holding the lock for them
costs what writing them inline did; a region that sends one handle several times writes
one frame.
"""

from __future__ import annotations

import threading

from dpool.protocol import ChannelClosed, encode_batch

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable


class SchedulerLock:
    """A ``threading.Lock`` whose release first hands ``outbox`` to ``flush``."""

    __slots__ = ("acquire", "locked", "_release", "outbox", "_flush")

    def __init__(self) -> None:
        lock = threading.Lock()
        self.acquire = lock.acquire
        self.locked = lock.locked
        self._release = lock.release
        self.outbox: list[tuple[Any, list]] = []  # (handle, messages), in the order sent
        self._flush: Callable[[list], None] = _no_flush

    def set_flush(self, flush: Callable[[list], None]) -> None:
        """``flush(outbox)`` writes every recorded send (the lock held) and empties it."""
        self._flush = flush

    def release(self) -> None:
        if self.outbox:
            try:
                self._flush(self.outbox)
            finally:
                self._release()
            return
        self._release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _no_flush(outbox: list) -> None:
    raise RuntimeError("SchedulerLock: sends recorded before a flush was set")


def write_sends(outbox: list, want_write: Callable[[Any], None]) -> None:
    """Write the ``(handle, messages)`` a region recorded: one frame per handle, its
    messages in the order recorded. Never blocks: what a socket cannot take now,
    ``want_write(handle)`` leaves to the IO loop. Empties ``outbox``."""
    if len(outbox) == 1:  # (most regions: one send)
        w, msgs = outbox.pop()
        _write(w, msgs, want_write)
        return
    try:
        merged: dict = {}
        for w, msgs in outbox:
            mine = merged.get(w)
            if mine is None:
                merged[w] = list(msgs)  # (a copy: one list may go to several)
            else:
                mine.extend(msgs)
        for w, msgs in merged.items():
            _write(w, msgs, want_write)
    finally:
        outbox.clear()


def _write(w: Any, msgs: list, want_write: Callable[[Any], None]) -> None:
    try:
        if not w.chan.send(encode_batch(msgs)):
            want_write(w)
    except ChannelClosed:
        pass  # the IO loop sees the EOF and handles the death

