"""Large values from a driver that reaches its node over TCP: uploaded straight into a
segment of the node's store, off the control connection.

    driver (no store of its own)                                  its node
    put/submit: pickle 5, buffers out of band
    PushSegment(object id, size) ─── a kept transfer connection ──▶ its NodeServer thread:
        ◀── go ahead (or: full / refused) ───────────────────────── checks, claims a segment
    header + table, meta, each buffer at its aligned offset ───────▶ recv_into a buffer,
        (sendmsg straight from the user's buffers: nothing joined)    pwrite into it
        ◀── stored: the segment's name (or: full / refused) ────────┘
    PutObject / SubmitTask, the payload naming that segment ──▶ (control connection) the
                                                                 scheduler adopts it, as
                                                                 a local driver's value

Before this, a TCP driver's large value went inline in its control message: joined
(one copy), pickled into the frame (another), sent on the one connection every other
message waits behind, unpickled and written into the store by the node under its
scheduler lock. 64 MB cost 91 ms that way; the bytes now cross once, from the user's
array into the node's segment, with no Python-level copy on either side.

The bytes are the segment, verbatim (``_segment``'s self-describing layout), so the node
unpickles nothing and needs none of the user's modules. Which segment is the node's
choice: ``segment_name(its store owner, object id)``, never a name from the wire; the id
must be one of an attached TCP driver's (``scheduling._attach`` checks that and the
size). The node answers before the bytes come ("go ahead") so a value that cannot fit
is refused without sending it, and the connection's framing (``protocol._channel``, which
reads ahead) never sees raw bytes. A transfer that breaks part-way leaves no segment
behind (the node unlinks its partial copy) and fails the driver's call with
``NodeLostError``; a full store fails it with ``ObjectStoreFullError``.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
from typing import Callable, Optional

from dpool.errors import Error, NodeLostError, ObjectStoreFullError, ProtocolError
from dpool.objects import _conns, _forkguard, _manager, _segment, _values
from dpool.objects._serialization import Serialized
from dpool.protocol import _auth

log = logging.getLogger("dpool.objects")

PUSH_TIMEOUT = 30.0  # a push that moves no byte for this long fails
_REPLY = struct.Struct("!BI")  # status, length of the text that follows
_SIZE = struct.Struct("!Q")
OK, FULL, REFUSED = 0, 1, 2
_MAX_TEXT = 4096
_IOV = 512  # parts per sendmsg call (Linux takes up to 1024)
_ZEROS = bytes(64)  # alignment padding between parts (``_segment._ALIGN``)


# -- the driver's side -------------------------------------------------------------------
class _NoAnswer(NodeLostError):
    """The node closed the connection before answering the request (a kept connection
    it had dropped, or it died): worth one more try on a fresh one."""


def push(host: str, port: int, token: bytes, object_id: int, ser: Serialized,
         timeout: float = PUSH_TIMEOUT) -> bytes:
    """Upload ``ser`` into the store of the node at ``host:port`` as ``object_id``; the
    stored payload that names the node's segment (for ``PutObject``/``SubmitTask``).
    ``ObjectStoreFullError`` if the node has no room, ``NodeLostError`` if it cannot be
    reached or the transfer breaks (the node then keeps nothing of it)."""
    views = [_segment._as_bytes_view(b) for b in ser.buffers]
    layout = _segment._layout(len(ser.meta), [v.nbytes for v in views])
    where = f"node {host}:{port}"
    for attempt in (0, 1):
        try:
            sock, kept = _conns.take(host, port, token, timeout)
        except OSError as exc:
            raise NodeLostError(f"cannot upload a value of {layout.size} bytes: {where} "
                                f"cannot be reached ({exc})") from exc
        try:
            name = _push_on(sock, where, object_id, layout, ser.meta, views, timeout)
        except _NoAnswer:
            sock.close()
            if kept and attempt == 0:
                continue  # the node had dropped the kept connection: a fresh one
            raise
        except BaseException:
            sock.close()  # the exchange was not finished: never reuse it
            raise
        _conns.give_back(host, port, sock)
        return _values._STORED_HEAD.pack(_values.TAG_STORED, object_id,
                                         layout.size) + name.encode()
    raise AssertionError("unreachable")  # pragma: no cover


def _push_on(sock: socket.socket, where: str, object_id: int, layout: _segment._Layout,
             meta: bytes, views: list, timeout: float) -> str:
    from dpool.protocol import PROTOCOL_VERSION, encode_batch
    from dpool.protocol import _messages as m

    size = layout.size
    sock.settimeout(timeout)
    try:
        request = encode_batch([m.PushSegment(PROTOCOL_VERSION, object_id, size)])
        sock.sendall(_SIZE.pack(len(request)) + request)  # one frame (protocol._channel)
        status, text = _reply(sock, timeout)
    except OSError as exc:
        raise _NoAnswer(f"{where} did not answer an upload request ({exc})") from exc
    if status is None:
        raise _NoAnswer(f"{where} closed the connection")
    _check(status, text, size, where)
    try:
        _manager._blocking(sock, socket.SO_SNDTIMEO, timeout)
        _send_parts(sock, _parts(layout, meta, views))
        sock.settimeout(timeout)
        status, text = _reply(sock, timeout)
    except OSError as exc:
        raise NodeLostError(f"the upload of a value of {size} bytes to {where} broke "
                            f"({exc})") from exc
    if status is None:
        raise NodeLostError(f"{where} closed the connection during the upload of a value "
                            f"of {size} bytes")
    _check(status, text, size, where)
    return text


def _check(status: int, text: str, size: int, where: str) -> None:
    if status == OK:
        return
    if status == FULL:
        raise ObjectStoreFullError(f"{where} has no room for a value of {size} bytes: "
                                   f"{text}")
    raise Error(f"{where} refused a value of {size} bytes: {text}")


def _reply(sock: socket.socket, timeout: float) -> tuple[Optional[int], str]:
    """(status, text) of the node's answer; (None, "") if it closed the connection."""
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


