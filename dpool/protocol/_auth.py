"""The authenticated handshake every dpool connection between processes starts with.

Pickles are code, so nothing a peer sends is unpickled before it has proved that it knows
the cluster's token. The handshake is mutual (the client also checks the server, so a
process squatting on a node's port cannot feed a driver pickles), runs on the raw socket
before any framing, and uses fixed-size fields only::

    server -> client   MAGIC (8 bytes) + server nonce (32 bytes)
    client -> server   HMAC(token, "client" + server nonce) (32) + client nonce (32)
    server -> client   b"OK" + HMAC(token, "server" + client nonce) (32)   or   b"NO"

HMAC-SHA256, compared in constant time. The two HMACs are domain-separated ("client",
"server") so a server can never be used as an oracle that answers its own challenge.
The whole handshake has a deadline: a peer that connects and says nothing is dropped,
it cannot hold a server's accept loop.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import time

from dpool.errors import AuthenticationError, Error

MAGIC = b"DPOOL\x00\x01\x00"  # protocol family + handshake version
_NONCE = 32
_MAC = 32
DEFAULT_TIMEOUT = 10.0


def _mac(token: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, role + nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """``n`` bytes, or fewer if the peer closed; ``socket.timeout`` at ``deadline`` (a
    peer trickling a byte at a time cannot stretch the handshake)."""
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("handshake deadline passed")
        sock.settimeout(left)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def server_handshake(sock: socket.socket, token: bytes,
                     timeout: float = DEFAULT_TIMEOUT) -> None:
    """Challenge a client that just connected. Raises ``AuthenticationError`` if it fails
    (the caller logs it and closes the socket); nothing else is read from it before."""
    old = sock.gettimeout()
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        nonce = os.urandom(_NONCE)
        sock.sendall(MAGIC + nonce)
        reply = _recv_exact(sock, _MAC + _NONCE, deadline)
        if len(reply) != _MAC + _NONCE:
            raise AuthenticationError("the peer closed the connection during the handshake")
        if not hmac.compare_digest(reply[:_MAC], _mac(token, b"client", nonce)):
            try:
                sock.sendall(b"NO")
            except OSError:
                pass
            raise AuthenticationError("the peer does not know the cluster token")
        sock.sendall(b"OK" + _mac(token, b"server", reply[_MAC:]))
    except OSError as exc:  # a timeout included
        raise AuthenticationError(f"handshake with the peer failed: {exc}") from exc
    finally:
        try:
            sock.settimeout(old)
        except OSError:
            pass


def client_handshake(sock: socket.socket, token: bytes, peer: str = "the server",
                     timeout: float = DEFAULT_TIMEOUT) -> None:
    """Answer a server's challenge and check the server's answer to ours."""
    old = sock.gettimeout()
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        hello = _recv_exact(sock, len(MAGIC) + _NONCE, deadline)
        if len(hello) < len(MAGIC) or hello[:len(MAGIC)] != MAGIC:
            raise Error(f"{peer} is not a dpool process (or speaks another handshake "
                        "version): check DPOOL_ADDRESS")
        nonce = os.urandom(_NONCE)
        sock.sendall(_mac(token, b"client", hello[len(MAGIC):]) + nonce)
        answer = _recv_exact(sock, 2 + _MAC, deadline)
        if not answer:
            raise Error(f"{peer} closed the connection during the handshake")
        if answer[:2] != b"OK":
            raise AuthenticationError(
                f"{peer} refused the cluster token: set DPOOL_TOKEN to the token that "
                "`dpool start --head` printed")
        if not hmac.compare_digest(answer[2:], _mac(token, b"server", nonce)):
            raise AuthenticationError(f"{peer} does not know the cluster token")
    except socket.timeout as exc:
        raise Error(f"{peer} did not complete the dpool handshake within {timeout:g} s") \
            from exc
    finally:
        try:
            sock.settimeout(old)
        except OSError:
            pass
