"""A dpool daemon's listeners: TCP for the cluster, a unix socket for drivers on this host.

Used by node daemons (drivers attach, other nodes connect as peers) and by global
schedulers (nodes connect as peers; no unix socket).

An accept thread takes connections on both; each new connection gets a short-lived
thread that runs the authenticated handshake (``protocol._auth``) and reads the driver's
``Attach`` frame under a deadline, then hands the socket to the local scheduler's IO loop
(``node._attach``); an object-transfer connection (first frame ``FetchSegment``,
or ``PushSegment`` from a driver that uploads a large value) keeps its thread, which
answers its requests until it closes or idles: a transfer never runs on the IO loop. A
peer that fails the handshake is logged and dropped without anything it sent being
unpickled; the accept loop keeps serving.

A process forked from a daemon (a node's workers) closes its copies of the listening
sockets (``os.register_at_fork``): a node SIGKILLed while its workers were still ending
would otherwise go on accepting connections, and the global scheduler's probe of a node
whose link closed (``global_scheduler._watch``) would take it for alive and leave the
verdict to its heartbeats, seconds later.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import weakref
from typing import Callable, Optional

from dpool.errors import AuthenticationError, Error, ProtocolError
from dpool.protocol import PROTOCOL_VERSION, Channel, ChannelClosed, decode_batch
from dpool.protocol import auth as _auth
from dpool.protocol import messages as m

log = logging.getLogger("dpool.node")

_ATTACH_TIMEOUT = 10.0
_MAX_HANDSHAKES = 64  # connections being authenticated at once; more are shed
_SEND_TIMEOUT = 30.0  # a reader that takes no bytes for this long is dropped
FETCH_IDLE_S = 30.0  # an object-transfer connection with no request for this long closes


_servers: weakref.WeakSet = weakref.WeakSet()  # this process's, to close after a fork


def _close_listeners_in_child() -> None:
    for server in list(_servers):
        for sock in (server._tcp, server._unix):
            if sock is not None:
                try:
                    sock.close()  # (the child's copy: the daemon's socket stays open)
                except OSError:
                    pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_listeners_in_child)


class NodeServer:
    def __init__(self, token: bytes, bind: str, port: int, unix_path: Optional[str],
                 on_attach: Optional[Callable[[Channel, m.Attach], None]],
                 on_peer: Callable[[Channel, m.PeerHello], None],
                 on_fetch: Optional[Callable[[socket.socket, m.FetchSegment], None]] = None,
                 on_lease: Optional[Callable[[socket.socket, m.LeaseRequest], None]] = None,
                 on_push: Optional[Callable[[socket.socket, m.PushSegment], None]] = None
                 ) -> None:
        self._token = token
        self._on_fetch = on_fetch
        self._on_push = on_push
        self._on_lease = on_lease
        self._on_attach = on_attach
        self._on_peer = on_peer
        self.unix_path = unix_path
        self._tcp = socket.create_server((bind, port), backlog=128, reuse_port=False)
        self.address = self._tcp.getsockname()[:2]
        self._unix: Optional[socket.socket] = None
        if unix_path is not None:
            if os.path.exists(unix_path):
                os.unlink(unix_path)  # a stale socket of a node that died on this path
            self._unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)
            try:
                self._unix.bind(unix_path)  # created 0600: this user's drivers only
            finally:
                os.umask(old)
            self._unix.listen(128)
        self._stop_r, self._stop_w = os.pipe()
        _servers.add(self)
        self._admitting = threading.BoundedSemaphore(_MAX_HANDSHAKES)
        self._thread = threading.Thread(target=self._accept_loop, name="dpool-node-accept",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=5)
        self._tcp.close()
        if self._unix is not None and self.unix_path is not None:
            self._unix.close()
            try:
                os.unlink(self.unix_path)
            except FileNotFoundError:
                pass
        os.close(self._stop_r)
        os.close(self._stop_w)

    def _accept_loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._tcp, selectors.EVENT_READ, "tcp")
        if self._unix is not None:
            sel.register(self._unix, selectors.EVENT_READ, "unix")
        sel.register(self._stop_r, selectors.EVENT_READ, None)
        try:
            while True:
                for key, _ in sel.select():
                    if key.data is None:
                        return
                    try:
                        conn, peer = key.fileobj.accept()  # type: ignore[union-attr]
                    except OSError:
                        continue
                    name = f"{peer[0]}:{peer[1]}" if key.data == "tcp" else "unix socket"
                    if not self._admitting.acquire(blocking=False):
                        log.warning("refused a connection from %s: %d handshakes already "
                                    "in progress", name, _MAX_HANDSHAKES)
                        conn.close()
                        continue
                    try:
                        threading.Thread(target=self._admit,
                                         args=(conn, name, key.data == "tcp"),
                                         name="dpool-node-admit", daemon=True).start()
                    except RuntimeError:  # cannot start a thread: shed this connection
                        self._admitting.release()
                        conn.close()
        finally:
            sel.close()

    def _admit(self, conn: socket.socket, peer: str, tcp: bool) -> None:
        try:
            fetches = self._admit_one(conn, peer, tcp)
        finally:
            self._admitting.release()
        if fetches is not None:  # no longer a handshake: this thread serves transfers
            self._serve_fetches(fetches, conn, peer)

    def _serve_fetches(self, chan: Channel, conn: socket.socket, peer: str) -> None:
        """Answer ``FetchSegment`` and ``PushSegment`` requests on an object-transfer
        connection, one after the other, until the peer closes it or leaves it idle for
        ``FETCH_IDLE_S`` (peers keep these connections for their next transfer:
        ``transfer._conns``)."""
        try:
            while True:
                frames = chan.recv_frames(timeout=FETCH_IDLE_S)
                if not frames:
                    return  # idle: the reader opens a new one when it needs one
                for frame in frames:
                    for msg in decode_batch(frame):
                        if not self._transfer(conn, msg):
                            raise ProtocolError(f"unexpected {type(msg).__name__} on an "
                                                "object-transfer connection")
        except ChannelClosed:
            pass
        except (Error, OSError) as exc:
            log.warning("dropped an object-transfer connection from %s: %s", peer, exc)
        finally:
            conn.close()

    def _transfer(self, conn: socket.socket, msg: object) -> bool:
        """Serve ``msg`` if it is an object-transfer request (False if it is not one)."""
        if isinstance(msg, (m.FetchSegment, m.PushSegment)) and \
                msg.version != PROTOCOL_VERSION:
            raise ProtocolError(f"a transfer request of protocol {msg.version}, this node "
                                f"speaks {PROTOCOL_VERSION}: run the same dpool version")
        if isinstance(msg, m.FetchSegment) and self._on_fetch is not None:
            conn.settimeout(_SEND_TIMEOUT)
            self._on_fetch(conn, msg)
            return True
        if isinstance(msg, m.PushSegment) and self._on_push is not None:
            conn.settimeout(_SEND_TIMEOUT)
            self._on_push(conn, msg)
            return True
        return False

    def _admit_one(self, conn: socket.socket, peer: str, tcp: bool) -> Optional[Channel]:
        """Authenticate ``conn`` and hand it on; an object-transfer connection comes back
        (with its first request answered) for ``_serve_fetches``."""
        try:
            if tcp:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _auth.server_handshake(conn, self._token)
            chan = Channel(conn, blocking=True)
            frames = chan.recv_frames(timeout=_ATTACH_TIMEOUT)
            if not frames:
                raise ProtocolError("no Attach message after the handshake")
            msgs = decode_batch(frames[0])
            if len(frames) != 1 or len(msgs) != 1:
                raise ProtocolError("expected exactly one hello message first")
            hello = msgs[0]
            if self._transfer(conn, hello):  # in this thread: a transfer of its own
                return chan
            if isinstance(hello, m.LeaseRequest) and self._on_lease is not None and not tcp:
                if hello.version != PROTOCOL_VERSION:
                    raise ProtocolError(f"driver speaks protocol {hello.version}, this "
                                        f"process {PROTOCOL_VERSION}: run the same dpool "
                                        "version")
                conn.settimeout(None)
                self._on_lease(conn, hello)  # the connection becomes the lease channel
                return None
            if not isinstance(hello, (m.Attach, m.PeerHello)) or (
                    isinstance(hello, m.Attach) and self._on_attach is None):
                raise ProtocolError(f"unexpected first message {type(hello).__name__}")
            if hello.version != PROTOCOL_VERSION:
                raise ProtocolError(f"peer speaks protocol {hello.version}, this process "
                                    f"{PROTOCOL_VERSION}: run the same dpool version")
            if isinstance(hello, m.Attach):
                self._on_attach(chan, hello)  # type: ignore[misc]
            else:
                self._on_peer(chan, hello)
        except AuthenticationError as exc:
            log.warning("refused a connection from %s: %s", peer, exc)
            conn.close()
        except (Error, ChannelClosed, OSError) as exc:
            log.warning("dropped a connection from %s: %s", peer, exc)
            conn.close()
        return None
