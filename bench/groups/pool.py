"""pool group: Pool.map, imap_unordered(chunksize=1), apply round trip."""

from __future__ import annotations

import time

from params import Params
from peers import PoolPeer
from recorder import Recorder
from timing import fit_batch, repeat_capped, summarize
from workloads import noop_arg


def _map(pool: PoolPeer, p: Params, rec: Recorder) -> None:
    items = list(range(p.pool_map_n))

    def once() -> None:
        out = pool.map(noop_arg, items)
        if len(out) != len(items):
            raise AssertionError(f"map returned {len(out)} results for {len(items)} items")

    times = repeat_capped(p.pool_map_reps, p.cap_s, once)
    rates = [len(items) / t for t in times]
    rec.metric("map_tps", summarize(rates)["median"], samples=rates, n=p.pool_map_n, reps=len(times))


def _drain_imap(pool: PoolPeer, n: int) -> None:
    count = sum(1 for _ in pool.imap_unordered(noop_arg, range(n), 1))
    if count != n:
        raise AssertionError(f"imap_unordered yielded {count} of {n} results")


def _imap_unordered(pool: PoolPeer, p: Params, rec: Recorder) -> None:
    n = fit_batch(p.pool_imap_n, p.cap_s, lambda k: _drain_imap(pool, k))
    t0 = time.perf_counter()
    _drain_imap(pool, n)
    elapsed = time.perf_counter() - t0
    rec.metric("imap_unordered_tps", n / elapsed, n=n, capped=n < p.pool_imap_n, elapsed_s=elapsed)


def _apply(pool: PoolPeer, p: Params, rec: Recorder) -> None:
    for _ in range(p.warmup):
        pool.apply(noop_arg, (0,))
    samples = repeat_capped(p.pool_apply_n, p.cap_s, lambda: pool.apply(noop_arg, (0,)))
    stats = summarize(samples)
    rec.metric("apply_s", stats["median"], capped=len(samples) < p.pool_apply_n, **stats)


def run(cls: type[PoolPeer], p: Params, rec: Recorder) -> None:
    keys = ("map_tps", "imap_unordered_tps", "apply_s")
    with rec.workload(*keys):
        with cls(p.workers) as pool:
            pool.map(noop_arg, list(range(1000)))  # warm-up: start workers
            with rec.workload("map_tps"):
                _map(pool, p, rec)
            with rec.workload("imap_unordered_tps"):
                _imap_unordered(pool, p, rec)
            with rec.workload("apply_s"):
                _apply(pool, p, rec)
