"""The fork server (zygote): a single-threaded copy of the driver that forks its workers.

``fork()`` in a process with several threads copies only the calling one: a lock another
thread held at that moment stays held in the child for good. The runtime always runs
threads (its IO thread, a Pool's, the program's own), so the zygote is forked once, at
``LocalScheduler.fork_point`` -- before the IO thread or a Pool's threads start, or the
first worker is forked -- and stays single-threaded. Once the driver runs threads, the zygote
forks the workers of the ``fork`` start method, but those whose initargs only inheritance
can pass (``LocalScheduler.spawn_locked``). A worker is a copy of the program as it was
then, with the driver's environment, working directory and standard output and error as
they are when the worker starts (compat/DIFFERENCES.md). A program that runs threads of
its own before its first task has the zygote forked by a process with threads. A node
daemon forks its zygote before it opens its port.

Protocol (one ``SOCK_SEQPACKET`` socket pair; the zygote serves one request at a time):

- driver -> zygote: ``_REQ`` header (payload length) + the pickled spawn request, in
  chunks of at most ``_CHUNK`` bytes; its descriptors (the worker's sockets, the driver's
  stdout and stderr) travel with the first chunk (``SCM_RIGHTS``).
- zygote -> driver: ``_REPLY`` messages: ``STARTED`` (the pid, with a pidfd of the worker
  attached), ``FAILED`` (an errno: the fork failed), ``EXITED`` (a pid and its exit code,
  as ``Popen.returncode``: negative for a signal).

The driver's end is ``Zygote`` (its ``_lock``: one request and one reader at a time), used
through ``_forkproc._ZygotePopen``: a worker's ``sentinel`` is its pidfd, signals go through
``pidfd_send_signal`` (never to a later process given the same pid), and its exit code is
the zygote's report. There is no zygote without pidfds (Linux < 5.3), with
``DPOOL_FORK_SERVER=0``, or when ``fork`` is not the default start method
(``_forkproc.fork_server``); then, or once it died, the driver forks the workers itself.
"""

from __future__ import annotations

import array
import errno
import os
import pickle
import select
import signal
import socket
import struct
import threading
import time

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Optional

__all__ = ["NAME", "Zygote", "usable"]

_REQ = struct.Struct("<Q")  # payload length
_REPLY = struct.Struct("<iii")  # kind, pid, value
STARTED, FAILED, EXITED = 1, 2, 3
_CHUNK = 32 * 1024
NAME = "dpool-zygote"  # the fork server's process name (``comm``)
_MAX_FDS = 8


def usable() -> bool:
    """Whether workers can come from a zygote here (pidfds: Linux 5.3+)."""
    return hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal") \
        and hasattr(socket, "SOCK_SEQPACKET") and hasattr(os, "waitstatus_to_exitcode")


def _set_comm(name: str) -> Optional[str]:
    """Name this (single-threaded) process ``name`` (Linux's ``comm``, 15 bytes at most);
    the name it had, or None where that cannot be done."""
    try:
        with open("/proc/self/comm", "r+b", buffering=0) as f:
            old = f.read().rstrip(b"\n").decode(errors="replace")
            f.seek(0)
            f.write(name.encode()[:15])
        return old
    except OSError:
        return None


def _recv_fds(sock: socket.socket, size: int) -> tuple[bytes, list[int]]:
    data, anc, _flags, _addr = sock.recvmsg(size, socket.CMSG_SPACE(_MAX_FDS * 4))
    fds: list[int] = []
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(raw[:len(raw) - len(raw) % a.itemsize])
            fds.extend(a)
    return data, fds


def _fds_msg(fds: list[int]) -> list:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []


