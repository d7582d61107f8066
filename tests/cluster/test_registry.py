"""The registries read in one view, and who declares a node dead.

``cluster_view`` gives what ``global_schedulers()`` and ``nodes()`` give, in fewer round
trips (an idle daemon's CPU was mostly these reads: issue 21), and carries a global
scheduler's heartbeat. A real ``GlobalScheduler`` reads the view when a heartbeat could
first have aged out (and when a node it does not count alive links or reports) and marks
a node that stopped heartbeating dead, which publishes the notice every node acts on; a
node whose link closes and whose address refuses connections is declared dead at once,
heartbeats or not (its peers here: fake nodes on real authenticated links)."""

from __future__ import annotations

import math
import secrets
import socket
import threading
import time

import pytest
import redis

from dpool.control import _keys as K
from dpool.control._redis import RedisControlStore
from dpool.global_scheduler._daemon import GlobalScheduler
from dpool.node._links import dial, peer_hello

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store(shards):
    addresses, password, _ = shards
    for a in addresses:
        host, port = a.rsplit(":", 1)
        with redis.Redis(host=host, port=int(port), password=password) as r:
            r.flushall()
    s = RedisControlStore(addresses, password, node_id="registry-test")
    yield s
    s.close()


def _without_age(rows: list) -> list:
    return [{k: v for k, v in r.items() if k != "age"} for r in rows]


def test_the_view_is_both_tables_in_one_trip_per_shard_and_one_more(store, shards):
    names = [f"node-{i}" for i in range(8)]
    assert len({K.shard_for(n, 2) for n in names}) == 2  # rows on both shards
    for i, n in enumerate(names):
        store.register_node(n, {"address": f"127.0.0.{i + 2}:7000", "num_cpus": i})
    store.register_global_scheduler("gs-1", "127.0.0.1:9001")
    store.register_global_scheduler("gs-2", "127.0.0.1:9002")
    store.mark_node_dead("node-3")

    trips = []
    run = store._run
    store._run = lambda shard, what, fill: trips.append(shard) or run(shard, what, fill)
    try:
        view = store.cluster_view()
    finally:
        del store._run
    assert sorted(trips) == [0, 0, 1]  # the listings, then each shard's rows
    assert view.beat is None
    assert _without_age(view.global_schedulers) == _without_age(store.global_schedulers())
    assert _without_age(view.nodes) == _without_age(store.nodes())
    assert [r["node_id"] for r in view.nodes] == sorted(names)
    assert [r["node_id"] for r in view.nodes if not r["alive"]] == ["node-3"]

    before = {r["gs_id"]: r["heartbeat"] for r in view.global_schedulers}
    time.sleep(0.05)
    view = store.cluster_view(gs_beat="gs-2")
    assert view.beat is True
    after = {r["gs_id"]: r["heartbeat"] for r in view.global_schedulers}
    assert after["gs-2"] > before["gs-2"] and after["gs-1"] == before["gs-1"]
    store.unregister_global_scheduler("gs-2")
    view = store.cluster_view(gs_beat="gs-2")
    assert view.beat is False  # refused: register again
    assert [r["gs_id"] for r in view.global_schedulers] == ["gs-1"]


def test_an_empty_cluster_has_an_empty_view(store):
    assert store.cluster_view(gs_beat="gs-x") == ([], [], False)


def test_the_global_scheduler_declares_a_silent_node_dead(store, shards):
    addresses, password, _ = shards
    store.register_node("silent", {"address": "127.0.0.9:7000", "num_cpus": 1})
    store.register_node("beating", {"address": "127.0.0.10:7000", "num_cpus": 1})
    notices: list = []
    got = threading.Event()

    def on_notice(channel: str, data: bytes) -> None:
        notices.append(K.parse_node_dead(data))
        got.set()

    sub = store.subscribe([K.CH_NODE_DEAD], on_notice)
    control = RedisControlStore(addresses, password)
    gs = GlobalScheduler(secrets.token_bytes(16), "127.0.0.1", 0, control)
    try:
        gs.serve()
        t0 = time.monotonic()
        while not got.is_set() and time.monotonic() - t0 < 20:
            assert store.heartbeat("beating", {})
            got.wait(0.2)
        assert notices == ["silent"]
        rows = {r["node_id"]: r for r in store.nodes()}
        assert rows["silent"]["dead"] and not rows["beating"]["dead"]
        # a row marked once is not marked (nor announced) again: two more reads
        reads = gs._watch.reads
        t0 = time.monotonic()
        while gs._watch.reads < reads + 2 and time.monotonic() - t0 < 20:
            assert store.heartbeat("beating", {})
            time.sleep(0.2)
        assert gs._watch.reads >= reads + 2
        assert notices == ["silent"]
        assert gs._watch is not None and gs._watch.alive == {"127.0.0.10:7000"}
    finally:
        gs.close()
        sub.stop()
        control.close()


