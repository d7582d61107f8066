"""Authenticated transfer connections to other nodes, kept for reuse.

A connection to a node's object port costs a TCP connect and the token handshake
(``protocol._dial``: two round trips and two HMACs) -- more than copying a 1 MB value.
So a process keeps the connections its transfers used, a few per node, and the next
transfer with the same node takes one: the node's ``NodeServer`` serves any number of
requests (``FetchSegment``, ``PushSegment``) on a connection, one after the other.

A kept connection may have been closed by the holder meanwhile (it drops connections
idle for ``node._server.FETCH_IDLE_S``, and it may have died): a transfer on a kept
connection that gets no answer at all is retried once on a fresh one
(``_ranges.asked``). Kept connections are dropped after ``IDLE_S`` unused, and in a
child after a fork (they are the parent's).
"""

from __future__ import annotations

import os
import socket
import threading
import time

from dpool.protocol import dial as _dial

IDLE_S = 20.0  # a kept connection unused this long is closed (the holder waits 30 s)
_PER_HOLDER = 4  # connections kept per holder (one per transfer running at once)

_lock = threading.Lock()
_idle: dict[str, list[tuple[socket.socket, float]]] = {}  # address -> [(sock, since)]


def take(host: str, port: int, token: bytes, timeout: float) -> tuple[socket.socket, bool]:
    """A connection to the node at ``host:port`` that has passed the handshake, and
    whether it is a kept one (False: new). A ``dpool.Error`` if a new one cannot be made
    (``protocol._dial``: ``Unreachable``, ``Broken``, ``AuthenticationError``)."""
    key = f"{host}:{port}"
    now = time.monotonic()
    stale = []
    sock = None
    with _lock:
        kept = _idle.get(key, [])
        while kept:
            s, since = kept.pop()
            if now - since < IDLE_S:
                sock = s
                break
            stale.append(s)
    for s in stale:
        s.close()
    if sock is not None:
        return sock, True
    return _dial.connect(host, port, token, f"node {key}", timeout), False


def give_back(host: str, port: int, sock: socket.socket) -> None:
    """Keep ``sock`` (after a transfer that read its whole answer) for the next one;
    close the connections to any holder that have idled past ``IDLE_S`` (a holder never
    asked again, or gone, would keep them open for good)."""
    key = f"{host}:{port}"
    now = time.monotonic()
    stale = []
    with _lock:
        for k in list(_idle):
            kept = _idle[k]
            fresh = [(s, since) for s, since in kept if now - since < IDLE_S]
            if len(fresh) < len(kept):
                stale += [s for s, since in kept if now - since >= IDLE_S]
                if fresh:
                    _idle[k] = fresh
                else:
                    del _idle[k]
        kept = _idle.setdefault(key, [])
        if len(kept) < _PER_HOLDER:
            kept.append((sock, now))
            sock = None  # type: ignore[assignment]
    for s in stale:
        s.close()
    if sock is not None:
        sock.close()


def close_all() -> None:
    """Close every kept connection (a node stopping; tests)."""
    with _lock:
        socks = [s for kept in _idle.values() for s, _ in kept]
        _idle.clear()
    for s in socks:
        s.close()


def _forget_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    _idle.clear()  # the parent's sockets: never use (or close) them here


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
