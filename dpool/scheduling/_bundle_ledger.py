"""Placement-group bundles held by one local scheduler (a node, or the embedded runtime):
what each reserved, and what of it its tasks use now.

    BundleHold(pg, i, {CPU: 2, GPU: 1}) ──hold──▶ Bundle: 2 CPUs, GPU #3 (its sub-ledger)
        the node's Ledger gives GPU #3 up; on a node, the scheduler's ``cpu_limit`` drops by 2
    task in bundle i ──acquire──▶ from the bundle only: its CPUs, its sub-ledger
    task ends ──release──▶ back to the bundle; bundle freed ──free──▶ back to the node

A bundle takes its GPUs, memory and custom resources out of the node's ``Ledger`` when it
is held (an ``Allocation`` like a task's) and keeps them in a sub-ledger of its own (a
``Ledger`` whose device ``k`` is the node's device ``ids[k]``), from which only its tasks
take. Its CPUs leave the general pool: a node's scheduler keeps ``cpu_limit`` = its CPUs
minus those reserved and idle (``idle_cpus``), so tasks outside bundles never take them;
a bundle task that starts moves its CPUs from ``idle_cpus`` to the busy count
(``busy_cpus_locked``), where every running task's are.

Holding never waits for running tasks: the CPUs of all bundles held need only be among
the node's; tasks outside bundles that run when one is taken finish, and none starts in
their place. GPUs, memory and custom resources must be free now, or the hold is refused
(its owner tries again later). A bundle freed while its tasks run gives its idle CPUs back
at once and the rest when its last task ends; no task starts in it meanwhile.

Pure bookkeeping under the scheduler's lock, no processes (tests/placement/).
"""

from __future__ import annotations

import collections

from dpool.scheduling._resources import Allocation, Ledger, Request, _describe

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Optional

__all__ = ["Bundle", "BundleAllocation", "BundleLedger"]


class BundleAllocation(collections.namedtuple("BundleAllocation",
                                              "request gpu_ids gpu_units key sub")):
    """A task's share of a bundle: like ``Allocation`` (``gpu_ids`` are the node's
    device indexes), plus the bundle (``key``: ``(pg_id, index)``) and the share of its
    sub-ledger (``sub``, an ``Allocation``)."""

    __slots__ = ()


class Bundle:
    __slots__ = ("key", "req", "alloc", "cpus_free", "sub", "ids", "running", "removed")

    def __init__(self, key: tuple, req: Request, alloc: Allocation, sub: Ledger) -> None:
        self.key = key
        self.req = req
        self.alloc = alloc  # what it took from the node's ledger
        self.cpus_free = req.cpus
        self.sub = sub
        self.ids = alloc.gpu_ids  # sub-ledger device k is the node's ids[k]
        self.running = 0
        self.removed = False

    def offer(self) -> str:
        return _describe(self.req.as_dict())


class BundleLedger:
    """The bundles held here, by ``(pg_id, index)``."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.bundles: dict[tuple, Bundle] = {}
        self.reserved_cpus = 0  # CPUs of the bundles held (not freed)
        self.idle_cpus = 0  # of those, not used by a running task

    # -- holding -------------------------------------------------------------------------
    def hold(self, key: tuple, req: Request, total_cpus: int) -> Optional[str]:
        """Reserve ``req`` for bundle ``key``; None when held (also when it was already),
        else why not now."""
        b = self.bundles.get(key)
        if b is not None and not b.removed:
            return None
        if b is not None:  # freed, its last tasks still running: cannot be held again yet
            return f"bundle {key[1]} of placement group {key[0]:#x} is still being freed here"
        if self.reserved_cpus + req.cpus > total_cpus:
            return (f"{req.cpus} CPUs asked, {total_cpus - self.reserved_cpus} of "
                    f"{total_cpus} not reserved by other bundles")
        short = self.ledger.shortfall(req)
        if short:
            return short
        a = self.ledger.acquire(req._replace(strategy=None))
        if a is None:
            return f"{req} is not free on this node now"
        led = self.ledger
        sub = Ledger([led.gpu_names[i] for i in a.gpu_ids], req.memory, dict(req.custom))
        sub.gpu_free = [a.gpu_units] * len(a.gpu_ids)  # a share of one device: its units
        self.bundles[key] = Bundle(key, req, a, sub)
        self.reserved_cpus += req.cpus
        self.idle_cpus += req.cpus
        return None

    def free(self, key: tuple) -> bool:
        """Bundle ``key`` is given up: its idle CPUs go back at once, the rest when its
        last task ends. False if it was not held."""
        b = self.bundles.get(key)
        if b is None or b.removed:
            return False
        b.removed = True
        self.reserved_cpus -= b.req.cpus
        self.idle_cpus -= b.cpus_free
        b.cpus_free = 0
        if not b.running:
            self._drop(b)
        return True

    def keys(self, pg_id: int) -> list:
        return [k for k, b in self.bundles.items() if k[0] == pg_id and not b.removed]

    def _drop(self, b: Bundle) -> None:
        del self.bundles[b.key]
        self.ledger.release(b.alloc)

    # -- tasks ---------------------------------------------------------------------------
    def _candidates(self, pg_id: int, index: int) -> list:
        if index >= 0:
            b = self.bundles.get((pg_id, index))
            return [b] if b is not None and not b.removed else []
        return [b for k, b in sorted(self.bundles.items()) if k[0] == pg_id and not b.removed]

    def holds(self, pg_id: int, index: int) -> bool:
        """Whether the bundle (``index`` -1: one of the group's) is held here."""
        return bool(self._candidates(pg_id, index))

    def never_fits(self, pg_id: int, index: int, r: Request) -> Optional[str]:
        """Why a task asking ``r`` can never run in that bundle (None: it can)."""
        cands = self._candidates(pg_id, index)
        for b in cands:
            if r.cpus <= b.req.cpus and b.sub.shortfall(r) is None:
                return None
        which = f"bundle {index}" if index >= 0 else "any of its bundles here"
        offers = ", ".join(b.offer() for b in cands) or "nothing"
        return (f"the task asks for {r._replace(strategy=None)} but {which} of placement "
                f"group {pg_id:#x} reserved {offers}")

    def acquire(self, pg_id: int, index: int, r: Request) -> Optional[BundleAllocation]:
        """Take what ``r`` needs from the bundle (the first with room, for -1), or None."""
        for b in self._candidates(pg_id, index):
            if r.cpus > b.cpus_free:
                continue
            sa = b.sub.acquire(r._replace(strategy=None))
            if sa is None:
                continue
            b.cpus_free -= r.cpus
            self.idle_cpus -= r.cpus
            b.running += 1
            return BundleAllocation(r, tuple(b.ids[i] for i in sa.gpu_ids), sa.gpu_units,
                                    b.key, sa)
        return None

    def release(self, a: BundleAllocation) -> None:
        """A task of the bundle ended: its share goes back to the bundle (or, the bundle
        freed meanwhile, with the bundle's last task, to the node)."""
        b = self.bundles.get(a.key)
        if b is None:
            return
        b.running -= 1
        b.sub.release(a.sub)
        if b.removed:
            if not b.running:
                self._drop(b)
            return
        b.cpus_free += a.request.cpus
        self.idle_cpus += a.request.cpus
