"""Reaching another dpool process: addresses, and dialing with the handshake.

Every connection a dpool process opens to another starts the same way: connect (TCP,
with ``TCP_NODELAY``: requests are small and must not wait for an acknowledgement; or
the node's unix socket), then the token handshake (``_auth.client_handshake``). A
connection for messages then says hello and reads the answer (``greet``): a node to a
peer (``PeerHello`` -> ``PeerWelcome``), a driver to its node (``Attach`` ->
``Attached``); a transfer connection (``transfer._conns``) sends its requests raw.

The errors say where it failed, so that each caller words its own message:
``Unreachable`` (no connection: refused, no route, no such host, no answer within the
timeout), ``Broken`` (connected, then the connection broke or timed out before the
hello was answered), ``NotAnswered`` (the peer did not answer the hello as expected);
``AuthenticationError`` if the peer refuses the token or does not know it, and a
``dpool.Error`` if it is no dpool process or does not finish the handshake in time
(``_auth``). A connection that fails is closed.
"""

from __future__ import annotations

import re
import socket
from typing import Any, TypeVar

from dpool.errors import Error
from dpool.protocol import _auth
from dpool.protocol._channel import Channel
from dpool.protocol._codec import decode_batch, encode_batch

_HOSTPORT = re.compile(r"^\[?([A-Za-z0-9._:-]+?)\]?:([0-9]{1,5})$")

_Answer = TypeVar("_Answer")


def parse_hostport(text: str, what: str = "DPOOL_ADDRESS") -> tuple[str, int]:
    """``"host:port"`` -> (host, port), or a clear ``dpool.Error``."""
    match = _HOSTPORT.match(text.strip())
    if match is None:
        raise Error(f"{what}={text!r} is not HOST:PORT (e.g. 127.0.0.1:6380), nor 'auto'")
    host, port = match.group(1), int(match.group(2))
    if not 0 < port < 65536:
        raise Error(f"{what}={text!r}: port {port} is out of range")
    return host, port


class DialError(Error):
    """Dialing failed on the socket: ``cause`` is the socket's error (and ``str`` its
    text)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Unreachable(DialError):
    """No connection was made: refused, no route, no such host, or no answer within the
    timeout (``cause`` is a ``socket.timeout`` then)."""


class Broken(DialError):
    """The connection was made, then broke (or timed out) before the hello was answered."""


class NotAnswered(Error):
    """The peer did not answer the hello with the expected message within the timeout."""


def connect(host: str, port: int, token: bytes, peer: str, timeout: float) -> socket.socket:
    """A TCP connection to ``host:port`` that passed the token handshake (``peer`` names
    the other side in the handshake's errors); its timeout is ``timeout``."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise Unreachable(exc) from exc
    return _handshake(sock, token, peer, timeout, nodelay=True)


def connect_unix(path: str, token: bytes, peer: str, timeout: float) -> socket.socket:
    """``connect``, to the unix socket at ``path``."""
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        raise Unreachable(exc) from exc
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise Unreachable(exc) from exc
    return _handshake(sock, token, peer, timeout, nodelay=False)


def _handshake(sock: socket.socket, token: bytes, peer: str, timeout: float,
               nodelay: bool) -> socket.socket:
    try:
        if nodelay:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _auth.client_handshake(sock, token, peer, timeout)
    except OSError as exc:
        sock.close()
        raise Broken(exc) from exc
    except BaseException:
        sock.close()
        raise
    return sock


def greet(sock: socket.socket, hello: Any, answer: type[_Answer],
          timeout: float) -> tuple[Channel, _Answer]:
    """Say ``hello`` on a connection that passed the handshake and read the peer's
    answer, an ``answer`` message: (a blocking channel with no timeout, the answer)."""
    try:
        chan = Channel(sock, blocking=True)
        chan.send(encode_batch([hello]))
        frames = chan.recv_frames(timeout=timeout)
        msgs = decode_batch(frames[0]) if frames else []
        if not msgs or not isinstance(msgs[0], answer):
            raise NotAnswered(f"no {answer.__name__} within {timeout:g} s")
        sock.settimeout(None)
        return chan, msgs[0]
    except OSError as exc:  # ChannelClosed too: reset, refused mid-way, timed out
        sock.close()
        raise Broken(exc) from exc
    except BaseException:
        sock.close()
        raise
