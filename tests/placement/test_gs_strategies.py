"""A real global scheduler process (``python -m dpool.global_scheduler``) places tasks by
the strategy they carry (after the request's fields on the wire): ``spread``,
``NodeAffinity`` hard and soft. Its peers are fake nodes on real authenticated
connections (as ``bench/micro/gs_place.py``): an origin that spills, two that receive."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from dpool.node._links import dial, peer_hello
from dpool.protocol import _messages as m
from dpool.protocol import decode_batch, encode_batch
from dpool.scheduling._placement_policy import NodeAffinity, strategy_to_wire
from tests._parallel import host


@pytest.fixture
def gs():
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
        for name, ip, cpus in (("origin", host(3), 0), ("b", host(4), 2), ("c", host(5), 2)):
            chan, _ = dial(address, token.encode(), peer_hello(f"node-{name}", f"{ip}:1",
                                                               cpus))
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


def _received(chans: list, n: int) -> list:
    """(index of the receiving peer, message) until ``n`` messages came."""
    got: list = []
    for _ in range(200):
        for i, chan in enumerate(chans):
            for frame in chan.recv_frames(timeout=0.05):
                got += [(i, msg) for msg in decode_batch(frame)]
        if len(got) >= n:
            break
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
