"""Per-task resources on the embedded runtime: CPUs, (fake) GPUs, custom resources.

No GPU is needed: the runtime is told it has some (``runtime_resources``), and tasks get
device ids and ``CUDA_VISIBLE_DEVICES`` as they would with real ones. Overlap is proven
with a file barrier (every task waits until all of them have arrived), never with timing
thresholds; running "one at a time" with non-overlapping [start, end] intervals.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dpool
from dpool import Pool, ProcessPoolExecutor, ResourceError


@pytest.fixture
def gpus2():
    """The embedded runtime offers 2 fake GPUs and 1 "TPU" during the test."""
    ex = ProcessPoolExecutor(1, runtime_resources={"GPU": 2, "TPU": 1})
    ex.shutdown()
    yield
    ProcessPoolExecutor(1, runtime_resources={}).shutdown()  # back to what is detected


def meet(barrier_dir: str, name: str, n: int, timeout: float = 20.0) -> bool:
    """Arrive at a barrier of ``n`` tasks; True once all arrived (False: timed out)."""
    Path(barrier_dir, name).touch()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(os.listdir(barrier_dir)) >= n:
            return True
        time.sleep(0.01)
    return False


def devices(barrier_dir=None, name="", n=0):
    met = meet(barrier_dir, name, n) if barrier_dir else None
    return os.environ.get("CUDA_VISIBLE_DEVICES"), dpool.get_gpu_ids(), met


def interval(t):
    start = time.monotonic()
    time.sleep(t)
    return start, time.monotonic()


def nested_parent(n):
    ex = dpool.get_executor()
    fs = [ex.submit(devices) for _ in range(n)]
    return os.environ.get("CUDA_VISIBLE_DEVICES"), [f.result(timeout=30)[0] for f in fs]


@dpool.resources(num_gpus=0.5)
def half_gpu():
    return dpool.get_gpu_ids()


def _no_overlap(spans):
    spans = sorted(spans)
    return all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_two_one_gpu_tasks_see_different_devices(gpus2, tmp_path):
    with ProcessPoolExecutor(2) as ex:
        fs = [ex.options(num_gpus=1).submit(devices, str(tmp_path), f"t{i}", 2)
              for i in range(2)]
        out = [f.result(timeout=30) for f in fs]
    assert all(met for _, _, met in out), out  # both ran at the same time
    assert sorted(env for env, _, _ in out) == ["0", "1"]
    assert sorted(ids[0] for _, ids, _ in out) == [0, 1]
    assert all(len(ids) == 1 for _, ids, _ in out)


def test_four_quarter_gpu_tasks_share_one_gpu_at_once(gpus2, tmp_path):
    with ProcessPoolExecutor(4) as ex:
        q = ex.options(num_gpus=0.25)
        fs = [q.submit(devices, str(tmp_path), f"t{i}", 4) for i in range(4)]
        out = [f.result(timeout=30) for f in fs]
    assert all(met for _, _, met in out), out
    assert len({env for env, _, _ in out}) == 1  # packed onto one device
    assert {tuple(ids) for _, ids, _ in out} in ({(0,)}, {(1,)})


def test_a_fifth_quarter_goes_to_the_other_gpu(gpus2, tmp_path):
    with ProcessPoolExecutor(5) as ex:
        q = ex.options(num_gpus=0.25)
        fs = [q.submit(devices, str(tmp_path), f"t{i}", 5) for i in range(5)]
        out = [f.result(timeout=30) for f in fs]
    assert all(met for _, _, met in out), out
    assert sorted(env for env, _, _ in out).count("0") in (1, 4)


def test_two_cpu_tasks_on_two_workers_run_one_at_a_time():
    with ProcessPoolExecutor(2) as ex:
        spans = list(ex.options(num_cpus=2).map(interval, [0.2] * 4))
    assert _no_overlap(spans), spans


def test_plain_tasks_wait_while_a_task_holds_every_cpu():
    with ProcessPoolExecutor(2) as ex:
        big = ex.options(num_cpus=2).submit(interval, 0.3)
        small = [ex.submit(interval, 0.05) for _ in range(3)]
        spans = [big.result(timeout=30)] + [f.result(timeout=30) for f in small]
    b = spans[0]
    assert all(s[1] <= b[0] or s[0] >= b[1] for s in spans[1:]), spans


def test_a_custom_resource_is_held_by_one_task_at_a_time(gpus2):
    with ProcessPoolExecutor(4, resources={"TPU": 1}) as ex:
        spans = [f.result(timeout=30) for f in [ex.submit(interval, 0.15) for _ in range(3)]]
    assert _no_overlap(spans), spans


def test_nested_tasks_inside_a_gpu_task(gpus2):
    # One CPU: the GPU task gives it back while it waits, so its children run; they ask
    # no GPU and never see the one it holds.
    with ProcessPoolExecutor(1) as ex:
        env, children = ex.options(num_gpus=1).submit(nested_parent, 3).result(timeout=60)
    assert env in ("0", "1")
    assert all(c is not None and env not in c.split(",") for c in children), children


def test_a_task_without_gpus_never_sees_a_held_one(gpus2, tmp_path):
    with ProcessPoolExecutor(1) as gpu_ex, ProcessPoolExecutor(1) as cpu_ex:
        held = gpu_ex.options(num_gpus=1).submit(devices, str(tmp_path), "gpu", 2)
        while not os.listdir(tmp_path):  # the GPU task runs now
            time.sleep(0.01)
        plain = cpu_ex.submit(devices, str(tmp_path), "cpu", 2).result(timeout=30)
        gpu = held.result(timeout=30)
    assert gpu[2] and plain[2]
    assert plain[0] is not None and gpu[0] not in plain[0].split(",")
    assert plain[1] == []


def test_impossible_requests_fail_at_once_with_a_typed_error(gpus2):
    with ProcessPoolExecutor(2) as ex:
        cases = {"GPU: 3 asked, 2 here": ex.options(num_gpus=3),
                 "FPGA: unknown here": ex.options(resources={"FPGA": 1}),
                 "CPU: 3 asked, 2 here": ex.options(num_cpus=3),
                 "TPU: 2 asked, 1 here": ex.options(resources={"TPU": 2})}
        for expected, view in cases.items():
            t0 = time.monotonic()
            with pytest.raises(ResourceError) as info:
                view.submit(devices).result(timeout=10)
            assert time.monotonic() - t0 < 5
            assert expected in str(info.value)
            assert "offer" in str(info.value)
        assert ex.submit(devices).result(timeout=10)[0] is None  # still usable
    assert issubclass(ResourceError, dpool.Error)


def test_bad_requests_raise_at_the_call():
    with ProcessPoolExecutor(1) as ex:
        with pytest.raises(ValueError, match="whole number"):
            ex.options(num_gpus=1.5)
        with pytest.raises(TypeError, match="num_gpus"):
            ex.options(num_gpus="1")
        with pytest.raises(ValueError, match="num_cpus"):
            ex.options(num_cpus=-1)
        with pytest.raises(ValueError, match="num_cpus"):
            ex.options(num_cpus=1.5)
        with pytest.raises(TypeError):
            ex.options(resources=["GPU"])
        with pytest.raises(ValueError, match="TPU"):
            ex.options(resources={"TPU": float("nan")})
    with pytest.raises(ValueError):
        ProcessPoolExecutor(1, resources={"GPU": -1})
    with pytest.raises(TypeError):
        dpool.resources(num_gpus=object())


def test_pool_and_map_with_resources(gpus2):
    with Pool(2, resources={"GPU": 1}) as p:
        out = p.map(devices, [None] * 6)
        assert {env for env, _, _ in out} <= {"0", "1"}
        assert all(len(ids) == 1 for _, ids, _ in out)
        assert p.apply_async(devices).get(timeout=30)[0] in ("0", "1")
    with ProcessPoolExecutor(2, resources={"GPU": 0.5}) as ex:
        out = list(ex.map(devices, [None] * 4, chunksize=2))
        assert all(len(ids) == 1 for _, ids, _ in out)
        # options() overrides the executor's request: no GPU at all
        assert list(ex.options(num_gpus=0).map(devices, [None]))[0][1] == []


@dpool.resources(num_gpus=1)
def one_gpu(_=None):
    return dpool.get_gpu_ids()


def test_pool_map_of_a_decorated_function(gpus2):
    with Pool(2) as p:
        assert all(len(ids) == 1 for ids in p.map(one_gpu, range(4)))
        assert all(len(ids) == 1 for ids in p.imap(one_gpu, range(4)))
        assert all(len(ids) == 1 for ids in p.map(one_gpu, range(4), chunksize=2))


def test_decorated_function_and_get_gpu_ids(gpus2):
    assert dpool.get_gpu_ids() == []  # outside a task
    assert half_gpu() == []  # called directly it runs as before
    with ProcessPoolExecutor(2) as ex:
        assert len(ex.submit(half_gpu).result(timeout=30)) == 1
        assert ex.options(num_gpus=0).submit(half_gpu).result(timeout=30) == []
        assert ex.submit(devices).result(timeout=30)[1] == []


def test_cancelled_waiting_task_and_shutdown(gpus2, tmp_path):
    with ProcessPoolExecutor(2) as ex:
        g = ex.options(num_gpus=2)
        first = g.submit(interval, 0.3)
        waiting = g.submit(interval, 0.1)
        time.sleep(0.05)
        assert waiting.cancel()
        first.result(timeout=30)
        later = [g.submit(interval, 0.2) for _ in range(3)]
        ex.shutdown(wait=True, cancel_futures=True)
    assert waiting.cancelled()
    assert sum(f.cancelled() for f in later) >= 1


def crash_once(marker):
    if not os.path.exists(marker):
        Path(marker).touch()
        os._exit(1)
    return dpool.get_gpu_ids()


def test_a_gpu_task_whose_worker_dies_is_retried_and_frees_its_gpu(gpus2, tmp_path):
    with ProcessPoolExecutor(2) as ex:
        g = ex.options(num_gpus=2)
        assert g.submit(crash_once, str(tmp_path / "m")).result(timeout=30) == [0, 1]
        assert g.submit(crash_once, str(tmp_path / "m")).result(timeout=30) == [0, 1]


def test_environment_declares_fake_gpus(tmp_path):
    code = ("import dpool, os\n"
            "def f():\n    return os.environ.get('CUDA_VISIBLE_DEVICES'), dpool.get_gpu_ids()\n"
            "if __name__ == '__main__':\n"
            "    with dpool.ProcessPoolExecutor(2) as ex:\n"
            "        print(ex.options(num_gpus=2).submit(f).result(30))\n"
            "        print(ex.options(resources={'TPU': 2}).submit(f).result(30))\n"
            "        print(type(ex.options(resources={'TPU': 3}).submit(f).exception(30)))\n")
    script = tmp_path / "s.py"
    script.write_text(code)
    env = dict(os.environ, DPOOL_NUM_GPUS="2", DPOOL_RESOURCES='{"TPU": 2}')
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, env=env, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["('0,1', [0, 1])", "(None, [])",
                                       "<class 'dpool.errors.ResourceError'>"]


def gpu_parent():
    ex = dpool.get_executor()
    child = ex.options(num_gpus=1).submit(devices)
    return dpool.get_gpu_ids(), child.result(timeout=30)[1]


def test_a_gpu_task_waits_on_a_nested_gpu_task(gpus2):
    # One CPU: the parent gives it back while it waits; it keeps its GPU, so the child
    # gets the other one.
    with ProcessPoolExecutor(1) as ex:
        mine, child = ex.options(num_gpus=1).submit(gpu_parent).result(timeout=60)
    assert sorted(mine + child) == [0, 1]


def test_plain_tasks_after_gpu_tasks_fill_the_group(gpus2):
    # Two GPU-bound workers take both slots; plain tasks get them back (an idle bound
    # worker is retired), and GPU tasks after that still find their devices.
    with ProcessPoolExecutor(2) as ex:
        g = ex.options(num_gpus=1)
        assert sorted(f.result(timeout=30)[0] for f in [g.submit(devices) for _ in range(2)]) \
            == ["0", "1"]
        assert [f.result(timeout=30)[1] for f in [ex.submit(devices) for _ in range(4)]] \
            == [[]] * 4
        assert len(g.submit(devices).result(timeout=30)[1]) == 1
        # The GPU task got its slot by retiring an idle plain worker: that one is told to
        # exit and its replacement starts at once, so it may still be exiting when the
        # result is back (the quicker workers start, the likelier). It does exit.
        deadline = time.monotonic() + 10
        while (len([p for p in ex._processes.values() if p.is_alive()]) > 2
               and time.monotonic() < deadline):
            time.sleep(0.01)
        assert len([p for p in ex._processes.values() if p.is_alive()]) <= 2


def test_zero_cpu_gpu_tasks_and_memory(gpus2):
    with ProcessPoolExecutor(1) as ex:
        only_gpu = ex.options(num_cpus=0, num_gpus=1)
        # two of them and a plain task at once: none needs the single CPU the other has
        fs = [only_gpu.submit(interval, 0.2) for _ in range(2)] + [ex.submit(interval, 0.2)]
        spans = [f.result(timeout=30) for f in fs]
        assert not _no_overlap(spans), spans
        assert ex.options(memory=2**20).submit(devices).result(timeout=30)[1] == []
        with pytest.raises(ResourceError, match="memory"):
            ex.options(memory=2**62).submit(devices).result(timeout=10)


def test_a_gpu_task_after_a_queue_of_plain_tasks_starts_once_they_are_done(gpus2):
    # (it used to wait for good: the last plain result did not look at waiting requests)
    with ProcessPoolExecutor(1) as ex:
        plain = [ex.submit(interval, 0.005) for _ in range(40)]
        gpu = ex.options(num_gpus=1).submit(interval, 0.005)
        start = gpu.result(timeout=30)[0]
        assert all(f.result(timeout=30)[1] <= start for f in plain)


def test_tasks_submitted_after_a_waiting_request_do_not_overtake_it(gpus2):
    # One CPU: plain tasks submitted after the GPU task must not keep it waiting
    # (each of them would find the CPU taken again by the one before).
    with ProcessPoolExecutor(1) as ex:
        first = [ex.submit(interval, 0.01) for _ in range(5)]
        gpu = ex.options(num_gpus=1).submit(interval, 0.01)
        later = [ex.submit(interval, 0.01) for _ in range(50)]
        start = gpu.result(timeout=30)[0]
        assert all(f.result(timeout=30)[0] >= start for f in later)
        assert all(f.result(timeout=30)[1] <= start for f in first)


def two_cpu_parent(barrier_dir):
    ex = dpool.get_executor()
    fs = [ex.submit(devices, barrier_dir, f"c{i}", 2) for i in range(2)]
    return [f.result(timeout=30)[2] for f in fs]


def test_a_waiting_task_gives_all_its_cpus_back(tmp_path):
    # num_cpus=2 on max_workers=2: while it waits, both of its children run at once
    with ProcessPoolExecutor(2) as ex:
        assert ex.options(num_cpus=2).submit(two_cpu_parent, str(tmp_path)).result(
            timeout=60) == [True, True]


def test_cancelling_a_request_that_waits_for_cpus_lets_the_others_run(gpus2):
    with ProcessPoolExecutor(1) as ex:
        busy = ex.submit(interval, 0.3)
        waiting = ex.options(num_cpus=1, num_gpus=1).submit(interval, 0.01)
        time.sleep(0.1)  # it waits for the CPU now; plain tasks behind it are held
        later = ex.submit(interval, 0.01)
        assert waiting.cancel()
        assert later.result(timeout=10) and busy.result(timeout=10)


_seen_at_init = None


def remember_devices():
    global _seen_at_init
    _seen_at_init = os.environ.get("CUDA_VISIBLE_DEVICES")


def devices_at_init():
    return _seen_at_init


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_initializer_already_sees_the_workers_gpus(gpus2, method):
    import multiprocessing as mp

    with ProcessPoolExecutor(1, mp_context=mp.get_context(method),
                             initializer=remember_devices) as ex:
        assert ex.options(num_gpus=2).submit(devices_at_init).result(timeout=60) == "0,1"


# -- the bookkeeping alone (no processes) ----------------------------------------------------
from dpool.scheduling import _detect  # noqa: E402
from dpool.scheduling import _resources  # noqa: E402


def test_requests_merge_and_default_to_none():
    assert _resources.build() is None
    assert _resources.build(_resources.spec(num_cpus=1)) is None  # the default
    r = _resources.build(_resources.spec(resources={"GPU": 1, "TPU": 2}),
                         _resources.spec(num_gpus=0.5))
    assert r == _resources.Request(1, 0.5, 0, (("TPU", 2.0),))
    assert str(r) == "{CPU: 1, GPU: 0.5, TPU: 2}"
    assert _resources.from_wire(_resources.to_wire(r)) == r


def test_ledger_packs_shares_and_gives_whole_gpus():
    led = _resources.Ledger(["0", "1"], memory=100, custom={"TPU": 1})
    q = _resources.Request(1, 0.25)
    shares = [led.acquire(q) for _ in range(4)]
    assert {a.gpu_ids for a in shares} == {(0,)}  # packed onto one device
    assert led.acquire(_resources.Request(1, 2.0)) is None  # device 0 is in use
    whole = led.acquire(_resources.Request(1, 1.0))
    assert whole.gpu_ids == (1,) and led.held_gpus() == {0, 1}
    assert led.acquire(q) is None
    for a in shares:
        led.release(a)
    assert led.held_gpus() == {1}
    assert led.acquire(_resources.Request(1, 1.0), prefer=[(1,), (0,)]).gpu_ids == (0,)
    assert led.acquire(_resources.Request(1, 0, 101)) is None
    assert "memory: 101 bytes asked, 100 here" in led.shortfall(_resources.Request(1, 0, 101))
    assert led.shortfall(_resources.Request(1, 0, 0, (("TPU", 1.0),))) is None
    assert led.names((1, 0)) == "1,0"


def test_gpu_names_declared_or_from_the_environment(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert _detect.gpu_names(2) == ["3", "5"]
    assert _detect.gpu_names(3) == ["0", "1", "2"]
    monkeypatch.setattr(_detect, "_nvml_count", lambda: None)
    monkeypatch.setattr(_detect, "_smi_count", lambda: None)
    assert _detect.gpu_names() == ["3", "5"]
    monkeypatch.setattr(_detect, "_nvml_count", lambda: 1)
    assert _detect.gpu_names() == ["3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(_detect, "_nvml_count", lambda: None)
    assert _detect.gpu_names() == []
    assert 1 <= _detect.cpus() <= (os.cpu_count() or 1)
    with pytest.raises(ValueError, match="JSON object"):
        _detect.parse_resources("[1]", "--resources")


def test_a_malformed_offer_fails_the_task_and_shutdown_returns(tmp_path):
    """DPOOL_NUM_GPUS that is not a number: the task asking for a GPU fails with a
    clear error, the executor shuts down (nothing is left outstanding)."""
    import textwrap

    script = tmp_path / "bad_offer.py"
    script.write_text(textwrap.dedent("""
        import dpool
        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor(2) as ex:
                try:
                    ex.options(num_gpus=1).submit(abs, -1).result(timeout=30)
                except dpool.ResourceError as exc:
                    print("ResourceError", "DPOOL_NUM_GPUS" in str(exc) or "abc" in str(exc))
                print(ex.submit(abs, -2).result(timeout=30))
            print("shut down")
    """))
    env = {**os.environ, "DPOOL_NUM_GPUS": "abc"}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["ResourceError True", "2", "shut down"]
