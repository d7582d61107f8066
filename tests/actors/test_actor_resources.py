"""Actors that hold resources (``options(num_gpus=..., resources=..., num_cpus=...)``) on
the embedded runtime: they hold them for their lifetime, others wait for them, a restart
takes them again, and what can never be met is a ``ResourceError`` at ``actor()``.

No GPU is needed: the runtime is told it has two (``runtime_resources``), and an actor's
process gets device ids and ``CUDA_VISIBLE_DEVICES`` as it would with real ones. "Waits"
is checked as "not done while the holder lives, done once it is killed": a slow machine
can only make the first half pass more easily, never fail it."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import wait

import pytest

import dpool
from dpool import ProcessPoolExecutor, ResourceError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def gpus2():
    """The embedded runtime offers 2 fake GPUs and 1 "TPU" during the test."""
    ProcessPoolExecutor(1, runtime_resources={"GPU": 2, "TPU": 1}).shutdown()
    yield
    ProcessPoolExecutor(1, runtime_resources={}).shutdown()  # back to what is detected


class Probe:
    def __init__(self) -> None:
        self.calls = 0

    def devices(self) -> tuple:
        self.calls += 1
        return os.environ.get("CUDA_VISIBLE_DEVICES"), dpool.get_gpu_ids(), self.calls

    def pid(self) -> int:
        return os.getpid()


def task_devices() -> tuple:
    return os.environ.get("CUDA_VISIBLE_DEVICES"), dpool.get_gpu_ids()


def test_gpu_actors_hold_their_devices_and_others_wait(gpus2):
    with ProcessPoolExecutor(2) as ex:
        one = ex.options(num_gpus=1).actor(Probe)
        two = ex.options(num_gpus=1).actor(Probe)
        a, b = one.devices(), two.devices()
        assert {a[0], b[0]} == {"0", "1"} and a[1] != b[1] and len(a[1]) == 1
        third = ex.options(num_gpus=1).actor(Probe)
        waiting = third.devices.submit()
        task = ex.options(num_gpus=1).submit(task_devices)
        done, _ = wait([waiting, task], timeout=0.5)
        assert not done  # both GPUs are held by the two actors, even while they are idle
        assert ex.submit(task_devices).result(timeout=30)[1] == []  # CPU tasks go on
        dpool.kill(one)
        # the freed GPU goes to one of them (the task gives it back when it ends; the
        # actor keeps it), the other gets a GPU once one is free again
        done, _ = wait([waiting, task], timeout=30, return_when="FIRST_COMPLETED")
        assert done and next(iter(done)).result()[0] == a[0]
        dpool.kill(two)
        assert waiting.result(timeout=30)[0] in ("0", "1")
        assert task.result(timeout=30)[0] in ("0", "1")
        assert len(task.result()[1]) == 1


def test_a_custom_resource_is_held_until_the_actor_ends(gpus2):
    ex = ProcessPoolExecutor(1)
    try:
        holder = ex.options(resources={"TPU": 1}).actor(Probe)
        assert holder.devices()[1] == []  # no GPU
        second = ex.options(resources={"TPU": 1}).actor(Probe)
        pending = second.devices.submit()
        assert not wait([pending], timeout=0.5).done
        ex.shutdown()  # ends `holder` after its calls: `second`'s call runs, then it ends
        assert pending.result(timeout=30)[2] == 1
    finally:
        ex.shutdown()


def test_a_restarted_actor_takes_a_gpu_again(gpus2):
    with ProcessPoolExecutor(1) as ex:
        a = ex.options(num_gpus=1, max_restarts=1).actor(Probe)
        first = a.devices()
        os.kill(a.pid(), signal.SIGKILL)
        again = a.devices()  # replayed: the calls before count
        assert again[2] == 2 and len(again[1]) == 1
        assert first[0] in ("0", "1") and again[0] in ("0", "1")
        other = ex.options(num_gpus=1).actor(Probe)  # the restart left one GPU free
        assert other.devices()[0] != again[0]


def test_requests_that_can_never_be_met_fail_at_actor(gpus2):
    with ProcessPoolExecutor(1) as ex:
        with pytest.raises(ResourceError, match="GPU: 3 asked, 2 here"):
            ex.options(num_gpus=3).actor(Probe)
        with pytest.raises(ResourceError, match="CPU: 100000 asked"):
            ex.options(num_cpus=100_000).actor(Probe)
        with pytest.raises(ResourceError, match="FPGA"):
            ex.options(resources={"FPGA": 1}).actor(Probe)
        with pytest.raises(dpool.PlacementError, match="the embedded runtime"):
            ex.options(scheduling=dpool.NodeAffinity("elsewhere:1")).actor(Probe)
        # (one host: every other strategy means this host)
        assert ex.options(scheduling="spread").actor(Probe).devices()[2] == 1
        assert ex.options(scheduling=dpool.NodeAffinity("elsewhere:1", soft=True)).actor(
            Probe).devices()[2] == 1
        assert ex.options(num_cpus=1).actor(Probe).devices()[2] == 1  # what can, runs


def test_an_actor_in_a_placement_groups_bundle_holds_its_share_until_it_ends(gpus2):
    """``options(placement_group=pg, bundle=i)``: the actor takes its share of the bundle
    (a task asking the same of that bundle waits until the actor is killed); a request
    the bundle never reserved fails its calls; removing the group ends its actors."""
    with ProcessPoolExecutor(2) as ex:
        pg = dpool.placement_group([{"CPU": 1, "GPU": 1}, {"CPU": 1}])
        holder = ex.options(placement_group=pg, bundle=0, num_cpus=1, num_gpus=1).actor(Probe)
        visible, ids, _ = holder.devices()
        assert len(ids) == 1 and visible == str(ids[0])
        waits = ex.options(placement_group=pg, bundle=0, num_gpus=1).submit(task_devices)
        other = ex.options(placement_group=pg, bundle=1).submit(task_devices)
        assert other.result(timeout=30)[1] == []  # (bundle 1 has no GPU)
        assert not waits.done()
        dpool.kill(holder)
        assert waits.result(timeout=30)[1] == ids  # the same device, free again
        too_big = ex.options(placement_group=pg, bundle=1, num_cpus=2).actor(Probe)
        with pytest.raises(dpool.ActorDiedError, match="reserved"):
            too_big.devices()
        anywhere = ex.options(placement_group=pg).actor(Probe)
        assert anywhere.devices()[2] == 1
        pg.remove()
        with pytest.raises(dpool.ActorDiedError, match="placement group .* was removed"):
            for _ in range(300):  # (the removal reaches the scheduler a moment later)
                anywhere.devices()
                time.sleep(0.01)
