"""Large values from a driver that reaches its node over TCP: uploaded straight into a
segment of the node's store, off the control connection.

    driver (no store of its own)                                  its node
    put/submit: pickle 5, buffers out of band
    PushSegment(object id, size) ─── a kept transfer connection ──▶ its NodeServer thread:
        ◀── go ahead (or: full / refused) ───────────────────────── checks, claims a segment
    header + table, meta, each buffer at its aligned offset ───────▶ splice socket -> pipe
        (sendmsg straight from the user's buffers: nothing joined)    -> segment
        ◀── stored: the segment's name (or: full / refused) ────────┘
    PutObject / SubmitTask, the payload naming that segment ──▶ (control connection) the
                                                                 scheduler adopts it, as
                                                                 a local driver's value

The bytes sent are the segment, verbatim (``_segment``'s layout): the node unpickles
nothing. A large value goes in ranges (``_ranges.split``), each on a connection of its
own: the range at offset 0 is asked for first and creates the segment; the others follow
once the node said go ahead, each written by its own node thread at its offset; the first
range's thread waits for them all and answers last, with the name. The node names the
segment (``segment_name(its store owner, object id)``, never a name from the wire) and
``node._attach`` checks the id and size. The node answers before the bytes come, so a
value that cannot fit is refused unsent and the framing (``protocol._channel``) never
sees raw bytes. A transfer that breaks part-way leaves no segment and fails the call with
``NodeLostError``; a full store fails it with ``ObjectStoreFullError``.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from dpool.errors import Error, NodeLostError, ObjectStoreFullError, ProtocolError
from dpool.objects import Serialized, _segment
from dpool.objects import forkguard as _forkguard
from dpool.objects import values as _values
from dpool.protocol import PROTOCOL_VERSION, DialError
from dpool.protocol import auth as _auth
from dpool.protocol import messages as m
from dpool.transfer import _conns, _ranges

PUSH_TIMEOUT = 30.0  # a push that moves no byte for this long fails
_REPLY = struct.Struct("!BI")  # status, length of the text that follows
OK, FULL, REFUSED, LOST = 0, 1, 2, 3  # LOST: a connection of the upload broke
_MAX_TEXT = 4096
_IOV = 512  # parts per sendmsg call (Linux takes up to 1024)
_ZEROS = bytes(64)  # alignment padding between parts (``_segment._ALIGN``)


# -- the driver's side -------------------------------------------------------------------
class _NoAnswer(_ranges.NoAnswer, NodeLostError):
    """The node closed the connection before answering the request (``_ranges.asked``
    tries a fresh connection)."""


def push(host: str, port: int, token: bytes, object_id: int, ser: Serialized,
         timeout: float = PUSH_TIMEOUT) -> bytes:
    """Upload ``ser`` into the store of the node at ``host:port`` as ``object_id``; the
    stored payload that names the node's segment (for ``PutObject``/``SubmitTask``).
    ``ObjectStoreFullError`` if the node has no room, ``NodeLostError`` if it cannot be
    reached or the transfer breaks (the node then keeps nothing of it).

    A large value goes in ranges over several connections at once, as ``_pull``
    fetches (one TCP stream leaves a core to spare on each side)."""
    views = [_segment._as_bytes_view(b) for b in ser.buffers]
    layout = _segment._layout(len(ser.meta), [v.nbytes for v in views])
    up = _Upload(host, port, token, object_id, layout.size,
                 _parts(layout, ser.meta, views), timeout)
    name = up.run(_ranges.split(layout.size))
    return _values._STORED_HEAD.pack(_values.TAG_STORED, object_id,
                                     layout.size) + name.encode()


class _Upload:
    """One value's bytes (``parts``, the segment's layout) on their way to a node."""

    def __init__(self, host: str, port: int, token: bytes, object_id: int, size: int,
                 parts: list[memoryview], timeout: float) -> None:
        self.host, self.port, self.token, self.timeout = host, port, token, timeout
        self.object_id, self.size, self.parts = object_id, size, parts
        self.where = f"node {host}:{port}"

    def run(self, ranges: list[tuple[int, int]]) -> str:
        """Send every range; the segment's name on the node. The range at offset 0 goes
        first (it creates the segment) and is answered last, when all are in."""
        sock = self._open(*ranges[0])
        try:
            errors = _ranges.in_parallel(self._range, ranges, "dpool-push-range",
                                         first=lambda: self._send(sock, *ranges[0]))
            if errors:
                raise _worst(errors)  # (closing ``sock`` tells the node to drop the value)
            name = self._done(sock)
        except BaseException:
            sock.close()  # the exchange was not finished: never reuse it
            raise
        _conns.give_back(self.host, self.port, sock)
        return name

    def _range(self, offset: int, length: int) -> None:
        """A range after the first: asked for, sent and answered on its own connection."""
        sock = self._open(offset, length)
        try:
            self._send(sock, offset, length)
            self._done(sock)
        except BaseException:
            sock.close()
            raise
        _conns.give_back(self.host, self.port, sock)

    def _open(self, offset: int, length: int) -> socket.socket:
        """A connection on which the node said go ahead for this range."""
        return _ranges.asked(self.host, self.port, self.token, self.timeout,
                             lambda sock: self._ask(sock, offset, length), self._unreachable)

    def _unreachable(self, exc: BaseException) -> None:
        if isinstance(exc, (OSError, DialError)):
            raise NodeLostError(f"cannot upload a value of {self.size} bytes: "
                                f"{self.where} cannot be reached ({exc})") from exc

    def _ask(self, sock: socket.socket, offset: int, length: int) -> None:
        sock.settimeout(self.timeout)
        try:
            _ranges.request(sock, m.PushSegment(PROTOCOL_VERSION, self.object_id,
                                                self.size, offset, length))
            status, text = _reply(sock, self.timeout)
        except OSError as exc:
            raise _NoAnswer(f"{self.where} did not answer an upload request ({exc})") \
                from exc
        if status is None:
            raise _NoAnswer(f"{self.where} closed the connection")
        _check(status, text, self.size, self.where)

    def _send(self, sock: socket.socket, offset: int, length: int) -> None:
        try:
            _ranges.blocking(sock, socket.SO_SNDTIMEO, self.timeout)
            _send_parts(sock, _slice(self.parts, offset, length))
        except OSError as exc:
            raise NodeLostError(f"the upload of a value of {self.size} bytes to "
                                f"{self.where} broke ({exc})") from exc

    def _done(self, sock: socket.socket) -> str:
        try:
            status, text = _reply(sock, self.timeout)
        except OSError as exc:
            raise NodeLostError(f"{self.where} did not confirm the upload of a value of "
                                f"{self.size} bytes ({exc})") from exc
        if status is None:
            raise NodeLostError(f"{self.where} closed the connection during the upload "
                                f"of a value of {self.size} bytes")
        _check(status, text, self.size, self.where)
        return text


def _check(status: int, text: str, size: int, where: str) -> None:
    if status == OK:
        return
    if status == FULL:
        raise ObjectStoreFullError(f"{where} has no room for a value of {size} bytes: "
                                   f"{text}")
    if status == LOST:
        raise NodeLostError(f"{where} lost the upload of a value of {size} bytes: {text}")
    raise Error(f"{where} refused a value of {size} bytes: {text}")


class _Lost(Error):
    """A range of an upload broke (its connection, or the whole upload dropped): the
    driver hears ``NodeLostError``, as for its own broken connection."""


def _status(failed: Error) -> int:
    if isinstance(failed, ObjectStoreFullError):
        return FULL
    return LOST if isinstance(failed, _Lost) else REFUSED


def _worst(errors: list) -> BaseException:
    """The error a failed upload reports: no room, else a lost connection, else the
    first (ranges fail in any order; one broken range makes the others fail too)."""
    for kind in (ObjectStoreFullError, NodeLostError):
        for exc in errors:
            if isinstance(exc, kind):
                return exc
    return errors[0]


def _reply(sock: socket.socket, timeout: float) -> tuple[Optional[int], str]:
    """(status, text) of the node's answer; (None, "") if it closed the connection."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    head = _auth._recv_exact(sock, _REPLY.size, deadline)
    if len(head) < _REPLY.size:
        return None, ""
    status, n = _REPLY.unpack(head)
    if n > _MAX_TEXT:
        raise ProtocolError(f"an upload answer of {n} bytes")
    text = _auth._recv_exact(sock, n, deadline) if n else b""
    if len(text) < n:
        return None, ""
    return status, text.decode("utf-8", "replace")


