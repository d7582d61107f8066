"""What is measured, in which unit, against which reference, and the targets.

Shared by the orchestrator (which peers to run per group), the peer
subprocess (metric keys) and the report (formatting, ratios, verdicts).
Raw values are stored in SI units (seconds, tasks/s, fractions); ``scale``
converts them to the unit shown in the report.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

RatioMode = Literal["peer/ref", "ref/peer"]
Op = Literal["<=", ">=", "<", ">"]

OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}

DISPLAY: dict[str, str] = {
    "dpool": "dpool",
    "ppe": "PPE",
    "mp": "mp.Pool",
    "loky": "loky",
    "ray": "Ray",
    "dask": "dask.distributed",
    "mpire": "mpire",
}

ALL_PEERS: tuple[str, ...] = tuple(DISPLAY)


@dataclass(frozen=True)
class Target:
    """A goal for dpool: ``ratio op value`` or ``figure op value``."""

    op: Op
    value: float
    on: Literal["ratio", "figure"] = "ratio"
    label: str = ""  # extra wording, e.g. "faster than Ray"


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    detail: str  # str.format()-ed with the run's Params fields
    unit: str
    scale: float
    higher_is_better: bool
    ratio_mode: RatioMode = "peer/ref"
    reference: str | None = None  # overrides the group's reference peer
    targets: tuple[Target, ...] = ()
    digits: int = 1


@dataclass(frozen=True)
class Group:
    name: str
    title: str
    reference: str
    peers: tuple[str, ...]
    metrics: tuple[Metric, ...] = field(default_factory=tuple)


def _obj_metrics(mb: int, params_field: str, targets: bool) -> tuple[Metric, ...]:
    size = f"{mb}mb"
    fast_reps = "{big_fast_reps}" if params_field == "big" else "{small_reps}"
    return (
        Metric(
            key=f"arg_{size}_s",
            title=f"{mb} MB array → {{obj_tasks}} tasks, passed as argument",
            detail="each task sums the array; median over {" + params_field + "_reps} run(s)",
            unit="ms",
            scale=1e3,
            higher_is_better=False,
            ratio_mode="ref/peer",
            targets=(Target(">=", 10.0),) if targets else (),
        ),
        Metric(
            key=f"put_{size}_s",
            title=f"{mb} MB array → {{obj_tasks}} tasks via put() (time includes put)",
            detail="dpool.put / ray.put once, refs passed to the tasks; median over " + fast_reps + " run(s) "
            "after a warm-up; peers without put() are skipped",
            unit="ms",
            scale=1e3,
            higher_is_better=False,
            ratio_mode="peer/ref",
            reference="ray",
            targets=((Target("<=", 50.0, on="figure"), Target("<", 1.0, label="faster than Ray")) if targets else ()),
        ),
        Metric(
            key=f"result_{size}_s",
            title=f"Task returning a {mb} MB array",
            detail="submit → array in the driver; median over " + fast_reps + " run(s) after a warm-up",
            unit="ms",
            scale=1e3,
            higher_is_better=False,
            ratio_mode="ref/peer",
            targets=(Target(">=", 5.0),) if targets else (),
        ),
    )


GROUPS: dict[str, Group] = {
    "executor": Group(
        name="executor",
        title="Executor (concurrent.futures-style submit/result)",
        reference="ppe",
        peers=("ppe", "dpool", "mp", "loky", "ray", "dask"),
        metrics=(
            Metric(
                key="roundtrip_s",
                title="No-op round trip",
                detail="submit → result one at a time; median of {roundtrip_n} after warm-up",
                unit="µs",
                scale=1e6,
                higher_is_better=False,
                targets=(Target("<=", 0.5),),
            ),
            Metric(
                key="throughput_tps",
                title="No-op throughput",
                detail="{throughput_n} submits, then wait for all",
                unit="tasks/s",
                scale=1.0,
                higher_is_better=True,
                targets=(Target(">=", 4.0),),
                digits=0,
            ),
            Metric(
                key="efficiency",
                title="Parallel efficiency",
                detail="{spin_tasks} tasks of {spin_s}s busy CPU on {workers} workers; ideal/actual time, "
                "best of {spin_reps} run(s) (other load can only lower it)",
                unit="%",
                scale=100.0,
                higher_is_better=True,
                targets=(Target(">=", 97.0, on="figure"),),
            ),
            Metric(
                key="startup_s",
                title="Start-up",
                detail="create executor → first result in a fresh executor; median of "
                "{startup_reps} ({startup_reps_heavy} for Ray/dask)",
                unit="ms",
                scale=1e3,
                higher_is_better=False,
                targets=(Target("<=", 2.0),),
                digits=0,
            ),
        ),
    ),
    "objects": Group(
        name="objects",
        title="Large objects (numpy float64 arrays)",
        reference="ppe",
        peers=("ppe", "dpool", "mp", "loky", "ray"),
        metrics=(
            *_obj_metrics(64, "big", targets=True),
            Metric(
                key="mem_arg_64mb",
                title="Peak memory during the 64 MB argument run",
                detail="memory of driver + all descendants (PSS without shared memory, "
                "plus the machine's shared memory: each page once, mapped or not), sampled "
                "every {mem_interval_s}s, minus baseline, divided by the array size "
                "(RSS, which counts a shared page once per process mapping it, and PSS in "
                "the notes)",
                unit="× array",
                scale=1.0,
                higher_is_better=False,
                targets=(Target("<", 2.0, on="figure"),),
                digits=2,
            ),
            *_obj_metrics(1, "small", targets=False),
        ),
    ),
    "pool": Group(
        name="pool",
        title="multiprocessing.Pool API",
        reference="mp",
        peers=("mp", "dpool", "ray", "mpire"),
        metrics=(
            Metric(
                key="map_tps",
                title="Pool.map of no-ops, default chunksize",
                detail="{pool_map_n} items; median of up to {pool_map_reps} runs (capped at {cap_s}s)",
                unit="tasks/s",
                scale=1.0,
                higher_is_better=True,
                targets=(Target(">=", 0.8),),
                digits=0,
            ),
            Metric(
                key="imap_unordered_tps",
                title="imap_unordered of no-ops, chunksize=1",
                detail="{pool_imap_n} items",
                unit="tasks/s",
                scale=1.0,
                higher_is_better=True,
                targets=(Target(">=", 1.0),),
                digits=0,
            ),
            Metric(
                key="apply_s",
                title="Pool.apply round trip",
                detail="median of {pool_apply_n} after warm-up",
                unit="µs",
                scale=1e6,
                higher_is_better=False,
                targets=(Target("<=", 0.75),),
            ),
        ),
    ),
}


@dataclass(frozen=True)
class Floor:
    """A lower bound measured in the same run (``floor.py``), for one of a group's metrics.

    The report shows dpool's figure as a multiple of it, against the project's goal.
    """

    metric: str  # the group's metric it bounds
    key: str  # its key in the floor child's metrics
    title: str
    detail: str
    goal: float  # project goal: dpool's figure ≤ goal × floor


FLOORS: dict[str, Floor] = {
    "executor": Floor(
        metric="roundtrip_s",
        key="floor_s",
        title="socketpair floor",
        detail="bare ping-pong of a 64-byte message between two Python processes over a "
        "socketpair (blocking send/recv, no framing or pickling); median of {roundtrip_n}",
        goal=4.0,
    ),
}

FLOOR_GROUPS: tuple[str, ...] = tuple(FLOORS)

