"""The controller side of ``--dpool``: one dpool task per pytest-xdist test worker.

    pytest controller (xdist)                          dpool worker (any node)
    execnet ──pipes──▶ bridge (_bridge.py) ◀─fd─┐      task (_task.py)
                                                │        └ python -u -c <bootstrap>
    listener (unix; TCP in cluster mode) ◀──────┴── authenticated connection ──┘

- ``start`` opens the listener (dpool's mutual HMAC handshake, a fresh random token;
  a unix socket in a 0700 directory for the bridges and, on the embedded runtime, the
  tasks; in cluster mode a TCP port on the address this host reaches the cluster by),
  creates an executor (``max_attempts=1``; with ``DPOOL_ADDRESS`` the cluster's nodes
  run it, with pytest's rootdir as the shipped working directory) and submits every task
  at once, so the test workers' interpreters start in parallel.
- It rewrites xdist's gateway specs to ``popen//python=<bridge>``. execnet starts the
  bridge; the bridge authenticates, and the controller passes it the file descriptor of
  a task's connection (``SCM_RIGHTS``): no byte of test traffic goes through the
  controller's threads. Any ready task serves any bridge; a bridge with none ready
  (xdist replacing a crashed worker) has a new task submitted for it.
- A test worker that dies closes its connection: the bridge exits, and xdist reports the
  crash and starts a replacement as with plain xdist.
- ``close`` (at ``pytest_unconfigure``, also after Ctrl-C or ``-x``) closes the
  listeners and unclaimed connections, removes the directory, lets the tasks end, and
  terminates what still runs. A controller killed outright runs no ``close``: its dpool
  workers exit (they watch their parent), their test workers with them
  (``PR_SET_PDEATHSIG``), the bridges at EOF; the next run removes its directory.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import secrets
import shlex
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any, Optional

from dpool.errors import Error
from dpool.protocol import auth as _auth

log = logging.getLogger("dpool.testing")

_HELLO_LIMIT = 1 << 16


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def _is_closed(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` (a task whose worker died before it was used)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class _TaskConn:
    __slots__ = ("hello", "sock")

    def __init__(self, sock: socket.socket, hello: dict) -> None:
        self.sock = sock
        self.hello = hello


class Backend:
    """One ``--dpool`` run: the listener, the executor, the pairing of bridges and tasks."""

    def __init__(self, rootdir: str, resources: Optional[dict], start_timeout: float,
                 marker: Optional[str]) -> None:
        self.rootdir = rootdir
        self.resources = resources
        self.start_timeout = start_timeout
        self.marker = marker
        self.rundir: Optional[str] = None
        self._token = secrets.token_bytes(32)
        self._listeners: list[socket.socket] = []
        # reentrant: a future that fails at submit runs its done-callback (which takes
        # the lock) inside submit, which is called with the lock held
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._ready: deque[_TaskConn] = deque()
        self._supply = 0  # tasks submitted whose connection no bridge has taken yet
        self._waiting = 0  # bridges waiting for a task
        self._failures: deque[str] = deque()  # why tasks ended before connecting
        self._futures: list = []
        self._unconnected: dict[int, Any] = {}  # task id -> future, until it connects
        self._executor: Any = None
        self._task_address: Any = None
        self._closed = False
        self.nodes: dict[str, int] = {}  # node -> test workers started there

    # -- start -------------------------------------------------------------------------
    def start(self, n: int) -> None:
        import dpool.executor
        from dpool.runtime import current as _current

        base = tempfile.gettempdir()
        if len(base) > 60:  # a unix socket path has at most 107 bytes
            base = "/tmp"
        _reap_rundirs(base)
        # mode 0700; named for this process, so a later run removes it if we are killed
        self.rundir = tempfile.mkdtemp(prefix=f"dpool-xdist-{os.getpid()}-", dir=base)
        fd = os.open(os.path.join(self.rundir, "token"), os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self._token)
        with open(os.path.join(self.rundir, "build"), "w") as f:  # (what bridges offer)
            json.dump(_auth.build(), f)
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(os.path.join(self.rundir, "s"))
        unix.listen(256)
        self._listeners.append(unix)
        cluster = bool(os.environ.get("DPOOL_ADDRESS"))
        kwargs: dict = {"max_workers": n, "max_attempts": 1}
        if cluster:
            runtime: Any = _current.driver()  # a ClusterRuntime: it has a target
            host = _reachable_host(runtime.target)
            tcp = socket.create_server((host, 0), backlog=256)
            self._listeners.append(tcp)
            self._task_address = (host, tcp.getsockname()[1])
            kwargs["working_dir"] = self.rootdir
        else:
            # The default start method (fork): a worker forked later holds copies of the
            # controller's descriptors (pipes to bridges, connections being handed over),
            # which matters only when a bridge is killed; closing the executor (which
            # kills the workers) ends those test workers too. (forkserver workers would
            # not: dpool's worker watchdog takes the forkserver for a dead driver.)
            self._task_address = os.path.join(self.rundir, "s")
        if self.resources is not None:
            kwargs["resources"] = self.resources
        for lsock in self._listeners:
            threading.Thread(target=self._accept_loop, args=(lsock,), daemon=True,
                             name="dpool-xdist-accept").start()
        self._executor = dpool.executor.ProcessPoolExecutor(**kwargs)
        with self._lock:
            for _ in range(n):
                self._submit()

    def bridge_command(self, slot: str) -> str:
        """What execnet runs (as ``popen//python=...``) for test worker ``slot``."""
        assert self.rundir is not None
        bridge = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bridge.py")
        return " ".join(shlex.quote(x) for x in
                        (sys.executable, "-S", "-I", bridge, self.rundir, slot))

    def _submit(self) -> None:
        """One more task (the lock held)."""
        from dpool.testing._task import serve_test_worker

        task_id = len(self._futures)
        fut = self._executor.submit(serve_test_worker, self._task_address, self._token,
                                    task_id, self.rootdir, os.getcwd(), self.marker)
        self._supply += 1
        self._futures.append(fut)
        self._unconnected[task_id] = fut
        fut.add_done_callback(lambda f: self._task_done(task_id, f))

    def _task_done(self, task_id: int, fut: Any) -> None:
        with self._lock:
            if self._unconnected.pop(task_id, None) is None:
                return  # it had connected: its test worker ran and ended
            self._supply -= 1
            try:
                exc = fut.exception()
            except BaseException as e:  # noqa: BLE001 - cancelled
                exc = e
            self._failures.append(f"its dpool task ended before connecting: {exc!r}")
            self._cond.notify_all()

    # -- the listener ----------------------------------------------------------------------
    def _accept_loop(self, lsock: socket.socket) -> None:
        while not self._closed:
            try:
                sock, _ = lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True,
                             name="dpool-xdist-conn").start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            _auth.server_handshake(sock, self._token)
            sock.settimeout(_auth.DEFAULT_TIMEOUT)
            role = _recv_exact(sock, 1)
            (size,) = struct.unpack("!I", _recv_exact(sock, 4))
            if size > _HELLO_LIMIT or role not in (b"T", b"B"):
                raise ConnectionError(f"unexpected message {role!r} ({size} bytes)")
            hello = json.loads(_recv_exact(sock, size))
            sock.settimeout(None)
        except (Error, OSError, ValueError) as exc:  # (a wrong token or version, ...)
            log.warning("dpool: refused a connection to the pytest controller: %s", exc)
            sock.close()
            return
        if role == b"T":
            self._task_connected(sock, hello)
        else:
            self._bridge_connected(sock, hello)

    def _task_connected(self, sock: socket.socket, hello: dict) -> None:
        with self._lock:
            if self._closed:
                sock.close()
                return
            if self._unconnected.pop(hello.get("task", -1), None) is None:
                sock.close()  # not a task of this run's, or one that already ended
                return
            self._supply -= 1
            self._ready.append(_TaskConn(sock, hello))
            self._cond.notify_all()

    def _bridge_connected(self, sock: socket.socket, hello: dict) -> None:
        slot = str(hello.get("slot"))
        deadline = time.monotonic() + self.start_timeout
        conn: Optional[_TaskConn] = None
        why = ""
        with self._lock:
            self._waiting += 1
            try:
                while conn is None:
                    while self._ready and conn is None:
                        c = self._ready.popleft()
                        if _is_closed(c.sock):
                            c.sock.close()
                            continue
                        conn = c
                    if conn is not None:
                        break
                    if self._closed:
                        why = "the pytest run is ending"
                        break
                    if self._failures:
                        why = self._failures.popleft()
                        break
                    if self._supply < self._waiting:
                        self._submit()  # a replacement for a test worker that ended
                    left = deadline - time.monotonic()
                    if left <= 0:
                        why = (f"no dpool worker took its task within "
                               f"{self.start_timeout:g} s (--dpool-start-timeout); are "
                               f"there enough free CPUs (or resources) for every test "
                               f"worker?")
                        break
                    self._cond.wait(min(left, 1.0))
            finally:
                self._waiting -= 1
        try:
            if conn is None:
                sock.sendall(b"E" + why.encode()[:4000])
                return
            node = str(conn.hello.get("node"))
            with self._lock:
                self.nodes[node] = self.nodes.get(node, 0) + 1
            log.debug("test worker %s runs on node %s (pid %s)", slot, node,
                      conn.hello.get("pid"))
            socket.send_fds(sock, [b"K"], [conn.sock.fileno()])
        except OSError:
            pass
        finally:
            sock.close()
            if conn is not None:
                conn.sock.close()

    # -- the end ---------------------------------------------------------------------------
    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ready = list(self._ready)
            self._ready.clear()
            self._cond.notify_all()
        for lsock in self._listeners:
            try:
                lsock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            lsock.close()
        for c in ready:  # their test workers read EOF and exit
            c.sock.close()
        if self.rundir is not None:
            shutil.rmtree(self.rundir, ignore_errors=True)
        ex = self._executor
        if ex is None:
            return
        ex.shutdown(wait=False, cancel_futures=True)
        # the test workers have exited (xdist tore them down) or got EOF just now
        _, running = concurrent.futures.wait(self._futures, timeout=timeout)
        if running:
            ex._terminate("the pytest run ended")
        ex.shutdown(wait=True)


def _reap_rundirs(base: str) -> None:
    """Remove the listener directories of controllers that were killed (SIGKILL runs no
    ``close``): ``dpool-xdist-<pid>-*`` of this user whose process is gone."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if len(parts) < 4 or parts[:2] != ["dpool", "xdist"] or not parts[2].isdigit():
            continue
        path = os.path.join(base, name)
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(parts[2]), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


def _reachable_host(target: Any) -> str:
    """The address of this host that the cluster's nodes reach it by."""
    override = os.environ.get("DPOOL_XDIST_HOST")
    if override:
        return override
    if getattr(target, "unix_path", None):
        return target.host  # attached to a node on this host: its address is ours
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((target.host, target.port or 9))
        return s.getsockname()[0]
