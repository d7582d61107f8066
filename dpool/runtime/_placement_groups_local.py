"""Placement groups on the embedded runtime: one host, its own reservations.

    placement_group(...) ──reserve──▶ LocalPlacementGroups ──GangTable (one node: "local")──▶
        scheduler.hold_bundle_locked / free_bundles_locked (the host's bundles)

The same state machine as a global scheduler's (``placement.GangTable``), over one node:
this host, with its CPUs (``cpu_count()``, or ``$DPOOL_NUM_CPUS``) and the runtime's
GPUs, memory and custom resources. So ``pack`` and ``spread`` put every bundle here,
``strict_spread`` with more than one bundle can never be met (``PlacementError``), and
a group that does not fit beside the ones held waits until one is removed -- the same
program runs unchanged on a laptop and on a cluster. On this runtime the host's CPUs are
each executor's ``max_workers``, not a limit shared by the runtime: a reservation keeps
other groups from them, not tasks outside groups (see README, "Placement groups").

Holds are answered at once (no node to ask); reports reach the caller after the
scheduler's lock is released (a ``ready()`` callback may submit). A group waiting for
GPUs, memory or custom resources that running tasks hold is tried again every
``_RETRY_S`` by a thread that runs only while one waits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dpool.placement import GangTable, NodeLoad
from dpool.scheduling import resources as _resources

_RETRY_S = 0.05
HOST = "local"

StateFn = Callable[[str, tuple, str], None]  # (state, nodes, reason)


class LocalPlacementGroups:
    def __init__(self, scheduler: Any, host_cpus: int) -> None:
        self._s = scheduler
        self.host_cpus = host_cpus
        self._acks: list = []  # holds answered, to hand the table (not re-entered)
        self._reports: list = []  # (callback, state, nodes, reason), delivered unlocked
        self._callbacks: dict[int, StateFn] = {}
        self.table = GangTable(self._hold, self._free, self._report)
        self._retrier: threading.Thread | None = None

    # -- the table's callbacks (lock held) ----------------------------------------------------
    def _hold(self, node: str, pg_id: int, index: int, req: Any, attempt: int) -> None:
        why = self._s.hold_bundle_locked(pg_id, index, req, self.host_cpus)
        self._acks.append((pg_id, index, why is None, why or "", attempt))

    def _free(self, node: str, pg_id: int, index: int) -> None:
        self._s.free_bundles_locked(pg_id, index)

    def _report(self, origin: str, pg_id: int, state: str, nodes: tuple, reason: str) -> None:
        cb = self._callbacks.get(pg_id)
        if state == "failed":
            self._callbacks.pop(pg_id, None)
        if cb is not None:
            self._reports.append((cb, state, nodes, reason))

    def _loads_locked(self) -> list:
        """This host as a global scheduler would see it: what it has, what is free."""
        led = self._s.resources_locked()
        resources = {"GPU": led.num_gpus, "memory": led.memory, **led.custom}
        free = {"GPU": sum(led.gpu_free) / _resources.GPU_UNIT, "memory": led.memory_free,
                **led.custom_free}
        held = self._s.bundles_held_locked()
        reserved = sum(self.table.gangs[pg].bundles[i].cpus for pg, i in held
                       if pg in self.table.gangs and i < len(self.table.gangs[pg].bundles))
        return [NodeLoad(HOST, self.host_cpus, busy=reserved, resources=resources, free=free,
                         node_id=HOST)]

    def _settle_locked(self) -> None:
        """Hand the table the answers its holds got (each may start or abandon a try)."""
        while self._acks:
            acks, self._acks = self._acks, []
            for pg_id, index, ok, reason, attempt in acks:
                self.table.held(pg_id, index, ok, reason, attempt, self._loads_locked())

    def _take_reports_locked(self) -> list:
        reports, self._reports = self._reports, []
        return reports

    @staticmethod
    def _deliver(reports: list) -> None:
        for cb, state, nodes, reason in reports:
            cb(state, nodes, reason)

    # -- the driver's calls (any thread) ---------------------------------------------------
    def reserve(self, pg_id: int, bundles: list, strategy: str, on_state: StateFn) -> None:
        s = self._s
        with s.lock:
            self._callbacks[pg_id] = on_state
            self.table.reserve(pg_id, HOST, bundles, strategy, self._loads_locked())
            self._settle_locked()
            waiting = self.table.waiting
            reports = self._take_reports_locked()
        self._deliver(reports)
        if waiting:
            self._start_retrier()

    def remove(self, pg_id: int) -> None:
        s = self._s
        with s.lock:
            self._callbacks.pop(pg_id, None)
            self.table.remove(pg_id, ())
            self.table.retry(self._loads_locked())  # (what was freed is in the loads now)
            self._settle_locked()
            reports = self._take_reports_locked()
        self._deliver(reports)

    def _start_retrier(self) -> None:
        with self._s.lock:
            if self._retrier is not None and self._retrier.is_alive():
                return
            t = self._retrier = threading.Thread(target=self._retry_loop, daemon=True,
                                                 name="dpool-placement-groups")
        t.start()

    def _retry_loop(self) -> None:
        s = self._s
        stop = threading.Event()
        while not stop.wait(_RETRY_S):
            with s.lock:
                if s.closed or not self.table.waiting:
                    self._retrier = None
                    return
                self.table.retry(self._loads_locked())
                self._settle_locked()
                reports = self._take_reports_locked()
            self._deliver(reports)