def _parts(layout: _segment._Layout, meta: bytes, views: list) -> list[memoryview]:
    """The segment's bytes as views of what is already in memory, padding included."""
    parts = [memoryview(layout.header), memoryview(meta)]
    end = layout.meta_offset + len(meta)
    for view, offset in zip(views, layout.buffer_offsets, strict=True):
        if offset > end:
            parts.append(memoryview(_ZEROS)[:offset - end])
        parts.append(view)
        end = offset + view.nbytes
    return [p for p in parts if p.nbytes]


def _slice(parts: list[memoryview], offset: int, length: int) -> list[memoryview]:
    """The views of ``parts`` that hold bytes ``offset`` .. ``offset + length``."""
    out = []
    pos, end = 0, offset + length
    for p in parts:
        n = p.nbytes
        if pos + n > offset and pos < end:
            out.append(p[max(0, offset - pos):min(n, end - pos)])
        pos += n
        if pos >= end:
            break
    return out


def _send_parts(sock: socket.socket, parts: list[memoryview]) -> None:
    """Send every part, in order, several per ``sendmsg`` call. A blocking socket takes
    a call's parts whole unless its send timeout (``SO_SNDTIMEO``) cuts it short; a
    partial send resumes where it stopped."""
    i = 0
    while i < len(parts):
        sent = sock.sendmsg(parts[i:i + _IOV])
        if sent == 0:
            raise ConnectionError("the connection took no bytes")
        while sent:
            n = parts[i].nbytes
            if sent >= n:
                sent -= n
                i += 1
            else:
                parts[i] = parts[i][sent:]
                sent = 0


