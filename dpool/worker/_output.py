"""A node's worker sends what it writes to the driver whose tasks it runs.

On the embedded runtime workers share the driver's terminal, as the stdlib's do. Under a
node daemon (``capture_output``) the worker points its file descriptors 1 and 2 at pipes
and a thread per pipe sends what comes out as ``Output`` messages over the worker's
connection: Python's ``print``, the ``logging`` module and C code writing to fd 1/2 all
reach the driver, which prefixes each line with node and worker pid when the task ran on
another host. ``sys.stdout`` becomes line-buffered, and logging starts unconfigured, as
in a fresh process (not in the node daemon's format).

A line is sent whole, on one path. Output may go to the driver by two paths (the node's
connection, or a lease's while the worker is lent) and a line may be written in pieces
(under ``-u``, ``print("x")`` is two writes). So a pump sends only up to the last newline
it has; the rest of the line (``_tails``, per stream) waits for its newline, for
``drain()`` -- which sends everything ahead of a result or ``LeaseReady`` on the
connection that carries them, the only moments the path changes -- or for the worker's
exit. A line longer than ``_CHUNK`` goes in pieces. Whole lines written around a change
of path may reach the driver in another order than they were written in.

Each stream's lock is held while its pipe is read and what was read is sent, so the
pump's and ``drain()``'s sends stay in order.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import threading
from typing import Any

from dpool.protocol import ChannelClosed, encode_batch
from dpool.protocol import messages as m

_CHUNK = 1 << 16


class OutputForwarder:
    def __init__(self, chan: Any) -> None:
        self.node_chan = chan
        self.chan = chan  # where output goes: the node, or the driver a worker is lent to
        self._threads: list[threading.Thread] = []
        self._pipes: list[tuple[int, int, threading.Lock]] = []  # (stream, read end, lock)
        # what follows each stream's last newline, not sent yet (under that stream's lock)
        self._tails: dict[int, bytes] = {1: b"", 2: b""}
        for stream in (1, 2):
            _flush(stream)
            r, w = os.pipe()
            os.dup2(w, stream)
            os.close(w)
            os.set_blocking(r, False)
            lock = threading.Lock()  # read-and-send: the pump's and drain's stay in order
            self._pipes.append((stream, r, lock))
            t = threading.Thread(target=self._pump, args=(r, stream, lock), daemon=True,
                                 name=f"dpool-output-{stream}")
            t.start()
            self._threads.append(t)
        for f in (sys.stdout, sys.stderr):
            try:
                f.reconfigure(line_buffering=True)  # type: ignore[union-attr]
            except (AttributeError, ValueError):
                pass
        # A worker forked from the node daemon would log in the daemon's format; the
        # driver's program expects a fresh process's logging (no handlers, WARNING).
        root = logging.getLogger()
        for h in list(root.handlers):
            root.removeHandler(h)
        root.setLevel(logging.WARNING)

    def _pump(self, r: int, stream: int, lock: threading.Lock) -> None:
        pid = os.getpid()
        poller = select.poll()
        poller.register(r, select.POLLIN)
        try:
            while True:
                poller.poll()
                with lock:
                    try:
                        data = os.read(r, _CHUNK)
                    except BlockingIOError:
                        continue  # drain() took it
                    eof = not data
                    if eof:  # the worker exits: what is left of a line goes too
                        data, self._tails[stream] = self._tails[stream], b""
                    else:
                        data = self._whole_lines(stream, data)
                    if data:
                        self._send(encode_batch([m.Output(0, pid, "", stream, data)]))
                if eof:
                    return
        except (OSError, ChannelClosed):
            return  # (ChannelClosed: the worker is going; its main loop sees it too)
        finally:
            os.close(r)

    def _send(self, msg: bytes) -> None:
        try:
            self.chan.send(msg)
        except ChannelClosed:  # a lease that ended (or is ending): the node
            self.node_chan.send(msg)

    def _whole_lines(self, stream: int, data: bytes) -> bytes:
        """``data`` read from ``stream``'s pipe after what was kept of it: the whole lines
        to send now (the rest is kept; with the stream's lock held)."""
        data = self._tails[stream] + data
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) < _CHUNK:
            self._tails[stream] = data
            return b""
        if end == 0 or len(data) - end >= _CHUNK:  # a line too long to keep: as it is
            end = len(data)
        self._tails[stream] = data[end:]
        return data[:end]

    def drain(self) -> list:
        """What was written and not sent yet, an unfinished line included, as messages
        to send ahead of a result on the same connection, so a task's output reaches the
        driver before its result does."""
        out: list = []
        pid = 0
        for stream, r, lock in self._pipes:
            _flush(stream)
            with lock:
                data, self._tails[stream] = self._tails[stream], b""
                while True:
                    try:
                        more = os.read(r, _CHUNK)
                    except (BlockingIOError, OSError):
                        more = b""
                    if more:
                        data += more
                    if data and (not more or len(data) >= _CHUNK):
                        pid = pid or os.getpid()
                        out.append(m.Output(0, pid, "", stream, data))
                        data = b""
                    if not more:
                        break
        return out

    def stop(self, timeout: float = 1.0) -> None:
        """Send what is still buffered (the worker is exiting)."""
        for stream in (1, 2):
            _flush(stream)
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (1, 2):
            os.dup2(devnull, stream)  # the pipes' last write ends close: the pumps see EOF
        os.close(devnull)
        for t in self._threads:
            t.join(timeout)


def _flush(stream: int) -> None:
    f = sys.stdout if stream == 1 else sys.stderr
    try:
        if f is not None:
            f.flush()
    except (OSError, ValueError):
        pass
