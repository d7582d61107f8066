"""What the spillback sends away and what it keeps (``node._spillback``), without processes.

A ``Spillback`` over a fake scheduler (``_fake_scheduler``): real groups and tasks, a
fake ``send`` that records the messages each global scheduler would get. The rule under
test: the k-th queued task waits about ``(k - free) / cpus * avg``; what would wait past
``threshold_s`` goes, tail first, within ``max_workers`` tasks away per group.
"""

from __future__ import annotations

import pickle

import pytest

from dpool.errors import WorkerCrashedError
from dpool.node._spillback import Spillback
from dpool.objects import _payload
from dpool.protocol import _messages as m
from dpool.scheduling import SchedulerAPI
from tests.node._fake_scheduler import FakeScheduler

GS = "gs-1:7000"


class Sent:
    """The spillback's ``send``: messages per address."""

    def __init__(self) -> None:
        self.msgs: dict[str, list] = {}

    def __call__(self, address: str, msgs: list) -> None:
        self.msgs.setdefault(address, []).extend(msgs)

    def ids(self, address: str = GS) -> list[int]:
        return [msg.task_id for msg in self.msgs.get(address, [])]


def _spillback(s: FakeScheduler, sent: Sent, schedulers: tuple = (GS,),
               **kw) -> Spillback:
    return Spillback(s, "node-a:6000", sent, lambda: list(schedulers), threshold_s=0.005,
                   **kw)


def test_the_fake_scheduler_is_a_scheduler_api() -> None:
    assert isinstance(FakeScheduler(), SchedulerAPI)


def test_the_spillback_plugs_in_through_the_api() -> None:
    s, sent = FakeScheduler(), Sent()
    sp = _spillback(s, sent)
    assert s.spillback is sp
    assert s.handlers[m.TaskResult.CODE] == sp._on_result_locked
    assert s.store.on_freed == sp._freed_locked


def test_a_queue_longer_than_free_cpus_and_the_threshold_spills_its_tail() -> None:
    s, sent = FakeScheduler(cpu_limit=4), Sent()
    s.busy = 4  # no CPU free
    s.batch.observe(7, 0.001)  # measured: 1 ms a task
    sp = _spillback(s, sent)
    g = s.new_group(max_workers=64)  # (room for plenty away: the threshold decides)
    tasks = s.queue_tasks(g, range(100, 130))
    sp.consider_locked(g)
    # 4 CPUs, 1 ms tasks: the first 5 ms / 1 ms * 4 = 20 wait less than the threshold
    assert [t.task_id for t in g.queue] == list(range(100, 120))
    assert sorted(sent.ids()) == list(range(120, 130))
    assert sent.ids()[0] == 129  # the tail first: the task that would wait longest
    msg = sent.msgs[GS][0]
    assert isinstance(msg, m.RemoteTask) and msg.origin == "node-a:6000" \
        and msg.fn_payload == b"fn" and msg.args == b"args"
    for t in tasks[20:]:  # away, but still this node's: running, charged an attempt
        assert sp.away[t.task_id].task is t and t.attempts == 1 and t.future.running()
    assert not s.finished


def test_free_cpus_keep_what_they_can_start_now() -> None:
    s, sent = FakeScheduler(cpu_limit=4), Sent()
    s.busy = 1  # 3 CPUs free
    s.batch.observe(7, 0.001)
    sp = _spillback(s, sent)
    g = s.new_group(max_workers=64)
    s.queue_tasks(g, range(23))  # 3 start now + 20 within the threshold
    sp.consider_locked(g)
    assert len(g.queue) == 23 and not sent.msgs
    s.queue_tasks(g, range(23, 25))
    sp.consider_locked(g)
    assert sent.ids() == [24, 23]


def test_a_never_measured_function_keeps_only_what_can_start_now() -> None:
    s, sent = FakeScheduler(cpu_limit=4), Sent()
    s.busy = 1
    sp = _spillback(s, sent)
    g = s.new_group(max_workers=8)
    s.queue_tasks(g, range(10))  # fn 7 never ran: it may be long
    sp.consider_locked(g)
    assert [t.task_id for t in g.queue] == [0, 1, 2]  # the 3 free CPUs take these
    assert sorted(sent.ids()) == list(range(3, 10))


