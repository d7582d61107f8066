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
- ``receive``: a range's bytes from the socket into the segment, spliced (one copy, by
  the kernel), the segment open only while a chunk goes in, no fork meanwhile
  (``_forkguard``); a kept receive buffer (``take_buffer``/``give_buffer``) and
  ``pwrite`` where the kernel cannot splice.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import socket
import struct
import threading
from typing import Any, Callable, Optional

from dpool.errors import Error
from dpool.objects import _segment
from dpool.objects import forkguard as _forkguard
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


class Closed(ConnectionError):
    """The sender closed the connection after ``received`` of a range's bytes."""

    def __init__(self, received: int, length: int, offset: int) -> None:
        super().__init__(f"the sender closed the connection after {received} of "
                         f"{length} bytes from {offset}")
        self.received = received


_SPLICE_MOVE, _SPLICE_MORE = 1, 4  # splice(2) flags
_F_SETPIPE_SZ = 1031
_PIPE = 1 << 20  # bytes a pipe holds (the default pipe-max-size)
_splice_ok = hasattr(os, "splice")  # False once splice failed as unsupported here


def receive(sock: socket.socket, path: str, offset: int, length: int,
            moved: Callable[[int], None] | None = None, *,
            keep_reading: bool = False) -> OSError | None:
    """Receive ``length`` bytes from ``sock`` (blocking, ``SO_RCVTIMEO`` set) into
    segment ``path`` from ``offset``; ``moved(n)`` as each chunk is in. ``Closed`` if
    the sender closes first, ``OSError`` if the connection breaks. A full store
    (``_segment._NO_SPACE_ERRNOS``) raises its ``OSError`` -- or, with
    ``keep_reading``, returns it once the rest of the range was read and dropped (an
    uploader still sending it would have its connection reset before it read the
    answer that says why); so does a segment removed meanwhile (``ENOENT``: another
    range of the upload failed).

    The bytes go socket -> pipe -> segment with ``splice``: the pipe takes references to
    the pages the socket holds (on loopback, the sender's own pages: it ``sendfile`` s
    them) and the kernel copies them once, into the segment's pages. Received into a
    buffer and written from it, they were copied twice; spliced, a 1 GB range moved in
    about half the time into fresh pages (bench/TRANSFER.md). Where ``splice`` is
    missing or refuses the socket, ``recv_into`` a kept buffer and ``pwrite``.
    """
    sink = _Sink(path, offset, keep_reading)
    if _splice_ok:
        pipe = _open_pipe()
        if pipe is not None:
            try:
                if _spliced(sock, pipe, sink, length, moved):
                    return sink.full
            finally:
                _close_pipe(pipe)
                sink.close()
    _buffered(sock, sink, length, moved)
    return sink.full


_pipes: set = set()  # the pipes of receives under way (closed in a forked child)


def _open_pipe() -> tuple[int, int] | None:
    try:
        pipe = os.pipe()
    except OSError:
        return None
    _pipes.add(pipe)
    return pipe


def _close_pipe(pipe: tuple[int, int]) -> None:
    _pipes.discard(pipe)
    os.close(pipe[0])
    os.close(pipe[1])


def _close_pipes_in_child() -> None:
    """A pipe may hold pages of a transfer (the sender's, on loopback) between the two
    splices: a worker forked meanwhile must not keep them for its whole life."""
    for r, w in list(_pipes):
        for fd in (r, w):
            try:
                os.close(fd)
            except OSError:
                pass
    _pipes.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_pipes_in_child)


# a segment out of room, or removed meanwhile (another range of the upload failed)
_DROPPED = _segment._NO_SPACE_ERRNOS | {errno.ENOENT}


class _Sink:
    """Where a range's chunks go: the segment, until it is full (then nowhere)."""

    def __init__(self, path: str, offset: int, keep_reading: bool) -> None:
        self.path, self.offset, self.keep_reading = path, offset, keep_reading
        self.full: OSError | None = None
        self._null = -1

    def write(self, chunk: Callable[[int, int], None], at: int) -> None:
        """``chunk(fd, offset)`` puts a chunk (from ``at`` in the range) into the
        segment, opened meanwhile under ``_forkguard.no_fork()`` (a worker must not
        inherit it: ``_pull.serve``) -- never while waiting for bytes, which may take
        as long as the sender does; or into /dev/null once the segment is full."""
        if self.full is None:
            try:
                with _forkguard.no_fork():
                    fd = os.open(self.path, os.O_WRONLY)
                    try:
                        chunk(fd, self.offset + at)
                    finally:
                        os.close(fd)
                return
            except OSError as exc:
                if not self.keep_reading or exc.errno not in _DROPPED:
                    raise
                self.full = exc
        if self._null < 0:
            self._null = os.open(os.devnull, os.O_WRONLY)
        chunk(self._null, -1)

    def close(self) -> None:
        if self._null >= 0:
            os.close(self._null)
            self._null = -1


def _spliced(sock: socket.socket, pipe: tuple[int, int], sink: _Sink, length: int,
             moved: Callable[[int], None] | None) -> bool:
    """``receive`` through ``pipe``; False, having moved nothing, if this kernel cannot
    splice from the socket (the caller then receives into a buffer)."""
    global _splice_ok
    r, w = pipe
    try:
        fcntl.fcntl(w, _F_SETPIPE_SZ, _PIPE)
    except OSError:  # over the user's pipe limit: the default size works too (slower)
        pass
    got = 0
    while got < length:
        # One call, then the pipe is drained: a call returns early when the pipe is out
        # of slots (one per piece of a packet, not per page), and another would block.
        try:
            n = os.splice(sock.fileno(), w, min(_PIPE, length - got),
                          flags=_SPLICE_MOVE | _SPLICE_MORE)
        except OSError as exc:
            if got == 0 and exc.errno in (errno.EINVAL, errno.ENOSYS):
                _splice_ok = False  # e.g. a socket type or kernel without it
                return False
            raise
        if n == 0:
            raise Closed(got, length, sink.offset)
        sink.write(functools.partial(_drain, r, n=n), got)
        got += n
        if moved is not None:
            moved(n)
    return True


def _drain(r: int, fd: int, offset: int, n: int) -> None:
    """Move ``n`` bytes from pipe ``r`` into ``fd`` at ``offset`` (-1: where it is)."""
    done = 0
    while done < n:
        done += os.splice(r, fd, n - done, offset_dst=offset + done if offset >= 0
                          else None, flags=_SPLICE_MOVE)


def _written(data: memoryview, fd: int, offset: int) -> None:
    """Write ``data`` into ``fd`` at ``offset`` (-1: nowhere, the segment is full)."""
    if offset >= 0:
        _segment._pwrite_all(fd, data, offset)


def _buffered(sock: socket.socket, sink: _Sink, length: int,
              moved: Callable[[int], None] | None) -> None:
    """``receive`` into a kept buffer, each chunk written with ``pwrite``."""
    buf = take_buffer()
    got = 0
    try:
        while got < length:
            n = sock.recv_into(buf, min(len(buf), length - got), socket.MSG_WAITALL)
            if n == 0:
                raise Closed(got, length, sink.offset)
            sink.write(functools.partial(_written, buf[:n]), got)
            got += n
            if moved is not None:
                moved(n)
    finally:
        give_buffer(buf)
