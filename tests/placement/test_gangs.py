"""Placement groups' state machine (``placement.GangTable``) and a scheduler's
bundles (``scheduling._bundle_ledger``), driven with fake nodes: no processes.

The table decides with ``place_bundles`` and holds in two phases: all bundles or none,
a group that does not fit beside the ones held waits (holding nothing) until one is
removed, a node's refusal frees what the try holds elsewhere, a dead node's groups are
lost. The ledger keeps a bundle's CPUs and resources from every task outside it."""

from __future__ import annotations

from dpool.placement import GangTable, NodeLoad
from dpool.scheduling._bundle_ledger import BundleLedger
from dpool.scheduling._resources import Ledger, Request

ONE = Request(1)


class Cluster:
    """Fake nodes that answer holds when told (``answer``), and a log of what happened."""

    def __init__(self, *cpus: int) -> None:
        self.loads = [NodeLoad(f"n{i}", c, resources={"GPU": 0}, free={"GPU": 0})
                      for i, c in enumerate(cpus)]
        self.holds: list = []  # (node, pg, index, attempt) sent, not answered
        self.held: dict = {}  # (pg, index) -> node: what the nodes hold now
        self.reports: list = []  # (pg, state, nodes, reason)
        self.table = GangTable(self._hold, self._free, self._report)

    def _hold(self, node, pg, i, req, attempt):
        self.holds.append((node, pg, i, attempt))

    def _free(self, node, pg, i):
        self.held.pop((pg, i), None)
        self.holds = [h for h in self.holds if (h[1], h[2]) != (pg, i)]

    def _report(self, origin, pg, state, nodes, reason):
        self.reports.append((pg, state, nodes, reason))

    def answer(self, ok=lambda node: True):
        """Each node answers the holds sent to it (and a report of its load follows)."""
        while self.holds:
            node, pg, i, attempt = self.holds.pop(0)
            good = ok(node)
            if good:
                self.held[(pg, i)] = node
            self.table.held(pg, i, good, "" if good else "busy", attempt, self.fresh())

    def fresh(self):
        """The nodes' next load reports: their CPUs minus what bundles hold there."""
        for n in self.loads:
            n.pending = 0
            n.busy = sum(1 for node in self.held.values() if node == n.address)
        return self.loads

    def state(self, pg):
        return [r[1] for r in self.reports if r[0] == pg]


def test_two_groups_that_do_not_fit_together_one_holds_the_other_waits_holding_nothing():
    c = Cluster(2, 2, 2)
    c.table.reserve(1, "n0", [ONE] * 4, "spread", c.fresh())
    c.table.reserve(2, "n0", [ONE] * 3, "spread", c.loads)  # before any load report
    assert {h[1] for h in c.holds} == {1}  # only the first started holding
    c.answer()
    assert c.state(1) == ["ready"] and c.state(2) == []
    assert len(c.held) == 4 and len(set(c.held.values())) == 3  # spread: every node
    c.table.retry(c.fresh())  # another report: still no room for 3
    assert not c.holds and all(pg == 1 for pg, _ in c.held)
    c.table.remove(1, c.fresh())
    assert not any(pg == 1 for pg, _ in c.held)
    c.table.retry(c.fresh())
    c.answer()
    assert c.state(2) == ["ready"]
    assert sorted(c.reports[-1][2]) == ["n0", "n1", "n2"]


def test_a_refused_hold_frees_the_others_and_the_group_tries_again():
    c = Cluster(1, 1)
    c.table.reserve(7, "n0", [ONE] * 2, "strict_spread", c.fresh())
    c.answer(ok=lambda node: node != "n1")  # n1 says no (its report was old)
    assert c.held == {} and c.state(7) == []  # nothing stays held
    c.table.retry(c.fresh())
    c.answer()
    assert c.state(7) == ["ready"] and sorted(c.held.values()) == ["n0", "n1"]