class Zygote:
    """The driver's end: start the zygote, ask it for workers, learn how they ended."""

    def __init__(self) -> None:
        """Fork the zygote. Call while this process has one thread, if at all possible."""
        self.driver_pid = os.getpid()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # the workers' ``parent_process().sentinel``: EOF once the driver is gone
        parent_r, self._parent_w = os.pipe()
        from dpool.scheduling._forkproc import flush_std_streams

        flush_std_streams()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the zygote (covered through its workers)
            code = 1
            try:
                from dpool.objects import mainref as _mainref

                _mainref.forked_server()
                ours.close()
                os.close(self._parent_w)
                code = _Server(theirs, parent_r, self.driver_pid).serve()
            finally:
                os._exit(code)
        theirs.close()
        os.close(parent_r)
        self.pid = pid
        self._pidfd = os.pidfd_open(pid)  # (no one else reaps it: it is the same process)
        self._sock = ours
        self._lock = threading.Lock()  # one reader and one request at a time
        self._codes: dict[int, int] = {}  # exit codes reported, not yet asked for
        self.alive = True  # it takes requests
        self._gone = False  # its end of the socket is closed: no more reports

    # -- requests ------------------------------------------------------------------------
    def spawn(self, request: tuple, fds: list[int]) -> tuple[int, int]:
        """A new worker: ``request`` (``_Server._become`` reads it) and the descriptors
        it names by position. Returns (pid, pidfd); raises ``OSError`` if the zygote
        cannot fork or is gone."""
        payload = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            if not self.alive:
                raise OSError(errno.ESRCH, "the fork server is gone")
            try:
                first = _REQ.pack(len(payload)) + payload[:_CHUNK - _REQ.size]
                self._sock.sendmsg([first], _fds_msg(fds))
                for i in range(_CHUNK - _REQ.size, len(payload), _CHUNK):
                    self._sock.sendall(payload[i:i + _CHUNK])
                while True:
                    kind, pid, value, pidfd = self._read_reply(None)
                    if kind == STARTED:
                        return pid, pidfd
                    if kind == FAILED:
                        raise OSError(value, f"the fork server could not fork: "
                                             f"{os.strerror(value)}")
            except OSError as exc:
                if exc.errno not in (errno.ENOMEM, errno.EAGAIN):
                    self._mark_lost()
                raise

    def exitcode(self, pid: int, timeout: Optional[float]) -> Optional[int]:
        """The exit code of worker ``pid`` whose pidfd said it ended: waits at most
        ``timeout`` seconds (None: for good) for the zygote's report."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while pid not in self._codes:
                if self._gone:
                    # nobody can tell any more: the usual cause of a worker's death that
                    # goes unexplained is a kill (the zygote was killed with it)
                    return -signal.SIGKILL
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                try:
                    self._read_reply(left)
                except OSError:
                    self._mark_lost()  # (then: the answer above)
            return self._codes.pop(pid)

    def finish(self) -> None:
        """No more workers: the zygote reports the exits of those there are, then ends
        (so that it ends while the runtime waits for its workers, not after)."""
        with self._lock:
            if self.alive:
                self.alive = False  # (a later start is forked here)
                try:
                    self._sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def close(self) -> None:
        """Stop the zygote (its workers are the runtime's to stop) and reap it."""
        with self._lock:
            if self._sock.fileno() < 0:
                return
            self.alive = False
            self._gone = True
            self._sock.close()
        os.close(self._parent_w)
        try:  # it exits on the EOF: wait for that (2 s at most), then reap it
            ended = select.select([self._pidfd], [], [], 2.0)[0]
            if not ended:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)  # type: ignore[attr-defined]
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        finally:
            os.close(self._pidfd)

    # -- replies -------------------------------------------------------------------------
    def _read_reply(self, timeout: Optional[float]) -> tuple[int, int, int, int]:
        """One reply (kind, pid, value, pidfd or -1); ``EXITED`` ones are recorded too.
        (0, 0, 0, -1) if none came within ``timeout``."""
        if timeout is not None:
            ready, _, _ = select.select([self._sock], [], [], max(0.0, timeout))
            if not ready:
                return 0, 0, 0, -1
        data, fds = _recv_fds(self._sock, _REPLY.size)
        if len(data) < _REPLY.size:
            for fd in fds:
                os.close(fd)
            self._mark_lost()
            raise OSError(errno.EPIPE, "the fork server is gone")
        kind, pid, value = _REPLY.unpack(data)
        for fd in fds[1:]:
            os.close(fd)
        if kind == EXITED:
            self._codes[pid] = value
        return kind, pid, value, fds[0] if fds else -1

    def _mark_lost(self) -> None:
        self._gone = True
        if self.alive:
            self.alive = False
            try:
                os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pass


