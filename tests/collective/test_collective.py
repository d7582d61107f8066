"""``dpool.collective`` on one host: every operation for 1-4 actor members through shared
memory and over TCP, groups formed from the driver and in the members, a member killed
mid-operation (every survivor fails with ``CollectiveError`` naming it, never hangs) and
the group formed again, and bad input."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import dpool
import dpool.collective as col
from dpool import ProcessPoolExecutor

pytestmark = pytest.mark.timeout(120)


class Member:
    def __init__(self, rank: int = 0, world: int = 1) -> None:
        self.rank, self.world = rank, world

    def pid(self) -> int:
        return os.getpid()

    def join(self, name: str, transport: str = "auto") -> int:
        col.init_group(self.world, self.rank, name, transport=transport)
        return col.get_world_size(name)

    def every_op(self, name: str) -> dict:
        r, n = self.rank, self.world
        rng = np.random.default_rng(r)
        out: dict = {}
        out["sum_small"] = col.allreduce(np.arange(6, dtype=np.int64).reshape(2, 3) * (r + 1),
                                         group_name=name)
        big = rng.integers(-1000, 1000, 300_000).astype(np.int32)  # (1.2 MB: the ring)
        out["sum_big"] = col.allreduce(big, group_name=name)
        out["prod"] = col.allreduce(np.array([r + 1.0, 2.0]), op="prod", group_name=name)
        out["min"] = col.allreduce(np.array([r, -r], dtype=np.int16), op="min", group_name=name)
        into = np.empty(4)
        out["out_same"] = col.allreduce(np.full(4, float(r)), op="max", out=into,
                                        group_name=name) is into
        out["max_into"] = into
        out["floats"] = col.allreduce(np.random.default_rng(100 + r).random(100_000),
                                      group_name=name)
        out["bcast"] = col.broadcast(np.arange(r, r + 5) if r == n - 1 else None,
                                     root=n - 1, group_name=name)
        out["gather"] = col.allgather(np.full(r + 1, r, dtype=np.uint8), group_name=name)
        out["rs"] = col.reducescatter(np.ones((9, 2)) * (r + 1), group_name=name)
        out["reduce"] = col.reduce(np.array([r, 1]), root=0, group_name=name)
        col.barrier(group_name=name)
        if n > 1:  # point to point: each to the next, around
            col.send(np.array([r * 10]), (r + 1) % n, group_name=name)
            out["recv"] = col.recv((r - 1) % n, group_name=name)
        out["big_input"] = big
        return out

    def step(self, name: str, k: int) -> float:
        return float(col.allreduce(np.full(3, float(k)), group_name=name)[0])

    def loop(self, name: str) -> tuple:
        a = np.ones(200_000)
        t = time.monotonic()
        try:
            while True:
                col.allreduce(a, group_name=name)
        except dpool.CollectiveError as e:
            return e.rank, time.monotonic() - t, str(e)

    def leave(self, name: str) -> bool:
        col.destroy_group(name)
        try:  # a group used after it was destroyed
            col.barrier(group_name=name)
        except dpool.CollectiveError as e:
            assert "not a member" in str(e), e
        else:
            raise AssertionError("no CollectiveError after destroy_group")
        return col.is_group_initialized(name)


def _check_every_op(res: list, n: int) -> None:
    want_small = np.arange(6).reshape(2, 3) * sum(range(1, n + 1))
    want_big = np.sum([r["big_input"].astype(np.int64) for r in res], axis=0).astype(np.int32)
    floats = [r["floats"] for r in res]
    for r, got in enumerate(res):
        assert got["sum_small"].dtype == np.int64 and (got["sum_small"] == want_small).all()
        assert (got["sum_big"] == want_big).all()
        assert got["prod"].tolist() == [float(np.prod(range(1, n + 1))), 2.0 ** n]
        assert got["min"].tolist() == [0, -(n - 1)] and got["min"].dtype == np.int16
        assert got["out_same"] and got["max_into"].tolist() == [n - 1.0] * 4
        assert np.array_equal(got["floats"], floats[0])  # the same bits everywhere
        want_f = np.sum([np.random.default_rng(100 + k).random(100_000) for k in range(n)],
                        axis=0)
        assert np.allclose(got["floats"], want_f, rtol=1e-12)
        assert got["bcast"].tolist() == list(range(n - 1, n + 4))
        assert [g.tolist() for g in got["gather"]] == [[k] * (k + 1) for k in range(n)]
        assert got["rs"].shape == np.array_split(np.ones((9, 2)), n)[r].shape
        assert (got["rs"] == sum(range(1, n + 1))).all()
        if r == 0:
            assert got["reduce"].tolist() == [sum(range(n)), n]
        else:
            assert got["reduce"] is None
        if n > 1:
            assert got["recv"].tolist() == [((r - 1) % n) * 10]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_operation_gives_numpys_answer_in_every_member(n, transport):
    with ProcessPoolExecutor(2) as ex:
        ms = [ex.actor(Member, r, n) for r in range(n)]
        used = col.create_group(ms, "g", transport=transport)
        assert used == ["shm" if transport == "shm" else "tcp"] * n
        res = [f.result(timeout=60) for f in [m.every_op.submit("g") for m in ms]]
        _check_every_op(res, n)
        assert [m.leave("g") for m in ms] == [False] * n


def test_members_form_a_group_themselves_through_the_runtime():
    with ProcessPoolExecutor(2) as ex:
        ms = [ex.actor(Member, r, 3) for r in range(3)]
        assert [f.result(timeout=60) for f in [m.join.submit("own") for m in ms]] == [3] * 3
        assert [f.result(timeout=60) for f in [m.step.submit("own", 2) for m in ms]] == [6.0] * 3
        # joined again (a new formation of the same name) once each left it
        assert [m.leave("own") for m in ms] == [False] * 3
        assert [f.result(timeout=60) for f in
                [m.join.submit("own", "tcp") for m in reversed(ms)]] == [3] * 3
        assert [f.result(timeout=60) for f in [m.step.submit("own", 1) for m in ms]] == [3.0] * 3


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_member_killed_mid_operation_fails_the_others_and_the_group_forms_again(transport):
    with ProcessPoolExecutor(3) as ex:
        ms = [ex.options(max_restarts=1).actor(Member, r, 3) for r in range(3)]
        col.create_group(ms, "g", transport=transport)
        victim = ms[1].pid()
        fs = [m.loop.submit("g") for m in ms]
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        for f in (fs[0], fs[2]):
            rank, _t, why = f.result(timeout=30)  # (never a hang)
            assert rank == 1 and "rank 1" in why, why
        # the killed actor restarted (its call in flight ran again, out of the group)
        assert fs[1].result(timeout=30)[0] == -1
        assert ms[1].pid() != victim
        col.create_group(ms, "g", transport=transport)  # formed again, same ranks
        assert [f.result(timeout=30) for f in [m.step.submit("g", 5) for m in ms]] == [15.0] * 3


class Bad:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def shapes(self) -> str:
        try:
            col.allreduce(np.zeros(3 + self.rank), group_name="b")
        except dpool.CollectiveError as e:
            return f"CollectiveError {e.rank}"
        return "no error"

    def after(self) -> str:
        try:
            col.barrier(group_name="b")
        except dpool.CollectiveError as e:
            return "failed earlier" if "failed earlier" in str(e) else str(e)
        return "no error"

    def alone(self, timeout: float) -> str:
        try:
            col.allreduce(np.zeros(3), group_name="t")
        except dpool.CollectiveError as e:
            return "timeout" if "timeout" in str(e) else str(e)
        return "no error"

    def bad(self, i: int) -> list:
        """Bad input ``i``: its error here; then, the group is unusable (the others
        would have waited for this member's part)."""
        calls = (lambda: col.allreduce(np.zeros(2), op="mean", group_name="b2"),
                 lambda: col.broadcast(np.zeros(2), root=5, group_name="b2"),
                 lambda: col.send(np.zeros(2), 0, group_name="b2"),
                 lambda: col.allreduce(["a"], group_name="b2"),
                 lambda: col.allreduce(np.zeros(2), group_name="nope"),
                 lambda: col.allreduce(np.zeros(2), out=np.zeros(3), group_name="b2"))
        out = []
        for call in (calls[i], lambda: col.barrier(group_name="b2")):
            try:
                call()
                out.append("no error")
            except Exception as e:  # noqa: BLE001
                out.append(type(e).__name__)
        col.destroy_group("b2")
        return out

    def shapes_of_nothing(self) -> list:
        return [col.allreduce(np.zeros((0, 3)), group_name="e").shape,
                col.allreduce(np.float64(self.rank + 1), group_name="e").shape,
                float(col.allreduce(np.array(2.0), group_name="e")),
                [a.shape for a in col.allgather(np.zeros(0), group_name="e")],
                col.broadcast(np.zeros((0,)) if self.rank == 0 else None,
                              group_name="e").shape]

    def leave_e(self) -> None:
        col.destroy_group("e")

    def wait_for_nobody(self) -> str:
        try:
            col.allreduce(np.zeros(3), group_name="d")
        except dpool.CollectiveError as e:
            return "left the group" if "left the group" in str(e) else str(e)
        return "no error"

    def leave(self) -> None:
        col.destroy_group("d")


def test_bad_input_gets_a_clear_error_at_the_call():
    with pytest.raises(dpool.CollectiveError, match="not a member"):
        col.allreduce(np.zeros(2))  # (the driver is no member)
    with pytest.raises(ValueError, match="out of range"):
        col.init_group(2, 2)
    with pytest.raises(TypeError, match="actor handles"):
        col.create_group([1, 2])
    with ProcessPoolExecutor(2) as ex:
        bs = [ex.actor(Bad, r) for r in range(2)]
        col.create_group(bs, "b")
        # members that disagree on the shape: each fails, none hangs
        assert sorted(f.result(timeout=30) for f in [b.shapes.submit() for b in bs]) == \
            ["CollectiveError 1", "CollectiveError 1"]
        assert [f.result(timeout=30) for f in [b.after.submit() for b in bs]] == \
            ["failed earlier"] * 2
        want = ["ValueError", "ValueError", "ValueError", "TypeError", "CollectiveError",
                "ValueError"]
        for i, error in enumerate(want):
            col.create_group(bs[:1], "b2")  # (one member: only its own mistakes)
            then = "CollectiveError" if error != "CollectiveError" else "no error"
            assert bs[0].bad(i) == [error, then], i
        col.create_group(bs, "t", timeout=1.0)  # a member that never calls: a timeout
        assert bs[0].alone(1.0) == "timeout"
        for transport in ("shm", "tcp"):  # empty and 0-d arrays keep their shapes
            col.create_group(bs, "e", transport=transport)
            got = [f.result(timeout=30) for f in [b.shapes_of_nothing.submit() for b in bs]]
            assert got == [[(0, 3), (), 4.0, [(0,), (0,)], (0,)]] * 2, (transport, got)
            for b in bs:
                b.leave_e()
        # a member that leaves fails the one waiting for it, at once
        col.create_group(bs, "d")
        waiting = bs[0].wait_for_nobody.submit()
        time.sleep(0.3)
        bs[1].leave()
        assert waiting.result(timeout=30) == "left the group"


class Wide:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def big(self) -> float:  # 8 MB over 3 members: ring chunks of 2.7 MB, in 1 MB frames
        a = np.arange(1_000_003, dtype=np.float64) * (self.rank + 1)
        out = col.allreduce(a, group_name="w")
        want = np.arange(1_000_003, dtype=np.float64) * 6
        return float(np.abs(out - want).max())


def test_a_large_ring_allreduce_reduces_its_chunks_piece_by_piece():
    with ProcessPoolExecutor(3) as ex:
        ws = [ex.actor(Wide, r) for r in range(3)]
        col.create_group(ws, "w", transport="tcp")
        assert [f.result(timeout=60) for f in [w.big.submit() for w in ws]] == [0.0] * 3


def gang_member(rank: int, world: int) -> tuple:
    col.init_group(world, rank, "gang")
    try:
        total = col.allreduce(np.array([rank + 1.0]), group_name="gang")
        return col.get_rank("gang"), float(total[0])
    finally:
        col.destroy_group("gang")


def test_the_tasks_of_a_placement_group_form_a_group():
    pg = dpool.placement_group([{"CPU": 1}, {"CPU": 1}])
    try:
        with ProcessPoolExecutor(2) as ex:
            fs = [ex.options(placement_group=pg, bundle=r).submit(gang_member, r, 2)
                  for r in range(2)]
            assert sorted(f.result(timeout=60) for f in fs) == [(0, 3.0), (1, 3.0)]
    finally:
        pg.remove()
