"""The local scheduler's decisions, driven event by event (``_sim``): no process, no IO
thread, each test in milliseconds. Each sequence is an order of events that happens in a
real run -- the races included: a worker that dies between two tasks, or while starting,
or holding a batch; a result that comes twice; a Hello that crosses an order to stop."""

from __future__ import annotations

import pytest

from dpool import WorkerCrashedError
from dpool.protocol import _messages as m
from dpool.scheduling import _states as S

pytestmark = pytest.mark.timeout(20)


def _batch(sim, g, n):
    """Submit ``n`` tasks (2 or 3: one batch) to a one-worker group whose worker has run
    one already (so the scheduler knows they are short): after its result, they go to
    the worker in one batch, which it holds at once."""
    first, f0 = sim.task(g)
    (w,) = sim.started
    w.hello()
    assert w.tasks() == [first]
    rest = [sim.task(g) for _ in range(n)]
    assert w.tasks() == []  # a busy worker is sent nothing new ...
    w.done(first, "r0")
    assert f0.result(0) == "r0"
    assert w.tasks() == [tid for tid, _f in rest]  # ... until its result: then a batch
    return w, rest


def test_a_task_is_sent_run_and_its_future_completed(sim):
    g = sim.group(max_workers=2)
    tid, f = sim.task(g)
    (w,) = sim.started  # one worker started for one task
    msgs = w.take()
    assert [type(x) for x in msgs] == [m.RegisterFunction, m.ExecuteTask]
    assert msgs[1].task_id == tid
    w.hello()
    w.done(tid, 42)
    assert f.result(0) == 42
    assert not w.handle.inflight and w.handle.state == S.W_READY


def test_a_death_between_tasks_charges_none_of_those_it_held(sim):
    g = sim.group(max_workers=1, max_attempts=1)  # any charge would fail the task
    w, rest = _batch(sim, g, 2)
    w.dies(exitcode=-9, running=0)  # it ran none of them
    assert w.handle.state == S.W_DEAD
    w2 = sim.started[1]  # replaced; every task it held goes to the new worker
    assert w2.tasks() == [tid for tid, _f in rest]
    w2.hello()
    for tid, _f in rest:
        w2.done(tid, tid)
    assert [f.result(0) for tid, f in rest] == [tid for tid, _f in rest]


def test_a_death_charges_only_the_task_it_ran(sim):
    g = sim.group(max_workers=1, max_attempts=1)
    w, rest = _batch(sim, g, 2)
    (t1, f1), (t2, f2) = rest
    w.dies(exitcode=-9, running=t1)  # it died running the first: the second only held
    with pytest.raises(WorkerCrashedError, match="attempt 1 of 1"):
        f1.result(0)
    w2 = sim.started[1]
    assert w2.tasks() == [t2]  # uncharged: back first in the queue, on the new worker
    w2.hello()
    w2.done(t2, "two")
    assert f2.result(0) == "two"


def test_a_result_sent_before_the_death_counts(sim):
    g = sim.group(max_workers=1, max_attempts=1)
    w, rest = _batch(sim, g, 2)
    (t1, f1), (t2, f2) = rest
    w.done(t1, "one")  # its result came; then it died running the second
    w.dies(exitcode=-9, running=t2)
    assert f1.result(0) == "one"
    with pytest.raises(WorkerCrashedError):
        f2.result(0)
    assert len(sim.started) == 1  # nothing left to run: no new worker


def test_a_charged_task_with_attempts_left_runs_again_first(sim):
    g = sim.group(max_workers=1, max_attempts=2)
    w, rest = _batch(sim, g, 2)
    (t1, f1), (t2, f2) = rest
    w.dies(exitcode=-9, running=t1)
    w2 = sim.started[1]
    assert w2.tasks() == [t1, t2]  # the charged one, then the one it only held
    w2.hello()
    w2.dies(exitcode=-9, running=t1)  # its second and last attempt
    with pytest.raises(WorkerCrashedError, match="attempt 2 of 2"):
        f1.result(0)
    w3 = sim.started[2]
    assert w3.tasks() == [t2]
    w3.hello()
    w3.done(t2, 2)
    assert f2.result(0) == 2


def test_a_worker_killed_while_starting_charges_nothing_and_is_replaced(sim):
    g = sim.group(max_workers=1, max_attempts=1)
    tid, f = sim.task(g)
    w = sim.started[0]
    assert w.tasks() == [tid]  # sent before its Hello
    w.dies(exitcode=-9, running=0)  # SIGKILLed in its initializer (the OOM killer, say)
    w2 = sim.started[1]
    assert w2.tasks() == [tid]
    w2.hello()
    w2.done(tid, "ok")
    assert f.result(0) == "ok"


