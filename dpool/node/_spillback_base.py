"""What the parts of the origin's ``Spillback`` share (``_spillback``, ``_spillback_waits``,
``_spillback_results``): its constants, the record of a task away, and the state and
methods each part reads from the others (declared here for the type checker; the
``Spillback`` sets and defines them)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from dpool.scheduling import SchedulerAPI, Task, WorkerGroup

_BACKOFF_S = 0.2
# Stored inputs this large go by reference (pulled by the runner): every stored value, at
# the default store threshold. Inline, a large input's bytes cross both peers' IO loops;
# by reference the runner pulls them on a kept connection (bench/NOTES.md).
REFERENCE_MIN = 256 << 10
GRACE_S = 10.0  # default of DPOOL_RESOURCE_GRACE_S
# After pulling a lent result, this node points tasks that take it at the lender's copy
# for this long (data locality: the global scheduler then places them there, with
# nothing to pull). The lender keeps it ``_remote.lend_timeout_s`` (60 s) unreleased.
LEND_USE_S = 20.0
_CHECK_S = 3.0  # how often a node running tasks for this one is asked which it still has


class _Away:
    __slots__ = ("task", "gs", "node", "sent_at", "pulling", "refs", "accepted_at",
                 "strikes", "lenders")

    def __init__(self, task: Task, gs: str, sent_at: float) -> None:
        self.task = task
        self.gs = gs
        self.node: Optional[str] = None
        self.sent_at = sent_at
        self.pulling = False  # done there; its lent result is being pulled from ``node``
        self.refs: tuple = ()  # segments of this store it was sent references to
        self.accepted_at = 0.0  # when ``node`` said Accepted
        self.strikes = 0  # answers in a row from ``node`` that it has no trace of it
        self.lenders: set = set()  # nodes whose lent copies its inputs were sent from


class SpillbackBase:
    """The ``Spillback``'s state and methods its parts use across modules."""

    _s: SchedulerAPI
    address: str
    token: bytes
    grace_s: float
    check_s: float
    away: dict[int, _Away]
    actor_logs: Any  # ``node._actor_rebuild.ActorRebuilds`` (a driver's placed actors)
    lent_copies: dict[str, tuple]
    _away_per_group: dict[int, int]
    _borrowers: dict[str, set]
    _unmet: dict[int, list]
    _parked: list
    _homeless: dict[int, list]
    _send: Callable[[str, list], None]
    _schedulers: Callable[[], list]
    _keep_local: Callable[[WorkerGroup], bool]
    _mirror: Callable[[WorkerGroup], bool]

    def consider_locked(self, g: WorkerGroup) -> None: raise NotImplementedError
    def _take_locked(self, task_id: int) -> Optional[Task]: raise NotImplementedError
    def _home_locked(self, t: Task, charge: bool) -> None: raise NotImplementedError
    def _start_locked(self, t: Task, gss: list) -> Optional[str]: raise NotImplementedError
    def _spillback_locked(self, t: Task, g: WorkerGroup, gs: str) -> Any: raise NotImplementedError
