"""The process execnet starts for a test worker under ``--dpool`` (run as a script).

xdist starts each test worker through an execnet gateway spec; ``--dpool`` rewrites the
specs to ``popen//python=<this script> RUNDIR SLOT``, so execnet starts this script
(adding ``-u -c <bootstrap>``, which it ignores) and speaks its protocol on its
stdin/stdout. The script connects to the controller's listener in RUNDIR (a unix socket
in a 0700 directory), proves it knows the run's token (dpool's mutual HMAC handshake,
``dpool.protocol._auth``, restated here), and gets back the file descriptor of one test
worker's authenticated connection (``SCM_RIGHTS``). From then on it relays bytes both
ways until either side closes: execnet's stdin to the socket, the socket to stdout.

It runs as ``python -S -I``: stdlib only, no dpool import, a few milliseconds to start
(execnet starts test workers one after another, so this is the part of start-up that
grows with the worker count). It ignores SIGINT, as a pipe would: a Ctrl-C reaches the
test worker and the controller, and the worker's last reports still get through.
"""

import hashlib
import hmac
import json
import os
import signal
import socket
import struct
import sys
import threading

MAGIC = b"DPOOL\x00\x02\x00"  # dpool.protocol._auth.MAGIC (a test checks they agree)
_NONCE = 32
_CHUNK = 1 << 16


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def handshake(sock, token, build):
    """The client side of ``dpool.protocol._auth`` (mutual HMAC-SHA256 challenge, then
    the builds: this bridge is the controller's own run, so it offers the controller's
    build, which the controller wrote beside the token)."""
    hello = _recv_exact(sock, len(MAGIC) + _NONCE)
    if hello[:len(MAGIC)] != MAGIC:
        raise OSError("the pytest controller's listener is not a dpool one")
    nonce = os.urandom(_NONCE)
    sock.sendall(hmac.new(token, b"client" + hello[len(MAGIC):], hashlib.sha256).digest()
                 + nonce + struct.pack("!H", len(build)) + build)
    if _recv_exact(sock, 2) != b"OK":
        raise OSError("the pytest controller refused this bridge's token")
    expect = hmac.new(token, b"server" + nonce, hashlib.sha256).digest()
    if not hmac.compare_digest(_recv_exact(sock, 32), expect):
        raise OSError("the pytest controller does not know this run's token")
    (n,) = struct.unpack("!H", _recv_exact(sock, 2))
    _recv_exact(sock, n)  # (the controller's build: the one sent)


def _pump_in(conn):
    """execnet -> test worker; at EOF the worker gets EOF too."""
    try:
        while True:
            data = os.read(0, _CHUNK)
            if not data:
                break
            conn.sendall(data)
    except OSError:
        pass
    try:
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def main(argv):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rundir, slot = argv[1], argv[2]
    try:
        with open(os.path.join(rundir, "token"), "rb") as f:
            token = f.read()
        with open(os.path.join(rundir, "build"), "rb") as f:
            build = f.read()
        ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ctl.settimeout(30)
        ctl.connect(os.path.join(rundir, "s"))
        handshake(ctl, token, build)
        hello = json.dumps({"slot": slot, "pid": os.getpid()}).encode()
        ctl.sendall(b"B" + struct.pack("!I", len(hello)) + hello)
        ctl.settimeout(None)  # the controller answers once a test worker is up, or says why not
        msg, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 16, 1)
    except OSError as exc:
        sys.stderr.write(f"dpool: test worker {slot}: cannot reach the pytest controller: "
                         f"{exc}\n")
        return 1
    if not fds:
        text = msg[1:].decode("utf-8", "replace") if msg else "the controller closed"
        sys.stderr.write(f"dpool: test worker {slot} did not start: {text}\n")
        return 1
    conn = socket.socket(fileno=fds[0])
    ctl.close()
    threading.Thread(target=_pump_in, args=(conn,), daemon=True).start()
    try:
        while True:
            data = conn.recv(_CHUNK)
            if not data:
                break
            view = memoryview(data)
            while view:
                view = view[os.write(1, view):]
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv))