def test_max_workers_caps_the_tasks_away() -> None:
    s, sent = FakeScheduler(cpu_limit=1), Sent()
    s.busy = 1
    s.batch.observe(7, 1.0)  # long tasks: one away per worker slot
    sp = _spillback(s, sent)
    g = s.new_group(max_workers=2)
    s.queue_tasks(g, range(5))
    sp.consider_locked(g)
    assert sent.ids() == [4, 3]
    sp.consider_locked(g)  # both slots are away already
    assert sent.ids() == [4, 3] and len(g.queue) == 3


def test_no_global_scheduler_spills_nothing() -> None:
    s, sent = FakeScheduler(cpu_limit=4), Sent()
    s.busy = 4
    sp = _spillback(s, sent, schedulers=())
    g = s.new_group()
    s.queue_tasks(g, range(50))
    sp.consider_locked(g)
    assert not sent.msgs and len(g.queue) == 50 and not sp.away


def test_a_group_kept_local_is_never_spilled() -> None:
    s, sent = FakeScheduler(cpu_limit=4), Sent()
    s.busy = 4
    g = s.new_group()
    sp = _spillback(s, sent, local_groups=lambda grp: grp is g)
    s.queue_tasks(g, range(50))
    sp.consider_locked(g)
    assert not sent.msgs and len(g.queue) == 50


def test_a_rejected_spill_comes_home_uncharged_and_pauses_spilling() -> None:
    s, sent = FakeScheduler(cpu_limit=4), Sent()
    s.busy = 4
    sp = _spillback(s, sent)
    g = s.new_group(max_workers=8)
    s.queue_tasks(g, range(4))
    sp.consider_locked(g)
    assert sorted(sent.ids()) == [0, 1, 2, 3]
    sp._on_rejected_locked(None, m.SpillbackRejected(3, "no other node"))
    (t,) = s.returned
    assert t.task_id == 3 and t.attempts == 0 and 3 not in sp.away
    # paused: a long queue stays here for now
    s.queue_tasks(g, range(10, 40))
    before = len(sent.ids())
    sp.consider_locked(g)
    assert len(sent.ids()) == before


def test_a_cancelled_task_is_skipped_not_spilled() -> None:
    s, sent = FakeScheduler(cpu_limit=4), Sent()
    s.busy = 4
    sp = _spillback(s, sent)
    g = s.new_group()
    tasks = s.queue_tasks(g, range(3))
    tasks[2].future.cancel()
    sp.consider_locked(g)
    assert sorted(sent.ids()) == [0, 1]
    assert [(t.task_id, ok) for t, ok, _ in s.finished] == [(2, False)]


def test_a_node_lost_retries_its_tasks_then_fails_them() -> None:
    s, sent = FakeScheduler(cpu_limit=4), Sent()
    s.busy = 4
    sp = _spillback(s, sent)
    g = s.new_group(max_attempts=2)
    s.queue_tasks(g, range(1))
    sp.consider_locked(g)
    h = type("Peer", (), {"address": "node-b:6000"})()
    sp._on_accepted_locked(h, m.Accepted(0, "node-b"))
    sp.node_lost_locked("node-b:6000")
    (t,) = s.returned  # charged: attempt 1 of 2 used
    assert t.attempts == 1 and not s.finished
    g.queue.clear()
    g.queue.append(t)
    sp.consider_locked(g)  # sent again: attempt 2
    sp._on_accepted_locked(h, m.Accepted(0, "node-b"))
    sp.node_lost_locked("node-b:6000")
    ((done, ok, payload),) = s.finished
    assert done is t and not ok
    err = _payload.loads_error(payload)
    assert isinstance(err, WorkerCrashedError) and "node-b:6000" in str(err)


@pytest.mark.parametrize("paused", [False, True])
def test_a_result_finishes_the_task_and_spills_more(paused: bool) -> None:
    s, sent = FakeScheduler(cpu_limit=1), Sent()
    s.busy = 1
    s.batch.observe(7, 1.0)
    sp = _spillback(s, sent)
    g = s.new_group(max_workers=1)
    s.queue_tasks(g, range(3))
    sp.consider_locked(g)
    assert sent.ids() == [2]
    if paused:
        sp._paused_until = float("inf")
    value = pickle.dumps(42)
    sp._on_result_locked(None, m.TaskResult(2, True, value, 0.5))
    assert [(t.task_id, ok, p) for t, ok, p in s.finished] == [(2, True, value)]
    assert 2 not in sp.away
    # a slot away is free again: the next tail task goes at once (unless paused)
    assert sent.ids() == ([2] if paused else [2, 1])
