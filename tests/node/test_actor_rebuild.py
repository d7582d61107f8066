"""What a driver's node keeps of its placed actors (``node._actor_rebuild``), driven
through the node's handlers on a fake scheduler: the log follows the order the calls
were forwarded in (a checkpoint may overtake the result of the last call it holds), and
a lost node's calls go back first in the actor's order while the actor is placed again
from the copy."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dpool.node._actor_placement import ActorPlacement
from dpool.node._actor_rebuild import ActorRebuilds
from dpool.protocol import messages as m
from dpool.scheduling import ActorConfig, ActorState
from dpool.scheduling._states import AWAY
from tests.node._fake_scheduler import FakeScheduler

pytestmark = pytest.mark.timeout(30)

GID = 42
FROM_H = SimpleNamespace(address="H", peer_id="H")  # the link from the actor's node


def _setup(max_restarts: int = 2):
    s = FakeScheduler()
    sent: list = []
    placement = ActorPlacement(s, "D", lambda node, msgs: sent.append((node, msgs)))
    placement.schedulers = lambda: ["gs"]
    rebuilds = ActorRebuilds(s, placement)
    g = s.new_group(GID, max_workers=1)
    g.actor = ActorState(ActorConfig("Counter#42", object(), b"ctor", max_restarts))
    g.actor.host = "H"
    placement.placed[GID] = "H"
    placement._cfgs[GID] = ("actor", 1, "fork", b"init", None, 1,
                            ("Counter#42", max_restarts, 0, 1, False, None))
    calls = s.queue_tasks(g, range(100, 104))
    g.queue.clear()
    for t in calls:  # (forwarded: away at H)
        t.state = AWAY
    rebuilds.forwarded_locked(g, calls)
    return s, sent, rebuilds, g, calls


def test_the_log_holds_the_calls_no_checkpoint_holds_in_the_order_forwarded():
    s, _sent, rebuilds, g, calls = _setup()
    rebuilds.ran_locked(calls[0])
    rebuilds.ran_locked(calls[1])
    assert [e[0] for e in g.actor.log] == [7, 7] and len(g.actor.log) == 2
    # the checkpoint after call 102 comes before 102's result: it holds 100..102
    s.handlers[m.ActorSaved.CODE](FROM_H, m.ActorSaved(GID, b"state", 102))
    assert g.actor.checkpoint == b"state" and g.actor.log == []
    rebuilds.ran_locked(calls[2])  # (late: held by the checkpoint already)
    assert g.actor.log == []
    rebuilds.ran_locked(calls[3])
    assert len(g.actor.log) == 1
    # a checkpoint naming a call this node does not know changes nothing
    s.handlers[m.ActorSaved.CODE](FROM_H, m.ActorSaved(GID, b"other", 999))
    assert g.actor.checkpoint == b"state" and len(g.actor.log) == 1
    # nor does one from a node the actor left
    s.handlers[m.ActorSaved.CODE](SimpleNamespace(address="OLD", peer_id="OLD"),
                                  m.ActorSaved(GID, b"stale", 103))
    assert g.actor.checkpoint == b"state" and len(g.actor.log) == 1


def test_calls_lost_with_the_node_go_back_first_in_order_and_the_actor_is_placed_again():
    s, sent, rebuilds, g, calls = _setup()
    rebuilds.ran_locked(calls[0])
    g.actor.order.append("later")  # a call admitted meanwhile, not yet sent
    assert rebuilds.calls_lost_locked(g, calls[1:], "its node H went away")
    assert list(g.actor.order) == [*calls[1:], "later"]
    assert list(g.queue) == calls[1:]
    assert g.actor.host == ActorState.PLACING and g.actor.restarts == 1
    assert GID not in rebuilds._placement.placed
    kill, ask = sent
    assert kill[0] == "H" and isinstance(kill[1][0], m.KillActor)
    assert ask[0] == "gs"
    msg = ask[1][0]
    assert isinstance(msg, m.RemoteTask) and msg.group_id == GID
    cfg = msg.group_cfg
    assert cfg[0] == "actor" and cfg[6][1] == 1  # (one restart left for its new node)
    assert cfg[3].endswith(b"True)")  # its new initializer: the boot, values inline
    # its node's other loss reports do not place it twice
    rebuilds.hosts_lost_locked({"H"}, "declared dead")
    assert len(sent) == 2


def test_an_actor_without_restarts_left_is_not_rebuilt():
    s, sent, rebuilds, g, calls = _setup(max_restarts=1)
    g.actor.restarts = 1
    assert not rebuilds.calls_lost_locked(g, calls, "its node H went away")
    assert sent == [] and g.actor.host == "H"
    s2, sent2, rebuilds2, g2, calls2 = _setup(max_restarts=0)
    assert not rebuilds2.calls_lost_locked(g2, calls2, "its node H went away")
    rebuilds2.ran_locked(calls2[0])
    assert g2.actor.log == []  # (nothing is kept for an actor that is never rebuilt)
