"""The task state table (``scheduling._states``): the legal moves, and a typed error for
every other one -- driven by event sequences, no processes."""

from __future__ import annotations

import itertools

import pytest

from dpool.scheduling import _states as S
from dpool.scheduling._records import Task, WorkerGroup


def _task(task_id: int = 0x2A) -> Task:
    return Task(task_id, 1, None, None, WorkerGroup(1, 2, None, None, None, 3), None, None)


def _run(*events: int) -> Task:
    t = _task()
    for e in events:
        S.transition(t, e)
    return t


@pytest.mark.timeout(10)
def test_every_listed_move_lands_where_the_table_says():
    for (state, event), to in S.TRANSITIONS.items():
        t = _task()
        t.state = state
        assert S.transition(t, event) == state
        assert t.state == to


@pytest.mark.timeout(10)
def test_every_other_move_raises_naming_the_task_state_and_event():
    for state, event in itertools.product(range(len(S.STATES)), range(len(S.EVENTS))):
        if (state, event) in S.TRANSITIONS:
            continue
        t = _task(0x99)
        t.state = state
        with pytest.raises(S.IllegalTransition) as info:
            S.transition(t, event)
        assert t.state == state  # unchanged
        err = info.value
        assert (err.task_id, err.state, err.event) == (0x99, S.STATES[state], S.EVENTS[event])
        assert f"task 0x99 is {S.STATES[state]}" in str(err)
        assert f"'{S.EVENTS[event]}'" in str(err)
        assert isinstance(err, RuntimeError)


@pytest.mark.timeout(10)
def test_done_is_final_and_every_other_state_can_finish():
    for state in range(len(S.STATES)):
        assert ((state, S.FINISH) in S.TRANSITIONS) == (state != S.DONE)
    assert not any(s == S.DONE for s, _e in S.TRANSITIONS)


@pytest.mark.timeout(10)
def test_every_state_is_reachable_from_new():
    seen = {S.NEW}
    frontier = [S.NEW]
    while frontier:
        state = frontier.pop()
        for (s, _e), to in S.TRANSITIONS.items():
            if s == state and to not in seen:
                seen.add(to)
                frontier.append(to)
    assert seen == set(range(len(S.STATES)))


@pytest.mark.timeout(10)
@pytest.mark.parametrize("events, end", [
    # the plain path: every input ready at submit, sent, finished
    ((S.READY, S.SEND, S.FINISH), S.DONE),
    # an input pending at submit; it becomes ready; the task runs
    ((S.WAIT, S.READY, S.SEND, S.FINISH), S.DONE),
    # queued, then at dispatch an input finds no room (or was lost): it waits again,
    # pinning nothing, and is queued when room comes
    ((S.READY, S.WAIT, S.READY, S.SEND, S.FINISH), S.DONE),
    # its worker dies holding it without running it (or it is handed back): queued again
    ((S.READY, S.SEND, S.REQUEUE, S.SEND, S.FINISH), S.DONE),
    # sent to another node, which rejects it: back in the queue, then it runs here
    ((S.READY, S.SPILLBACK, S.RETURN, S.SEND, S.FINISH), S.DONE),
    # cancelled while queued
    ((S.READY, S.FINISH), S.DONE),
    # the executor was broken when it came
    ((S.FINISH,), S.DONE),
])
def test_paths_a_task_takes(events, end):
    assert _run(*events).state == end


@pytest.mark.timeout(10)
@pytest.mark.parametrize("events, bad", [
    # a task finished twice (its worker's death and its result both settle it)
    ((S.READY, S.SEND, S.FINISH), S.FINISH),
    # a finished task put back in the queue (a requeue racing its result)
    ((S.READY, S.SEND, S.FINISH), S.REQUEUE),
    # a queued task requeued as if it had been sent (counted against a worker twice)
    ((S.READY,), S.REQUEUE),
    # a task sent to a worker while it waits for an input
    ((S.WAIT,), S.SEND),
    # a task sent twice
    ((S.READY, S.SEND), S.SEND),
    # a running task sent to another node
    ((S.READY, S.SEND), S.SPILLBACK),
    # a task that never left coming back from another node
    ((S.READY,), S.RETURN),
])
def test_races_are_caught_where_they_happen(events, bad):
    t = _run(*events)
    with pytest.raises(S.IllegalTransition):
        S.transition(t, bad)


# -- workers -----------------------------------------------------------------------------

def _worker():
    from dpool.scheduling._records import WorkerHandle

    return WorkerHandle(7, WorkerGroup(1, 2, None, None, None, 3), None, None)


@pytest.mark.timeout(10)
def test_every_other_worker_move_raises_naming_the_worker_state_and_event():
    for state, event in itertools.product(range(len(S.WORKER_STATES)),
                                          range(len(S.WORKER_EVENTS))):
        w = _worker()
        w.state = state
        if (state, event) in S.WORKER_TRANSITIONS:
            assert S.worker_transition(w, event) == state
            assert w.state == S.WORKER_TRANSITIONS[state, event]
            continue
        with pytest.raises(S.IllegalWorkerTransition) as info:
            S.worker_transition(w, event)
        assert w.state == state
        assert str(info.value).startswith(f"worker 7 is {S.WORKER_STATES[state]}")
        assert isinstance(info.value, S.IllegalTransition)


@pytest.mark.timeout(10)
def test_a_worker_lives_through_its_states():
    w = _worker()
    assert w.alive and not w.ready  # starting: it may be sent tasks already
    w.mark_ready()
    assert w.alive and w.ready
    assert w.mark_stopping() is True
    assert not w.alive and not w.ready
    assert w.mark_stopping() is False  # (told twice: the runtime's end after its group's)
    w.mark_ready()  # a Hello that crossed the order to stop changes nothing
    assert w.state == S.W_STOPPING
    assert w.mark_closed() == S.W_STOPPING  # exited as told: nobody is charged
    with pytest.raises(S.IllegalWorkerTransition):
        w.mark_closed()  # its death handled twice
    with pytest.raises(S.IllegalWorkerTransition):
        w.mark_ready()  # a Hello after its socket closed


@pytest.mark.timeout(10)
def test_a_worker_that_dies_starting_or_ready_says_which():
    w = _worker()
    assert w.mark_closed() == S.W_STARTING  # died in its initializer: no task charged
    w = _worker()
    w.mark_ready()
    assert w.mark_closed() == S.W_READY  # died running: the running task is charged
