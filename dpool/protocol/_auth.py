"""The authenticated handshake every dpool connection between processes starts with.

Pickles are code, so nothing a peer sends is unpickled before it has proved that it knows
the cluster's token. The handshake is mutual (the client also checks the server, so a
process squatting on a node's port cannot feed a driver pickles), runs on the raw socket
before any framing, and uses fixed-size fields only::

    server -> client   MAGIC (8 bytes) + server nonce (32 bytes)
    client -> server   HMAC(token, "client" + server nonce) (32) + client nonce (32)
                       + the client's build (2-byte length + JSON)
    server -> client   b"OK" + HMAC(token, "server" + client nonce) (32) + the server's build
                       or  b"NO"  (a wrong token)
                       or  b"VB" + the same HMAC + the server's build  (versions differ)

HMAC-SHA256, compared in constant time. The two HMACs are domain-separated ("client",
"server") so a server can never be used as an oracle that answers its own challenge.
The whole handshake has a deadline: a peer that connects and says nothing is dropped,
it cannot hold a server's accept loop.

A *build* is what must match for two processes to work together: dpool's version and
wire protocol, Python's major.minor (pickles of code are bytecode of one minor version),
cloudpickle's version; with the host, for the message. Each side checks the other's, so a
node or driver of another version is refused at the door, with both versions and both
hosts named, never with a strange error later. The builds travel as JSON (read only after
the token was proved), in a layout no version changes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import time

from dpool.errors import AuthenticationError, Error, ProtocolError

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Optional


class VersionMismatch(ProtocolError):
    """The peer's dpool, Python or cloudpickle version is not this process's."""


MAGIC = b"DPOOL\x00\x02\x00"  # protocol family + handshake version (2: builds exchanged)
_NONCE = 32
_MAC = 32
DEFAULT_TIMEOUT = 10.0


_BUILD_MAX = 4096
_build: Optional[dict] = None


def build() -> dict:
    """This process's build (see the module's doc)."""
    global _build
    if _build is None:
        import json
        import sys

        import cloudpickle

        from dpool.protocol._codec import PROTOCOL_VERSION

        _build = {"dpool": getattr(sys.modules.get("dpool"), "__version__", "?"),
                  "protocol": PROTOCOL_VERSION,
                  "python": "%d.%d" % sys.version_info[:2],
                  "cloudpickle": cloudpickle.__version__,
                  "host": socket.gethostname()}
        json.dumps(_build)  # (it must travel)
    return _build


_COMPARED = ("dpool", "protocol", "python", "cloudpickle")


def mismatch(mine: dict, theirs: dict) -> Optional[str]:
    """What differs between two builds, as a sentence naming both; None if they match."""
    diff = [k for k in _COMPARED if mine.get(k) != theirs.get(k)]
    if not diff:
        return None
    def show(b: dict) -> str:
        return ", ".join(f"{k} {b.get(k)}" for k in _COMPARED)
    return (f"host {theirs.get('host', '?')} runs {show(theirs)}; host "
            f"{mine.get('host', '?')} (this process) runs {show(mine)}: "
            f"{' and '.join(diff)} {'differs' if len(diff) == 1 else 'differ'} -- install the same dpool, Python and cloudpickle "
            "versions on every host of a cluster")


def _pack_build() -> bytes:
    import json

    data = json.dumps(build()).encode()
    return len(data).to_bytes(2, "big") + data


def _read_build(sock: socket.socket, deadline: float) -> dict:
    import json

    head = _recv_exact(sock, 2, deadline)
    n = int.from_bytes(head, "big") if len(head) == 2 else 0
    if not 0 < n <= _BUILD_MAX:
        raise Error("the peer sent no build (an older dpool?): run the same dpool version "
                    "everywhere")
    data = _recv_exact(sock, n, deadline)
    try:
        theirs = json.loads(data)
    except ValueError:
        theirs = None
    if not isinstance(theirs, dict):
        raise Error("the peer sent an unreadable build")
    return theirs


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
        theirs = _read_build(sock, deadline)
        why = mismatch(build(), theirs)
        if why is not None:
            try:  # (with its proof of the token: a client reads builds only after one)
                sock.sendall(b"VB" + _mac(token, b"server", reply[_MAC:]) + _pack_build())
            except OSError:
                pass
            raise VersionMismatch(f"refused a peer of another version: {why}")
        sock.sendall(b"OK" + _mac(token, b"server", reply[_MAC:]) + _pack_build())
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
        sock.sendall(_mac(token, b"client", hello[len(MAGIC):]) + nonce + _pack_build())
        answer = _recv_exact(sock, 2, deadline)
        if not answer:
            raise Error(f"{peer} closed the connection during the handshake")
        if answer in (b"OK", b"VB"):
            answer += _recv_exact(sock, _MAC, deadline)
        if answer[:2] == b"VB" and hmac.compare_digest(answer[2:],
                                                       _mac(token, b"server", nonce)):
            why = mismatch(build(), _read_build(sock, deadline))
            raise VersionMismatch(f"{peer} refused this process: {why or 'versions differ'}")
        if answer[:2] != b"OK":
            raise AuthenticationError(
                f"{peer} refused the cluster token: set DPOOL_TOKEN to the token that "
                "`dpool start --head` printed")
        if not hmac.compare_digest(answer[2:], _mac(token, b"server", nonce)):
            raise AuthenticationError(f"{peer} does not know the cluster token")
        why = mismatch(build(), _read_build(sock, deadline))
        if why is not None:
            raise VersionMismatch(f"{peer} is of another version: {why}")
    except socket.timeout as exc:
        raise Error(f"{peer} did not complete the dpool handshake within {timeout:g} s") \
            from exc
    finally:
        try:
            sock.settimeout(old)
        except OSError:
            pass
