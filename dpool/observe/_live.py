"""``python -m dpool run --progress``: a live line for an unmodified program.

A daemon thread reads what the runtime recorded since the program started (the embedded
runtime's event log, or the cluster's event streams and node table) once per
``interval`` and rewrites one line on stderr: tasks done, running, queued, failed, and
CPUs in use per node. It reads records the runtime keeps anyway: the program's tasks pay
nothing for it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO, Any


def counts(events: list) -> dict[str, int]:
    """Task states from ``(task_id, kind, t, worker_id, node)`` events, oldest first."""
    state: dict[int, str] = {}
    for tid, kind, _t, _w, _node in events:
        if kind == "submit":
            state.setdefault(tid, "queued")
        elif kind == "start":
            if state.get(tid) not in ("done", "failed"):
                state[tid] = "running"
        elif kind == "end":
            state[tid] = "done"
        elif kind == "error":
            state[tid] = "failed"
    out = {"done": 0, "running": 0, "queued": 0, "failed": 0}
    for s in state.values():
        out[s] += 1
    return out


class LiveLine:
    def __init__(self, interval: float = 1.0, file: IO[str] | None = None) -> None:
        self.interval = interval
        self.file = file if file is not None else sys.stderr
        self.t0 = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: Any = None
        self._width = 0
        self.last = ""

    def _read(self) -> str:
        if os.environ.get("DPOOL_ADDRESS"):
            from dpool.observe._cluster import cluster_status, open_store

            if self._store is None:
                self._store, _ = open_store()
            events, _fns = self._store.event_log(self.t0)
            status, _target = cluster_status()
            cpus = " ".join(f"{n['node_id']} {n['cpus_used']}/{n['cpus_total']}"
                            for n in status["nodes"] if n.get("alive"))
        else:
            from dpool.runtime import current as _current

            events, _fns = _current.driver().control.event_log(self.t0)  # type: ignore[attr-defined]
            c = counts(events)
            cpus = f"this host {c['running']}/{os.cpu_count()}"
            return self._format(c, cpus)
        return self._format(counts(events), cpus)

    @staticmethod
    def _format(c: dict, cpus: str) -> str:
        return (f"dpool: {c['done']} done, {c['running']} running, {c['queued']} queued, "
                f"{c['failed']} failed | CPUs used: {cpus}")

    def _show(self, final: bool = False) -> None:
        try:
            text = self._read()
        except Exception as exc:  # noqa: BLE001 - the program must not suffer for the line
            text = f"dpool: progress unavailable ({exc})"
        self.last = text
        pad = " " * max(0, self._width - len(text))
        self._width = len(text)
        try:
            self.file.write("\r" + text + pad + ("\n" if final else ""))
            self.file.flush()
        except (OSError, ValueError):
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._show()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="dpool-progress-line")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self._show(final=True)
        if self._store is not None:
            self._store.close()
