"""A real global scheduler process (``python -m dpool.global_scheduler``) places tasks by
the strategy they carry (after the request's fields on the wire): ``spread``,
``NodeAffinity`` hard and soft. Its peers are fake nodes on real authenticated
connections (as ``bench/micro/gs_place.py``): an origin that spills, two that receive.
A task that ``spread`` sends back to its origin (``RunHere``) leaves no load believed on
it: a placement group that needs the origin is placed at once, with no report."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from dpool.node._links import dial, peer_hello
from dpool.placement import NodeAffinity, strategy_to_wire
from dpool.protocol import _messages as m
from dpool.protocol import decode_batch, encode_batch
from dpool.scheduling import _resources
from tests._parallel import host


@pytest.fixture
def gs():
    """A global scheduler and its peers: a 0-CPU origin, two 2-CPU nodes."""
    yield from _scheduler_and_peers(0, 2)


@pytest.fixture
def gs_one_cpu_each():
    """The same with 1 CPU on each (the origin too: a head that runs tasks)."""
    yield from _scheduler_and_peers(1, 1)


def _scheduler_and_peers(origin_cpus: int, cpus: int) -> Iterator[list]:
    token = secrets.token_hex(16)
    r, w = os.pipe()
    env = dict(os.environ, DPOOL_TOKEN=token)
    proc = subprocess.Popen([sys.executable, "-m", "dpool.global_scheduler", "--bind",
                             host(2), "--ready-fd", str(w), "--log-level", "WARNING"],
                            pass_fds=(w,), env=env)
    os.close(w)
    peers: list = []
    try:
        line = os.read(r, 200).decode().split()
        os.close(r)
        address = line[1]
        for name, ip, n in (("origin", host(3), origin_cpus), ("b", host(4), cpus),
                            ("c", host(5), cpus)):
            chan, _ = dial(address, token.encode(), peer_hello(f"node-{name}", f"{ip}:1", n))
            peers.append(chan)
        yield peers
    finally:
        for chan in peers:
            chan.close()
        proc.terminate()
        proc.wait(10)


def _task(task_id: int, strategy: object) -> m.RemoteTask:
    req = (1, 0.0, 0, (), strategy_to_wire(strategy))
    return m.RemoteTask(task_id, f"{host(3)}:1", 1, (2, "fork", None, None, 3), 1,
                        b"\x80\x05N.", None, None, "/", (), (), req)


def _received(chans: list, n: int, timeout: float = 30.0) -> list:
    """(index of the receiving peer, message) until ``n`` messages came (or ``timeout``
    seconds passed)."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        for i, chan in enumerate(chans):
            for frame in chan.recv_frames(timeout=0.05):
                got += [(i, msg) for msg in decode_batch(frame)]
    return got


@pytest.mark.timeout(60)
def test_strategies_on_the_wire(gs):
    origin, b, c = gs
    b.send(encode_batch([m.Load(20, 2, 2, 0.5, ())]))  # b is swamped: the default avoids it
    for k in range(50):  # until b's load report has arrived (another connection)
        origin.send(encode_batch([_task(100 + k, None)]))
        if [i for i, _ in _received([origin, b, c], 1)] == [2]:
            break
    else:
        raise AssertionError("the default rule kept placing on the swamped node")
    origin.send(encode_batch([_task(i, "spread") for i in range(6)]))
    got = _received([origin, b, c], 6)
    assert sorted(i for i, _ in got) == [1, 1, 1, 2, 2, 2]  # round-robin, none on the origin
    origin.send(encode_batch([_task(10, NodeAffinity(f"{host(5)}:1")),
                              _task(11, NodeAffinity("node-b", soft=False)),
                              _task(12, NodeAffinity("gone:1", soft=True)),
                              _task(13, NodeAffinity("gone:1"))]))
    got = {msg.task_id: (i, msg) for i, msg in _received([origin, b, c], 4)}
    assert got[10][0] == 2 and got[11][0] == 1  # by address, by node id
    assert got[12][0] in (1, 2)  # soft: placed elsewhere
    i, failed = got[13]
    assert i == 0 and isinstance(failed, m.PlacementFailed)
    assert "'gone:1'" in failed.reason and "no such node is alive" in failed.reason


@pytest.mark.timeout(60)
def test_a_task_run_on_its_origin_leaves_it_free_for_a_placement_group(gs_one_cpu_each):
    # The user's report: spread tasks, then a strict_spread group over every node waited
    # (here up to 5 s, with a 1-CPU head): the scheduler counted the tasks spread back to the origin
    # (``RunHere``) as pending there, and the origin's reports, unchanged by them (they
    # never count as received over the link), were not sent again until its refresh.
    origin, b, c = gs_one_cpu_each
    peers = [origin, b, c]
    for chan in peers:
        chan.send(encode_batch([m.Load(0, 0, 1, 0.002, (), (), 0)]))  # idle
    received = [0, 0, 0]  # RemoteTasks each got (their load reports count them)
    for k in (1, 2):  # until b and c are linked (their dials return before that)
        for t in range(50):
            origin.send(encode_batch([_task(200 + t, NodeAffinity(f"{host(3 + k)}:1"))]))
            (i, _), = _received(peers, 1)
            received[i] += i > 0
            if i == k:
                break
    origin.send(encode_batch([_task(i, "spread") for i in range(6)]))
    got = _received(peers, 6)
    assert sorted(i for i, _ in got) == [0, 0, 1, 1, 2, 2], got  # round-robin
    assert all(isinstance(msg, m.RunHere) for i, msg in got if i == 0), got
    # b and c ran theirs and say so; the origin's report would be what it sent before
    # (idle, nothing received over the link), so it sends none
    for i, _ in got:
        received[i] += i > 0
    for k in (1, 2):
        peers[k].send(encode_batch([m.Load(0, 0, 1, 0.002, (), (), received[k])]))
    bundle = _resources.to_wire(_resources.Request(1))
    origin.send(encode_batch([m.PlacementGroupReserve(7, f"{host(3)}:1", (bundle,) * 3,
                                          "strict_spread")]))
    # at once: no report comes (a real origin's unchanged one would, within 5 s)
    holds = _received(peers, 3, timeout=3.0)
    assert sorted(i for i, _ in holds) == [0, 1, 2], holds
    for i, hold in holds:
        assert isinstance(hold, m.BundleHold) and hold.hold and hold.pg_id == 7, hold
        peers[i].send(encode_batch([m.BundleHeld(7, hold.index, True, "", hold.attempt)]))
    (i, state), = _received([origin], 1)
    assert isinstance(state, m.PlacementGroupState) and state.state == "ready", state
    assert sorted(state.nodes) == [f"{host(k)}:1" for k in (3, 4, 5)], state
