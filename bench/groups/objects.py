"""objects group: large numpy arrays as arguments, via put(), and as results."""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt

from memsampler import TreeMemorySampler
from params import MiB, Params
from peers import ExecutorPeer
from recorder import Recorder
from timing import repeat, summarize
from workloads import array_sum, make_array, noop

Array = npt.NDArray[np.float64]


def _check_sums(values: list[float], expected: float) -> None:
    bad = [v for v in values if v != expected]
    if bad:
        raise AssertionError(f"wrong task results: {bad[:3]} (expected {expected})")


def _send_as_arg(peer: ExecutorPeer, arr: Array, tasks: int) -> None:
    _check_sums(peer.results([peer.submit(array_sum, arr) for _ in range(tasks)]), float(arr.size))


def _send_via_put(peer: ExecutorPeer, arr: Array, tasks: int) -> None:
    ref = peer.put(arr)
    _check_sums(peer.results([peer.submit(array_sum, ref) for _ in range(tasks)]), float(arr.size))
    del ref


def _fetch_result(peer: ExecutorPeer, n_elems: int) -> None:
    out = peer.result(peer.submit(make_array, n_elems))
    if getattr(out, "shape", None) != (n_elems,) or out[-1] != 1.0:
        raise AssertionError(f"wrong result array: {type(out).__name__} {getattr(out, 'shape', None)}")


def _memory(peer: ExecutorPeer, arr: Array, p: Params, rec: Recorder, key: str) -> float:
    """Run (a) once under the memory sampler; return its (perturbed) duration."""
    with TreeMemorySampler(interval_s=p.mem_interval_s) as sampler:
        t0 = time.perf_counter()
        _send_as_arg(peer, arr, p.obj_tasks)
        elapsed = time.perf_counter() - t0
    m = sampler.result()
    rec.metric(
        key,
        m.mem_delta / arr.nbytes,
        mem_delta_mb=m.mem_delta / MiB,
        rss_x_array=m.rss_delta / arr.nbytes,
        rss_delta_mb=m.rss_delta / MiB,
        pss_delta_mb=m.pss_delta / MiB,
        pss_x_array=m.pss_delta / arr.nbytes,
        baseline_rss_mb=m.baseline_rss / MiB,
        peak_rss_mb=m.peak_rss / MiB,
        mem_samples=m.samples,
        processes=m.processes,
        elapsed_s=elapsed,
    )
    return elapsed


def _size(peer: ExecutorPeer, p: Params, rec: Recorder, label: str, nbytes: int, reps: int, fast_reps: int) -> None:
    """(a) ``reps`` times (slow for pickling peers), put and result ``fast_reps`` times."""
    arr = np.ones(nbytes // 8, dtype=np.float64)
    tasks = p.obj_tasks

    key = f"arg_{label}_s"
    with rec.workload(key):
        samples: list[float] = []
        if label == "64mb":  # the memory run doubles as the warm-up
            with rec.workload("mem_arg_64mb"):
                elapsed = _memory(peer, arr, p, rec, "mem_arg_64mb")
                if p.mem_run_timed:
                    samples.append(elapsed)
        else:
            _send_as_arg(peer, arr, tasks)
        samples += repeat(reps - len(samples), lambda: _send_as_arg(peer, arr, tasks))
        rec.metric(key, summarize(samples)["median"], samples=samples, tasks=tasks, nbytes=arr.nbytes)

    key = f"put_{label}_s"
    with rec.workload(key):
        if not peer.supports_put:
            rec.skip_metric(key, "no put()")
        else:
            _send_via_put(peer, arr, tasks)
            samples = repeat(fast_reps, lambda: _send_via_put(peer, arr, tasks))
            rec.metric(key, summarize(samples)["median"], samples=samples, tasks=tasks, nbytes=arr.nbytes)

    key = f"result_{label}_s"
    with rec.workload(key):
        _fetch_result(peer, arr.size)
        samples = repeat(fast_reps, lambda: _fetch_result(peer, arr.size))
        rec.metric(key, summarize(samples)["median"], samples=samples, nbytes=arr.nbytes)


def run(cls: type[ExecutorPeer], p: Params, rec: Recorder) -> None:
    keys = tuple(f"{kind}_{size}_s" for size in ("64mb", "1mb") for kind in ("arg", "put", "result"))
    with rec.workload(*keys, "mem_arg_64mb"):
        with cls(p.workers) as peer:
            peer.results([peer.submit(noop) for _ in range(4 * p.workers)])
            _size(peer, p, rec, "64mb", p.big_bytes, p.big_reps, p.big_fast_reps)
            _size(peer, p, rec, "1mb", p.small_bytes, p.small_reps, p.small_reps)
