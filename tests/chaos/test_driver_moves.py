"""A driver connected over TCP whose node is SIGKILLed moves to a live node (issue 17,
item 2): every unfinished future still gets its result, exactly once; a small ``put``
survives (the driver kept its bytes); a large one, uploaded only into the dead node's
store, fails with ``ObjectLostError`` naming it; nothing is left behind.

A loopback cluster of three nodes (``host(2)`` head, ``host(3)``, ``host(4)``). The
driver runs in a process of its own with a state directory of its own, so it reaches
its node over TCP, as a driver on a host without a node does.
"""

from __future__ import annotations

import os
import textwrap
import time

import psutil
import pytest

from dpool.errors import Error
from dpool.runtime._address import resolve
from tests.cluster.conftest import running, start_cluster, stop_cluster

MOVES = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import dpool
    from dpool.errors import ObjectLostError

    def slow(x):
        time.sleep(0.4)
        return x, os.environ.get("DPOOL_NODE_ID")

    def grow(a, k):
        time.sleep(0.3)
        return a + k                      # 8 MB in, 8 MB out

    def total(a, small):
        return float(a.sum()) + small["k"]

    class Keeper:  # an actor on the node that dies: gone with it
        def __init__(self):
            self.n = 0

        def add(self, k, wait=0.0):
            time.sleep(wait)
            self.n += k
            return self.n

    if __name__ == "__main__":
        victim = int(sys.argv[1])
        with dpool.ProcessPoolExecutor() as ex:
            small = dpool.put({"k": 5})
            big = dpool.put(np.ones(1_000_000))              # 8 MB: pushed, not kept
            assert ex.submit(total, big, small).result(timeout=60) == 1_000_005.0
            keeper = ex.actor(Keeper)
            assert keeper.add(1) == 1
            in_flight = keeper.add.submit(1, 5.0)
            fs = [ex.submit(slow, i) for i in range(24)]
            chain = [ex.submit(grow, np.zeros(1_000_000), 1)]
            for k in range(2, 6):
                chain.append(ex.submit(grow, chain[-1], k))
            time.sleep(0.6)
            os.kill(victim, signal.SIGKILL)
            out = [f.result(timeout=90) for f in fs]
            print("SLOW", sorted(x for x, _ in out), flush=True)
            last = chain[-1].result(timeout=90)
            print("CHAIN", last.shape, float(last[0]), float(last[-1]), flush=True)
            for f in (in_flight, keeper.add.submit(1)):
                try:
                    f.result(timeout=60)
                except dpool.ActorDiedError as exc:
                    print("ACTOR", "was lost" in str(exc), flush=True)
            later = ex.submit(total, np.ones(10), small).result(timeout=60)
            print("SMALL", later, flush=True)
            try:
                dpool.get(big, timeout=30)
            except ObjectLostError as exc:
                print("GET", exc.object_id == big.id, bool(exc.node), flush=True)
            try:
                ex.submit(total, big, small).result(timeout=30)
            except ObjectLostError as exc:
                print("TASK", exc.object_id == big.id, flush=True)
            from dpool.runtime import _current  # what the driver kept for a move
            mover = _current.client().mover
            print("RECORDS", len(mover.records), len(mover.puts), flush=True)
""")


def _family(pid: int) -> list[int]:
    try:
        p = psutil.Process(pid)
        return [pid, *(c.pid for c in p.children(recursive=True))]
    except psutil.Error:
        return []


@pytest.mark.timeout(180)
def test_a_tcp_drivers_node_sigkilled_the_driver_moves_and_loses_no_future(tmp_path):
    c = start_cluster(tmp_path, n_nodes=3)
    try:
        victim = c.nodes[2]
        env = c.driver_env(DPOOL_ADDRESS=victim.address,
                           DPOOL_STATE_DIR=str(tmp_path / "driver-state"))
        family = _family(victim.pid)
        t0 = time.monotonic()
        out = c.run_script(MOVES, tmp_path, str(victim.pid), env=env, timeout=150)
        elapsed = time.monotonic() - t0
        assert out.returncode == 0, out.stderr[-4000:]
        lines = out.stdout.splitlines()
        assert f"SLOW {list(range(24))}" in lines, out.stdout
        assert "CHAIN (1000000,) 15.0 15.0" in lines, out.stdout  # 1+2+3+4+5
        assert "SMALL 15.0" in lines, out.stdout
        assert lines.count("ACTOR True") == 2, out.stdout
        assert "GET True True" in lines, out.stdout
        assert "TASK True" in lines, out.stdout
        assert "RECORDS 0 1" in lines, out.stdout  # nothing kept but the live small put
        assert "moved to node" in out.stderr, out.stderr[-3000:]
        print(f"driver script with one node move: {elapsed:.1f} s")
        deadline = time.monotonic() + 15  # the dead node's workers see their node gone
        while any(running(p) for p in family) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in family if running(p)]
    finally:
        stop_cluster(c)
    assert not [s for s in os.listdir("/dev/shm") if s.startswith(f"dpool_{victim.pid}_")]


def test_dpool_address_may_list_the_nodes_to_move_to(monkeypatch, tmp_path):
    monkeypatch.setenv("DPOOL_STATE_DIR", str(tmp_path))
    t = resolve("127.0.0.9:7001, 127.0.0.8:7002,127.0.0.7:7003", token="T")
    assert (t.host, t.port, t.alternates) == ("127.0.0.9", 7001,
                                              ("127.0.0.8:7002", "127.0.0.7:7003"))
    assert resolve("127.0.0.9:7001", token="T").alternates == ()
    with pytest.raises(Error, match="not HOST:PORT"):
        resolve("127.0.0.9:7001,nonsense", token="T")
