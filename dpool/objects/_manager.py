"""Objects between nodes: a node pulls a stored value it needs straight from the node
that holds it, into a segment of its own store.

    node B (needs it)                                   node A (holds it)
    fetch(address, name) ── TCP: handshake, Fetch ──▶ NodeServer admit thread
       new segment of B's store  ◀── size, then raw bytes (sendfile from /dev/shm) ──┘
       recv_into its mapping

A stored value is one segment whose layout is self-describing (``_segment``), so a copy
is the segment's bytes, verbatim: A sends them with ``sendfile`` from the tmpfs file, B
receives with ``recv_into`` straight into the mapping of its new segment -- no copy of
the value in Python memory on either side, and nothing unpickled. Every transfer is its
own connection, authenticated like any other (``protocol._auth``), so a large one never
holds up a node's control messages. A fetch that fails part-way (the holder died, the
connection broke) removes the partial segment and raises: a torn value is never used.

A spilled task refers to its large inputs by ``remote_ref`` payloads (the holder's
address and segment name) instead of carrying their bytes; the executing node fetches
each once, however many of its tasks need it (``scheduling._remote``).
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import time
from typing import Optional

from dpool.errors import Error, ObjectLostError
from dpool.objects import _segment, _values
from dpool.protocol import _auth

TAG_REMOTE = 0x03  # a stored value held by another node: (size, address, segment name)
_REMOTE_HEAD = struct.Struct("!BQH")  # tag, size, length of the address
_SIZE = struct.Struct("!Q")
_CHUNK = 4 << 20
FETCH_TIMEOUT = 30.0


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


# -- the holder's side (a NodeServer admit thread) --------------------------------------
def serve(sock: socket.socket, name: str) -> None:
    """Send segment ``name``'s size, then its bytes; size 0 if it is gone."""
    path = os.path.join(_segment.SHM_DIR, name.lstrip("/"))
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        sock.sendall(_SIZE.pack(0))
        return
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        sock.sendall(_SIZE.pack(size))
        sock.sendfile(f, 0, size)  # the kernel copies from tmpfs to the socket


# -- the reader's side -----------------------------------------------------------------
def fetch(address: str, token: bytes, name: str, object_id: int, owner_pid: int,
          timeout: float = FETCH_TIMEOUT) -> bytes:
    """Copy the holder's segment ``name`` into this host's store as object ``object_id``
    (a segment named for ``owner_pid``); the stored payload. ``ObjectLostError`` if the
    holder does not have it or goes away part-way."""
    from dpool.protocol import PROTOCOL_VERSION, Channel, encode_batch
    from dpool.protocol import _messages as m
    from dpool.runtime._address import parse_hostport

    host, port = parse_hostport(address, "object holder")
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise ObjectLostError(f"cannot reach node {address}, which holds {name}: {exc}") \
            from exc
    local = _segment.segment_name(owner_pid, object_id)
    created = False
    try:
        _auth.client_handshake(sock, token, f"node {address}", timeout)
        Channel(sock, blocking=True).send(encode_batch([m.FetchSegment(PROTOCOL_VERSION,
                                                                       name)]))
        sock.settimeout(timeout)  # (the channel made it blocking without one)
        head = _auth._recv_exact(sock, _SIZE.size, time.monotonic() + timeout)
        size = _SIZE.unpack(head)[0] if len(head) == _SIZE.size else 0
        if size == 0:
            raise ObjectLostError(f"object segment {name} is gone from node {address}")
        fd = _segment._create(local, size)
        created = True
        try:
            with mmap.mmap(fd, size) as mm:
                view = memoryview(mm)
                try:
                    got = 0
                    while got < size:
                        n = sock.recv_into(view[got:], min(_CHUNK, size - got))
                        if n == 0:
                            raise ObjectLostError(
                                f"node {address} went away after {got} of {size} bytes of "
                                f"{name}")
                        got += n
                finally:
                    view.release()
        finally:
            os.close(fd)
        return _values._STORED_HEAD.pack(_values.TAG_STORED, object_id, size) + \
            local.encode()
    except BaseException as exc:
        if created:
            _segment.unlink(local)  # never a torn value
        if isinstance(exc, (ObjectLostError, Error)):
            raise
        if isinstance(exc, OSError):
            raise ObjectLostError(f"fetching {name} from node {address} failed: {exc}") \
                from exc
        raise
    finally:
        sock.close()

