"""Answering a driver's or worker's question after work done off the IO thread.

Handlers that must not wait (a control-store round trip: the actor directory, the
key-value table) run their work on a thread of its own; ``answer`` then takes the
scheduler's lock to send ``ObjectValue(request_id)`` -- the asker's ``ask`` waits for
it -- if the asker is still connected.
"""

from __future__ import annotations

from typing import Any

from dpool.protocol import messages as m
from dpool.scheduling import SchedulerAPI


def answer(s: SchedulerAPI, h: Any, request_id: int, ok: bool, payload: bytes) -> None:
    """Send ``ObjectValue(request_id, ok, payload)`` to ``h`` (any thread but the lock's
    holder)."""
    with s.lock:
        if h.alive:
            s.send_locked(h, [m.ObjectValue(request_id, ok, payload)])
        out = s.take_out_locked()
    s.deliver(out)
