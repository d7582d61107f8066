"""The scheduler's decisions for actor groups, event by event (``_sim``): the order of
calls, what a death does with restarts left and without, what a checkpoint keeps."""

from __future__ import annotations

import pytest

from dpool import ActorDiedError
from dpool.objects import payload as _payload
from dpool.protocol import _messages as m
from dpool.scheduling import ActorConfig, WorkerGroupConfig

pytestmark = pytest.mark.timeout(20)


def _actor(sim, max_restarts=0, every=0):
    cfg = ActorConfig("A#1", print, b"ctor", max_restarts, every)
    init = _payload.dumps((print, (b"ctor", None, [], every)))
    return sim.add_group(WorkerGroupConfig(1, None, init, None, 1, None, None, cfg))


def _boot_args(g):
    _boot, args = _payload.loads(g.initializer)
    assert args[4] == g.actor.cfg.max_concurrency
    return args[:4]  # (ctor, checkpoint, replay, every)


def test_a_call_waiting_for_an_input_holds_back_the_calls_after_it(sim):
    tasks = sim.group(max_workers=1)
    g = _actor(sim)
    p, _fp = sim.task(tasks)
    producer = sim.started[0]
    c1, f1 = sim.task(g, deps=(p,))  # waits for p
    c2, f2 = sim.task(g)  # ready, but made after c1
    actor = sim.started[1]  # its worker started for the calls
    assert actor.tasks() == []  # c2 is not sent ahead of c1
    producer.hello()
    producer.done(p, 5)
    actor.hello()
    assert actor.tasks() == [c1, c2]  # in the order made, once c1's input is there
    actor.done(c1, 1)
    actor.done(c2, 2)
    assert (f1.result(0), f2.result(0)) == (1, 2)
    assert len(sim.started) == 2  # one worker, for good


def test_a_death_with_restarts_left_replays_the_log_then_resends_what_it_held(sim):
    g = _actor(sim, max_restarts=1)
    c0, f0 = sim.task(g)
    (w,) = sim.started
    w.hello()
    assert w.tasks() == [c0]
    w.done(c0, "first")
    assert f0.result(0) == "first"
    c1, f1 = sim.task(g)
    assert w.tasks() == [c1]
    c2, f2 = sim.task(g)  # behind c1 (c1's run time is not known: it goes alone)
    w.dies(exitcode=-9, running=c1)
    new = sim.started[1]  # restarted
    ctor, checkpoint, replay, _every = _boot_args(g)
    assert ctor == b"ctor" and checkpoint is None
    # c0, which it ran, replayed with its function and arguments; c1, c2 not (never ran)
    assert [(fn, args) for fn, args, _deps in replay] == [
        (sim._functions[1], _payload.dumps(((), {})))]
    new.hello()
    assert new.tasks() == [c1, c2]  # uncharged, in order, each to complete once
    new.done(c1, "again")
    new.done(c2, "next")
    assert (f1.result(0), f2.result(0)) == ("again", "next")


def test_a_death_without_restarts_fails_every_call_with_actor_died_error(sim):
    g = _actor(sim)
    c1, f1 = sim.task(g)
    (w,) = sim.started
    w.hello()
    assert w.tasks() == [c1]
    c2, f2 = sim.task(g)
    w.dies(exitcode=-9, running=c1)
    for f in (f1, f2):
        with pytest.raises(ActorDiedError, match=r"A#1 died: .*SIGKILL \(max_restarts=0\)"):
            f.result(0)
    _c3, f3 = sim.task(g)  # and later calls
    with pytest.raises(ActorDiedError):
        f3.result(0)
    assert len(sim.started) == 1  # not restarted


def test_a_checkpoint_replaces_the_calls_before_it(sim):
    g = _actor(sim, max_restarts=-1, every=2)
    (c1, _f1), (c2, _f2) = sim.task(g), sim.task(g)
    (w,) = sim.started
    w.hello()
    w.take()
    w.done(c1, 1)
    w.tasks()  # (c2: sent once c1's short run time is known)
    w.done(c2, 2)
    assert len(g.actor.log) == 2
    w.send(m.ActorCheckpoint(b"state-after-2"))
    assert g.actor.log == [] and g.actor.checkpoint == b"state-after-2"
    c3, _f3 = sim.task(g)
    assert w.tasks() == [c3]
    w.done(c3, 3)
    w.dies(exitcode=-9, running=0)
    _ctor, checkpoint, replay, every = _boot_args(g)
    assert checkpoint == b"state-after-2" and len(replay) == 1 and every == 2


def test_a_closed_actor_refuses_later_calls_with_actor_died_error(sim):
    g = _actor(sim)
    c1, f1 = sim.task(g)
    (w,) = sim.started
    w.hello()
    assert w.tasks() == [c1]
    sim.close_group(g)
    w.done(c1, "last")  # a pending call completes: then the actor stops
    assert f1.result(0) == "last"
    assert any(isinstance(x, m.Shutdown) for x in w.take())
    _c2, f2 = sim.task(g)
    with pytest.raises(ActorDiedError, match="shut down"):
        f2.result(0)
