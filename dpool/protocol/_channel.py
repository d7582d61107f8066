"""Framing: length-prefixed frames over a connected stream socket.

Each frame is an 8-byte big-endian length followed by the body (see ``_codec``). Reads
pull as much as the kernel has (up to the channel's read buffer) and hand back every
complete frame, so a burst of small frames costs one system call, not one per frame. The
read buffer starts at ``_FIRST_CHUNK`` and doubles, up to ``_RECV_CHUNK``, each time a
read fills it (more was waiting): a busy channel soon reads 256 KiB at a time, a quiet
one holds 16 KiB.

Two modes:
- blocking (workers): ``recv_frames()`` waits for at least one frame; ``send`` blocks.
- non-blocking (the scheduler's IO loop): ``recv_ready()`` reads what is there;
  ``send`` never blocks -- what the kernel would not take is kept in ``_out`` and written
  by ``flush()`` when the socket becomes writable. This is what keeps the scheduler from
  deadlocking against a worker that is itself blocked sending a large result to it.
"""

from __future__ import annotations

import socket
import struct
import threading

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Optional

_HEADER = struct.Struct("!Q")
_HLEN = _HEADER.size
_RECV_CHUNK = 1 << 18
_FIRST_CHUNK = 1 << 14


class ChannelClosed(ConnectionError):
    """The peer closed the connection (or it broke)."""


class Channel:
    __slots__ = ("sock", "_buf", "_out", "_send_lock", "_blocking", "fileno", "_chunk",
                 "read_lock")

    def __init__(self, sock: socket.socket, *, blocking: bool = True) -> None:
        self.sock = sock
        self._buf = bytearray()
        # recv_into a buffer kept for the channel's life (sock.recv(256 KiB) would
        # allocate, and with glibc mmap and fault in, 256 KiB per call), grown as reads
        # fill it: a bytearray is zero-filled, all resident, so every channel holding
        # 256 KiB from the start cost that much memory (an anonymous mapping, resident only
        # as reads reach it, needed ``mmap``: ~1.6 M instructions to load in every program)
        self._chunk = memoryview(bytearray(_FIRST_CHUNK))
        self._out = bytearray()
        self._send_lock = threading.Lock()
        # Held by whoever reads (and handles what it read) when two threads may: the
        # scheduler's IO loop and a leader (see scheduling/_ioloop.py). Others ignore it.
        self.read_lock = threading.Lock()
        self._blocking = blocking
        sock.setblocking(blocking)
        self.fileno = sock.fileno()

    def set_blocking(self, blocking: bool) -> None:
        """Switch modes (a node hands an attached driver's socket to its IO loop)."""
        with self._send_lock:
            self._blocking = blocking
            self.sock.setblocking(blocking)

    # -- sending -------------------------------------------------------------------------
    def send(self, body: bytes) -> bool:
        """Send one frame. Returns False if part of it is queued for ``flush()``."""
        data = _HEADER.pack(len(body)) + body if len(body) < 65536 else None
        with self._send_lock:
            try:
                if self._blocking:
                    if data is None:
                        self.sock.sendall(_HEADER.pack(len(body)))
                        self.sock.sendall(body)
                    else:
                        self.sock.sendall(data)
                    return True
                if data is None:
                    data = _HEADER.pack(len(body)) + body
                if self._out:
                    self._out += data
                    return False
                try:
                    n = self.sock.send(data)
                except BlockingIOError:
                    n = 0
                if n < len(data):
                    self._out += memoryview(data)[n:]
                    return False
                return True
            except (BrokenPipeError, ConnectionResetError, OSError) as exc:
                raise ChannelClosed(str(exc)) from exc

    def flush(self) -> bool:
        """Write queued output (non-blocking mode). True when nothing is left queued."""
        with self._send_lock:
            while self._out:
                try:
                    n = self.sock.send(self._out)
                except BlockingIOError:
                    return False
                except OSError as exc:
                    raise ChannelClosed(str(exc)) from exc
                del self._out[:n]
            return True

    def pending_output(self) -> int:
        """Bytes sent but not yet written to the socket (a non-blocking channel's)."""
        return len(self._out)

    # -- receiving -----------------------------------------------------------------------
    def _frames(self) -> list[bytes]:
        buf = self._buf
        frames = []
        pos = 0
        end = len(buf)
        while end - pos >= _HLEN:
            (size,) = _HEADER.unpack_from(buf, pos)
            if end - pos - _HLEN < size:
                break
            start = pos + _HLEN
            frames.append(bytes(buf[start : start + size]))
            pos = start + size
        if pos:
            del buf[:pos]
        return frames

    def _read_once(self) -> bool:
        try:
            n = self.sock.recv_into(self._chunk)
        except BlockingIOError:
            return True
        except TimeoutError:
            raise  # recv_frames(timeout=...) ran out: not a closed connection
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc
        if not n:
            raise ChannelClosed("peer closed the connection")
        chunk = self._chunk
        self._buf += chunk[:n]
        if n == len(chunk) and n < _RECV_CHUNK:  # filled: more is waiting, read more at once
            self._chunk = memoryview(bytearray(min(2 * n, _RECV_CHUNK)))
        return True

    def recv_ready(self) -> list[bytes]:
        """Non-blocking: read what the kernel has, return the complete frames."""
        self._read_once()
        return self._frames()

    def recv_frames(self, timeout: Optional[float] = None) -> list[bytes]:
        """Blocking: wait (up to ``timeout``; None = forever) for at least one frame.

        Returns [] on timeout.
        """
        frames = self._frames()
        if frames:
            return frames
        if timeout is not None:
            self.sock.settimeout(timeout)
        try:
            while True:
                try:
                    self._read_once()
                except TimeoutError:  # socket.timeout is TimeoutError since 3.10
                    return []
                frames = self._frames()
                if frames:
                    return frames
        finally:
            if timeout is not None:
                self.sock.settimeout(None)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
