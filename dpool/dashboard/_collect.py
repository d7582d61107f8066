"""The dashboard's view of the cluster, refreshed by one thread.

Every ``interval`` seconds ``Collector`` reads the node and global-scheduler tables, the
shards' health and the events logged since its last read (``_source.ControlReader``),
accounts the events (``_activity.Activity``) and builds a *snapshot*: one JSON-able dict
that the page, its fragment and ``/api/state`` render. Requests only read the latest
snapshot, so any number of open pages costs the control store one reader. Nothing here
touches a task's path: the events are the ones the schedulers log anyway.

Snapshot keys: ``cluster``, ``updated`` (time), ``errors`` (what could not be read),
``nodes``, ``global_schedulers``, ``shards``, ``rate`` (``Activity.rate``), ``running``
(``count`` and the longest-running ``tasks``), ``failed`` (the latest failures).
"""

from __future__ import annotations

import logging
import threading
import time

from dpool.dashboard._activity import Activity
from dpool.dashboard._source import ControlReader

log = logging.getLogger("dpool.dashboard")

SHOW_RUNNING = 30
SHOW_FAILED = 20


class Collector:
    """Reads the cluster every ``interval`` s in a thread of its own (``start``/``stop``);
    ``snapshot()`` is the latest view."""

    def __init__(self, reader: ControlReader, cluster: str, interval: float = 1.0,
                 activity: Activity | None = None) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self.reader = reader
        self.cluster = cluster
        self.interval = interval
        self.activity = activity or Activity()
        self._lock = threading.Lock()
        self._snapshot: dict = {"cluster": cluster, "updated": 0.0, "nodes": [],
                                "global_schedulers": [], "shards": [], "errors": [],
                                "rate": self.activity.rate(time.time()),
                                "running": {"count": 0, "tasks": []}, "failed": []}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._since = time.time() - self.activity.window_s

    def snapshot(self) -> dict:
        with self._lock:
            return self._snapshot

    def start(self) -> None:
        self.refresh()  # the first page has data
        self._thread = threading.Thread(target=self._loop, name="dpool-dashboard-collect",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception:
                log.exception("dashboard refresh failed")

    def refresh(self) -> dict:
        """Read the cluster once and publish a new snapshot (also returned)."""
        errors: list[str] = []
        r = self.reader
        now = time.time()
        events, event_errors = r.events_since(self._since)
        errors += event_errors
        self.activity.add(events)
        snap = dict(self.snapshot())
        try:
            snap["nodes"] = [_node(row) for row in r.tables.nodes()]
            snap["global_schedulers"] = [
                {"gs_id": g.get("gs_id"), "address": g.get("address"),
                 "alive": bool(g.get("alive")), "age": g.get("age")}
                for g in r.tables.global_schedulers()]
        except Exception as exc:  # noqa: BLE001 - ControlStoreError: shown on the page
            errors.append(f"node table: {exc}")
        snap["shards"] = r.tables.shard_info()  # (never raises)
        gone = {n["node_id"] for n in snap["nodes"] if not n["alive"]}
        snap["running"], snap["failed"] = self._tasks(errors, gone)
        snap.update(cluster=self.cluster, updated=now, errors=errors,
                    rate=self.activity.rate(now))
        with self._lock:
            self._snapshot = snap
        return snap

    def _tasks(self, errors: list, dead_nodes: set) -> tuple[dict, list]:
        a = self.activity
        shown = a.longest_running(SHOW_RUNNING)
        failed = a.recent_failures(SHOW_FAILED)
        try:
            rows = self.reader.task_rows([x.task_id for x in shown] +
                                         [f.task_id for f in failed if f.row is None])
        except Exception as exc:  # noqa: BLE001
            errors.append(f"task table: {exc}")
            rows = {}
        else:
            # a task whose row is gone or over, though its end event was not read, or that
            # ran on a node now dead (its home runs it again, under its own id or another)
            over = [x.task_id for x in shown if rows.get(x.task_id, {}).get("state")
                    not in ("PENDING", "RUNNING")
                    or rows[x.task_id].get("node") in dead_nodes]
            a.forget(over)
            shown = [x for x in shown if x.task_id not in over]
            for f in failed:
                f.row = f.row or rows.get(f.task_id)
        running = [{"task_id": x.task_id, "started": x.started, "worker_id": x.worker_id,
                    "retried": x.starts > 1, "spilled_here": a.spilled_here(x.task_id),
                    **_row(rows.get(x.task_id))} for x in shown]
        failures = [{"task_id": f.task_id, "at": f.at, **_row(f.row or rows.get(f.task_id))}
                    for f in failed]
        return {"count": len(a.running), "tasks": running}, failures


def _row(row: dict | None) -> dict:
    if row is None:
        return {"function": None, "node": None, "attempts": None, "traceback": None}
    att = row.get("att")
    return {"function": row.get("function"), "node": row.get("node"),
            "attempts": int(att) if att and att.isdigit() else None,
            "traceback": row.get("err")}


def _node(row: dict) -> dict:
    """A node-table row as the page shows it."""
    load = row.get("load") or {}
    resources = dict(row.get("resources") or load.get("resources") or {})
    used = load.get("resources_used") or {}
    return {
        "node_id": row.get("node_id"), "hostname": row.get("hostname"),
        "alive": bool(row.get("alive")), "dead": bool(row.get("dead")),
        "age": row.get("age"),
        "cpus_used": load.get("cpus_used", 0),
        "cpus_total": row.get("num_cpus", resources.get("CPU", 0)),
        "resources": {k: {"total": v, "used": used.get(k)} for k, v in resources.items()
                      if k not in ("CPU", "memory")},
        "queued": load.get("queued", 0), "workers": load.get("workers"),
        "drivers": load.get("drivers"),
        "store_used": load.get("store_used", 0),
        "store_capacity": load.get("store_capacity", 0),
    }
