"""What pulling (``_pull``) and uploading (``_push``) a segment in ranges share.

A large segment moves in ranges, each on a transfer connection of its own, all at once:
one TCP stream leaves a core to spare on each side of a loopback copy, so several
streams move a segment faster than one. Both directions go the same way:

- ``split(size)``: the ranges -- as many as ``_STREAMS``, but none under ``_STREAM_MIN``
  bytes unless the segment is, page-aligned;
- ``in_parallel``: one range in this thread, the others in threads of their own, every
  thread that started joined before the caller sees an error;
- ``asked``: a kept connection (``_conns``) on which the node answered the range's
  request, or a fresh one when the node had dropped the kept one (``NoAnswer``);
- ``request``: the request, one frame, as ``protocol._channel`` frames it (the node reads
  it with its own framing, then the connection carries raw bytes);
- ``blocking``: the socket in blocking mode under the kernel's timeouts, so that a range
  moves in few calls, each with the GIL released;
- ``take_buffer``/``give_buffer``: receive buffers kept between transfers;
  ``write_chunk``: a received chunk into the segment, no fork meanwhile (``_forkguard``).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from typing import Any, Callable, Optional

from dpool.errors import Error
from dpool.objects import _forkguard, _segment
from dpool.protocol import encode_batch
from dpool.transfer import _conns

_SIZE = struct.Struct("!Q")
_STREAMS = max(1, min(4, os.cpu_count() or 1))  # connections one large transfer uses
_STREAM_MIN = 16 << 20  # bytes each of them moves at least
_PAGE = 4096
_BUFFER = 8 << 20  # bytes received per pwrite (a larger buffer moves faster: fewer calls)
_SPARE_BUFFERS = 4


def split(size: int) -> list[tuple[int, int]]:
    """(offset, length) of the parts of a ``size``-byte segment moved at once."""
    if size <= 0:
        return [(0, 0)]
    n = max(1, min(_STREAMS, size // _STREAM_MIN))
    step = -(-size // n // _PAGE) * _PAGE
    return [(off, min(step, size - off)) for off in range(0, size, step)] or [(0, 0)]


def in_parallel(work: Callable[[int, int], None], ranges: list[tuple[int, int]],
                name: str, first: Optional[Callable[[], None]] = None
                ) -> list[BaseException]:
    """``work(offset, length)`` for every range at once: the first range in this thread,
    the others in threads of their own (named ``name``); the errors they raised, in the
    order they did. ``first()``, if given, runs in this thread instead of the first
    range's ``work``, and what it raises is raised, not listed.

    Every thread that started is joined before this returns or raises, whatever happens;
    only those: a thread that fails to start raises its own error, not one of joining a
    thread that never ran.
    """
    errors: list[BaseException] = []

    def one(offset: int, length: int) -> None:
        try:
            work(offset, length)
        except BaseException as exc:  # noqa: BLE001 - the caller raises it
            errors.append(exc)

    started: list[threading.Thread] = []
    try:
        for off, n in ranges[1:]:
            t = threading.Thread(target=one, args=(off, n), daemon=True, name=name)
            t.start()
            started.append(t)  # (only what started is joined: a failed start raises)
        if first is not None:
            first()
        else:
            one(*ranges[0])
    finally:
        for t in started:
            t.join()
    return errors


class NoAnswer(Exception):
    """Mixed into the error an ``ask`` raises when the node closed the connection before
    answering at all (a kept connection it had dropped, or it died): worth one more try
    on a fresh connection (``asked``)."""


def asked(host: str, port: int, token: bytes, timeout: float,
          ask: Callable[[socket.socket], None],
          unreachable: Callable[[BaseException], None]) -> socket.socket:
    """A connection to the node at ``host:port`` on which ``ask(sock)`` went through: a
    kept one if there is one (``_conns``), else a new one. An ask that raises a
    ``NoAnswer`` on a kept connection is tried once more, on a fresh one (the node drops
    connections that idle too long, and a kept one may have died with its node).

    If no connection can be made, ``unreachable(error)`` is called in the handler, to
    raise the caller's error for it (if it returns, the error itself is raised). Any
    error closes the connection: an exchange that was not finished never leaves one.
    """
    for attempt in (0, 1):
        try:
            sock, kept = _conns.take(host, port, token, timeout)
        except (OSError, Error) as exc:
            unreachable(exc)
            raise
        try:
            ask(sock)
        except NoAnswer:
            sock.close()
            if kept and attempt == 0:
                continue  # the node had dropped the kept connection: a fresh one
            raise
        except BaseException:
            sock.close()
            raise
        return sock
    raise AssertionError("unreachable")  # pragma: no cover


def request(sock: socket.socket, msg: Any) -> None:
    """Send ``msg`` as one frame (``protocol._channel``'s framing)."""
    body = encode_batch([msg])
    sock.sendall(_SIZE.pack(len(body)) + body)


def blocking(sock: socket.socket, option: int, timeout: float) -> None:
    """Put ``sock`` in blocking mode, with the kernel's ``option`` (``SO_SNDTIMEO`` or
    ``SO_RCVTIMEO``) as the limit on a call that makes no progress. In a daemon with
    busy threads, a call per socket-buffer's worth (what a socket with a Python timeout
    does: wait until ready, then move what fits) waits for the GIL each time, and in a
    busy node those waits add up to more than the copy itself; a blocking call moves it
    all (``sendfile``, ``MSG_WAITALL``) with the GIL released once."""
    sock.settimeout(None)
    sec = int(timeout)
    sock.setsockopt(socket.SOL_SOCKET, option,
                    struct.pack("ll", sec, int((timeout - sec) * 1e6)))


_spare: list[memoryview] = []  # receive buffers between transfers (faulted in already)
_spare_lock = threading.Lock()


def take_buffer() -> memoryview:
    """A receive buffer: a kept one (transfers run in short-lived threads, and a new
    buffer faults its pages in again), else a new one."""
    with _spare_lock:
        if _spare:
            return _spare.pop()
    return memoryview(bytearray(_BUFFER))


def give_buffer(buf: memoryview) -> None:
    with _spare_lock:
        if len(_spare) < _SPARE_BUFFERS:
            _spare.append(buf)


def write_chunk(path: str, data: memoryview, offset: int) -> None:
    """Write a received chunk into segment ``path``, the segment open only meanwhile and
    no fork meanwhile (a worker must not inherit it: ``_pull.serve``); never while
    waiting for the bytes, which may take as long as the sender does."""
    with _forkguard.no_fork():
        fd = os.open(path, os.O_WRONLY)
        try:
            _segment._pwrite_all(fd, data, offset)
        finally:
            os.close(fd)
