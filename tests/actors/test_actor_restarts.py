"""An actor whose process dies: restarted from its checkpoint and the calls after it, or
its calls fail with ActorDiedError. Real processes, real SIGKILLs."""

from __future__ import annotations

import os
import signal
import time

import pytest

import dpool
from dpool import ProcessPoolExecutor

pytestmark = pytest.mark.timeout(60)


class Ledger:
    """State: ``total`` and ``entries``; ``ran_here``: calls this process ran (a replay
    included), which a checkpoint does not carry."""

    def __init__(self, start: int = 0) -> None:
        self.total = start
        self.entries: list = []
        self.ran_here = 0

    def __getstate__(self) -> dict:
        return {"total": self.total, "entries": self.entries}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.ran_here = 0

    def add(self, k: int) -> int:
        self.ran_here += 1
        self.total += k
        self.entries.append(k)
        return self.total

    def slow_add(self, k: int, s: float) -> int:
        time.sleep(s)
        return self.add(k)

    @dpool.readonly
    def state(self) -> tuple:
        return self.total, list(self.entries), self.ran_here, os.getpid()


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def ex():
    with ProcessPoolExecutor(2) as e:
        yield e


@pytest.mark.parametrize("every,replayed", [(0, 12), (5, 2)])
def test_a_restart_rebuilds_the_state_from_checkpoint_and_replay(ex, every, replayed):
    a = ex.options(max_restarts=1, checkpoint_every=every).actor(Ledger, 100)
    for k in range(1, 13):
        a.add(k)
    for _ in range(5):
        a.state()  # read-only: not replayed, not counted towards checkpoints
    total, entries, _ran, pid = a.state()
    assert total == 100 + 78
    _kill(pid)
    total2, entries2, ran_here, pid2 = a.state()
    assert pid2 != pid
    assert (total2, entries2) == (total, entries)  # the same state in the new process
    assert ran_here == replayed  # the calls after the last checkpoint, replayed


def test_calls_in_flight_at_the_death_complete_once_in_order(ex):
    a = ex.options(max_restarts=1).actor(Ledger)
    a.add(1)
    pid = a.state()[3]
    running = a.slow_add.submit(10, 1.0)
    behind = [a.add.submit(k) for k in (100, 1000)]
    time.sleep(0.3)  # slow_add is running
    _kill(pid)
    assert running.result(timeout=30) == 11
    assert [f.result(timeout=30) for f in behind] == [111, 1111]
    total, entries, _ran, _pid = a.state()
    assert (total, entries) == (1111, [1, 10, 100, 1000])  # each call once


def test_without_restarts_left_the_calls_fail_with_actor_died_error(ex):
    a = ex.options(max_restarts=1).actor(Ledger)
    a.add(1)
    _kill(a.state()[3])
    assert a.add(1) == 2  # restarted once
    pid = a.state()[3]
    pending = a.slow_add.submit(1, 5.0)
    time.sleep(0.3)
    _kill(pid)
    with pytest.raises(dpool.ActorDiedError, match=r"SIGKILL after 1 restart") as info:
        pending.result(timeout=30)
    assert info.value.actor.startswith("Ledger#") and "SIGKILL" in info.value.reason
    with pytest.raises(dpool.ActorDiedError):
        a.add(1)


def test_a_death_without_restarts_fails_the_running_call_with_actor_died_error(ex):
    a = ex.actor(Ledger)
    pid = a.state()[3]
    running = a.slow_add.submit(1, 5.0)
    time.sleep(0.3)
    _kill(pid)
    with pytest.raises(dpool.ActorDiedError, match=r"died with signal SIGKILL \(max_restarts=0\)"):
        running.result(timeout=30)


def test_the_executor_stays_usable_when_an_actor_dies(ex):
    a = ex.actor(Ledger)
    _kill(a.state()[3])
    with pytest.raises(dpool.ActorDiedError):
        a.add(1)
    assert ex.submit(abs, -3).result() == 3
    assert ex.actor(Ledger, 5).add(1) == 6
