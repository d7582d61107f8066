"""Following a failover of a control-store shard: Redis replication watched by Sentinel.

A spec ``sentinel://HOST:PORT[,HOST:PORT...]/MASTER[,MASTER...]`` (the Sentinels, then one
master name per shard, in shard order; ``dpool start --head --replicas 1`` makes one)
reaches each shard's primary through redis-py's ``Sentinel.master_for``: every connection
asks the Sentinels where the primary is, so after a promotion the next one goes to it.
Every ``RedisControlStore`` built from such a spec follows a failover.

Replication is asynchronous, so a promoted replica may lack writes the old primary had
acknowledged. What puts them back:

- owners re-assert their rows: a node or global scheduler whose heartbeat is refused, or
  that a read of the registry no longer lists, registers again (``node._agent``,
  ``global_scheduler._watch``);
- ``Failover`` keeps the batched commands (and immediate location writes) this process
  sent to each shard in the last ``REPLAY_WINDOW_S``; when a shard's primary is another
  server than at its last write (seen by a flush, or by the flusher every ``CHECK_S``),
  it sends them to the new primary first, in order. They are idempotent (an event batch
  may be logged twice);
- ``incr_replicated`` waits (``WAIT 1``, up to ``WAIT_MS``) for a replica to have an id
  prefix's ``INCR``, so no prefix is handed out twice; with no replica it logs that.

Without a spec (plain ``host:port`` shards) nothing here runs; a shard that is down is
named in the ``ControlStoreError`` of every call that needs it (``down_message``).
``send`` and ``due`` run under the store's flush lock; ``_lock`` guards the kept writes.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.sentinel import Sentinel

from dpool.control import _redis_batch
from dpool.errors import ControlStoreError

log = logging.getLogger("dpool.control")

SCHEME = "sentinel://"
REPLAY_WINDOW_S = 3.0  # recent writes kept per shard, to re-send after a failover
CHECK_S = 0.5  # the flusher checks for a failover this often while writes are kept
WAIT_MS = 1000  # how long new_id_prefix waits for a replica to have its INCR


@dataclass(frozen=True)
class SentinelSpec:
    """Where the Sentinels are and which master each shard is (shard order)."""

    sentinels: tuple[tuple[str, int], ...]
    masters: tuple[str, ...]

    def __str__(self) -> str:
        return (SCHEME + ",".join(f"{h}:{p}" for h, p in self.sentinels) + "/"
                + ",".join(self.masters))


def parse_spec(shards: Sequence[str] | str) -> SentinelSpec | None:
    """The Sentinel spec in ``shards`` (a string, or a list split on commas, as ``--redis``
    and the head's welcome carry it); None for plain ``host:port`` shards."""
    text = shards if isinstance(shards, str) else ",".join(shards)
    text = text.strip()
    if not text.startswith(SCHEME):
        return None
    hosts, sep, names = text[len(SCHEME):].partition("/")
    masters = tuple(n.strip() for n in names.split(",") if n.strip())
    sentinels: list[tuple[str, int]] = []
    for a in hosts.split(","):
        host, colon, port = a.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            sentinels = []
            break
        sentinels.append((host, int(port)))
    if not sep or not masters or not sentinels:
        raise ControlStoreError(
            f"malformed Sentinel address {text!r}; expected "
            f"'sentinel://HOST:PORT[,HOST:PORT...]/MASTER[,MASTER...]' (the Sentinels, "
            f"then one master name per control-store shard)")
    return SentinelSpec(tuple(sentinels), masters)


def down_message(shard: int, nshards: int, address: str, what: str, e: Exception,
                 replicated: bool) -> str:
    """What a caller sees when a shard does not answer: which one, and what that means."""
    head = f"cannot reach control-store shard {address} (shard {shard} of {nshards}, {what})"
    cause = str(e).rstrip(".")
    if replicated:
        return (f"{head}: {cause}. Its primary is down or being replaced: Sentinel promotes its "
                f"replica within a few seconds; retry then. If this lasts, no replica is "
                f"left or the Sentinels cannot agree (check them with `dpool status`).")
    return (f"{head}: {cause}. The cluster has no replica of this shard, so while it is down "
            f"the rows stored on it are out of reach: nodes cannot join, `dpool status` "
            f"cannot list the nodes, and the lineage and object locations on it cannot be "
            f"read or written. Restart the shard (or the head); to survive this, start the "
            f"cluster with `dpool start --head --replicas 1`.")


def _sentinel_password(spec: SentinelSpec, password: str, connect_timeout: float,
                       timeout: float) -> str | None:
    """The cluster's password if the Sentinels require one (dpool's do), else None (an
    external deployment's Sentinels may have none)."""
    for host, port in spec.sentinels:
        client = redis.Redis(host=host, port=port, password=password or None,
                             socket_connect_timeout=connect_timeout, socket_timeout=timeout)
        try:
            client.ping()
            return password or None
        except redis.AuthenticationError as e:
            if "without any password" in str(e) or "no password is set" in str(e):
                return None
        except redis.RedisError:
            continue  # unreachable: ask the next one
        finally:
            client.close()
    return password or None


class Failover:
    """Per-shard clients through Sentinel, and the replay of this process's recent writes
    to a shard's new primary. ``send`` and ``due`` run under the store's flush lock."""

    def __init__(self, spec: SentinelSpec, password: str, *, connect_timeout: float,
                 timeout: float, retry: Any) -> None:
        self.spec = spec
        sentinel_pw = _sentinel_password(spec, password, connect_timeout, timeout)
        self.sentinel = Sentinel(
            list(spec.sentinels),
            sentinel_kwargs={"password": sentinel_pw, "socket_connect_timeout":
                             connect_timeout, "socket_timeout": timeout})
        self.clients: list[Any] = [
            self.sentinel.master_for(name, password=password or None,
                                     decode_responses=False,
                                     socket_connect_timeout=connect_timeout,
                                     socket_timeout=timeout, retry=retry,
                                     client_name="dpool")
            for name in spec.masters]
        sentinels = ",".join(f"{h}:{p}" for h, p in spec.sentinels)
        self.addresses = [f"{name}@sentinel:{sentinels}" for name in spec.masters]
        n = len(spec.masters)
        self._master: list[tuple | None] = [None] * n  # the primary this process last wrote
        self._recent: list[collections.deque] = [collections.deque() for _ in range(n)]
        self._lock = threading.Lock()  # _recent: the flusher and immediate writes
        self._next_check = 0.0
        self.failovers = 0  # failovers this process noticed (and replayed for)

    def send(self, shard: int, commands: list[bytes]) -> None:
        """Send a flush's ``commands`` to the shard's primary, after this process's recent
        writes if the primary changed since its last write; keep them for a later one."""
        seen: list = []
        _redis_batch.send(self.clients[shard], commands,
                          before=lambda conn: self._before(shard, conn, seen))
        self._master[shard] = seen[0]
        if commands:
            self.retain(shard, commands)
        else:
            self._prune(shard, time.monotonic())

    def _before(self, shard: int, conn: Any, seen: list) -> list[bytes]:
        address = (conn.host, int(conn.port))
        seen.append(address)
        last = self._master[shard]
        if last is None or last == address:
            return []
        with self._lock:
            replay = [c for _, batch in self._recent[shard] for c in batch]
        self.failovers += 1
        log.warning("control-store shard %d (%s) failed over from %s:%d to %s:%d: "
                    "re-sending this process's %d writes of the last %.0f s", shard,
                    self.spec.masters[shard], *last, *address, len(replay), REPLAY_WINDOW_S)
        return replay

    def retain(self, shard: int, commands: list[bytes]) -> None:
        now = time.monotonic()
        with self._lock:
            self._recent[shard].append((now, commands))
        self._prune(shard, now)

    def _prune(self, shard: int, now: float) -> None:
        cutoff = now - REPLAY_WINDOW_S
        with self._lock:
            recent = self._recent[shard]
            while recent and recent[0][0] < cutoff:
                recent.popleft()

    def due(self) -> list[int]:
        """The shards to look at now (every ``CHECK_S``, those with kept writes): the
        flusher ``send``s each nothing, which re-sends the kept writes if the primary
        changed while this process was not writing to it."""
        now = time.monotonic()
        if now < self._next_check:
            return []
        self._next_check = now + CHECK_S
        return [shard for shard, recent in enumerate(self._recent)
                if recent and self._master[shard] is not None]

    def incr_replicated(self, client: Any, key: bytes, count: int) -> int:
        """``INCRBY key count``, acknowledged by a replica (``WAIT``) when one is there."""
        pipe = client.pipeline(transaction=False)
        pipe.incrby(key, count)
        pipe.execute_command("WAIT", 1, WAIT_MS)
        value, acks = pipe.execute()
        if int(acks) < 1:
            log.warning("id prefix %d is not on a replica yet (none answered within %d ms): "
                        "a failover now could hand it out again", int(value), WAIT_MS)
        return int(value)

    def primary(self, shard: int) -> str | None:
        """The shard's primary as the Sentinels name it now (None: none agreed)."""
        try:
            host, port = self.sentinel.discover_master(self.spec.masters[shard])
        except redis.RedisError:
            return None
        return f"{host}:{port}"

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.sentinel.close()
