"""executor group: round trip, throughput, parallel efficiency, start-up."""

from __future__ import annotations

import time

from params import Params
from peers import ExecutorPeer
from recorder import Recorder
from timing import fit_batch, repeat_capped, summarize
from workloads import noop, spin


def _extra_startups(cls: type[ExecutorPeer], p: Params, first: float, rec: Recorder) -> None:
    """More fresh create → first-result cycles; ``first`` is the main session's."""
    reps = p.startup_reps_heavy if cls.heavy_startup else p.startup_reps
    samples = [first]
    for _ in range(reps - 1):
        peer = cls(p.workers)
        t0 = time.perf_counter()
        try:
            peer.open()
            peer.result(peer.submit(noop))
            samples.append(time.perf_counter() - t0)
        finally:
            peer.close()
    rec.metric("startup_s", summarize(samples)["median"], samples=samples)


def _warm_up(peer: ExecutorPeer, p: Params) -> None:
    # Enough concurrent tasks that every worker has started and imported the module.
    peer.results([peer.submit(spin, 0.002) for _ in range(4 * p.workers)])
    peer.results([peer.submit(noop) for _ in range(p.warmup)])
    for _ in range(p.warmup):
        peer.result(peer.submit(noop))


def _roundtrip(peer: ExecutorPeer, p: Params, rec: Recorder) -> None:
    samples = repeat_capped(p.roundtrip_n, p.cap_s, lambda: peer.result(peer.submit(noop)))
    stats = summarize(samples)
    rec.metric("roundtrip_s", stats["median"], capped=len(samples) < p.roundtrip_n, **stats)


def _burst(peer: ExecutorPeer, n: int) -> float:
    """Submit ``n`` no-ops, then wait for all; return the submit phase's time."""
    t0 = time.perf_counter()
    handles = [peer.submit(noop) for _ in range(n)]
    submitted = time.perf_counter() - t0
    peer.results(handles)
    return submitted


def _throughput(peer: ExecutorPeer, p: Params, rec: Recorder) -> None:
    n = fit_batch(p.throughput_n, p.cap_s, lambda k: _burst(peer, k))
    t0 = time.perf_counter()
    submitted = _burst(peer, n)
    elapsed = time.perf_counter() - t0
    rec.metric("throughput_tps", n / elapsed, n=n, capped=n < p.throughput_n, elapsed_s=elapsed, submit_s=submitted)


def _efficiency(peer: ExecutorPeer, p: Params, rec: Recorder) -> None:
    """Best of ``spin_reps``: load from other processes can only lower it."""
    ideal = p.spin_tasks * p.spin_s / p.workers
    runs: list[float] = []
    for _ in range(p.spin_reps):
        t0 = time.perf_counter()
        peer.results([peer.submit(spin, p.spin_s) for _ in range(p.spin_tasks)])
        runs.append(time.perf_counter() - t0)
    rec.metric(
        "efficiency",
        ideal / min(runs),
        ideal_s=ideal,
        actual_s=min(runs),
        runs_s=runs,
        median_efficiency=ideal / summarize(runs)["median"],
        tasks=p.spin_tasks,
    )


def run(cls: type[ExecutorPeer], p: Params, rec: Recorder) -> None:
    keys = ("startup_s", "roundtrip_s", "throughput_tps", "efficiency")
    with rec.workload(*keys):
        peer = cls(p.workers)
        t0 = time.perf_counter()
        with peer:
            peer.result(peer.submit(noop))
            first_startup = time.perf_counter() - t0
            _warm_up(peer, p)
            with rec.workload("roundtrip_s"):
                _roundtrip(peer, p, rec)
            with rec.workload("throughput_tps"):
                _throughput(peer, p, rec)
            with rec.workload("efficiency"):
                _efficiency(peer, p, rec)
        with rec.workload("startup_s"):
            _extra_startups(cls, p, first_startup, rec)
