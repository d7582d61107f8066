"""Cluster-unique id prefixes: blocks reserved from the control store never overlap."""

from __future__ import annotations

import threading

from dpool.control._redis import RedisControlStore
from dpool.node._ids import IdPrefixes


def test_prefixes_of_two_nodes_never_collide(shards):
    addresses, password, _ = shards
    a_store = RedisControlStore(addresses, password)
    b_store = RedisControlStore(addresses, password)
    try:
        a = IdPrefixes(a_store.new_id_prefix, block=8)
        b = IdPrefixes(b_store.new_id_prefix, block=8)
        got: list[int] = []
        lock = threading.Lock()

        def take(p: IdPrefixes) -> None:
            for _ in range(50):  # several blocks each: the pools refill from Redis
                x = p.take()
                with lock:
                    got.append(x)

        threads = [threading.Thread(target=take, args=(p,)) for p in (a, b, a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 200 and len(set(got)) == 200
        assert min(got) >= 1
    finally:
        a_store.close()
        b_store.close()


def test_top_up_reserves_before_running_out(shards):
    addresses, password, _ = shards
    store = RedisControlStore(addresses, password)
    calls = []

    def reserve(n: int) -> int:
        calls.append(n)
        return store.new_id_prefix(n)

    try:
        p = IdPrefixes(reserve, block=4)
        assert calls == [4]
        p.take()
        p.take()
        p.top_up()  # half of a block left: nothing reserved yet
        assert calls == [4]
        p.take()
        p.top_up()  # one left: the agent reserves the next block in the background
        assert calls == [4, 4]
        assert len({p.take() for _ in range(5)}) == 5
        assert calls == [4, 4]
    finally:
        store.close()


def test_a_lone_node_counts_from_one():
    p = IdPrefixes(None)
    assert [p.take() for _ in range(3)] == [1, 2, 3]
