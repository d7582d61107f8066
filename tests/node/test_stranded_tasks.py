"""No task may sit where nobody will act on it (issue 17): the spillback's and the runner's
safety nets, without processes (``_fake_scheduler``).

- a pool whose ``max_workers`` is 0 (sized by a 0-CPU head before it saw the node that
  joined) still spills its tasks: they used to stay queued on the head for good;
- a task queued on a node with no CPUs that no node takes (no global scheduler linked,
  every offer rejected) fails with ``ResourceError`` after the grace period;
- a node that accepted a task and lost it is noticed: the origin asks the runner about
  tasks accepted a while ago (``TasksQuery``), and one the runner has no trace of in two
  answers in a row (``TasksKnown``) is offered again, uncharged.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
from types import SimpleNamespace

from dpool.node._remote import RemoteRunner
from dpool.node._spillback import Spillback
from dpool.protocol import _messages as m
from tests.node._fake_scheduler import FakeScheduler

GS = "gs-1:7000"
ORIGIN = "node-a:6000"
RUNNER = "node-b:6001"


class Sent:
    def __init__(self) -> None:
        self.msgs: dict[str, list] = {}

    def __call__(self, address: str, msgs: list) -> None:
        self.msgs.setdefault(address, []).extend(msgs)

    def take(self, address: str) -> list:
        return self.msgs.pop(address, [])


def _spillback(s: FakeScheduler, sent: Sent, schedulers: tuple = (GS,)) -> Spillback:
    return Spillback(s, ORIGIN, sent, lambda: list(schedulers), threshold_s=0.005)


def _peer(address: str) -> SimpleNamespace:
    return SimpleNamespace(address=address, peer_id=address)


# -- a pool of 0 workers ------------------------------------------------------------------
def test_a_pool_sized_at_zero_cpus_still_spills_its_tasks() -> None:
    s, sent = FakeScheduler(cpu_limit=0), Sent()
    sp = _spillback(s, sent)
    g = s.new_group(max_workers=0)  # cpu_count() said 0: the head had not seen the node
    s.queue_tasks(g, range(3))
    sp.consider_locked(g)
    assert [msg.task_id for msg in sent.take(GS)] == [2]  # one away at a time, not none
    assert len(g.queue) == 2


# -- a node with no CPUs: ResourceError after the grace period ----------------------------
def test_no_global_scheduler_on_a_zero_cpu_node_fails_after_the_grace() -> None:
    s, sent = FakeScheduler(cpu_limit=0), Sent()
    sp = _spillback(s, sent, schedulers=())
    sp.grace_s = 5.0
    g = s.new_group()
    (t,) = s.queue_tasks(g, range(1))
    sp._homeless_locked(100.0)
    assert sp.wants_tick()
    sp._homeless_locked(104.0)  # within the grace: a scheduler may link yet
    assert list(g.queue) == [t] and not s.unrunnable
    sp._homeless_locked(105.5)
    ((failed, why),) = s.unrunnable
    assert failed is t and not g.queue
    assert "no CPUs" in why and "no global scheduler is linked" in why \
        and "DPOOL_RESOURCE_GRACE_S" in why
    assert not sp._homeless and not sp.wants_tick()


def test_rejected_everywhere_on_a_zero_cpu_node_fails_after_the_grace() -> None:
    s, sent = FakeScheduler(cpu_limit=0), Sent()
    sp = _spillback(s, sent)
    sp.grace_s = 0.0
    g = s.new_group()
    (t,) = s.queue_tasks(g, range(1))
    sp.consider_locked(g)
    (msg,) = sent.take(GS)
    sp._on_rejected_locked(None, m.SpillbackRejected(msg.task_id, "no other node with CPUs"))
    assert list(g.queue) == [t] and t.attempts == 0  # home, uncharged
    sp.tick_locked()
    ((failed, why),) = s.unrunnable
    assert failed is t and "no other node with CPUs" in why


def test_a_node_taking_the_group_clears_the_grace() -> None:
    s, sent = FakeScheduler(cpu_limit=0), Sent()
    sp = _spillback(s, sent)
    sp.grace_s = 0.0
    g = s.new_group(max_workers=1)
    s.queue_tasks(g, range(2))
    sp.consider_locked(g)
    (msg,) = sent.take(GS)
    sp._on_rejected_locked(None, m.SpillbackRejected(msg.task_id, "no other node with CPUs"))
    sp._paused_until = 0.0
    sp.consider_locked(g)
    (msg,) = sent.take(GS)
    sp._on_accepted_locked(_peer(RUNNER), m.Accepted(msg.task_id, RUNNER))
    sp._homeless_locked(1e9)  # the other task waits behind max_workers: it may
    assert not s.unrunnable and len(g.queue) == 1


def test_a_node_with_cpus_never_fails_a_queued_task_this_way() -> None:
    s, sent = FakeScheduler(cpu_limit=2), Sent()
    s.busy = 2
    sp = _spillback(s, sent, schedulers=())
    sp.grace_s = 0.0
    g = s.new_group()
    s.queue_tasks(g, range(1))
    sp.tick_locked()
    assert not s.unrunnable and len(g.queue) == 1 and not sp._homeless


# -- a runner that lost an accepted task ----------------------------------------------------
def _runner(s: FakeScheduler, sent: Sent) -> RemoteRunner:
    return RemoteRunner(s, RUNNER, sent)


def _remote_task(task_id: int) -> m.RemoteTask:
    return m.RemoteTask(task_id, ORIGIN, 1, (2, mp.get_start_method(), None, None, 3), 7,
                        pickle.dumps(len), b"args", None, "/tmp", (), ())


def test_the_runner_answers_which_accepted_tasks_it_has() -> None:
    s, sent = FakeScheduler(), Sent()
    r = _runner(s, sent)
    r._on_task_locked(_peer(ORIGIN), _remote_task(11))
    r._on_task_locked(_peer(ORIGIN), _remote_task(12))
    assert [type(x).__name__ for x in sent.take(ORIGIN)] == ["Accepted", "Accepted"]
    (g,) = s.groups.values()
    r._on_query_locked(_peer(ORIGIN), m.TasksQuery(ORIGIN, (11, 12, 13)))
    (reply,) = sent.take(ORIGIN)
    assert reply == m.TasksKnown(RUNNER, (11, 12), (13,))
    # a task running on a worker is known; one admitted and then in nothing is not
    w = SimpleNamespace(inflight={g.queue[0].task_id: g.queue[0]})
    g.workers.append(w)
    g.queue.clear()
    r._on_query_locked(_peer(ORIGIN), m.TasksQuery(ORIGIN, (11, 12)))
    assert sent.take(ORIGIN) == [m.TasksKnown(RUNNER, (11,), (12,))]
    # another origin's tasks are not this origin's
    assert r.tasks_of_locked("node-c:6002") == set()


def test_a_finished_task_is_unknown_once_its_result_went() -> None:
    s, sent = FakeScheduler(), Sent()
    r = _runner(s, sent)
    r._on_task_locked(_peer(ORIGIN), _remote_task(11))
    (g,) = s.groups.values()
    t = g.queue.popleft()
    t.future(True, pickle.dumps(3))  # ``done``: the result goes to the origin
    sent.take(ORIGIN)
    assert r.tasks_of_locked(ORIGIN) == set() and not r._remote


def test_the_origin_offers_a_task_its_runner_lost_again_after_two_answers() -> None:
    s, sent = FakeScheduler(cpu_limit=0), Sent()
    sp = _spillback(s, sent)
    sp.check_s = 0.0
    g = s.new_group()
    (t,) = s.queue_tasks(g, range(1))
    sp.consider_locked(g)
    sent.take(GS)
    runner = _peer(RUNNER)
    sp._on_accepted_locked(runner, m.Accepted(0, RUNNER))
    assert t.attempts == 1
    sp.tick_locked()
    assert sent.take(RUNNER) == [m.TasksQuery(ORIGIN, (0,))]
    sp._on_known_locked(runner, m.TasksKnown(RUNNER, (), (0,)))  # may cross its result
    assert 0 in sp.away and not s.returned
    sp._on_known_locked(runner, m.TasksKnown(RUNNER, (0,), ()))  # known again: reset
    sp._on_known_locked(runner, m.TasksKnown(RUNNER, (), (0,)))
    assert 0 in sp.away and not s.returned
    sp._on_known_locked(_peer("node-c:6002"), m.TasksKnown("node-c:6002", (), (0,)))
    assert 0 in sp.away  # (another node's word about it counts for nothing)
    sp._on_known_locked(runner, m.TasksKnown(RUNNER, (), (0,)))
    assert s.returned == [t] and 0 not in sp.away and t.attempts == 0  # uncharged
    assert not s.finished


def test_tasks_not_yet_accepted_or_being_pulled_are_not_asked_about() -> None:
    s, sent = FakeScheduler(cpu_limit=0), Sent()
    sp = _spillback(s, sent)
    sp.check_s = 0.0
    g = s.new_group()
    s.queue_tasks(g, range(2))
    sp.consider_locked(g)
    sent.take(GS)
    sp._on_accepted_locked(_peer(RUNNER), m.Accepted(1, RUNNER))
    sp.away[1].pulling = True
    sp.tick_locked()
    assert RUNNER not in sent.msgs


def test_origin_and_runner_together_recover_a_lost_task() -> None:
    """The whole round: spilled, accepted, lost at the runner, offered again."""
    s_a, s_b, sent = FakeScheduler(cpu_limit=0), FakeScheduler(), Sent()
    sp = _spillback(s_a, sent)
    sp.check_s = 0.0
    r = _runner(s_b, sent)
    g = s_a.new_group()
    (t,) = s_a.queue_tasks(g, range(5, 6))
    sp.consider_locked(g)
    (msg,) = sent.take(GS)  # the global scheduler places it on the runner
    r._on_task_locked(_peer(ORIGIN), msg)
    for reply in sent.take(ORIGIN):
        s_a.handlers[reply.CODE](_peer(RUNNER), reply)
    (mirror,) = s_b.groups.values()
    mirror.queue.clear()  # the runner loses it (the state issue 17 saw)
    for _ in range(2):
        sp.tick_locked()
        for query in sent.take(RUNNER):
            s_b.handlers[query.CODE](_peer(ORIGIN), query)
        for reply in sent.take(ORIGIN):
            s_a.handlers[reply.CODE](_peer(RUNNER), reply)
    assert s_a.returned == [t] and not sp.away


# -- a link that closes as it opens ---------------------------------------------------------
def test_messages_queued_for_a_link_that_closed_as_it_opened_come_back() -> None:
    """The IO loop may see a fresh link close before ``Links`` publishes it (its closed
    hooks then find nothing to take back): the messages queued while connecting go to
    ``on_unreachable`` (the spillback takes their tasks home), not into a dead channel."""
    import secrets
    import threading

    from dpool.global_scheduler._daemon import GlobalScheduler
    from dpool.node._links import Links, peer_hello

    class ClosesAtOnce:  # an IO loop that sees the peer close the moment it is added
        def add(self, h: object) -> None:
            h.mark_closed()  # type: ignore[attr-defined]

        def want_write(self, h: object) -> None:
            pass

    token = secrets.token_bytes(16)
    gs = GlobalScheduler(token, "127.0.0.1", 0)
    gs.serve()
    back: list = []
    came = threading.Event()

    def unreachable(address: str, msgs: list) -> None:
        back.append((address, msgs))
        came.set()

    links = Links(token, peer_hello(ORIGIN, ORIGIN, 0), ClosesAtOnce(),  # type: ignore[arg-type]
                  unreachable)
    try:
        msg = _remote_task(9)
        links.send(gs.address, [msg])
        assert came.wait(10), "the queued messages were lost"
        assert back == [(gs.address, [msg])]
        assert not links.connected(gs.address)  # a dead link is never published
    finally:
        links.close()
        gs.close()
