"""Running Redis Sentinel for replicated control-store shards (``dpool start --replicas``).

``SentinelServer`` is one ``redis-server --sentinel`` child process watching every shard's
primary (``sentinel monitor dpool-<i> ...``); ``start_replicated`` starts, for shards
already running, ``replicas`` replicas each and ``sentinels`` Sentinels (3 by default: a
quorum of 2 survives the loss of one). On one host that is what tests and small clusters
use; a production deployment runs its Sentinels on three machines and passes them with
``--redis-address sentinel://...`` (``_sentinel``).

Sentinel needs a config file it can rewrite (it records failovers there), so the password
is in that file (mode 0600, in the server's own directory), not on its command line.
Sentinels require the cluster's password too, and use it with each other
(``sentinel sentinel-pass``) and with the shards (``sentinel auth-pass``).

Timing: a primary that does not answer for ``down_after_ms`` (default 1000) is down for
one Sentinel; once a quorum agree, one of them promotes the replica with the most data
(measured failover times: bench/RECOVERY.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from dpool.control._redis_server import RedisServer
from dpool.errors import ControlStoreError

MASTER_PREFIX = "dpool-"  # shard i's primary is "dpool-<i>" to the Sentinels
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 10_000


def master_name(shard: int) -> str:
    return f"{MASTER_PREFIX}{shard}"


class SentinelServer(RedisServer):
    """One Sentinel watching ``masters``: ``[(name, "host:port"), ...]``."""

    def __init__(self, port: int, password: str, masters: Sequence[tuple[str, str]],
                 bind: str = "127.0.0.1", dir: str | None = None,
                 executable: str | None = None, detached: bool = False,
                 announce_ip: str | None = None, quorum: int = 2,
                 down_after_ms: int = DOWN_AFTER_MS, require_password: bool = True) -> None:
        super().__init__(port, password, bind=bind, dir=dir, executable=executable,
                         detached=detached, announce_ip=announce_ip)
        self.masters = list(masters)
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.require_password = require_password  # False: as some external deployments

    @property
    def config_path(self) -> str:
        assert self.dir is not None
        return os.path.join(self.dir, "sentinel.conf")

    def _argv(self, exe: str) -> list:
        self._write_config()
        return [exe, self.config_path, "--sentinel"]

    def _stdin_config(self) -> bytes:
        return b""  # everything is in the config file

    def _auth_password(self) -> str | None:
        return self._password if self.require_password else None

    def _write_config(self) -> None:
        pw = self._quoted_password().decode()
        lines = [f"port {self.port}", f"bind {self.bind}", f'dir "{self.dir}"',
                 f'logfile "{self.logfile}"', "daemonize no"]
        if self.require_password:
            lines += [f"requirepass {pw}", f"sentinel sentinel-pass {pw}"]
        if self.announce_ip:
            lines += [f"sentinel announce-ip {self.announce_ip}",
                      f"sentinel announce-port {self.port}"]
        for name, address in self.masters:
            host, _, port = address.rpartition(":")
            lines += [f"sentinel monitor {name} {host} {int(port)} {self.quorum}",
                      f"sentinel auth-pass {name} {pw}",
                      f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
                      f"sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}",
                      f"sentinel parallel-syncs {name} 1"]
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")


def sentinel_address(sentinels: Sequence[str], shards: int) -> str:
    """The ``--redis`` spec for shards watched by ``sentinels`` (``"host:port"`` each)."""
    names = ",".join(master_name(i) for i in range(shards))
    return f"sentinel://{','.join(sentinels)}/{names}"


def start_replicated(primaries: Sequence[RedisServer], password: str, *, ports: Sequence[int],
                     sentinel_ports: Sequence[int], announce_ip: str, bind: str,
                     dirs: Sequence[str] = (), sentinel_dirs: Sequence[str] = (),
                     detached: bool = False, down_after_ms: int = DOWN_AFTER_MS,
                     started: list | None = None,
                     sentinel_password: bool = True) -> tuple[list, list]:
    """For running ``primaries`` (shard order), start one replica each on ``ports`` and
    the Sentinels on ``sentinel_ports``: ``(replicas, sentinels)``. Every server started
    is appended to ``started`` at once, so a caller can stop them if a later one fails."""
    started = [] if started is None else started
    replicas = []
    for i, primary in enumerate(primaries):
        r = RedisServer(ports[i], password, bind=bind, dir=dirs[i] if dirs else None,
                        detached=detached, replicaof=f"{announce_ip}:{primary.port}",
                        announce_ip=announce_ip)
        if r.dir:
            os.makedirs(r.dir, exist_ok=True)
        started.append(r)
        r.start()
        replicas.append(r)
    masters = [(master_name(i), f"{announce_ip}:{p.port}") for i, p in enumerate(primaries)]
    quorum = len(sentinel_ports) // 2 + 1
    sentinels = []
    for j, port in enumerate(sentinel_ports):
        s = SentinelServer(port, password, masters, bind=bind,
                           dir=sentinel_dirs[j] if sentinel_dirs else None,
                           detached=detached, announce_ip=announce_ip, quorum=quorum,
                           down_after_ms=down_after_ms, require_password=sentinel_password)
        if s.dir:
            os.makedirs(s.dir, exist_ok=True)
        started.append(s)
        s.start()
        sentinels.append(s)
    wait_watching(sentinels, password if sentinel_password else "",
                  [m for m, _ in masters])
    return replicas, sentinels


def wait_watching(sentinels: Sequence[SentinelServer], password: str,
                  masters: Sequence[str], timeout: float = 20.0) -> None:
    """Wait until every Sentinel knows the others and each master's replica: only then
    can they agree on a failover (they find each other through hello messages every 2 s).
    ``ControlStoreError`` after ``timeout``."""
    import redis

    clients = [redis.Redis(host=s.bind, port=s.port, password=password or None,
                           socket_timeout=2.0,
                           socket_connect_timeout=2.0) for s in sentinels]
    deadline = time.monotonic() + timeout
    state: dict = {}
    try:
        while True:
            try:
                state = {(c.connection_pool.connection_kwargs["port"], m): c.sentinel_master(m)
                         for c in clients for m in masters}
                if all(int(v.get("num-other-sentinels", 0)) >= len(sentinels) - 1
                       and int(v.get("num-slaves", 0)) >= 1 for v in state.values()):
                    return
            except redis.RedisError as e:
                state = {"error": str(e)}
            if time.monotonic() > deadline:
                raise ControlStoreError(
                    f"the Sentinels did not find each other and the replicas within "
                    f"{timeout:g} s: {state}")
            time.sleep(0.1)
    finally:
        for c in clients:
            c.close()
