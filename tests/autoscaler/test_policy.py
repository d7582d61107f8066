"""The autoscaler's built-in rule (``QueueTarget``), pure: views in, decisions out."""

from __future__ import annotations

import pytest

from dpool.autoscaler import ClusterView, QueueTarget, parse_range
from dpool.autoscaler._policy import NodeSeen


def view(nodes, pending=0, ours=None, now=100.0):
    return ClusterView(nodes, pending, sum(n.ours for n in nodes) + pending
                       if ours is None else ours, now)


def head(queued=0, used=0, total=0):
    return NodeSeen("head:1", total, used, queued)


def node(i, used=0, queued=0, idle_since=None, total=1):
    return NodeSeen(f"n{i}:1", total, used, queued, True, idle_since)


def test_it_adds_nodes_for_queued_work_at_most_doubling():
    p = QueueTarget(0, 8, cpus_per_node=1, idle_timeout_s=10)
    assert p.decide(view([head(queued=20)])).add == 1  # none yet: one
    assert p.decide(view([head(queued=16), node(1, used=1)])).add == 1  # doubling: 1 -> 2
    two = p.decide(view([head(queued=12), node(1, used=1), node(2, used=1)]))
    assert two.add == 2
    assert p.decide(view([head(queued=30)] + [node(i, used=1) for i in range(6)])).add == 2
    assert p.decide(view([head(queued=30)] + [node(i, used=1) for i in range(8)])).add == 0


def test_nodes_still_starting_and_free_cpus_count():
    p = QueueTarget(0, 8, cpus_per_node=2, idle_timeout_s=10)
    assert p.decide(view([head(queued=3, total=4)])).add == 0  # free CPUs take them
    assert p.decide(view([head(queued=4)], pending=2)).add == 0  # 2 nodes x 2 CPUs coming
    assert p.decide(view([head(queued=5)], pending=2)).add == 1


def test_it_removes_only_its_own_nodes_idle_long_enough_down_to_the_minimum():
    p = QueueTarget(1, 4, cpus_per_node=1, idle_timeout_s=10)
    nodes = [head(), node(1, idle_since=80.0), node(2, idle_since=95.0), node(3, used=1)]
    d = p.decide(view(nodes, now=100.0))
    assert d.remove == ["n1:1"] and d.add == 0  # n2 not idle long enough, n3 busy
    nodes = [head(), node(1, idle_since=0.0), node(2, idle_since=0.0)]
    assert len(p.decide(view(nodes)).remove) == 1  # keeps MIN = 1
    nodes = [head(queued=1), node(1, idle_since=0.0, total=0)]
    assert p.decide(view(nodes)).remove == []  # never while work waits


def test_it_starts_the_minimum():
    p = QueueTarget(2, 4, cpus_per_node=1, idle_timeout_s=10)
    assert p.decide(view([head()])).add == 2


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="MIN <= MAX"):
        QueueTarget(3, 2, 1, 10)
    with pytest.raises(ValueError, match="CPUs"):
        QueueTarget(0, 2, 0, 10)
    assert parse_range("0:4") == (0, 4)
    for bad in ("4", "a:b", "3:1", "-1:2"):
        with pytest.raises(ValueError, match="MIN"):
            parse_range(bad)


def test_a_standing_request_is_kept_whatever_is_queued():
    p = QueueTarget(0, 4, cpus_per_node=1, idle_timeout_s=10)
    v = view([head()])
    v.requested_cpus = 3
    assert p.decide(v).add == 1  # (doubling from none: one, then two, ...)
    nodes = [head()] + [node(i, idle_since=0.0) for i in range(3)]
    v = view(nodes)
    v.requested_cpus = 3
    assert p.decide(v).remove == [] and p.decide(v).add == 0  # idle, but asked for
    v.requested_cpus = 2
    assert len(p.decide(v).remove) == 1