# -- the node's side (a NodeServer thread: not the IO loop, not under the scheduler lock) --
def receive(sock: socket.socket, object_id: int, size: int, owner_pid: int,
            check: Callable[[int, int], None], keep: Callable[[str, int], bool],
            timeout: float = PUSH_TIMEOUT) -> None:
    """Serve one ``PushSegment`` on ``sock``: the value becomes segment
    ``segment_name(owner_pid, object_id)`` of this host's store, not yet adopted.

    ``check(object_id, size)`` raises ``ObjectStoreFullError`` (answered "full") or
    another ``dpool.Error`` (answered "refused") before any byte comes; ``keep(name,
    size)`` takes the finished segment for the scheduler to adopt, or says False (its
    driver detached meanwhile: the segment is removed). ``OSError``/``ConnectionError``
    if the connection breaks part-way (the partial segment is removed first)."""
    try:
        check(object_id, size)
        if size <= _segment._HEADER.size:
            raise ProtocolError(f"a value of {size} bytes is too small to be a segment")
        name = _segment.segment_name(owner_pid, object_id)
    except ObjectStoreFullError as exc:
        return _answer(sock, FULL, str(exc))
    except (Error, ValueError) as exc:
        return _answer(sock, REFUSED, str(exc))
    # No fork while the fd is open: a child would keep the segment's pages (``_forkguard``).
    with _forkguard.no_fork():
        try:
            fd = _segment._claim_recycled(name, size)
            if fd is None:
                fd = _segment._create(name, size, allocate=False)
        except ObjectStoreFullError as exc:
            return _answer(sock, FULL, str(exc))
        except FileExistsError as exc:
            return _answer(sock, REFUSED, str(exc))
        try:
            _answer(sock, OK, "")
            full = _receive_into(sock, fd, size, name, timeout)
            if full is None:
                full = _not_a_segment(fd, size, name)
        except BaseException:
            _segment.unlink(name)  # never a torn value
            raise
        finally:
            os.close(fd)
    if full is not None:
        _segment.unlink(name)
        status = FULL if isinstance(full, ObjectStoreFullError) else REFUSED
        return _answer(sock, status, str(full))
    if not keep(name, size):
        _segment.unlink(name)
        return _answer(sock, REFUSED, "its driver is no longer attached")
    _answer(sock, OK, name)


def _receive_into(sock: socket.socket, fd: int, size: int, name: str,
                  timeout: float) -> Optional[Error]:
    """Receive ``size`` bytes into segment ``fd``. If the store fills up part-way, the
    rest is read and dropped (the driver is still sending it; closing on it would reset
    the connection before it reads the answer) and the error returned."""
    full: Optional[Error] = None
    buf = _manager._take_buffer()  # kept between transfers: its pages are faulted in
    got = 0
    try:
        _manager._blocking(sock, socket.SO_RCVTIMEO, timeout)
        while got < size:
            n = sock.recv_into(buf, min(len(buf), size - got), socket.MSG_WAITALL)
            if n == 0:
                raise ConnectionError(f"the driver closed the connection after {got} of "
                                      f"{size} bytes")
            if full is None:
                try:
                    _segment._pwrite_all(fd, buf[:n], got)
                except OSError as exc:
                    if exc.errno not in _segment._NO_SPACE_ERRNOS:
                        raise
                    full = _segment._full(name, size, str(exc))
            got += n
    finally:
        _manager._give_buffer(buf)
    return full


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