def test_a_node_whose_link_closes_and_whose_address_refuses_is_dead_at_once(store, shards):
    addresses, password, _ = shards
    token = secrets.token_bytes(16)
    listeners = {name: socket.create_server(("127.0.0.1", 0)) for name in ("gone", "alive")}
    where = {name: f"127.0.0.1:{lst.getsockname()[1]}" for name, lst in listeners.items()}
    for name, address in where.items():
        store.register_node(name, {"address": address, "num_cpus": 1})
    notices: list = []
    sub = store.subscribe([K.CH_NODE_DEAD],
                          lambda ch, data: notices.append(K.parse_node_dead(data)))
    control = RedisControlStore(addresses, password)
    gs = GlobalScheduler(token, "127.0.0.1", 0, control)
    links = []
    try:
        gs.serve()
        for name in ("gone", "alive"):
            links.append(dial(gs.address, token,
                              peer_hello(name, where[name], 1))[0])
        # both keep heartbeating: only the probe can find "gone" dead
        listeners["gone"].close()
        for chan in links:
            chan.close()
        closed = time.monotonic()
        while time.monotonic() - closed < 20 and not notices:
            store.heartbeat("gone", {})  # (refused once it is marked)
            assert store.heartbeat("alive", {})
            time.sleep(0.05)
        # not by age: both heartbeat every 50 ms, so only the probe can have found it
        assert notices == ["gone"]
        time.sleep(1.0)  # "alive" still listens: its closed link alone is no verdict
        assert store.heartbeat("alive", {})
        assert notices == ["gone"]
    finally:
        gs.close()
        sub.stop()
        control.close()
        for lst in listeners.values():
            lst.close()


def test_a_node_whose_listener_closes_just_after_its_link_is_dead_at_once(store, shards):
    """A process being killed closes its sockets one by one: its link may close a moment
    before its listening socket, and a probe in between is accepted. The probe tries
    again, so the node is still found dead by the probe, not seconds later by age (it
    keeps heartbeating here: only the probe can find it). Here the listener takes the
    first probe and closes."""
    addresses, password, _ = shards
    token = secrets.token_bytes(16)
    lst = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{lst.getsockname()[1]}"
    store.register_node("dying", {"address": address, "num_cpus": 1})
    notices: list = []
    sub = store.subscribe([K.CH_NODE_DEAD],
                          lambda ch, data: notices.append(K.parse_node_dead(data)))
    knocked = threading.Event()

    def accept_one_then_close() -> None:  # the first probe gets in; then no listener
        try:
            conn, _ = lst.accept()
            conn.close()
            knocked.set()
        except OSError:
            pass
        finally:
            lst.close()

    control = RedisControlStore(addresses, password)
    gs = GlobalScheduler(token, "127.0.0.1", 0, control)
    try:
        gs.serve()
        threading.Thread(target=accept_one_then_close, daemon=True).start()
        chan = dial(gs.address, token, peer_hello("dying", address, 1))[0]
        chan.close()  # the link first, its listener once the probe got in
        assert knocked.wait(20)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 20 and not notices:
            store.heartbeat("dying", {})  # (refused once it is marked)
            time.sleep(0.05)
        assert notices == ["dying"]
    finally:
        gs.close()
        sub.stop()
        control.close()
        lst.close()


def test_a_node_that_leaves_is_not_declared_dead(store):
    """A row removed (``dpool stop``: the node leaves the table before its links close)
    is not marked, and no notice goes out."""
    store.register_node("leaving", {"address": "127.0.0.1:1", "num_cpus": 1})
    store.remove_node("leaving")
    assert not store.mark_node_dead("leaving")
    assert store.nodes() == []


