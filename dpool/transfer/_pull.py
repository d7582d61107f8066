"""Objects between nodes: a node pulls a stored value it needs straight from the node
that holds it, into a segment of its own store.

    node B (needs it)                                        node A (holds it)
    fetch(address, name, size) ─ kept connections: FetchSegment(name, offset, length) ─▶
       a segment of B's store (a freed one's pages)     one NodeServer thread each
         ◀── per range: size, then raw bytes (sendfile from /dev/shm) ──┘
       splice socket -> pipe -> segment at the range's offset (a thread per range)

A copy is the segment's bytes, verbatim (``_segment``'s layout describes itself): A sends
them with ``sendfile``, B splices them into its new segment (``_ranges.receive``); no copy
of the value in Python memory on either side, nothing unpickled. Transfers run on
connections of their own, authenticated like any other (``protocol._auth``) and kept for
the next transfer (``_conns``), so a large one never holds up control messages.

A fetch that fails part-way (the holder died, the connection broke) removes the partial
segment; the reader then tries the other nodes that keep a copy (the object table lists
them; a node serves its copy under the holder's segment name), and raises
``ObjectLostError`` naming the object and the node when none can give it: a torn value
is never used. A kept connection the holder had closed is retried once on a fresh one.

A spilled task refers to its large inputs by ``remote_ref`` payloads (the holder's
address, segment name and size); the executing node fetches each once, however many of
its tasks need it (``node._remote``). ``fetch_into`` pulls into a TCP driver's memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import struct
import time
from collections.abc import Callable, Iterable
from typing import Optional

from dpool import errors
from dpool.errors import AuthenticationError, Error, ObjectLostError, ObjectStoreFullError
from dpool.objects import _segment
from dpool.objects import forkguard as _forkguard
from dpool.objects import values as _values
from dpool.objects import writemaps as _writemaps
from dpool.protocol import PROTOCOL_VERSION, parse_hostport
from dpool.protocol import auth as _auth
from dpool.protocol import messages as m
from dpool.transfer import _conns, _ranges

log = logging.getLogger("dpool.objects")

TAG_REMOTE = 0x03  # a stored value held by another node: (size, address, segment name)
_REMOTE_HEAD = struct.Struct("!BQH")  # tag, size, length of the address
_SIZE = struct.Struct("!Q")
_SEND_CHUNK = 8 << 20  # bytes sent per open of the segment (``serve``)
_FORK_WAIT_S = 0.5  # the longest one send or write holds off a fork of this process
FETCH_TIMEOUT = 30.0
_LOG_SIZE = 1 << 20  # a fetch of at least this many bytes is logged (time, pages)
_OTHER_TIMEOUT = 5.0  # the limit on a call that makes no progress, with a listed copy


def remote_ref(payload: bytes, address: str) -> bytes:
    """A reference to the stored value ``payload`` of the node at ``address`` (other
    payloads are returned unchanged)."""
    ref = _values.stored(payload)
    if ref is None:
        return payload
    _oid, name, size = ref
    addr = address.encode()
    return _REMOTE_HEAD.pack(TAG_REMOTE, size, len(addr)) + addr + name.encode()


def parse_remote(payload: Optional[bytes]) -> Optional[tuple[int, str, str]]:
    """(size, holder's address, segment name) of a remote reference, else None."""
    if not payload or payload[0] != TAG_REMOTE:
        return None
    _, size, alen = _REMOTE_HEAD.unpack_from(payload, 0)
    pos = _REMOTE_HEAD.size
    return size, payload[pos:pos + alen].decode(), payload[pos + alen:].decode()


# -- the holder's side (a NodeServer thread, one per connection) ------------------------
def serve(sock: socket.socket, name: str, offset: int = 0, length: int = -1) -> int:
    """Send segment ``name``'s size, then ``length`` of its bytes from ``offset`` (-1: to
    the end; a range past the end sends what there is); size 0 if it is gone. The number
    of bytes sent.

    The segment is opened for each ``_SEND_CHUNK`` and closed after it, each time under
    ``_forkguard.no_fork()``: a worker forked meanwhile must not inherit the descriptor
    (it would pin the pages for its whole life), and a fork waits at most ``_FORK_WAIT_S``
    for a send whose reader is slow. Each open takes the shared lock and checks that the
    name still names the same file, as any reader of a large segment (``_recycle``): a
    segment freed part-way ends the send (the reader sees a broken transfer), never sends
    bytes of another object that reused its pages.
    """
    path = os.path.join(_segment.SHM_DIR, name.lstrip("/"))
    size = ino = 0
    with _forkguard.no_fork():
        fd = _open_held(path, 0)
        if fd is not None:
            st = os.fstat(fd)
            size, ino = st.st_size, st.st_ino
            os.close(fd)
    if offset < 0 or offset > size or length < -1:
        size = 0  # not a range of it: as if it were gone (the reader's error says so)
    sock.sendall(_SIZE.pack(size))
    if not size:
        return 0
    end = size if length < 0 else min(size, offset + length)
    timeout = sock.gettimeout() or FETCH_TIMEOUT
    _ranges.blocking(sock, socket.SO_SNDTIMEO, min(timeout, _FORK_WAIT_S))
    pos, stalled = offset, 0.0
    while pos < end:  # the kernel copies from tmpfs to the socket
        with _forkguard.no_fork():
            fd = _open_held(path, ino)
            if fd is None:
                raise ConnectionError(f"segment {name} was freed after {pos - offset} of "
                                      f"{end - offset} bytes were sent")
            try:
                n = os.sendfile(sock.fileno(), fd, pos, min(end - pos, _SEND_CHUNK))
            except BlockingIOError:  # the reader took nothing for _FORK_WAIT_S
                n = -1
            finally:
                os.close(fd)
        if n == 0:
            raise ConnectionError(f"the segment shrank to {pos} of {size} bytes")
        if n < 0:
            stalled += _FORK_WAIT_S
            if stalled >= timeout:
                raise TimeoutError(f"the reader took no bytes for {timeout:.0f} s")
            continue
        stalled, pos = 0.0, pos + n
    return end - offset


def _open_held(path: str, ino: int) -> Optional[int]:
    """A descriptor of segment ``path`` under a shared lock, if the name still names the
    file (inode ``ino``, if not 0) and no writer holds it; else None."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        here = os.fstat(fd).st_ino
        if here != os.stat(path).st_ino or (ino and here != ino):
            raise FileNotFoundError(path)
    except OSError:
        os.close(fd)
        return None
    return fd


# -- the reader's side -----------------------------------------------------------------
class _NoAnswer(_ranges.NoAnswer, ObjectLostError):
    """The holder closed the connection before answering at all (``_ranges.asked``
    tries a fresh connection)."""


def fetch(address: str, token: bytes, name: str, object_id: int, owner_pid: int,
          size: int, timeout: float = FETCH_TIMEOUT,
          others: Optional[Callable[[], Iterable[str]]] = None) -> bytes:
    """Copy the holder's segment ``name`` (``size`` bytes) into this host's store as
    object ``object_id`` (a segment named for ``owner_pid``); the stored payload.

    ``ObjectLostError`` (naming the object and the node) if the holder does not have it
    or goes away part-way -- after trying each node that ``others()`` names (nodes that
    keep a copy of it, as the object table lists them: they serve it under the holder's
    name). The partial copy is removed first: never a torn value.

    A large segment comes in ranges over several connections at once (``_ranges``): one
    TCP stream leaves a core to spare on each side. The pages it lands in are a freed
    segment's when the store has one (``_recycle``): allocating fresh tmpfs pages costs
    about as much as the copy; those are mapped and received into (``recv_into``, one
    copy at memory speed), fresh ones are spliced into the file (``_ranges.receive``).
    """
    try:
        return _fetch_from(address, token, name, object_id, owner_pid, size, timeout)
    except ObjectLostError as exc:
        if others is None:
            raise
        first = exc
    try:
        alternatives = [a for a in others() if a != address]
    except Exception as exc:  # noqa: BLE001 - the table unreachable: the holder's error
        log.warning("no other copy of %s looked up: %s", name, exc)
        raise first from None
    for alt in alternatives:
        try:
            # (a short limit: a table entry may name a node that died without saying so)
            payload = _fetch_from(alt, token, name, object_id, owner_pid, size,
                                  min(timeout, _OTHER_TIMEOUT))
        except ObjectStoreFullError:
            raise  # no room here: another copy would not fit either
        except Error as exc:  # lost there too, or a stale entry of the table
            log.warning("no copy of %s from node %s either: %s", name, alt, exc)
            continue
        log.warning("fetched %s from node %s, which keeps a copy (%s)", name, alt, first)
        return payload
    if alternatives:
        errors.add_note(first, f"dpool: the copies on {', '.join(alternatives)} could not "
                        "be fetched either")
    raise first


def _fetch_from(address: str, token: bytes, name: str, object_id: int, owner_pid: int,
                size: int, timeout: float) -> bytes:
    """``fetch`` from one node."""
    host, port = parse_hostport(address, "object holder")
    local = _segment.segment_name(owner_pid, object_id)
    t0 = time.monotonic()
    kept = contextlib.ExitStack()
    mem = None
    with _forkguard.no_fork():  # (no child may inherit the claimed segment's lock)
        fd = _segment._claim_recycled(local, size)
        recycled = fd is not None
        try:
            if fd is None:
                fd = _segment._create(local, size, allocate=False)
            else:  # allocated pages: received straight into a mapping of them
                mem = kept.enter_context(_writemaps.mapped(fd, size))
        except BaseException:
            if fd is not None:
                _segment.unlink(local)
            raise
        finally:
            if fd is not None:
                os.close(fd)  # each chunk opens it again (``_ranges.receive``)
    args = (host, port, address, token, name, _held_id(name), size, timeout, local)
    src: _Source
    with kept:
        if mem is None:
            src = _Source(*args)
        else:
            src = into = _IntoMemory(*args)
            into.view = mem
        try:
            src.pull_all()
        except BaseException:
            _segment.unlink(local)  # never a torn value
            raise
        finally:
            if mem is not None:
                into.view.release()
    if size >= _LOG_SIZE:
        log.info("fetched %s from node %s in %.1f ms (%d bytes into %s pages)", name,
                 address, (time.monotonic() - t0) * 1e3, size,
                 "recycled" if recycled else "fresh")  # (bench/transfer.py)
    return _values._STORED_HEAD.pack(_values.TAG_STORED, object_id, size) + local.encode()


class Gone(ObjectLostError):
    """The holder does not have the segment (freed, or spilled to its disk meanwhile)."""


class _Source:
    """One holder's segment, pulled in ranges (each on a connection of its own)."""

    def __init__(self, host: str, port: int, address: str, token: bytes, name: str,
                 held: int, size: int, timeout: float, local: str) -> None:
        self.host, self.port, self.address, self.token = host, port, address, token
        self.name, self.held, self.size, self.timeout = name, held, size, timeout
        self.local = local  # the copy's segment here
        self.path = os.path.join(_segment.SHM_DIR, local.lstrip("/"))

    def lost(self, what: str, cls: type = ObjectLostError) -> ObjectLostError:
        return cls(f"object {self.held:#x} ({self.name}) is lost: {what}",
                   object_id=self.held, node=self.address)

    def pull_all(self) -> None:
        """Every range of the segment at once (``_ranges.in_parallel``), then the first
        error raised (the caller removes what was written)."""
        errors = _ranges.in_parallel(self._pull, _ranges.split(self.size),
                                     "dpool-fetch-range")
        if errors:
            raise errors[0]

    def _pull(self, offset: int, length: int) -> None:
        """Receive ``length`` bytes from ``offset`` into the copy."""
        sock = _ranges.asked(self.host, self.port, self.token, self.timeout,
                             lambda s: self._ask(s, offset, length), self._unreachable)
        try:
            self._receive(sock, offset, length)
        except BaseException:
            sock.close()  # the answer was not read to its end: never reuse it
            raise
        _conns.give_back(self.host, self.port, sock)

    def _unreachable(self, exc: BaseException) -> None:
        if not isinstance(exc, AuthenticationError):
            raise self.lost(f"its node {self.address} cannot be reached ({exc})") from exc

    def _ask(self, sock: socket.socket, offset: int, length: int) -> None:
        """Request a range; the holder's answer must say it has the whole segment."""
        address, timeout = self.address, self.timeout
        sock.settimeout(timeout)
        try:
            _ranges.request(sock, m.FetchSegment(PROTOCOL_VERSION, self.name, offset,
                                                 length))
            head = _auth._recv_exact(sock, _SIZE.size, time.monotonic() + timeout)
        except OSError as exc:
            raise self.lost(f"node {address} did not answer ({exc})", _NoAnswer) from exc
        if not head:
            raise self.lost(f"node {address} closed the connection", _NoAnswer)
        size = _SIZE.unpack(head)[0] if len(head) == _SIZE.size else 0
        if size == 0:
            raise self.lost(f"node {address} does not hold it (freed, spilled, or never "
                            "there)", Gone)
        if size != self.size:
            raise self.lost(f"node {address} holds {size} bytes of it, not {self.size}")

    def _receive(self, sock: socket.socket, offset: int, length: int) -> None:
        """The range's bytes, into the copy's segment (``_ranges.receive``: spliced from
        the socket into the segment's pages, not through a buffer of this process)."""
        address = self.address
        written = [0]

        def moved(n: int) -> None:
            written[0] += n

        try:
            _ranges.blocking(sock, socket.SO_RCVTIMEO, self.timeout)
            _ranges.receive(sock, self.path, offset, length, moved)
        except _ranges.Closed as exc:
            raise self.lost(f"node {address} went away after {exc.received} of the "
                            f"{length} bytes from {offset}") from exc
        except OSError as exc:
            if exc.errno in _segment._NO_SPACE_ERRNOS:
                raise _segment._full(self.local, self.size, str(exc)) from exc
            raise self.lost(f"the transfer from node {address} broke after {written[0]} "
                            f"of the {length} bytes from {offset} ({exc})") from exc


def _held_id(name: str) -> int:
    """The holder's object id in segment name ``name`` (0 if it is not one)."""
    try:
        return int(name.rsplit("_", 1)[1], 16)
    except (IndexError, ValueError):
        return 0


# -- a driver's side: a stored value pulled into this process's own memory --------------
def fetch_into(address: str, token: bytes, name: str, buf: memoryview,
               timeout: float = FETCH_TIMEOUT) -> None:
    """Fill ``buf`` (writable, in this process) with the bytes of the holder's segment
    ``name`` (``buf.nbytes`` of them): for a driver that reaches its node over TCP and
    has no store to copy into. Pulled in ranges over several kept connections at once,
    as ``fetch`` does, each straight into its part of the buffer (``recv_into``: no copy
    in Python); a value unpickled from it keeps its arrays there, zero-copy. ``Gone`` if
    the holder does not have it, ``ObjectLostError`` if it goes away part-way."""
    host, port = parse_hostport(address, "object holder")
    size = buf.nbytes
    src = _IntoMemory(host, port, address, token, name, _held_id(name), size, timeout, "")
    src.view = buf
    src.pull_all()


class _IntoMemory(_Source):
    """A segment pulled into ``view`` (this process's memory) instead of a segment."""

    view: memoryview

    def _receive(self, sock: socket.socket, offset: int, length: int) -> None:
        address, timeout = self.address, self.timeout
        part = self.view[offset:offset + length]
        got = 0
        try:
            _ranges.blocking(sock, socket.SO_RCVTIMEO, timeout)
            while got < length:
                n = sock.recv_into(part[got:], length - got, socket.MSG_WAITALL)
                if n == 0:
                    raise self.lost(f"node {address} went away after {got} of the "
                                    f"{length} bytes from {offset}")
                got += n
        except OSError as exc:
            raise self.lost(f"the transfer from node {address} broke after {got} of the "
                            f"{length} bytes from {offset} ({exc})") from exc
        finally:
            part.release()
