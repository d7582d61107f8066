"""Benchmark sizes: the defaults (~2.5 min in all) and ``--quick`` (~1 min; ~30 s without Ray/dask)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

MiB = 1 << 20


@dataclass(frozen=True)
class Params:
    workers: int = 2
    warmup: int = 50
    # wall-time cap for each long loop (round trips, bursts): slow peers do fewer
    cap_s: float = 4.0
    # executor group
    roundtrip_n: int = 2000
    throughput_n: int = 10_000
    spin_tasks: int = 200
    spin_s: float = 0.007
    spin_reps: int = 3  # efficiency is the best of these runs
    # start-up samples: the main session's creation plus (reps - 1) fresh cycles
    startup_reps: int = 5
    startup_reps_heavy: int = 2  # peers whose start-up takes seconds (Ray, dask)
    # objects group
    obj_tasks: int = 8
    big_bytes: int = 64 * MiB
    small_bytes: int = 1 * MiB
    big_reps: int = 2  # (a) as an argument: ~2.5 s a run for the pickling peers
    big_fast_reps: int = 5  # via put, and as a result
    small_reps: int = 10
    mem_interval_s: float = 0.005
    # count the (sampler-perturbed) memory run as a timing sample instead of
    # only as the warm-up: saves one 64 MB round per peer in --quick
    mem_run_timed: bool = False
    # pool group
    pool_map_n: int = 100_000
    pool_map_reps: int = 5  # capped by cap_s
    pool_imap_n: int = 10_000
    pool_apply_n: int = 2000
    # per (group, peer) subprocess wall-clock limit
    timeout_s: float = 150.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Params:
        return cls(**data)


DEFAULT = Params()

QUICK = dataclasses.replace(
    DEFAULT,
    warmup=20,
    cap_s=2.0,
    roundtrip_n=200,
    throughput_n=1000,
    spin_tasks=100,
    spin_reps=1,
    startup_reps=3,
    startup_reps_heavy=1,
    big_reps=1,
    big_fast_reps=2,
    mem_run_timed=True,
    small_reps=3,
    pool_map_n=100_000,
    pool_map_reps=3,
    pool_imap_n=2000,
    pool_apply_n=300,
    timeout_s=75.0,
)
