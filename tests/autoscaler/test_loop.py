"""The autoscaler's loop over a provider that records what it is asked (the real one,
``LocalProvider``, runs in tests/cluster/test_autoscaler.py): what it adds, what it
forgets when a node it started disappears, what it removes."""

from __future__ import annotations

import time

from dpool.autoscaler import QueueTarget
from dpool.autoscaler._daemon import Autoscaler
from dpool.autoscaler._providers import ProvidedNode


class Recorder:
    cpus_per_node = 1

    def __init__(self):
        self._nodes: list = []
        self.terminated: list = []

    def create_node(self):
        n = ProvidedNode(f"10.0.0.{len(self._nodes) + 1}", created=time.monotonic())
        n.started.set()  # (at once, here)
        self._nodes.append(n)
        return n

    def terminate_node(self, node):
        self.terminated.append(node.key)
        self._nodes.remove(node)

    def nodes(self):
        return list(self._nodes)


def _wait(cond):
    deadline = time.monotonic() + 5
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def test_it_adds_for_a_queue_forgets_a_lost_node_and_removes_idle_ones():
    status = {"nodes": [{"node_id": "head", "alive": True, "cpus_total": 0,
                         "cpus_used": 0, "queued": 5}]}
    p = Recorder()
    a = Autoscaler(lambda: status, p, QueueTarget(0, 3, 1, idle_timeout_s=0.0),
                   min_nodes=0, max_nodes=3)
    a.step()
    assert len(p.nodes()) == 1  # none yet: one
    n1 = p.nodes()[0]
    n1.node_id = "n1"
    status["nodes"].append({"node_id": "n1", "alive": True, "cpus_total": 1,
                            "cpus_used": 1, "queued": 0})
    a.step()
    assert len(p.nodes()) == 2  # doubling: 1 -> 2
    n2 = p.nodes()[1]
    n2.node_id = "n2"
    status["nodes"].append({"node_id": "n2", "alive": True, "cpus_total": 1,
                            "cpus_used": 1, "queued": 0})
    status["nodes"][0]["queued"] = 0  # (the queue taken: both run)
    a.step()  # (both seen alive; nothing to add or remove)
    assert len(p.nodes()) == 2 and not p.terminated
    status["nodes"] = [x for x in status["nodes"] if x["node_id"] != "n2"]  # n2 dies
    a.step()
    assert _wait(lambda: "10.0.0.2" in p.terminated)  # forgotten, not counted as coming
    status["nodes"][1]["cpus_used"] = 0
    a.step()  # idle (timeout 0): n1 goes
    assert _wait(lambda: "10.0.0.1" in p.terminated)
    assert [d[1] for d in a.decisions if d[1]] == [1, 1]


class Greedy:
    """A policy that asks too much both ways: the loop keeps it within MIN..MAX."""

    def decide(self, view):
        from dpool.autoscaler import Decision

        return Decision(add=10, remove=[n.node_id for n in view.nodes if n.ours])


def test_the_loop_keeps_any_policy_within_min_and_max():
    status = {"nodes": [{"node_id": "head", "alive": True, "cpus_total": 0,
                         "cpus_used": 0, "queued": 0}]}
    p = Recorder()
    a = Autoscaler(lambda: status, p, Greedy(), min_nodes=1, max_nodes=2)
    a.step()
    assert len(p.nodes()) == 2  # not 10
    for i, n in enumerate(p.nodes()):
        n.node_id = f"n{i}"
        status["nodes"].append({"node_id": n.node_id, "alive": True, "cpus_total": 1,
                                "cpus_used": 0, "queued": 0})
    a.step()  # (asks to remove both: one stays)
    assert _wait(lambda: len(p.terminated) == 1)
    time.sleep(0.1)
    assert len(p.terminated) == 1