# -- the node's side (NodeServer threads: not the IO loop, not under the scheduler lock) --
@dataclass(slots=True)
class _Incoming:
    """A value whose ranges are arriving (on several connections at once)."""

    size: int
    done: int = 0  # bytes of the ranges all in
    moved: int = 0  # bytes received so far (the stall check's progress)
    offsets: set = field(default_factory=set)  # ranges asked for (each once)
    failed: Optional[Error] = None


class Receiver:
    """Serves ``PushSegment`` requests for one store (owner ``owner_pid``).

    ``check(object_id, size)`` raises ``ObjectStoreFullError`` (answered "full") or
    another ``dpool.Error`` (answered "refused") before any byte comes; ``keep(name,
    size)`` takes a finished segment for the scheduler to adopt, or says False (its
    driver detached meanwhile: the segment is removed). The thread of the range at
    offset 0 creates the segment, waits for the other ranges' threads to write theirs,
    checks the layout and answers with the name; any range failing (its connection
    broke, no room) fails the whole value, and its segment is removed.
    """

    def __init__(self, owner_pid: int, check: Callable[[int, int], None],
                 keep: Callable[[str, int], bool], timeout: float = PUSH_TIMEOUT,
                 unkeep: Optional[Callable[[str], bool]] = None) -> None:
        self.owner_pid, self._check, self._keep, self.timeout = owner_pid, check, keep, timeout
        self._unkeep = unkeep or (lambda name: False)  # undo keep: whether it was kept
        self._cv = threading.Condition(threading.Lock())
        self._incoming: dict[str, _Incoming] = {}
        # uploads that failed lately, and why: a range that asks after its upload was
        # dropped hears that reason ("full"), not "no upload under way" (lost)
        self._failed: dict[str, tuple[Error, float]] = {}

    def serve(self, sock: socket.socket, object_id: int, size: int, offset: int = 0,
              length: int = -1) -> None:
        """Serve one request on ``sock``. ``OSError``/``ConnectionError`` if the
        connection breaks part-way (the value is dropped first)."""
        if length < 0:
            length = size - offset
        try:
            self._check(object_id, size)
            if size <= _segment._HEADER.size:
                raise ProtocolError(f"a value of {size} bytes is too small to be one")
            if offset < 0 or length <= 0 or offset + length > size:
                raise ProtocolError(f"bytes {offset}..{offset + length} are not a part of "
                                    f"a value of {size} bytes")
            name = _segment.segment_name(self.owner_pid, object_id)
        except ObjectStoreFullError as exc:
            return _answer(sock, FULL, str(exc))
        except (Error, ValueError) as exc:
            return _answer(sock, REFUSED, str(exc))
        if offset == 0:
            self._first(sock, name, size, length)
        else:
            self._other(sock, name, size, offset, length)

    def _first(self, sock: socket.socket, name: str, size: int, length: int) -> None:
        # No fork while the fd is open: a child would keep the segment's pages
        # (``_forkguard``). Not while waiting for the other ranges, though: a fork
        # waiting for this section would hold off theirs, which this one waits for.
        with _forkguard.no_fork():  # (no child may inherit the claimed segment's lock)
            try:
                fd = _segment._claim_recycled(name, size)
                if fd is None:
                    fd = _segment._create(name, size, allocate=False)
            except ObjectStoreFullError as exc:
                return _answer(sock, FULL, str(exc))
            except FileExistsError as exc:
                return _answer(sock, REFUSED, str(exc))
            os.close(fd)  # each chunk opens it again (``_ranges.receive``)
        inc = _Incoming(size, offsets={0})
        with self._cv:
            self._incoming[name] = inc
            self._failed.pop(name, None)  # (an upload of it again)
        try:
            _answer(sock, OK, "")
            full = _receive_into(sock, name, 0, length, size, self.timeout,
                                 lambda n: self._moved(inc, n))
        except BaseException:
            self._drop(inc, name)
            raise
        self._arrived(inc, length, full)
        try:
            failed = self._wait_all(sock, inc, name)
        except BaseException:
            self._drop(inc, name)
            raise
        with self._cv:
            self._incoming.pop(name, None)
            if failed is not None:
                self._remember_failed_locked(name, failed)
        if failed is None:
            with _forkguard.no_fork():
                fd = os.open(os.path.join(_segment.SHM_DIR, name.lstrip("/")), os.O_RDONLY)
                try:
                    failed = _not_a_segment(fd, size, name)
                finally:
                    os.close(fd)
        if failed is not None:
            _segment.unlink(name)
            return _answer(sock, _status(failed), str(failed))
        if not self._keep(name, size):
            _segment.unlink(name)
            return _answer(sock, REFUSED, "its driver is no longer attached")
        try:
            _answer(sock, OK, name)
        except BaseException:
            if self._unkeep(name):  # the driver never heard of it: it never names it
                _segment.unlink(name)
            raise

    def _drop(self, inc: _Incoming, name: str) -> None:
        """The first range's connection broke: the value is dropped, never torn."""
        self._arrived(inc, 0, _Lost("the first range's connection broke"))
        with self._cv:
            self._incoming.pop(name, None)
            self._remember_failed_locked(name, inc.failed or _Lost("dropped"))
        _segment.unlink(name)

    def _other(self, sock: socket.socket, name: str, size: int, offset: int,
               length: int) -> None:
        with self._cv:
            inc = self._incoming.get(name)
            ok = inc is not None and inc.size == size and inc.failed is None \
                and offset not in inc.offsets
            if ok:
                inc.offsets.add(offset)  # type: ignore[union-attr]
            gone = self._failed.get(name) if inc is None else None
        if gone is not None:  # it failed before this range asked: the same answer
            return _answer(sock, _status(gone[0]), str(gone[0]))
        if not ok or inc is None:
            return _answer(sock, LOST, f"no upload of {name} ({size} bytes) under way "
                                          f"that lacks the bytes from {offset}")
        if not os.path.exists(_path(name)):  # the upload failed meanwhile
            self._arrived(inc, 0, _Lost(f"the upload of {name} failed"))
            return _answer(sock, LOST, f"the upload of {name} failed")
        try:
            _answer(sock, OK, "")
            full = _receive_into(sock, name, offset, length, size, self.timeout,
                                 lambda n: self._moved(inc, n))
        except BaseException:
            self._arrived(inc, 0, _Lost(f"the connection of the range from {offset} "
                                        "broke"))
            raise
        self._arrived(inc, length, full)
        failed = inc.failed
        if failed is not None:
            return _answer(sock, _status(failed), str(failed))
        _answer(sock, OK, "")

    def _remember_failed_locked(self, name: str, failed: Error) -> None:
        now = time.monotonic()
        for old in [n for n, (_, t) in self._failed.items() if now - t > self.timeout]:
            del self._failed[old]
        self._failed[name] = (failed, now)

    def _moved(self, inc: _Incoming, n: int) -> None:
        with self._cv:
            inc.moved += n

    def _arrived(self, inc: _Incoming, n: int, failed: Optional[Error]) -> None:
        with self._cv:
            if failed is not None:
                inc.failed = inc.failed or failed
            else:
                inc.done += n
            self._cv.notify_all()

    def _wait_all(self, sock: socket.socket, inc: _Incoming, name: str) -> Optional[Error]:
        """Until every range is in, one failed (its error), or the driver gave up on the
        value (closed this connection: ``ConnectionError``) or no bytes came for
        ``timeout`` (a range that stalls fails by itself in that time: the receive
        timeout; this catches a range never asked for)."""
        moved = inc.moved
        deadline = time.monotonic() + self.timeout
        with self._cv:
            while inc.done < inc.size and inc.failed is None:
                if inc.moved != moved:  # bytes still arrive on some range
                    moved, deadline = inc.moved, time.monotonic() + self.timeout
                elif time.monotonic() > deadline:
                    return _Lost(f"the upload of {name} stalled at {inc.done} of "
                                 f"{inc.size} bytes")
                self._cv.wait(0.05)
                if _closed(sock):
                    raise ConnectionError(f"the driver gave up on the upload of {name}")
            return inc.failed


