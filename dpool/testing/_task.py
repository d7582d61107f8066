"""The dpool task that hosts one pytest-xdist test worker (runs in a dpool worker process).

The task connects back to the pytest controller's listener (TCP in cluster mode, the
controller's unix socket on the embedded runtime), authenticates with the run's token
(``dpool.protocol._auth``, mutual), says hello, and starts the test worker: a fresh
``python -u -c <execnet's bootstrap line>`` whose stdin and stdout are that connection --
exactly what execnet's ``popen`` gateway would start, with the socket where the pipes
were. It starts at once, before any bridge has claimed the connection, so the
interpreters of all test workers start in parallel; execnet's bootstrap source waits in
the socket until the controller pairs the connection with a bridge.

Why a child process rather than the dpool worker itself: a test suite must see a fresh
interpreter as with plain xdist (no dpool worker state: its threads, its ``fd`` 1/2
plumbing, its "inside a task" runtime, which would change how a suite that uses dpool
behaves), and a test that crashes takes down only its test worker; the task then
returns the exit code (the executor has ``max_attempts=1``: dpool never retries it,
xdist reports the crash and asks for a replacement, which is a new task). The dpool
worker holds its CPU (and resources) while the test worker runs; the test worker dies
with it (``PR_SET_PDEATHSIG``), so terminating the executor leaves nothing behind.

On a remote node the dpool worker runs in the shipped copy of the controller's rootdir
(``protocol._workdir``); ``$DPOOL_XDIST_ROOT`` tells the test worker where that copy is,
and ``_remote`` maps the controller's paths onto it.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from typing import Optional, Union

from dpool.protocol import auth as _auth

# execnet's popen bootstrap line (execnet.gateway_io.popen_bootstrapline), after making
# the test worker die with the dpool worker that started it.
_BOOT = (
    "import os,signal,sys\n"
    "try:\n"
    "    import ctypes; ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG\n"
    "except Exception: pass\n"
    "if os.getppid() != {ppid}: os._exit(1)\n"
    "exec(eval(sys.stdin.readline()))\n"
)


def local_root(root: str, cwd_rel: Optional[str], marker: Optional[str]) -> str:
    """Where the controller's ``root`` is on this node: ``root`` itself, or the shipped
    copy this dpool worker runs in (its cwd is the controller's, mapped into the copy;
    its ``sys.path[0]`` is the copy)."""
    def holds(path: str) -> bool:
        return os.path.isdir(path) and (
            marker is None or os.path.exists(os.path.join(path, marker)))

    candidates = []
    here = os.getcwd()
    if cwd_rel is not None:
        if cwd_rel == ".":
            candidates.append(here)
        elif here.endswith(os.sep + cwd_rel):
            candidates.append(here[:-len(cwd_rel) - 1])
    if sys.path and sys.path[0]:
        candidates.append(sys.path[0])
    candidates.append(root)
    for c in candidates:
        if holds(c):
            return c
    raise FileNotFoundError(
        f"dpool: the test files of {root} are not on node {os.environ.get('DPOOL_NODE_ID')}"
        f" (looked in {candidates})")


def serve_test_worker(address: Union[str, tuple], token: bytes, task_id: int, root: str,
                      cwd: str, marker: Optional[str], timeout: float = 30.0) -> int:
    """Start a test worker wired to the controller at ``address``; its exit code."""
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(address)
    else:
        sock = socket.create_connection(tuple(address), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        _auth.client_handshake(sock, token, "the pytest controller", timeout)
        cwd_rel = os.path.relpath(cwd, root) if _under(cwd, root) else None
        here = local_root(root, cwd_rel, marker)
        node = os.environ.get("DPOOL_NODE_ID", "local")
        hello = json.dumps({"task": task_id, "pid": os.getpid(), "node": node,
                            "root": here}).encode()
        sock.sendall(b"T" + struct.pack("!I", len(hello)) + hello)
        sock.settimeout(None)
        workdir = os.path.join(here, cwd_rel) if cwd_rel is not None else cwd
        if not os.path.isdir(workdir):
            workdir = here
        env = dict(os.environ)
        env["DPOOL_XDIST_ROOT"] = here
        proc = subprocess.Popen(
            [sys.executable, "-u", "-c", _BOOT.format(ppid=os.getpid())],
            stdin=sock.fileno(), stdout=sock.fileno(), cwd=workdir, env=env)
    finally:
        sock.close()  # the test worker holds the connection now: its exit closes it
    return proc.wait()


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
