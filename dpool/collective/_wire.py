"""Member-to-member TCP links of a collective group: frames, and moving several of them
at once.

A frame is a 13-byte header -- kind, the operation's sequence number, the body's length
-- then the body. ``transfer`` moves a set of sends and receives on several links at
once (non-blocking sockets, ``poll``), so that a ring step's send to the right and
receive from the left progress together whatever their size, and raises
``CollectiveError`` when a peer's link closes (it died, or gave up on the group: an
``ABORT`` frame carries its reason), when a frame is not the one expected, or when the
operation runs past its deadline.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from typing import Callable, Optional

from dpool.errors import CollectiveError

HEADER = struct.Struct("!BIQ")  # kind, sequence number, body length
HELLO, DATA, META, ABORT = 1, 2, 3, 4
_KINDS = {HELLO: "hello", DATA: "data", META: "metadata", ABORT: "abort"}
_STEP = 1 << 20  # bytes per send()/recv_into() call


class Link:
    """A connection to the member of rank ``rank`` (non-blocking)."""

    __slots__ = ("sock", "rank", "mid_frame", "closed")

    def __init__(self, sock: socket.socket, rank: int) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # a peer's host that dies without closing the link: seen within ~20 s, not never
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 3), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
        self.sock = sock
        self.rank = rank
        self.mid_frame = False  # a frame is partly sent (an abort cannot follow it)
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass


class Send:
    __slots__ = ("link", "parts", "i", "off")

    def __init__(self, link: Link, kind: int, seq: int, body: memoryview | bytes) -> None:
        self.link = link
        body = memoryview(body).cast("B") if not isinstance(body, bytes) else body
        self.parts = [HEADER.pack(kind, seq, len(body)), body]
        self.i = 0
        self.off = 0

    def progress(self, group: str) -> bool:
        link = self.link
        while self.i < len(self.parts):
            part = self.parts[self.i]
            try:
                n = link.sock.send(memoryview(part)[self.off:self.off + _STEP])
            except BlockingIOError:
                return False
            except OSError as exc:
                raise _lost(group, link, exc) from exc
            link.mid_frame = True
            self.off += n
            if self.off == len(part):
                self.i += 1
                self.off = 0
        link.mid_frame = False
        return True


class Recv:
    """A frame of ``kind`` for operation ``seq`` from ``link``: into ``into`` (its size
    must match), or into a new buffer (``into`` None: ``body``)."""

    __slots__ = ("link", "kind", "seq", "into", "head", "got", "body", "then")

    def __init__(self, link: Link, kind: int, seq: int,
                 into: Optional[memoryview] = None,
                 then: Optional[Callable[[], None]] = None) -> None:
        self.then = then  # run as soon as the frame is in (e.g. reduce it)
        self.link = link
        self.kind = kind
        self.seq = seq
        self.into = memoryview(into).cast("B") if into is not None else None
        self.head = bytearray(HEADER.size)
        self.got = 0
        self.body: Optional[memoryview] = None

    def progress(self, group: str) -> bool:
        link = self.link
        while True:
            size = HEADER.size
            target = memoryview(self.head)[self.got:] if self.got < size else \
                self.body[self.got - size:]  # type: ignore[index]
            if len(target) == 0:
                return True
            try:
                n = link.sock.recv_into(target[:_STEP])
            except BlockingIOError:
                return False
            except OSError as exc:
                raise _lost(group, link, exc) from exc
            if n == 0:
                raise _lost(group, link, None)
            self.got += n
            if self.got == size:
                self._header(group)
                if self.body is not None and len(self.body) == 0:
                    return True

    def aborted(self, group: str) -> CollectiveError:
        """The error an ``ABORT`` frame reports: its reason, the rank it names."""
        return CollectiveError(self.payload().decode("utf-8", "replace"), group=group,
                               rank=self.seq - 1)

    def payload(self) -> bytes:
        assert self.body is not None
        return bytes(self.body)

    def _header(self, group: str) -> None:
        kind, seq, length = HEADER.unpack(self.head)
        if kind == ABORT:
            self.body = memoryview(bytearray(length))
            self.kind = ABORT  # (read its reason, then raise: ``transfer``)
            self.seq = seq  # (the rank it names, plus one)
            return
        if kind != self.kind or seq != self.seq:
            raise CollectiveError(
                f"collective group {group!r}: rank {self.link.rank} sent {_KINDS.get(kind)} "
                f"for operation {seq}, this member expected {_KINDS[self.kind]} for "
                f"operation {self.seq} (the members called different operations)",
                group=group, rank=self.link.rank)
        if self.into is not None:
            if length != len(self.into):
                raise CollectiveError(
                    f"collective group {group!r}: rank {self.link.rank} sent {length} "
                    f"bytes, this member expected {len(self.into)} (their arrays differ)",
                    group=group, rank=self.link.rank)
            self.body = self.into
        else:
            self.body = memoryview(bytearray(length))


def _lost(group: str, link: Link, exc: Optional[BaseException]) -> CollectiveError:
    why = f": {exc}" if exc is not None else ""
    return CollectiveError(
        f"collective group {group!r}: the member of rank {link.rank} closed its link "
        f"mid-operation (it died, or left the group){why}", group=group, rank=link.rank)


SPIN_S = 50e-6  # retry without sleeping this long before blocking in poll (see ``spin``)
spin = True  # False where the members outnumber the CPUs (a spinner keeps a peer off one)


def transfer(group: str, ops: list, deadline: Optional[float]) -> None:
    """Run ``ops`` (``Send``s and ``Recv``s; those on one link in list order) until all
    are done. ``CollectiveError`` on a lost link, an abort, a wrong frame, or past
    ``deadline`` (``time.monotonic()``; None: none). Small frames mostly arrive within a
    few microseconds: it retries for ``SPIN_S`` before it sleeps in ``poll`` (waking a
    sleeping process costs more than that on a VM)."""
    spin_until = time.perf_counter() + SPIN_S if spin else 0.0
    queues: dict[int, list] = {}  # fd -> [sends], [recvs] in order
    for op in ops:
        q = queues.setdefault(op.link.sock.fileno(), [[], [], op.link])
        q[0 if isinstance(op, Send) else 1].append(op)
    poller = select.poll()
    quiet: set = set()  # send-only links whose input is a later operation's: unwatched
    while queues:
        for fd, (sends, recvs, link) in list(queues.items()):
            if sends and not recvs and fd not in quiet and _peer_gave_up(group, link):
                quiet.add(fd)
            while sends and sends[0].progress(group):
                sends.pop(0)
            while recvs and recvs[0].progress(group):
                r = recvs.pop(0)
                if r.kind == ABORT:
                    raise r.aborted(group)
                if r.then is not None:  # (while the next frames arrive in the kernel)
                    r.then()
            if not sends and not recvs:
                del queues[fd]
        if not queues:
            return
        if spin_until and time.perf_counter() < spin_until:
            continue
        for fd, (sends, recvs, _link) in queues.items():
            # (a link this member only sends on is watched for input too: a peer that
            # gave up says so there -- an abort, or its end of the link closed)
            poller.register(fd, (select.POLLOUT if sends else 0) |
                            (select.POLLIN if recvs or fd not in quiet else 0))
        wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
        if wait <= 0:
            raise CollectiveError(f"collective group {group!r}: the operation ran past "
                                  "its timeout (a member never called it, or is stuck)",
                                  group=group)
        poller.poll(wait * 1000.0)
        for fd in queues:
            poller.unregister(fd)


def _peer_gave_up(group: str, link: Link) -> bool:
    """On a link this member only sends on: raise if the peer aborted (its ``ABORT``
    frame is next) or closed it; True if what is next is a later operation's frame
    (left for it); False if nothing came."""
    try:
        head = link.sock.recv(HEADER.size, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    except OSError as exc:
        raise _lost(group, link, exc) from exc
    if not head:
        raise _lost(group, link, None)
    if head[0] != ABORT:
        return True
    r = Recv(link, ABORT, 0)
    while not r.progress(group):
        select.select([link.sock], [], [], 1.0)
    raise r.aborted(group)


def abort(links: list, reason: str, rank: int = -1) -> None:
    """Tell each peer why this member gives up on the group, and which member's loss
    (``rank``, -1: none) made it (where no frame is half sent), then end this member's
    side of every link: a peer waiting on one fails with ``reason`` (or, past a
    half-sent frame, sees the link end). The sockets stay open
    until the group is destroyed: closing one with input unread would reset it, and the
    peer could lose the reason."""
    body = reason.encode("utf-8", "replace")
    frame = HEADER.pack(ABORT, rank + 1, len(body)) + body  # (the rank it names)
    for link in links:
        if link.closed:
            continue
        if not link.mid_frame:
            try:
                link.sock.send(frame)  # (small: all of it, or the peer sees a close)
            except OSError:
                pass
        try:
            link.sock.shutdown(socket.SHUT_WR)
        except OSError:
            link.close()