def test_a_late_answer_to_an_abandoned_try_is_ignored():
    c = Cluster(1, 1)
    c.table.reserve(3, "n0", [ONE] * 2, "spread", c.fresh())
    (a0, a1) = c.holds
    c.holds = []
    c.table.held(3, a1[2], False, "busy", a1[3], c.fresh())  # abandoned: try 1
    c.table.retry(c.fresh())  # try 2
    c.table.held(3, a0[2], True, "", a0[3], c.fresh())  # try 1's late answer
    assert c.state(3) == []
    c.answer()
    assert c.state(3) == ["ready"]


def test_groups_that_can_never_fit_fail_at_once():
    c = Cluster(2, 2, 2)
    for pg, bundles, strategy, text in [
            (1, [ONE] * 4, "strict_spread", "strict_spread needs 4 distinct nodes"),
            (2, [Request(3)], "pack", "fits no node"),
            (3, [Request(2)] * 4, "spread", "do not fit the nodes together"),
            (4, [Request(1, gpus=1.0)], "pack", "fits no node")]:
        c.table.reserve(pg, "n0", bundles, strategy, c.fresh())
        (state, reason), = [(r[1], r[3]) for r in c.reports if r[0] == pg]
        assert state == "failed" and text in reason
    assert not c.holds and not c.table.gangs


def test_a_dead_node_makes_its_groups_lost_and_frees_their_other_bundles():
    c = Cluster(2, 2, 2)
    c.table.reserve(1, "n0", [ONE] * 3, "strict_spread", c.fresh())
    c.answer()
    c.loads = [n for n in c.loads if n.address != "n2"]
    c.table.node_lost("n2", c.fresh())
    pg, state, nodes, reason = c.reports[-1]
    assert (pg, state) == (1, "lost") and "n2" in reason
    assert [k for k, v in c.held.items() if v != "n2"] == []  # the others were freed
    assert c.table.node_of(1, 0) is None
    # its origin dying removes a group
    c.table.reserve(2, "n1", [ONE], "pack", c.fresh())
    c.answer()
    c.table.node_lost("n1", c.fresh())
    assert 2 not in c.table.gangs


def test_a_bundle_keeps_its_cpus_and_gpus_from_tasks_outside_it():
    led = Ledger(["0", "1"])
    bl = BundleLedger(led)
    assert bl.hold((1, 0), Request(2, gpus=1.0), total_cpus=3) is None
    assert bl.idle_cpus == 2 and led.held_gpus() == frozenset({0})
    assert "CPUs asked" in bl.hold((1, 1), Request(2), total_cpus=3)  # 3 CPUs in all
    # a task outside it: the node's other GPU only
    a = led.acquire(Request(1, gpus=1.0))
    assert a is not None and a.gpu_ids == (1,)
    assert led.acquire(Request(1, gpus=1.0)) is None
    # tasks in it: from the bundle only
    assert bl.never_fits(1, 0, Request(3)) is not None
    t = bl.acquire(1, 0, Request(1, gpus=1.0))
    assert t is not None and t.gpu_ids == (0,) and bl.idle_cpus == 1
    assert bl.acquire(1, 0, Request(1, gpus=1.0)) is None  # its one GPU is taken
    # freed while a task runs: its idle CPU goes now, the GPU when the task ends
    assert bl.free((1, 0)) and bl.idle_cpus == 0
    assert led.held_gpus() == frozenset({0, 1})
    bl.release(t)
    led.release(a)
    assert led.held_gpus() == frozenset() and not bl.bundles and led.held == 0


def test_a_share_of_one_gpu_in_a_bundle():
    led = Ledger(["0"])
    bl = BundleLedger(led)
    assert bl.hold((5, 0), Request(0, gpus=0.5), total_cpus=1) is None
    assert bl.acquire(5, 0, Request(0, gpus=0.5)) is not None
    assert bl.acquire(5, -1, Request(0, gpus=0.25)) is None
    assert led.acquire(Request(0, gpus=0.5)) is not None  # the other half: anyone's