class _Server:
    """The zygote's loop: fork a worker per request, report each one's end."""

    def __init__(self, sock: socket.socket, parent_sentinel: int, driver_pid: int) -> None:
        self.sock = sock
        self.parent_sentinel = parent_sentinel
        self.driver_pid = driver_pid
        self.children: dict[int, int] = {}  # pidfd -> pid
        self.out: list[bytes] = []  # replies the driver has not taken yet
        self.finishing = False  # no more requests: end once every worker is reported
        self.poll = select.poll()

    def serve(self) -> int:
        self.comm = _set_comm(NAME)  # how ``ps`` and ``psutil``'s ``name()`` show it
        # Ctrl-C reaches the whole foreground process group: the zygote ignores it (its
        # workers get the program's handler back); the driver's end stops it
        self.sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:  # what every worker would import first, imported once here (the driver
            from dpool.protocol import preload_worker  # imports it too: ``add_group``)

            preload_worker()
        except Exception:  # noqa: BLE001 - the worker reports it when it starts
            pass
        self.sock.setblocking(False)
        self.poll.register(self.sock, select.POLLIN)
        while True:
            for fd, ev in self.poll.poll(1000):
                if fd == self.sock.fileno():
                    if ev & (select.POLLHUP | select.POLLERR):
                        return 0  # the driver's end is closed
                    if ev & select.POLLOUT:
                        self._flush()
                    if ev & select.POLLIN and not self._request():
                        # the driver is done asking (``Zygote.finish``): report the
                        # exits of the workers there are, then end
                        self.finishing = True
                        self.poll.modify(self.sock, self._mask())
                else:
                    self._reap(fd)
            if self.finishing and not self.children and not self.out:
                return 0
            if os.getppid() != self.driver_pid:  # the driver died and its end lingers
                return 0

    def _mask(self) -> int:
        return (0 if self.finishing else select.POLLIN) | (select.POLLOUT if self.out else 0)

    def _request(self) -> bool:
        try:
            data, fds = _recv_fds(self.sock, _CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            for fd in fds:
                os.close(fd)
            return False
        (size,) = _REQ.unpack_from(data)
        payload = bytearray(data[_REQ.size:])
        self.sock.setblocking(True)
        try:
            while len(payload) < size:
                more = self.sock.recv(_CHUNK)
                if not more:
                    return False
                payload += more
        finally:
            self.sock.setblocking(False)
        try:
            self._fork(pickle.loads(payload), fds)
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def _fork(self, request: tuple, fds: list[int]) -> None:
        try:
            pid = os.fork()
        except OSError as exc:
            self._send(_REPLY.pack(FAILED, 0, exc.errno or errno.EAGAIN))
            return
        if pid == 0:  # pragma: no cover - the worker
            code = 1
            try:
                code = self._become(request, fds)
            finally:
                os._exit(code)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = pid
        self.poll.register(pidfd, select.POLLIN)
        self._send(_REPLY.pack(STARTED, pid, 0), pidfd)

    def _become(self, request: tuple, fds: list[int]) -> int:  # pragma: no cover - child
        """In the new worker: drop the zygote's state, take the driver's, run."""
        self.sock.close()
        if self.comm is not None:
            _set_comm(self.comm)
        for pidfd in self.children:
            os.close(pidfd)
        signal.signal(signal.SIGINT, self.sigint)
        name, identity, parent_name, env, cwd, stdio, target, args = request
        for fd, i in zip((1, 2), stdio):
            if i is not None and fds[i] != fd:
                os.dup2(fds[i], fd)
        args = tuple(socket.socket(fileno=os.dup(fds[a.i])) if isinstance(a, FdArg) else a
                     for a in args)
        for fd in fds:
            os.close(fd)
        fds.clear()
        environ = os.environ
        for key in [k for k in environ if k not in env]:
            del environ[key]
        for key, value in env.items():
            if environ.get(key) != value:
                environ[key] = value
        try:
            os.chdir(cwd)
        except OSError:
            pass  # as a fork whose directory went away: the worker's own cwd says
        from dpool.scheduling import _forkproc

        proc = _forkproc.ForkedWorker(target=target, args=args, name=name)
        proc._identity = identity
        proc._parent_pid, proc._parent_name = self.driver_pid, parent_name
        return _forkproc._bootstrap(proc, self.parent_sentinel)

    def _reap(self, pidfd: int) -> None:
        pid = self.children.pop(pidfd, None)
        self.poll.unregister(pidfd)
        os.close(pidfd)
        if pid is None:
            return
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return
        self._send(_REPLY.pack(EXITED, pid, os.waitstatus_to_exitcode(status)))

    def _send(self, reply: bytes, fd: int = -1) -> None:
        if fd >= 0:  # the only reply with a descriptor: sent now, before any later one
            self._flush()
            if not self.out:
                try:
                    self.sock.sendmsg([reply], _fds_msg([fd]))
                    return
                except BlockingIOError:
                    pass
            # the driver waits for this reply while it reads: block until it is taken
            self.sock.setblocking(True)
            try:
                for queued in self.out:
                    self.sock.send(queued)
                self.out.clear()
                self.sock.sendmsg([reply], _fds_msg([fd]))
            finally:
                self.sock.setblocking(False)
            self.poll.modify(self.sock, self._mask())
            return
        self.out.append(reply)
        self._flush()

    def _flush(self) -> None:
        while self.out:
            try:
                self.sock.send(self.out[0])
            except BlockingIOError:
                self.poll.modify(self.sock, self._mask())
                return
            except OSError:
                self.out.clear()
                return
            del self.out[0]
        self.poll.modify(self.sock, self._mask())


class FdArg:
    """A socket argument of the worker's target, sent as descriptor ``i`` of the request."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __reduce__(self) -> tuple:
        return FdArg, (self.i,)
