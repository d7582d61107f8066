"""``dpool.placement_group``: reserve bundles of resources together -- all or none -- and
run tasks in them (``executor.options(placement_group=pg, bundle=i)``).

    pg = dpool.placement_group([{"CPU": 1, "GPU": 1}] * 4, strategy="spread")
    pg.ready().result(30)          # all four bundles held (a concurrent.futures.Future)
    ex.options(placement_group=pg, bundle=0).submit(train, 0)
    pg.remove()                    # frees them (or: ``with pg: ...``)

Who decides: on a cluster, a global scheduler (``global_scheduler._placement_groups``), which
sees every node's free resources and holds the bundles on the nodes in two phases
(``placement.GangTable``); on the embedded runtime, this process, against this host
(``_placement_groups_local``). Either way the same ``PlacementGroup`` answers: ``state``,
``bundle_nodes``, ``ready()``, ``remove()``.
"""

from __future__ import annotations

import concurrent.futures as _cf
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from dpool.errors import PlacementError
from dpool.futures import Future
from dpool.placement import STRATEGIES
from dpool.runtime import _current
from dpool.scheduling import resources as _resources

__all__ = ["PlacementGroup", "placement_group"]


def _bundle(i: int, b: Any) -> _resources.Request:
    if not isinstance(b, Mapping):
        raise TypeError(f"bundle {i} must be a mapping of resource name to amount, such as "
                        f"{{'CPU': 1, 'GPU': 1}}; got {type(b).__name__} {b!r}")
    s = _resources.spec(resources=b)
    cpus = s.pop("CPU", 0)
    gpus = float(s.pop("GPU", 0.0))
    memory = s.pop("memory", 0)
    custom = tuple(sorted((k, float(v)) for k, v in s.items() if v))
    if not cpus and not gpus and not memory and not custom:
        raise ValueError(f"bundle {i} ({dict(b)!r}) reserves nothing: give it CPUs, GPUs, "
                         "memory or a custom resource")
    return _resources.Request(cpus, gpus, memory, custom)


class PlacementGroup:
    """Bundles of resources reserved together (``dpool.placement_group`` makes one).

    ``state``: "pending" (waiting for room), "ready" (every bundle held), "failed" (it
    can never be reserved: ``error``), "lost" (a node holding a bundle died: ``error``;
    remove it and reserve a new one) or "removed". ``bundle_nodes``: the node holding
    each bundle once ready (``"local"`` on the embedded runtime)."""

    def __init__(self, bundles: Sequence[Mapping[str, float]], strategy: str = "pack") -> None:
        if _current.in_worker():
            raise PlacementError("placement groups are reserved by the driver, not inside "
                                 "a task (pass the group to the task's submitter instead)")
        if isinstance(bundles, Mapping) or not isinstance(bundles, Sequence) or not bundles:
            raise TypeError("placement_group needs a non-empty list of bundles, such as "
                            f"[{{'CPU': 1}}] * 4; got {bundles!r}")
        if strategy not in STRATEGIES:
            raise ValueError(f"placement group strategy {strategy!r}: use one of "
                             f"{', '.join(STRATEGIES)}")
        self._requests = [_bundle(i, b) for i, b in enumerate(bundles)]
        self.bundle_specs: list[dict] = [dict(b) for b in bundles]
        self.strategy = strategy
        self._driver = _current.driver()
        self.id: int = self._driver.new_id()
        self._lock = threading.Lock()
        self._state = "pending"
        self._nodes: Optional[list[str]] = None
        self._error: Optional[PlacementError] = None
        self._ready: Future = Future()
        self._driver.reserve_placement_group(self.id, self._requests, strategy,
                                             self._on_state)

    # -- what the runtime reports (any thread) -----------------------------------------------
    def _on_state(self, state: str, nodes: tuple, reason: str) -> None:
        with self._lock:
            if self._state == "removed":
                return
            if state == "ready":
                self._state, self._nodes = "ready", list(nodes)
            elif state in ("failed", "lost"):
                self._state = state
                self._error = PlacementError(
                    f"placement group {self.id:#x} ({len(self._requests)} bundles, "
                    f"{self.strategy}) {'cannot be reserved' if state == 'failed' else 'is lost'}"
                    f": {reason}")
            else:
                return
        if not self._ready.done():
            if state == "ready":
                self._ready.set_result(self)
            else:
                self._ready.set_exception(self._error)  # type: ignore[arg-type]

    # -- the user's ---------------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._state

    @property
    def error(self) -> Optional[PlacementError]:
        """Why it failed or was lost (None otherwise)."""
        return self._error

    @property
    def bundle_count(self) -> int:
        return len(self._requests)

    @property
    def bundle_nodes(self) -> Optional[list[str]]:
        """The node holding each bundle, once ready (None before)."""
        return None if self._nodes is None else list(self._nodes)

    def ready(self) -> _cf.Future:
        """A future that resolves to this group once every bundle is held, or raises
        ``PlacementError`` if it can never be (or was lost)."""
        if self._state == "lost" and self._ready.done() and self._ready.exception() is None:
            f: Future = Future()
            f.set_exception(self._error)  # type: ignore[arg-type]
            return f
        return self._ready

    def wait(self, timeout: Optional[float] = None) -> bool:
        """True once ready, False if ``timeout`` passed first; raises ``PlacementError``
        if it failed or was lost."""
        try:
            self.ready().result(timeout)
        except _cf.TimeoutError:
            return False
        return True

    def remove(self) -> None:
        """Free every bundle (tasks still running in one finish; those waiting for one
        fail with ``PlacementError``). A pending group stops waiting. Idempotent."""
        with self._lock:
            if self._state == "removed":
                return
            self._state = "removed"
            self._error = PlacementError(f"placement group {self.id:#x} was removed")
        self._driver.remove_placement_group(self.id)
        if not self._ready.done():
            self._ready.set_exception(self._error)

    def _usable(self, timeout: Optional[float] = None) -> None:
        """Before a task is submitted into it: wait until ready; raise if it never will."""
        if self._state == "ready":
            return
        if self._state in ("removed", "lost", "failed"):
            raise self._error  # type: ignore[misc]
        self.ready().result(timeout)

    def __enter__(self) -> "PlacementGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        where = f" on {self._nodes}" if self._nodes else ""
        return (f"<PlacementGroup {self.id:#x} {self.strategy} "
                f"{[str(r) for r in self._requests]} {self._state}{where}>")


def placement_group(bundles: Sequence[Mapping[str, float]],
                    strategy: str = "pack") -> PlacementGroup:
    """Reserve ``bundles`` (each a dict of resources: ``{"CPU": 1, "GPU": 1}``; a missing
    ``CPU`` is 0) together across the cluster -- all or none -- placed by ``strategy``:
    ``"pack"`` (as few nodes as they fit on), ``"spread"`` (as many as there are) or
    ``"strict_spread"`` (each on a different node, or ``PlacementError``). Returns at
    once; ``ready()`` says when they are held. A group that can never be held (no set of
    nodes has room for it) fails with ``PlacementError``; one that does not fit beside
    the groups held now waits until one is removed. Submit into it with
    ``executor.options(placement_group=pg, bundle=i)`` (``bundle=None``: any of its
    bundles); ``remove()`` frees it."""
    return PlacementGroup(bundles, strategy)
