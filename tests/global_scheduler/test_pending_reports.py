"""A load report that crossed the global scheduler's placements does not make the node
look idle: the report says how many spilled tasks the node had got over the link when it
counted (``m.Load.received``), and the tasks placed past that stay pending there.

A real ``GlobalScheduler`` in this process; its peers are fake nodes on real
authenticated connections (``dial`` with a ``PeerHello``, as a node links): an origin
that spills, and B (2 CPUs) and C (3 CPUs) that receive."""

from __future__ import annotations

import secrets
import time

import pytest

from dpool.global_scheduler._daemon import GlobalScheduler
from dpool.node._links import dial, peer_hello
from dpool.protocol import Channel, decode_batch, encode_batch
from dpool.protocol import _messages as m
from tests._parallel import host

ORIGIN, B, C = f"{host(3)}:1", f"{host(4)}:1", f"{host(5)}:1"


def _task(task_id: int) -> m.RemoteTask:
    return m.RemoteTask(task_id, ORIGIN, 1, (2, "fork", None, None, 3), 1, b"\x80\x05N.",
                        None, None, "/", (), ())


def _report(gs: GlobalScheduler, chan: Channel, address: str, busy: int, cpus: int,
            received: int, mark: float) -> None:
    """Send a load report and wait until the scheduler applied it (``mark``, its
    avg_task_s, tells this report from the last): the peers are separate connections,
    so nothing else orders it before the next spill."""
    chan.send(encode_batch([m.Load(0, busy, cpus, mark, (), (), received)]))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with gs._lock:
            entry = gs._nodes.get(address)  # (its hello may not be handled yet)
            if entry is not None and entry[1].avg_task_s == mark:
                return
        time.sleep(0.005)
    raise AssertionError(f"the report of {address} was not applied within 10 s")


def _tasks_on(chan: Channel, n: int) -> list:
    """The ids of the ``n`` RemoteTasks that come on ``chan`` (10 s at most)."""
    got: list = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        for frame in chan.recv_frames(timeout=0.1):
            got += [msg.task_id for msg in decode_batch(frame)
                    if isinstance(msg, m.RemoteTask)]
    return got


def _nothing_on(chan: Channel) -> bool:
    return not chan.recv_frames(timeout=0.2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("received", [0, -1], ids=["stale-report", "uncounted-report"])
def test_a_report_crossing_placements_keeps_them_pending(received: int) -> None:
    token = secrets.token_bytes(16)
    gs = GlobalScheduler(token, "127.0.0.1", 0)
    chans: list = []
    try:
        gs.serve()
        for name, address, cpus in (("b", B, 2), ("c", C, 3), ("origin", ORIGIN, 0)):
            chans.append(dial(gs.address, token, peer_hello(f"node-{name}", address, cpus))[0])
        b, c, origin = chans
        _report(gs, b, B, busy=0, cpus=2, received=0, mark=0.01)
        _report(gs, c, C, busy=3, cpus=3, received=0, mark=0.02)  # C full: both go to B
        origin.send(encode_batch([_task(1), _task(2)]))
        assert sorted(_tasks_on(b, 2)) == [1, 2]
        assert _nothing_on(c) and _nothing_on(origin)
        with gs._lock:
            assert gs._nodes[B][1].pending == 2

        # B's report was counted before the two tasks reached it; C's is accurate
        _report(gs, b, B, busy=0, cpus=2, received=received, mark=0.03)
        _report(gs, c, C, busy=2, cpus=3, received=0, mark=0.04)
        with gs._lock:
            pending = gs._nodes[B][1].pending
        origin.send(encode_batch([_task(3)]))
        if received == 0:  # both still pending on B (full): C has a free CPU
            assert _tasks_on(c, 1) == [3] and _nothing_on(b)
            assert pending == 2
        else:  # a node that does not count: its report shows everything (as before)
            assert _tasks_on(b, 1) == [3] and _nothing_on(c)
            assert pending == 0
        assert _nothing_on(origin)  # no rejection
        assert (gs.placed, gs.rejected) == (3, 0)
    finally:
        for chan in chans:
            chan.close()
        gs.close()
