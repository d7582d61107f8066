"""The cluster's control store: ``ControlStore`` over N sharded Redis servers.

::

    caller thread(s)                    flush() (caller's IO loop or start_flusher's thread)
    ┌──────────────────────┐  append   ┌─────────┐  group by shard_for(id)   ┌──────────┐
    │ add_task, log_event, │─────────▶│  deque   │─────────────────────────▶│ shard 0  │
    │ set_task_state, ...  │  (1 op)   └─────────┘  one pipelined buffer     │ shard 1  │
    └──────────────────────┘                         per shard (_redis_batch) │ ...      │
    reads (get_task, nodes, ...) ── flush first, then straight to the shard ─▶└──────────┘

A write of the ``ControlStore`` interface costs its caller one deque append; ``flush``
(under ``_flush_lock``) sends the backlog as one pipelined buffer per shard, with the
flush's events as ONE entry of each shard's event stream (``_keys.pack_events``).
Cluster operations (registry and heartbeats: ``_registry``; object locations; pub/sub)
are immediate. Reads flush first: a read sees this process's writes.

Replicated shards (``sentinel://...`` addresses): each shard's client follows its primary
through Sentinel, and what a failover can lose is re-sent or re-asserted (``_sentinel``).

Failures: every redis-py error becomes a ``ControlStoreError`` naming the shard. A flush
that fails puts the failed shards' ops back at the front of the queue for the next flush;
table writes are idempotent, and an event batch may be logged twice.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dpool.control import _keys as K
from dpool.control import _redis_batch, _sentinel
from dpool.control._redis_observe import ObserveReads
from dpool.control._redis_pubsub import PubSub, Subscription
from dpool.control._registry import Registry
from dpool.control._task_record import TaskRecord
from dpool.errors import ControlStoreError

log = logging.getLogger("dpool.control")

EVENT_LOG_ENTRIES = 20_000  # per shard; each entry is one flush's events (MAXLEN ~)
_FLUSHER_IDLE_S = 1.0  # the longest sleep of a flusher with nothing queued
# compare-and-set / compare-and-delete of one key (the actor directory)
_SWAP = "if redis.call('GET', KEYS[1]) == ARGV[1] then " \
        "redis.call('SET', KEYS[1], ARGV[2]) return 1 end return 0"
_DELETE_IF = "if redis.call('GET', KEYS[1]) == ARGV[1] then " \
             "return redis.call('DEL', KEYS[1]) end return 0"


def _parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ControlStoreError(
            f"malformed control-store shard address {address!r}; expected 'host:port'")
    return host, int(port)


class RedisControlStore(ObserveReads, PubSub, Registry):
    """``ControlStore`` over Redis shards ``["host:port", ...]`` sharing one password.

    ``node_id`` is written into the task rows this process adds. Construction PINGs every
    shard (``check=False`` skips it). ``connect_timeout`` and ``timeout`` (seconds) bound
    every call: an unreachable or silent shard raises ``ControlStoreError`` within them.
    """

    def __init__(self, shards: Sequence[str], password: str, *, node_id: str = "",
                 connect_timeout: float = 2.0, timeout: float = 3.0,
                 event_log_entries: int = EVENT_LOG_ENTRIES, check: bool = True) -> None:
        if not shards:
            raise ControlStoreError("a control store needs at least one shard address")
        spec = _sentinel.parse_spec(shards)
        self.addresses = list(shards)
        self.node_id = node_id
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._has_password = bool(password)
        self._event_cap = event_log_entries
        # One retry, on a dropped connection only (a server restart): a timeout is not
        # retried, so a silent shard costs at most ``timeout``, not a multiple of it.
        retry = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
        # Any: redis-py's annotations cannot tell that decode_responses=False means bytes
        self._clients: list[Any] = []
        # with replicas: the clients follow each shard's primary through Sentinel
        self._failover: _sentinel.Failover | None = None
        if spec is not None:
            self._failover = _sentinel.Failover(spec, password, connect_timeout=connect_timeout,
                                                timeout=timeout, retry=retry)
            self.addresses = self._failover.addresses
            self._clients = self._failover.clients
        else:
            for address in self.addresses:
                host, port = _parse_address(address)
                self._clients.append(redis.Redis(
                    host=host, port=port, password=password, decode_responses=False,
                    socket_connect_timeout=connect_timeout, socket_timeout=timeout,
                    retry=retry, client_name="dpool"))
        self._n = len(self._clients)
        self._ops: collections.deque = collections.deque()
        self._flush_lock = threading.Lock()
        self._flusher: threading.Thread | None = None
        self._stop_flusher = threading.Event()
        # The flusher sleeps while nothing is queued; a write that finds it asleep wakes
        # it (the flag is read after the append: see ``_flush_loop``).
        self._flusher_idle = False
        self._flush_wake = threading.Event()
        ops, wake = self._ops, self._flush_wake

        def push(op: tuple) -> None:
            ops.append(op)
            if self._flusher_idle:
                wake.set()

        self._push = push
        self._subscriptions: list[Subscription] = []
        if check:
            try:
                for shard in range(self._n):
                    with self._errors(shard, "PING"):
                        self._clients[shard].ping()
            except BaseException:
                for client in self._clients:
                    client.close()
                if self._failover is not None:
                    self._failover.sentinel.close()
                raise

    # -- plumbing ------------------------------------------------------------------------
    def _auth_error(self, address: str, e: Exception) -> ControlStoreError:
        if not self._has_password:
            return ControlStoreError(
                f"control-store shard {address} requires a password and none was given; "
                f"pass the cluster's password")
        return ControlStoreError(
            f"control-store shard {address} refused the password ({e}); check the "
            f"cluster's password")

    @contextlib.contextmanager
    def _errors(self, shard: int, what: str) -> Iterator[None]:
        address = self.addresses[shard]
        try:
            yield
        except redis.AuthenticationError as e:
            raise self._auth_error(address, e) from e
        except redis.TimeoutError as e:
            raise ControlStoreError(
                f"control-store shard {address} did not answer {what} in time (connect "
                f"timeout {self.connect_timeout} s, reply timeout {self.timeout} s)") from e
        except redis.ConnectionError as e:
            raise ControlStoreError(_sentinel.down_message(
                shard, len(self.addresses), address, what, e,
                self._failover is not None)) from e
        except redis.ResponseError as e:
            if str(e).startswith(("WRONGPASS", "NOAUTH", "invalid password")):
                raise self._auth_error(address, e) from e
            raise ControlStoreError(f"control-store shard {address} failed {what}: {e}") from e
        except redis.RedisError as e:
            raise ControlStoreError(f"control-store shard {address} failed {what}: {e}") from e

    def _shard(self, key_id: K.Id) -> int:
        return K.shard_for(key_id, self._n)

    def _run(self, shard: int, what: str, fill: Callable[[Any], object]) -> list:
        """One pipeline to ``shard``: ``fill(pipe)`` queues commands; returns the replies."""
        with self._errors(shard, what):
            pipe = self._clients[shard].pipeline(transaction=False)
            fill(pipe)
            return pipe.execute()

    # -- ControlStore writes: one deque append each --------------------------------------
    def register_function(self, fn_id: int, name: str, payload: bytes) -> None:
        self._push((0, fn_id, name, payload))

    def add_task(self, task_id: int, fn_id: int, args: bytes | None, dep_ids: tuple | None,
                 group_id: int, at: float | None = None, worker_id: int = 0) -> None:
        self._push((1, task_id, fn_id, args, dep_ids, group_id, at, worker_id))

    def set_task_state(self, task_id: int, state: str, attempts: int,
                       at: float | None = None, error: bytes | None = None,
                       size: int | None = None) -> None:
        """``error``: a failed task's error payload (its traceback text is read off the
        task's path, when flushed); ``size``: the bytes its result takes in the store
        (``dpool objects`` shows it while the result is held)."""
        if error is None and size is None:
            self._push((2, task_id, state, attempts, at))
        else:
            self._push((2, task_id, state, attempts, at, error, size))

    def add_call_edge(self, task_id: int, after: int) -> None:
        self._push((9, task_id, after))

    def add_object(self, object_id: int, size: int, location: str) -> None:
        self._push((3, object_id, size, location))

    def remove_object(self, object_id: int) -> None:
        self._push((4, object_id))

    def add_copy(self, object_id: int, node_id: str) -> None:
        """Node ``node_id`` keeps a copy of the object (batched; listed by
        ``object_locations`` while the object's holder has it)."""
        self._push((6, object_id, node_id))

    def remove_copy(self, object_id: int, node_id: str) -> None:
        self._push((7, object_id, node_id))

    def log_event(self, task_id: int, kind: str, t: float, worker_id: int) -> None:
        self._push((5, task_id, kind, t, worker_id))

    def backlog(self) -> int:
        return len(self._ops)

    def flush(self) -> None:
        """Send the queued writes: one buffer per shard. Raises ``ControlStoreError``
        if a shard fails; its ops stay queued (at the front) for the next flush."""
        # Take the lock even when the queue is empty: another thread (the flusher) may
        # have popped this thread's writes and still be sending them; returning before it
        # is done would let a read miss them.
        with self._flush_lock:
            ops = self._ops
            if not ops:
                return
            batch = [ops.popleft() for _ in range(len(ops))]
            by_shard: dict[int, list] = {}
            n = self._n
            for op in batch:
                by_shard.setdefault(K.shard_for(op[1], n) if n > 1 else 0, []).append(op)
            unsent = set(by_shard)
            error: ControlStoreError | None = None
            node_id = self.node_id.encode()
            try:
                for shard, shard_ops in by_shard.items():
                    commands = self._encode(shard_ops, node_id)
                    try:
                        with self._errors(shard, "a batched write"):
                            if self._failover is None:
                                _redis_batch.send(self._clients[shard], commands)
                            else:
                                self._failover.send(shard, commands)
                        unsent.discard(shard)
                    except ControlStoreError as e:
                        error = error or e
            finally:  # also on an interrupt: nothing popped is forgotten
                if unsent:
                    ops.extendleft(reversed([op for op in batch
                                             if (K.shard_for(op[1], n) if n > 1 else 0)
                                             in unsent]))
            if error is not None:
                raise error

    def _encode(self, ops: list, node_id: bytes) -> list[bytes]:
        try:
            return _redis_batch.encode_ops(ops, node_id, self._event_cap)
        except Exception:  # noqa: BLE001 - found and logged one by one below
            log.debug("a batch of %d control-store writes failed to encode", len(ops))
        # A write with a value of the wrong type (a caller's bug): drop just that one, so
        # it cannot block the queue forever or take the other writes down with it.
        commands = []
        for op in ops:
            try:
                commands += _redis_batch.encode_ops([op], node_id, self._event_cap)
            except Exception:
                log.exception("dropped a control-store write that cannot be encoded: %.200r",
                              op)
        return commands

    def _flush_before_read(self) -> None:
        # Reads see this process's writes; a shard that cannot take them must not fail a
        # read from another shard (a read from that shard raises on its own).
        try:
            self.flush()
        except ControlStoreError as e:
            log.debug("read without flushing: %s", e)

    def start_flusher(self, interval: float = 0.005) -> None:
        """Flush every ``interval`` seconds from a daemon thread (until ``close``)."""
        if self._flusher is not None:
            return
        self._stop_flusher.clear()
        self._flusher = threading.Thread(target=self._flush_loop, args=(interval,),
                                         name="dpool-control-flusher", daemon=True)
        self._flusher.start()

    def _flush_loop(self, interval: float) -> None:
        wait = interval
        ops = self._ops
        idle_s = _FLUSHER_IDLE_S if self._failover is None else min(_FLUSHER_IDLE_S, 0.5)
        while not self._stop_flusher.is_set():
            if not ops:
                # Nothing queued: sleep until a write wakes us (an idle node daemon must
                # cost no CPU: bench/IDLE.md). The flag goes up before the last
                # look at the queue, and a writer looks at the flag after its append, so
                # no write is left behind. The timeout: ops a failed flush put back (not
                # pushed), and the failover check of replicated shards.
                self._flusher_idle = True
                if not ops:
                    self._flush_wake.wait(idle_s)
                self._flusher_idle = False
                self._flush_wake.clear()
                if not ops:
                    if self._failover is not None:
                        self._try_failover_check()
                    continue
            if self._stop_flusher.wait(wait):  # let a batch gather, as before
                break
            try:
                self.flush()
                if self._failover is not None:
                    self._check_failover()
                wait = interval
            except ControlStoreError as e:
                wait = min(max(wait * 2, 0.1), 2.0)
                log.warning("control-store flush failed (%d ops queued, retry in %.1f s): %s",
                            len(self._ops), wait, e)

    def _try_failover_check(self) -> None:
        try:
            self._check_failover()
        except ControlStoreError as e:
            log.warning("control-store failover check failed: %s", e)

    def _check_failover(self) -> None:
        """Re-send recent writes to a shard whose primary changed while this process was
        not writing to it (``_sentinel``)."""
        assert self._failover is not None
        with self._flush_lock:
            for shard in self._failover.due():
                with self._errors(shard, "a failover check"):
                    self._failover.send(shard, [])

    def close(self) -> None:
        """Stop the flusher and listeners, send what is queued (best effort), disconnect."""
        if self._flusher is not None:
            self._stop_flusher.set()
            self._flush_wake.set()
            self._flusher.join(5.0)
            self._flusher = None
        try:
            self.flush()
        except ControlStoreError as e:
            log.warning("control store closed with %d writes unsent: %s", len(self._ops), e)
        for sub in self._subscriptions:
            sub.stop()
        self._subscriptions = []
        for client in self._clients:
            client.close()
        if self._failover is not None:
            self._failover.sentinel.close()

    def __enter__(self) -> RedisControlStore:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- ControlStore reads: flush, then straight to the shard ---------------------------
    def get_task(self, task_id: int) -> TaskRecord | None:
        self._flush_before_read()
        shard = self._shard(task_id)
        with self._errors(shard, "get_task"):
            row = self._clients[shard].hgetall(K.task_key(task_id))
        if not row or b"fn" not in row:
            return None
        deps = row.get(b"deps")
        return TaskRecord(task_id, int(row[b"fn"]), row.get(b"args"),
                          K.unpack_ids(deps) if deps else (), int(row[b"group"]),
                          row[b"state"].decode(), int(row[b"att"]), (task_id,),
                          int(row.get(b"after", 0)))

    def get_function(self, fn_id: int) -> bytes | None:
        self._flush_before_read()
        shard = self._shard(fn_id)
        with self._errors(shard, "get_function"):
            return self._clients[shard].hget(K.fn_key(fn_id), b"payload")

    # -- code packages ---------------------------------------------------------------------
    def put_workdir(self, digest: str, archive: bytes, ttl_s: int = 7 * 24 * 3600) -> None:
        """Store a packed working directory once (by content hash) for other nodes."""
        shard = self._shard(digest)
        with self._errors(shard, "put_workdir"):
            self._clients[shard].set(K.workdir_key(digest), archive, ex=ttl_s, nx=True)

    def get_workdir(self, digest: str) -> bytes | None:
        shard = self._shard(digest)
        with self._errors(shard, "get_workdir"):
            return self._clients[shard].get(K.workdir_key(digest))

    def put_value(self, key: str, value: bytes, ttl_s: float) -> None:
        """Set ``key`` of the small key-value table for ``ttl_s`` seconds."""
        shard = self._shard(key)
        with self._errors(shard, "put_value"):
            self._clients[shard].set(K.kv_key(key), value, px=max(1, int(ttl_s * 1000)))

    def get_value(self, key: str) -> bytes | None:
        shard = self._shard(key)
        with self._errors(shard, "get_value"):
            return self._clients[shard].get(K.kv_key(key))

    # -- the actor directory (named actors) ---------------------------------------------
    def claim_actor_name(self, name: str, record: bytes,
                         stale: Callable[[bytes], bool]) -> bytes | None:
        """Give ``name`` to the actor ``record``: None, or the record of the actor that
        holds it (taken over instead when ``stale(record)`` says that one is gone)."""
        shard = self._shard(name)
        key = K.actor_key(name)
        with self._errors(shard, "claim_actor_name"):
            client = self._clients[shard]
            for _ in range(3):
                if client.set(key, record, nx=True):
                    return None
                have = client.get(key)
                if have is None:
                    continue  # (released meanwhile)
                if not stale(have):
                    return bytes(have)
                if client.eval(_SWAP, 1, key, have, record):
                    return None
            return bytes(client.get(key) or b"")

    def find_actor_name(self, name: str) -> bytes | None:
        shard = self._shard(name)
        with self._errors(shard, "find_actor_name"):
            return self._clients[shard].get(K.actor_key(name))

    def release_actor_name(self, name: str, record: bytes) -> None:
        """Free ``name`` if ``record`` still holds it."""
        shard = self._shard(name)
        with self._errors(shard, "release_actor_name"):
            self._clients[shard].eval(_DELETE_IF, 1, K.actor_key(name), record)

    def get_object(self, object_id: int) -> tuple[int, str] | None:
        """``(size, a location)``, or None if the object is unknown or has no copy left."""
        size, locations = self.object_locations(object_id)
        if not locations:
            return None
        return size, min(locations)

    def events(self) -> list[tuple[int, str, float, int]]:
        """Every logged event still in the capped streams, oldest first."""
        self._flush_before_read()
        out: list[tuple[int, str, float, int]] = []
        for shard in range(self._n):
            with self._errors(shard, "XRANGE events"):
                entries = self._clients[shard].xrange(K.EVENTS)
            for _entry_id, fields in entries:
                out.extend(K.unpack_events(fields[b"e"]))
        out.sort(key=lambda e: e[2])
        return out

    # -- ids -------------------------------------------------------------------------------
    def new_id_prefix(self, count: int = 1) -> int:
        """A prefix no other process got (one INCR): ids are ``make_id(prefix, counter)``.
        With ``count``, the first of that many consecutive prefixes (one INCRBY)."""
        with self._errors(K.SINGLETON_SHARD, "INCR id prefix"):
            client = self._clients[K.SINGLETON_SHARD]
            if self._failover is None:
                last = int(client.incrby(K.ID_PREFIX_COUNTER, count))
            else:  # never handed out twice: a replica must have it (WAIT)
                last = self._failover.incr_replicated(client, K.ID_PREFIX_COUNTER, count)
        prefix = last - count + 1
        if last >= K.ID_PREFIX_LIMIT:
            raise ControlStoreError(
                f"the cluster ran out of id prefixes ({prefix}); restart its control store")
        return prefix

    # -- object table (immediate) -----------------------------------------------------------
    def add_object_location(self, object_id: int, node_id: str, size: int) -> None:
        """Record a copy on ``node_id`` and publish an object-ready notice (one pipeline)."""
        def fill(p: Any) -> None:
            p.hset(K.object_key(object_id), b"size", size)
            p.sadd(K.locations_key(object_id), node_id)
            p.publish(K.CH_OBJECT_READY, K.object_ready_message(object_id, size, node_id))
        self._run(self._shard(object_id), "add_object_location", fill)
        if self._failover is not None:  # re-sent to a new primary after a failover
            self._failover.retain(self._shard(object_id), [
                _redis_batch.pack((b"HSET", K.object_key(object_id), b"size", b"%d" % size)),
                _redis_batch.pack((b"SADD", K.locations_key(object_id), node_id.encode()))])

    def remove_object_location(self, object_id: int, node_id: str) -> None:
        shard = self._shard(object_id)
        with self._errors(shard, "remove_object_location"):
            self._clients[shard].srem(K.locations_key(object_id), node_id)

    def object_locations(self, object_id: int) -> tuple[int, set[str]]:
        """``(size, node ids holding a copy)``; ``(0, set())`` for an unknown object."""
        self._flush_before_read()
        replies = self._run(self._shard(object_id), "object_locations", lambda p: (
            p.hget(K.object_key(object_id), b"size"),
            p.smembers(K.locations_key(object_id))))
        size, members = replies
        if size is None:
            return 0, set()
        return int(size), {m.decode() for m in members}

    # -- pub/sub ------------------------------------------------------------------------------
    # -- status -------------------------------------------------------------------------------
    def shard_info(self) -> list[dict]:
        """Per shard: ``shard`` (its index), ``address``, ``alive`` (PING),
        ``used_memory``, ``keys``, ``replicas`` (connected to its primary); with Sentinel
        also ``primary`` (its address now); ``error`` and ``degraded`` (what is out of
        reach) instead when the shard does not answer. Never raises."""
        out = []
        for shard, address in enumerate(self.addresses):
            row: dict = {"shard": shard, "address": address}
            if self._failover is not None:
                row["primary"] = self._failover.primary(shard)
            try:
                ping, memory, keys, repl = self._run(shard, "status", lambda p: (
                    p.ping(), p.info("memory"), p.dbsize(), p.info("replication")))
                row.update(alive=bool(ping), used_memory=int(memory["used_memory"]),
                           keys=int(keys), replicas=int(repl.get("connected_slaves", 0)))
            except ControlStoreError as e:
                row.update(alive=False, error=str(e), degraded=(
                    "failing over to its replica" if self._failover is not None else
                    "no replica: nodes cannot join; the node rows, lineage and object "
                    "locations on this shard are out of reach until it is back"))
            out.append(row)
        return out