def _closed(sock: socket.socket) -> bool:
    """Whether the driver closed ``sock`` (or sent more: it must wait for the answer,
    so either way it gave up on this value). (``poll``, not ``select``: that fails for
    descriptors above 1023, which a busy node has.)"""
    try:
        p = select.poll()
        p.register(sock.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(p.poll(0))
    except (OSError, ValueError):
        return True


def _path(name: str) -> str:
    return os.path.join(_segment.SHM_DIR, name.lstrip("/"))


def _receive_into(sock: socket.socket, name: str, offset: int, length: int, size: int,
                  timeout: float, moved: Callable[[int], None]) -> Error | None:
    """Receive ``length`` bytes into segment ``name`` from ``offset``
    (``_ranges.receive``: spliced into its pages; no fork is held off while the bytes
    come). If the store fills up part-way (or another range failed and the segment is
    gone), the rest is read and dropped (the driver is still sending it; closing on it
    would reset the connection before it reads the answer) and the error returned."""
    _ranges.blocking(sock, socket.SO_RCVTIMEO, timeout)
    try:
        full = _ranges.receive(sock, _path(name), offset, length, moved, keep_reading=True)
    except _ranges.Closed as exc:
        raise ConnectionError(f"the driver closed the connection after {exc.received} "
                              f"of {length} bytes from {offset}") from exc
    if full is None:
        return None
    if full.errno == errno.ENOENT:  # removed: another range failed (its error is told)
        return _Lost(f"the upload of {name} failed")
    return _segment._full(name, size, str(full))


def _not_a_segment(fd: int, size: int, name: str) -> Optional[Error]:
    """An error if the bytes are not a value in the segment layout (a driver's bug:
    readers would fail on it later, with less to go on)."""
    seg = _segment
    try:
        magic, version, _, nbuffers, meta_len = seg._HEADER.unpack(
            os.pread(fd, seg._HEADER.size, 0))
        table_end = seg._HEADER.size + seg._ENTRY.size * nbuffers
        if magic != seg._MAGIC or version != seg._VERSION or table_end + meta_len > size:
            raise ValueError("no segment header")
        table = os.pread(fd, table_end - seg._HEADER.size, seg._HEADER.size)
        for i in range(nbuffers):
            offset, nbytes = seg._ENTRY.unpack_from(table, seg._ENTRY.size * i)
            if offset + nbytes > size:
                raise ValueError(f"buffer {i} runs past the end")
    except (ValueError, struct.error) as exc:
        return ProtocolError(f"the uploaded bytes are not a dpool value ({name}): {exc}")
    return None


def _answer(sock: socket.socket, status: int, text: str) -> None:
    data = text.encode()[:_MAX_TEXT]
    sock.settimeout(PUSH_TIMEOUT)
    sock.sendall(_REPLY.pack(status, len(data)) + data)
