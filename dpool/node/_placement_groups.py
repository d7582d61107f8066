"""Placement groups at a node: relaying its drivers' groups, holding bundles.

    driver ──PlacementGroupReserve─▶ NodePlacementGroups ──▶ a global scheduler (the first
           ──PlacementGroupRemove──▶      (origin)           linked, by address)
           ◀─PlacementGroupState───
    global scheduler ──BundleHold──▶ NodePlacementGroups ──▶ scheduler.hold_bundle_locked
                     ◀──BundleHeld──      (holder)           / free_bundles_locked

As the origin of a group it forwards its driver's reservation to one global scheduler
(which owns the group's state: ``global_scheduler._placement_groups``) and that scheduler's
answers back to the driver. As a holder it reserves bundles in its local scheduler
(``scheduling._bundle_ledger``) when a global scheduler says so, and frees them when
told -- or when that scheduler's link closes (whatever it owned is gone with it), or
when the driver that reserved a group detaches (its groups are removed).

Handlers run on the scheduler's IO thread with its lock held (``_locked``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dpool.protocol import messages as m
from dpool.scheduling import SchedulerAPI
from dpool.scheduling import resources as _resources

log = logging.getLogger("dpool.node")


class NodePlacementGroups:
    def __init__(self, scheduler: SchedulerAPI, address: str,
                 send: Callable[[str, list], None],
                 schedulers: Callable[[], list]) -> None:
        self._s = scheduler
        self.address = address
        self._send = send  # (peer address, messages): over the link to it
        self._schedulers = schedulers  # global schedulers linked now
        self._owners: dict[int, tuple] = {}  # pg_id -> (driver handle, its scheduler)
        self._holders: dict[tuple, str] = {}  # (pg_id, index) held -> scheduler's address
        scheduler.register_handler(m.PlacementGroupReserve.CODE, self._on_reserve_locked)
        scheduler.register_handler(m.PlacementGroupRemove.CODE, self._on_remove_locked)
        scheduler.register_handler(m.PlacementGroupState.CODE, self._on_state_locked)
        scheduler.register_handler(m.BundleHold.CODE, self._on_hold_locked)

    # -- as the origin (a driver's groups) ------------------------------------------------------
    def _on_reserve_locked(self, d: Any, msg: m.PlacementGroupReserve) -> None:
        gss = sorted(self._schedulers())
        if not gss:
            self._s.send_locked(d, [m.PlacementGroupState(
                msg.pg_id, "failed", (), "no global scheduler is linked to this node to "
                "reserve the placement group (is the head running?)")])
            return
        self._owners[msg.pg_id] = (d, gss[0])
        self._send(gss[0], [m.PlacementGroupReserve(msg.pg_id, self.address, msg.bundles,
                                                    msg.strategy)])

    def _on_remove_locked(self, d: Any, msg: m.PlacementGroupRemove) -> None:
        owner = self._owners.pop(msg.pg_id, None)
        if owner is not None:
            self._send(owner[1], [m.PlacementGroupRemove(msg.pg_id, self.address)])

    def _on_state_locked(self, h: Any, msg: m.PlacementGroupState) -> None:
        owner = self._owners.get(msg.pg_id)
        if owner is None:
            return
        if msg.state == "failed":
            del self._owners[msg.pg_id]
        if owner[0].alive:
            self._s.send_locked(owner[0], [msg])

    def driver_closed_locked(self, d: Any) -> None:
        """A driver detached: the groups it reserved are removed."""
        for pg_id, (owner, gs) in list(self._owners.items()):
            if owner is d:
                del self._owners[pg_id]
                self._send(gs, [m.PlacementGroupRemove(pg_id, self.address)])

    # -- as a holder ----------------------------------------------------------------------------
    def _on_hold_locked(self, h: Any, msg: m.BundleHold) -> None:
        key = (msg.pg_id, msg.index)
        s = self._s
        if not msg.hold:
            self._holders.pop(key, None)
            s.free_bundles_locked(msg.pg_id, msg.index)
            return
        req = _resources.from_wire(tuple(msg.req))
        assert req is not None  # (a bundle's request is a tuple, never None, on the wire)
        why = s.hold_bundle_locked(msg.pg_id, msg.index, req)
        if why is None:
            self._holders[key] = h.address
        else:
            log.info("cannot hold bundle %d of placement group %#x now: %s", msg.index,
                     msg.pg_id, why)
        self._send(h.address, [m.BundleHeld(msg.pg_id, msg.index, why is None, why or "",
                                            msg.attempt)])

    def peer_closed_locked(self, h: Any) -> None:
        """A link closed: if a global scheduler's, the bundles it had this node hold are
        freed, and the drivers whose groups it owned are told they are lost."""
        names = {h.address, getattr(h, "peer_id", None)}
        for key, gs in list(self._holders.items()):
            if gs in names:
                del self._holders[key]
                self._s.free_bundles_locked(*key)
        for pg_id, (d, gs) in list(self._owners.items()):
            if gs in names:
                del self._owners[pg_id]
                if d.alive:
                    self._s.send_locked(d, [m.PlacementGroupState(
                        pg_id, "lost", (), f"the global scheduler that reserved it ({gs}) "
                        "is gone: remove the group and reserve a new one")])