def test_a_task_that_kills_its_worker_before_it_starts_fails_in_the_end(sim):
    # It kills every worker it is sent to while the worker reads it, before the board
    # names it: it would come back uncharged for good. After 5 such deaths per attempt
    # (10) each one is charged: the 10th and the 11th spend its two attempts.
    g = sim.group(max_workers=1, max_attempts=2)
    tid, f = sim.task(g)
    deaths = 0
    while not f.done():
        w = sim.started[-1]
        assert w.tasks() == [tid]
        w.hello()
        w.dies(exitcode=-11, running=0)
        deaths += 1
        assert deaths <= 20
    with pytest.raises(WorkerCrashedError):
        f.result(0)
    assert deaths == 11


def test_a_result_that_comes_twice_completes_its_future_once(sim):
    g = sim.group(max_workers=1)
    tid, f = sim.task(g)
    w = sim.started[0]
    w.hello()
    w.done(tid, "first")
    w.done(tid, "second")  # (a retried task's late duplicate): ignored
    assert f.result(0) == "first"


def test_a_task_cancelled_while_queued_is_never_sent(sim):
    g = sim.group(max_workers=1)
    t1, f1 = sim.task(g)
    t2, f2 = sim.task(g)
    w = sim.started[0]
    assert w.tasks() == [t1]
    assert f2.cancel()
    w.hello()
    w.done(t1, 1)
    assert w.tasks() == []  # the cancelled one was skipped
    assert f2.cancelled() and f1.result(0) == 1


def test_a_hello_that_crosses_the_order_to_stop_changes_nothing(sim):
    g = sim.group(max_workers=1)
    tid, f = sim.task(g)
    w = sim.started[0]
    w.hello()
    w.done(tid, 1)
    sim.close_group(g)  # (executor shutdown): its idle worker is told to exit
    assert any(isinstance(x, m.Shutdown) for x in w.take())
    assert w.handle.state == S.W_STOPPING
    w.hello()  # sent before it read the order
    assert w.handle.state == S.W_STOPPING
    w.dies(exitcode=0)  # it exits as told: nothing to charge, no replacement
    assert w.handle.state == S.W_DEAD and len(sim.started) == 1


def test_a_task_waits_for_its_input_then_runs_with_it(sim):
    g = sim.group(max_workers=2)
    a, fa = sim.task(g)
    b, fb = sim.task(g, deps=(a,))
    w = sim.started[0]
    assert w.tasks() == [a] and len(sim.started) == 1  # b waits: no worker for it yet
    w.hello()
    w.done(a, 7)
    sent = [x for x in w.take() if isinstance(x, m.ExecuteTask)]
    assert [x.task_id for x in sent] == [b]
    ((oid, ok, _payload),) = sent[0].deps  # its input, as the worker reads it
    assert (oid, ok) == (a, True)
    w.done(b, 8)
    assert (fa.result(0), fb.result(0)) == (7, 8)


def test_a_task_whose_input_failed_is_sent_with_the_failure(sim):
    g = sim.group(max_workers=1)
    a, fa = sim.task(g)
    b, fb = sim.task(g, deps=(a,))
    w = sim.started[0]
    w.hello()
    assert w.tasks() == [a]
    w.send(m.TaskDone(a, False, _dumps_error(ValueError("boom")), 0.001))
    with pytest.raises(ValueError, match="boom"):
        fa.result(0)
    sent = [x for x in w.take() if isinstance(x, m.ExecuteTask)]
    assert [x.task_id for x in sent] == [b]
    assert sent[0].deps[0][:2] == (a, False)  # the worker raises it as b's error


def test_a_worker_retires_after_max_tasks_and_a_new_one_takes_the_rest(sim):
    from dpool.scheduling import WorkerGroupConfig

    g = sim.add_group(WorkerGroupConfig(1, None, None, 2, 3))  # max_tasks_per_child=2
    ids = [sim.task(g) for _ in range(3)]
    w = sim.started[0]
    w.hello()
    sent: list = []
    while new := w.tasks():
        sent += new
        for tid in new:
            w.done(tid, tid)
    assert sent == [ids[0][0], ids[1][0]]  # its two, then nothing more
    assert w.handle.retiring
    w.dies(exitcode=0)  # it exits by itself, as told by max_tasks
    w2 = sim.started[1]
    assert w2.tasks() == [ids[2][0]]


def _dumps_error(exc):
    from dpool.objects import _payload

    return _payload.dumps_error(exc)


