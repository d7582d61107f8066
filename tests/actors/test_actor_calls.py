"""Actors on the embedded runtime: calls in order on one process's state, futures in and
out, handles passed to tasks and actors, errors, options, shutdown."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import CancelledError, Future, wait

import numpy as np
import pytest

import dpool
from dpool import ProcessPoolExecutor

pytestmark = pytest.mark.timeout(60)


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.n = start
        self.seen: list = []

    def add(self, k: int = 1) -> int:
        self.n += k
        self.seen.append(k)
        return self.n

    def history(self) -> list:
        return self.seen

    @dpool.readonly
    def pid(self) -> int:
        return os.getpid()

    def fail(self, msg: str) -> None:
        raise ValueError(msg)

    def sleep(self, s: float) -> int:
        time.sleep(s)
        return self.n

    def array(self, n: int) -> np.ndarray:
        return np.full(n, self.n, dtype=np.int64)

    def call_other(self, other: dpool.ActorHandle, k: int) -> int:
        return other.add(k)

    def touch(self, path: str) -> bool:
        open(path, "w").close()
        return True


def _slow(x: int, s: float) -> int:
    time.sleep(s)
    return x


def _use_handle(c: dpool.ActorHandle, k: int) -> tuple[int, int]:
    f = c.add.submit(k)  # a future from a task, as from the driver
    return f.result(), c.pid()


def _total(a: np.ndarray) -> int:
    return int(a.sum())


@pytest.fixture
def ex():
    with ProcessPoolExecutor(2) as e:
        yield e


def test_calls_run_in_order_on_the_actors_state_in_its_own_process(ex):
    c = ex.actor(Counter, 10)
    assert c.add(5) == 15  # a plain call waits, as a Manager proxy's does
    fs = [c.add.submit(i) for i in range(200)]
    assert all(isinstance(f, Future) for f in fs)
    assert [f.result() for f in fs] == [15 + sum(range(i + 1)) for i in range(200)]
    assert c.history() == [5, *range(200)]  # one at a time, in the order made
    assert c.pid() != os.getpid()
    assert c.pid() == c.pid()  # one process for its life


def test_the_task_table_records_an_actors_calls_as_a_chain(ex):
    from dpool.runtime import current

    c = ex.actor(Counter)
    calls = [c.add.submit(1) for _ in range(3)] + [c.pid.submit()]
    task = ex.submit(abs, -1)
    assert [f.result(timeout=30) for f in calls[:3]] == [1, 2, 3]
    task.result(timeout=30)
    control = current.driver().scheduler.control
    rows = [control.get_task(f._oid) for f in [*calls, task]]
    assert [r.after for r in rows] == [0, *(f._oid for f in calls[:3]), 0]
    assert len({r.group_id for r in rows[:4]}) == 1 and rows[4].group_id != rows[0].group_id


def test_an_exception_reaches_the_caller_with_the_traceback_and_the_actor_lives_on(ex):
    c = ex.actor(Counter)
    c.add(1)
    with pytest.raises(ValueError, match="bad call") as info:
        c.fail("bad call")
    assert "in fail" in str(info.value.__cause__)  # the actor process's traceback
    f = c.fail.submit("again")
    assert isinstance(f.exception(), ValueError)
    assert c.add(1) == 2  # its state survived both


def test_a_call_waiting_for_a_future_holds_back_the_calls_made_after_it(ex):
    c = ex.actor(Counter)
    slow = ex.submit(_slow, 100, 0.5)
    first = c.add.submit(slow)  # dataflow: waits for the task's result
    second = c.add.submit(1)  # ready at once, but made after
    assert second.result(timeout=10) == 101
    assert first.result() == 100
    assert c.history() == [100, 1]


def test_call_futures_feed_tasks_and_large_results_go_through_the_store(ex):
    c = ex.actor(Counter, 3)
    arr = c.array.submit(1_000_000)  # 8 MB: stored, not pickled through the socket
    assert ex.submit(_total, arr).result() == 3_000_000
    assert arr.result().shape == (1_000_000,)
    assert ex.submit(abs, c.add.submit(-10)).result() == 7


def test_a_handle_passes_to_tasks_and_to_other_actors(ex):
    c = ex.actor(Counter)
    got, pid = ex.submit(_use_handle, c, 5).result()
    assert got == 5 and pid == c.pid()
    other = ex.actor(Counter, 100)
    assert c.call_other(other, 7) == 107  # an actor calling another (it waits inside)
    assert other.history() == [7]
    assert c.add(1) == 6


def _wait_for(path: str) -> bool:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if os.path.exists(path):
            return True
        time.sleep(0.01)
    return False


def test_an_actor_holds_no_worker_of_max_workers(tmp_path):
    with ProcessPoolExecutor(1) as ex:
        c = ex.actor(Counter)
        marker = str(tmp_path / "touched")
        busy = ex.submit(_wait_for, marker)  # the executor's one worker, busy until ...
        assert c.touch(marker) is True  # ... the actor runs a call meanwhile
        assert busy.result() is True


def test_shutdown_runs_the_pending_calls_then_ends_the_actor():
    ex = ProcessPoolExecutor(2)
    c = ex.actor(Counter)
    pid = c.pid()
    fs = [c.sleep.submit(0.05) for _ in range(5)] + [c.add.submit(1)]
    ex.shutdown(wait=True)
    assert fs[-1].result(0) == 1  # done by the time shutdown returned
    assert not _alive(pid)
    with pytest.raises(dpool.ActorDiedError, match="shut down") as info:
        c.add(1)
    assert info.value.actor.startswith("Counter#")


def test_shutdown_cancel_futures_cancels_the_calls_not_started():
    ex = ProcessPoolExecutor(2)
    c = ex.actor(Counter)
    running = c.sleep.submit(0.5)
    end = time.monotonic() + 30
    while not running.running() and time.monotonic() < end:  # sent to the actor
        time.sleep(0.01)
    queued = [c.add.submit(1) for _ in range(5)]  # (held back while it runs)
    ex.shutdown(wait=True, cancel_futures=True)
    assert running.result(0) == 0
    assert all(f.cancelled() for f in queued)


def test_a_queued_call_can_be_cancelled(ex):
    c = ex.actor(Counter)
    first = c.sleep.submit(0.5)
    second = c.add.submit(1)
    assert second.cancel()
    third = c.add.submit(2)
    assert third.result(timeout=10) == 2 and first.result() == 0
    with pytest.raises(CancelledError):
        second.result()
    assert c.history() == [2]


def test_calls_from_many_threads_all_run_once(ex):
    c = ex.actor(Counter)
    out: list = []

    def caller() -> None:
        out.extend(f.result() for f in [c.add.submit(1) for _ in range(100)])

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(out) == list(range(1, 401))


def test_named_actors_and_kill(ex):
    c = ex.options(name="the-counter").actor(Counter)
    assert dpool.get_actor("the-counter").add(2) == 2
    with pytest.raises(ValueError, match="exists already"):
        ex.options(name="the-counter").actor(Counter)
    pending = c.sleep.submit(5)
    time.sleep(0.2)
    dpool.kill(c)
    with pytest.raises(dpool.ActorDiedError, match="killed") as info:
        pending.result(timeout=10)
    assert info.value.actor == "the-counter"
    with pytest.raises(dpool.ActorDiedError):
        c.add(1)
    with pytest.raises(ValueError, match="no live actor"):
        dpool.get_actor("the-counter")
    ex.options(name="the-counter").actor(Counter)  # the name is free again


def _add_to(name: str, k: int) -> int:
    return dpool.get_actor(name).add(k)


def _find(name: str) -> str:
    try:
        dpool.get_actor(name)
    except ValueError as e:
        return str(e)
    return "found"


def _kill(name: str) -> str:
    dpool.kill(dpool.get_actor(name))
    return "sent"


def test_tasks_find_named_actors_and_kill_them(ex):
    c = ex.options(name="found-by-tasks").actor(Counter, 10)
    assert ex.submit(_add_to, "found-by-tasks", 5).result(timeout=30) == 15
    assert c.history() == [5]
    assert ex.submit(_find, "nobody").result(timeout=30) == "no live actor named 'nobody'"
    assert ex.submit(_kill, "found-by-tasks").result(timeout=30) == "sent"
    with pytest.raises(dpool.ActorDiedError, match="killed"):
        c.sleep.submit(0).result(timeout=30)  # (the kill arrives while this waits, or first)
        c.sleep.submit(30).result(timeout=30)
    assert ex.submit(_find, "found-by-tasks").result(timeout=30) == \
        "no live actor named 'found-by-tasks'"
    with pytest.raises(TypeError, match="name"):
        dpool.get_actor(3)  # type: ignore[arg-type]


def _add_one(counter) -> int:  # noqa: ANN001
    return counter.add(1)


def test_ended_actors_leave_the_scheduler_and_late_calls_still_say_why(ex):
    from dpool.runtime import current

    s = current.driver().scheduler
    before = set(s._groups)
    handles = [ex.options(name=f"gone-{i}").actor(Counter) for i in range(4)]
    assert [h.add(1) for h in handles] == [1, 1, 1, 1]
    for h in handles:
        dpool.kill(h)
    deadline = time.monotonic() + 30  # (their workers exit, then their groups leave)
    while set(s._groups) - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not set(s._groups) - before  # scans over the groups stay short
    with pytest.raises(dpool.ActorDiedError, match="actor gone-0 died: it was killed"):
        ex.submit(_add_one, handles[0]).result(timeout=30)  # a late call, by id
    with pytest.raises(dpool.ActorDiedError, match="killed"):
        handles[1].add(1)  # (the driver's handle holds its group)


def test_a_detached_actor_outlives_its_executors_shutdown():
    ex = ProcessPoolExecutor(1)
    c = ex.options(lifetime="detached").actor(Counter)
    c.add(1)
    ex.shutdown()
    assert c.add(1) == 2
    dpool.kill(c)
    with pytest.raises(dpool.ActorDiedError):
        c.add(1)


def test_a_constructor_that_raises_fails_every_call_with_actor_died_error(ex):
    c = ex.actor(_Broken)
    with pytest.raises(dpool.ActorDiedError, match="constructor raised RuntimeError: nope"):
        c.go()
    with pytest.raises(dpool.ActorDiedError):
        c.go.submit().result(timeout=10)


class _Broken:
    def __init__(self) -> None:
        raise RuntimeError("nope")

    def go(self) -> None:
        pass


def test_bad_input_gets_clear_typed_errors(ex):
    with pytest.raises(TypeError, match="takes a class"):
        ex.actor(len)
    with pytest.raises(dpool.SerializationError, match="constructor arguments"):
        ex.actor(Counter, threading.Lock())
    with pytest.raises(TypeError, match="unexpected keyword"):
        ex.options(max_restart=1)
    with pytest.raises(TypeError, match="apply to actor"):
        ex.options(max_restarts=1).submit(abs, 1)
    with pytest.raises(ValueError, match="max_restarts"):
        ex.options(max_restarts=-2).actor(Counter)
    with pytest.raises(ValueError, match="max_concurrency"):
        ex.options(max_concurrency=0).actor(Counter)
    with pytest.raises(ValueError, match="no one order to replay"):
        ex.options(max_concurrency=2, max_restarts=1).actor(Counter)
    c = ex.actor(Counter)
    with pytest.raises(AttributeError, match="no method 'nope'"):
        c.nope  # noqa: B018
    assert not hasattr(c, "_private") and "add" in dir(c)
    with pytest.raises(TypeError):
        c.add(1, 2, 3)  # the method's own error, raised in the actor
    assert c.add(1) == 1
    with pytest.raises(TypeError, match="takes an actor handle"):
        dpool.kill(object())  # type: ignore[arg-type]
    ex.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.actor(Counter)


def test_wait_and_as_completed_take_call_futures(ex):
    c = ex.actor(Counter)
    fs = [c.sleep.submit(0.01) for _ in range(3)]
    done, not_done = wait(fs, timeout=10)
    assert len(done) == 3 and not not_done
    ready, rest = dpool.wait(fs, num_returns=2, timeout=10)
    assert len(ready) == 2


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Gate:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.barrier = threading.Barrier(4)

    def meet(self) -> str:
        self.barrier.wait(20)  # passes only if four calls wait at once
        return threading.current_thread().name

    def wait(self, timeout: float) -> bool:
        return self.event.wait(timeout)

    def open(self) -> bool:
        self.event.set()
        return True

    def nap(self, s: float) -> str:
        time.sleep(s)
        return threading.current_thread().name


def test_max_concurrency_runs_calls_at_once_on_threads(ex):
    g = ex.options(max_concurrency=4).actor(Gate)
    waiting = g.wait.submit(20)  # blocks a thread of the actor ...
    assert g.open() is True  # ... while another call runs
    assert waiting.result(timeout=10) is True
    names = [f.result(timeout=30) for f in [g.meet.submit() for _ in range(4)]]
    assert len(set(names)) == 4  # four threads


def test_one_call_at_a_time_by_default(ex):
    g = ex.actor(Gate)
    t0 = time.monotonic()
    names = [f.result(timeout=10) for f in [g.nap.submit(0.2) for _ in range(3)]]
    assert time.monotonic() - t0 >= 0.6 and len(set(names)) == 1

