"""The sharded control store over replicated shards (``control._sentinel``): real
redis-server primaries, replicas and Sentinels, started and stopped here.

A shard's primary is SIGKILLed; the store follows Sentinel to the promoted replica, and a
write the primary had acknowledged but never replicated (the replica's link cut first) is
re-sent there by the process that made it.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import time

import psutil
import pytest
import redis

from dpool.control import _keys as K
from dpool.control._redis import RedisControlStore
from dpool.control._redis_server import RedisServer
from dpool.control._sentinel import SentinelSpec, parse_spec
from dpool.control._sentinel_server import sentinel_address, start_replicated
from dpool.errors import ControlStoreError, Error

IP = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((IP, 0))
        return s.getsockname()[1]


def _gone(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture
def replicated():
    """Two shards, a replica of each, three Sentinels: ``(spec, password, primaries,
    replicas)``; every server stopped at the end, also when the test fails."""
    password = secrets.token_hex(16)
    servers: list[RedisServer] = []
    try:
        primaries = []
        for _ in range(2):
            server = RedisServer(free_port(), password)
            servers.append(server)
            primaries.append(server.start(timeout=20))
        replicas, sentinels = start_replicated(
            primaries, password, ports=[free_port(), free_port()],
            sentinel_ports=[free_port() for _ in range(3)], announce_ip=IP, bind=IP,
            started=servers)
        spec = sentinel_address([s.address for s in sentinels], 2)
        yield spec, password, primaries, replicas
    finally:
        pids = [s.pid for s in servers if s.pid is not None]
        for s in reversed(servers):  # Sentinels first
            s.stop()
        assert not _gone(pids), "redis-server or sentinel processes left behind"


def _id_on(shard: int, start: int = 1) -> int:
    i = start
    while K.shard_for(i, 2) != shard:
        i += 1
    return i


def _promoted(spec: str, password: str, name: str, old_port: int, timeout: float) -> tuple:
    from redis.sentinel import Sentinel

    parsed = parse_spec(spec)
    assert parsed is not None
    sentinel = Sentinel(list(parsed.sentinels), sentinel_kwargs={"password": password,
                                                                 "socket_timeout": 1.0})
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                host, port = sentinel.discover_master(name)
                if port != old_port:
                    return host, port
            except redis.RedisError:
                pass
            time.sleep(0.05)
    finally:
        sentinel.close()
    raise AssertionError(f"Sentinel did not promote a replica of {name} in {timeout} s")


def test_parse_spec():
    spec = parse_spec("sentinel://10.0.0.5:26379,10.0.0.6:26380/s0,s1")
    assert spec == SentinelSpec((("10.0.0.5", 26379), ("10.0.0.6", 26380)), ("s0", "s1"))
    # as --redis and the head's welcome carry it: split on commas
    assert parse_spec(str(spec).split(",")) == spec
    assert parse_spec(["127.0.0.1:6381", "127.0.0.1:6382"]) is None
    for bad in ("sentinel://", "sentinel://h:1", "sentinel://h/s0", "sentinel://h:0/s0",
                "sentinel://h:1/", "sentinel://:1/s0"):
        with pytest.raises(ControlStoreError, match="malformed Sentinel address"):
            parse_spec(bad)


@pytest.mark.timeout(120)
def test_store_follows_a_failover_and_resends_an_unreplicated_write(replicated):
    spec, password, primaries, replicas = replicated
    store = RedisControlStore([spec], password, node_id="n1", timeout=1.0,
                              connect_timeout=1.0)
    try:
        kept, lost, after = _id_on(1), _id_on(1, 1000), _id_on(1, 2000)
        store.add_task(kept, 7, b"kept", None, 1)
        store.flush()
        before = store.new_id_prefix()
        # Cut the replica off (stopped, its link closed by the primary): what the primary
        # takes now is acknowledged but never replicated.
        replica = replicas[1]
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            raw = redis.Redis(host=IP, port=primaries[1].port, password=password)
            raw.client_kill_filter(_type="replica")
            raw.close()
            store.add_task(lost, 7, b"lost", None, 1)
            store.flush()  # acknowledged by the primary...
            os.kill(primaries[1].pid, signal.SIGKILL)  # ...which dies with it
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        host, port = _promoted(spec, password, "dpool-1", primaries[1].port, timeout=60)
        assert port == replica.port
        promoted = redis.Redis(host=host, port=port, password=password)
        try:
            assert promoted.exists(K.task_key(kept))  # replicated before the cut
            assert not promoted.exists(K.task_key(lost))  # really lost by the failover
            # The next flush goes to the new primary, after the writes it lost.
            store.add_task(after, 7, b"after", None, 1)
            deadline = time.monotonic() + 30
            while True:
                try:
                    store.flush()
                    break
                except ControlStoreError:
                    assert time.monotonic() < deadline, "no write succeeded after failover"
                    time.sleep(0.05)
            assert promoted.hget(K.task_key(lost), b"args") == b"lost"
            assert promoted.hget(K.task_key(after), b"args") == b"after"
        finally:
            promoted.close()
        assert store.get_task(lost).args == b"lost"
        assert store._failover is not None and store._failover.failovers == 1
        # shard 0 was not touched; id prefixes still never repeat
        assert store.new_id_prefix() > before
        info = store.shard_info()
        assert [i["alive"] for i in info] == [True, True]
        assert info[1]["primary"] == f"{IP}:{replica.port}" and info[1]["replicas"] == 0
        assert info[0]["replicas"] == 1
    finally:
        store.close()


def test_replicas_run_their_timers_at_1_hz_as_the_primaries(replicated):
    """An idle replica at Redis's default 10 Hz cost as much as a node daemon
    (bench/IDLE.md): replicas run at 1 Hz like the primaries, and still follow them."""
    _, password, primaries, replicas = replicated
    for server in primaries + replicas:
        client = redis.Redis(host=IP, port=server.port, password=password)
        try:
            assert client.config_get("hz") == {"hz": "1"}, server
            if server in replicas:
                deadline = time.monotonic() + 10
                while client.info("replication").get("master_link_status") != "up":
                    assert time.monotonic() < deadline, f"{server}: link to its primary not up"
                    time.sleep(0.05)
        finally:
            client.close()


@pytest.mark.timeout(120)
def test_flusher_resends_after_a_failover_while_idle(replicated):
    """A process that writes nothing after the failover still re-sends what it lost (its
    flusher checks the primary while it keeps recent writes)."""
    spec, password, primaries, replicas = replicated
    store = RedisControlStore([spec], password, node_id="n1", timeout=1.0,
                              connect_timeout=1.0)
    try:
        lost = _id_on(1, 5000)
        replica = replicas[1]
        store.start_flusher()
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            raw = redis.Redis(host=IP, port=primaries[1].port, password=password)
            raw.client_kill_filter(_type="replica")
            raw.close()
            store.add_object(lost, 123, "host")
            store.flush()
            os.kill(primaries[1].pid, signal.SIGKILL)
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        host, port = _promoted(spec, password, "dpool-1", primaries[1].port, timeout=60)
        promoted = redis.Redis(host=host, port=port, password=password)
        try:
            deadline = time.monotonic() + 20
            while not promoted.exists(K.object_key(lost)):
                assert time.monotonic() < deadline, "the lost write was not re-sent"
                time.sleep(0.05)
            assert promoted.smembers(K.locations_key(lost)) == {b"n1"}
        finally:
            promoted.close()
    finally:
        store.close()


def test_a_shard_down_without_replicas_is_named_with_what_is_degraded():
    password = secrets.token_hex(16)
    servers = [RedisServer(free_port(), password).start(timeout=20) for _ in range(2)]
    try:
        addresses = [s.address for s in servers]
        store = RedisControlStore(addresses, password, timeout=1.0, connect_timeout=1.0)
        try:
            servers[1].stop()
            info = store.shard_info()
            assert info[0]["alive"] and not info[1]["alive"]
            assert info[1]["shard"] == 1 and "nodes cannot join" in info[1]["degraded"]
        finally:
            store.close()
        # a node joining now: a typed error naming the shard and what it means
        with pytest.raises(ControlStoreError) as ei:
            RedisControlStore(addresses, password, timeout=1.0, connect_timeout=1.0)
        msg = str(ei.value)
        assert isinstance(ei.value, Error)
        assert f"shard {addresses[1]} (shard 1 of 2, PING)" in msg
        assert "no replica of this shard" in msg and "--replicas 1" in msg
    finally:
        for s in servers:
            s.stop()


@pytest.mark.timeout(120)
def test_an_external_deployment_whose_sentinels_have_no_password():
    """``--redis-address sentinel://...`` of a deployment whose Sentinels ask for no
    password (the masters still ask for the cluster's): the store works and follows a
    failover there too."""
    password = secrets.token_hex(16)
    servers: list[RedisServer] = []
    try:
        primaries = []
        for _ in range(2):
            server = RedisServer(free_port(), password)
            servers.append(server)
            primaries.append(server.start(timeout=20))
        _, sentinels = start_replicated(
            primaries, password, ports=[free_port(), free_port()],
            sentinel_ports=[free_port() for _ in range(3)], announce_ip=IP, bind=IP,
            started=servers, sentinel_password=False)
        spec = sentinel_address([s.address for s in sentinels], 2)
        with RedisControlStore(spec.split(","), password, timeout=1.0,
                               connect_timeout=1.0) as store:
            tid = _id_on(1)
            store.add_task(tid, 3, b"a", None, 1)
            store.flush()
            os.kill(primaries[1].pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while True:
                try:
                    assert store.get_task(tid).args == b"a"
                    break
                except ControlStoreError:
                    assert time.monotonic() < deadline, "no failover"
                    time.sleep(0.05)
    finally:
        pids = [s.pid for s in servers if s.pid is not None]
        for s in reversed(servers):
            s.stop()
        assert not _gone(pids)