def test_a_worker_blocked_in_a_nested_wait_gives_its_slot_back(sim):
    g = sim.group(max_workers=1)
    t1, f1 = sim.task(g)
    t2, f2 = sim.task(g)
    w1 = sim.started[0]
    w1.hello()
    assert w1.tasks() == [t1] and len(sim.started) == 1
    w1.send(m.Blocked(()))  # t1 waits on other tasks: its CPU goes to the queue
    w2 = sim.started[1]
    assert w2.tasks() == [t2]
    w2.hello()
    w2.done(t2, 2)
    w1.send(m.Unblocked())
    w1.done(t1, 1)
    assert (f1.result(0), f2.result(0)) == (1, 2)


def test_a_blocking_worker_hands_back_what_it_had_not_started(sim):
    g = sim.group(max_workers=1, max_attempts=1)
    w, rest = _batch(sim, g, 2)
    (t1, f1), (t2, f2) = rest
    w.send(m.Blocked((t2,)))  # running t1, it waits; t2 would wait behind it
    w2 = sim.started[1]
    assert w2.tasks() == [t2]  # uncharged: max_attempts=1 and it still runs
    w2.hello()
    w2.done(t2, 2)
    w.send(m.Unblocked())
    w.done(t1, 1)
    assert (f1.result(0), f2.result(0)) == (1, 2)


def test_a_nested_task_runs_and_its_value_goes_to_the_worker_that_submitted_it(sim):
    g = sim.group(max_workers=2)
    outer, f = sim.task(g)
    w1 = sim.started[0]
    w1.hello()
    assert w1.tasks() == [outer]
    inner = 0x7000
    w1.send(m.SubmitTask(inner, 1, _args(), None, g.group_id), m.Blocked(()))
    w2 = sim.started[1]
    assert w2.tasks() == [inner]
    w2.hello()
    w2.done(inner, "in")
    (value,) = [x for x in w1.take() if isinstance(x, m.ObjectValue)]
    assert (value.object_id, value.ok) == (inner, True)
    w1.send(m.Unblocked())
    w1.done(outer, "out")
    assert f.result(0) == "out"


def test_an_initializer_that_raises_breaks_the_group(sim):
    from concurrent.futures.process import BrokenProcessPool

    g = sim.group(max_workers=1)
    tid, f = sim.task(g)
    w = sim.started[0]
    w.send(m.InitFailed(_dumps_error(RuntimeError("no config"))))
    with pytest.raises(BrokenProcessPool, match="no config"):
        f.result(0)
    t2, f2 = sim.task(g)  # the group is broken for good
    with pytest.raises(BrokenProcessPool):
        f2.result(0)


def test_shutdown_with_cancel_futures_cancels_what_has_not_started(sim):
    g = sim.group(max_workers=1)
    t1, f1 = sim.task(g)
    queued = [sim.task(g) for _ in range(3)]
    w = sim.started[0]
    w.hello()
    assert w.tasks() == [t1]
    sim.cancel_queued(g)
    assert all(f.cancelled() for _t, f in queued)
    w.done(t1, 1)
    assert f1.result(0) == 1
    assert w.tasks() == []


def test_terminating_a_group_fails_what_it_had_and_stops_its_workers(sim):
    g = sim.group(max_workers=1)
    t1, f1 = sim.task(g)
    t2, f2 = sim.task(g)
    w = sim.started[0]
    w.hello()
    sim.terminate_group(g, "terminated by the test")
    for f in (f1, f2):
        with pytest.raises(Exception, match="terminated by the test"):
            f.result(0)
    assert w.handle.state == S.W_STOPPING
    assert any(isinstance(x, m.Shutdown) for x in w.take())


def _args():
    from dpool.objects import _payload

    return _payload.dumps(((), {}))


def test_a_queued_reader_pins_its_input_only_when_it_is_sent(sim):
    # (the race of a store filling up: readers queued behind a running task pinned every
    # value they would read, leaving no room for the running task's result)
    g = sim.group(max_workers=1)
    p, fp = sim.task(g)
    (w,) = sim.started
    w.hello()
    assert w.tasks() == [p]
    w.done(p, "input")
    fp.result(0)
    slow = sim.task(g, fn_id=2)[0]  # unknown duration: nothing is sent ahead of it
    assert w.tasks() == [slow]
    reader, fr = sim.task(g, deps=(p,))
    (queued,) = [t for t in g.queue if t.task_id == reader]
    assert queued.state == S.QUEUED and queued.deps is None  # queued: pins nothing
    assert w.tasks() == []
    w.done(slow, None)
    assert w.tasks() == [reader]  # sent: its input pinned for it, and sent with it
    assert queued.state == S.RUNNING and queued.deps is not None
    w.done(reader, "out")
    assert fr.result(0) == "out"