def test_the_next_read_comes_when_the_stalest_heartbeat_could_age_out():
    """A global scheduler reads the node table when a verdict could first be due, not
    every beat: the least time an alive node has left before ``DEAD_AFTER``."""
    from dpool.control._registry import DEAD_AFTER, READ_MARGIN_S, next_read_s

    rows = [{"age": 0.25, "alive": True}, {"age": 0.75, "alive": True},
            {"age": 9.0, "alive": False}, {"age": 2.0, "alive": False, "dead": True}]
    assert next_read_s(rows) == pytest.approx(DEAD_AFTER - 0.75 + READ_MARGIN_S)
    assert next_read_s([]) == pytest.approx(DEAD_AFTER + READ_MARGIN_S)
    assert next_read_s(rows[2:]) == pytest.approx(DEAD_AFTER + READ_MARGIN_S)
    # a heartbeat already older than the limit (a late beat): read again at once
    assert next_read_s([{"age": DEAD_AFTER + 1, "alive": True}]) == READ_MARGIN_S


def test_a_node_heard_that_the_last_read_did_not_show_alive_wakes_a_read(store):
    from dpool.control._registry import BEAT_S
    from dpool.global_scheduler._watch import NodeWatch

    watch = NodeWatch(store, "gs-w", lambda: None)  # (its thread not started)
    watch.heard("127.0.0.5:7000")  # nothing read yet: every linked node counts
    assert not watch._wake.is_set()
    watch.alive = {"127.0.0.5:7000"}
    watch.heard("127.0.0.5:7000")
    assert not watch._wake.is_set()
    watch.heard("127.0.0.6:7000")  # joined (or came back) since the last read
    assert watch._wake.is_set()
    asked = watch._read_by
    assert asked <= time.monotonic()  # now
    watch._wake.clear()
    watch.heard("127.0.0.6:7000")  # its next report, the read not done yet: nothing more
    assert not watch._wake.is_set() and watch._read_by == asked
    watch._read_by = math.inf  # (the read is done; the node is still not alive in it)
    watch.heard("127.0.0.6:7000")  # within the beat: a read at the beat's end, not never
    assert watch._wake.is_set() and watch._read_by == asked + BEAT_S


def test_a_global_scheduler_that_registers_is_announced(store):
    """Nodes link to a new global scheduler on its notice (its address), not at their
    next read."""
    got: list = []
    heard = threading.Event()
    sub = store.subscribe([K.CH_SCHEDULER_UP],
                          lambda ch, data: (got.append((ch, data)), heard.set()))
    try:
        store.register_global_scheduler("gs-new", "127.0.0.1:9009")
        assert heard.wait(10)
        assert got == [(K.CH_SCHEDULER_UP, K.scheduler_up_message("127.0.0.1:9009"))]
        assert K.parse_scheduler_up(got[0][1]) == "127.0.0.1:9009"
        assert [g["gs_id"] for g in store.global_schedulers()] == ["gs-new"]
    finally:
        sub.stop()


def test_a_node_that_links_after_the_first_read_gets_tasks(store, shards):
    """The scheduler's first read finds no node; one that registers and links later is
    counted alive (its link wakes a read), and a node that then goes silent is dead."""
    addresses, password, _ = shards
    token = secrets.token_bytes(16)
    lst = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{lst.getsockname()[1]}"
    notices: list = []
    sub = store.subscribe([K.CH_NODE_DEAD],
                          lambda ch, data: notices.append(K.parse_node_dead(data)))
    control = RedisControlStore(addresses, password)
    gs = GlobalScheduler(token, "127.0.0.1", 0, control)
    chan = None
    try:
        gs.serve()
        assert gs._watch is not None
        t0 = time.monotonic()
        while gs._watch.alive is None and time.monotonic() - t0 < 20:
            time.sleep(0.01)
        assert gs._watch.alive == set()
        store.register_node("late", {"address": address, "num_cpus": 1})
        chan = dial(gs.address, token, peer_hello("late", address, 1))[0]
        t0 = time.monotonic()
        while address not in gs._watch.alive and time.monotonic() - t0 < 20:
            time.sleep(0.01)
        assert gs._watch.alive == {address}
        with gs._lock:
            assert [x.address for x in gs._loads_locked()] == [address]
        t0 = time.monotonic()  # it never heartbeats again
        while not notices and time.monotonic() - t0 < 20:
            time.sleep(0.05)
        assert notices == ["late"] and gs._watch.alive == set()
    finally:
        if chan is not None:
            chan.close()
        gs.close()
        sub.stop()
        control.close()
        lst.close()
