"""A node's Prometheus endpoint (``dpool start --metrics-port P``).

``GET /metrics``: the text exposition format (version 0.0.4), every name prefixed
``dpool_``, base units (seconds, bytes), counters ending ``_total``; it answers only a
request with ``Authorization: Bearer <the cluster token>`` (Prometheus'
``authorization: {credentials_file: ...}``), and 401 otherwise. ``GET /health``: ``ok``
while the node serves (no token: it says nothing else; for liveness/readiness probes).

What it exports, read when scraped (the scheduler's lock held briefly):

- ``dpool_tasks_total{outcome="finished|failed"}`` and ``dpool_task_duration_seconds``
  (a histogram of the time in the task's function), counted from when the endpoint
  started (``TaskMetrics``, which the scheduler's result handler feeds);
- ``dpool_tasks_queued``, ``dpool_workers{state="busy|idle"}``, ``dpool_cpus{kind=
  "total|used"}``;
- ``dpool_object_store_bytes{kind="used|capacity|spilled"}``;
- ``dpool_node_heartbeat_age_seconds{node=...}``: each node's, from the node table (on
  a node of a cluster), and ``dpool_nodes_alive``.
"""

from __future__ import annotations

import bisect
import hmac
import http.server
import logging
import threading
from typing import Any, Callable, Optional

log = logging.getLogger("dpool.node")

BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0)


class TaskMetrics:
    """Outcomes and durations of the tasks a scheduler finished (fed under its lock)."""

    __slots__ = ("finished", "failed", "counts", "total_s")

    def __init__(self) -> None:
        self.finished = 0
        self.failed = 0
        self.counts = [0] * (len(BUCKETS) + 1)  # per bucket; the last: above every bound
        self.total_s = 0.0

    def copy(self) -> TaskMetrics:
        """A snapshot (taken under the scheduler's lock: one scrape sees one state)."""
        c = TaskMetrics()
        c.finished, c.failed, c.counts, c.total_s = (self.finished, self.failed,
                                                     list(self.counts), self.total_s)
        return c

    def observe(self, ok: bool, duration: float) -> None:
        if ok:
            self.finished += 1
        else:
            self.failed += 1
        self.counts[bisect.bisect_left(BUCKETS, duration)] += 1
        self.total_s += duration


def line(name: str, value: float, labels: Optional[dict] = None) -> str:
    """One sample in the text format: ``name{labels} value``."""
    text = str(value) if isinstance(value, int) else repr(float(value))  # (all digits)
    if labels:
        inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
        return f"{name}{{{inner}}} {text}"
    return f"{name} {text}"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(status: dict, tasks: TaskMetrics, workers: tuple[int, int], spilled: int,
           heartbeats: dict) -> str:
    """The exposition text for a node's ``status`` (``status_locked``'s), its task
    metrics, (busy, idle) workers, spilled bytes and the nodes' heartbeat ages."""
    out = [
        "# HELP dpool_tasks_total Tasks this node finished, by outcome.",
        "# TYPE dpool_tasks_total counter",
        line("dpool_tasks_total", tasks.finished, {"outcome": "finished"}),
        line("dpool_tasks_total", tasks.failed, {"outcome": "failed"}),
        "# HELP dpool_task_duration_seconds Time tasks spent in their function.",
        "# TYPE dpool_task_duration_seconds histogram",
    ]
    running = 0
    for bound, n in zip(BUCKETS, tasks.counts, strict=False):
        running += n
        out.append(line("dpool_task_duration_seconds_bucket", running, {"le": f"{bound:g}"}))
    out.append(line("dpool_task_duration_seconds_bucket", running + tasks.counts[-1],
                     {"le": "+Inf"}))
    out.append(line("dpool_task_duration_seconds_sum", tasks.total_s))
    out.append(line("dpool_task_duration_seconds_count", sum(tasks.counts)))
    out += [
        "# HELP dpool_tasks_queued Tasks waiting on this node for a worker.",
        "# TYPE dpool_tasks_queued gauge",
        line("dpool_tasks_queued", status.get("queued", 0)),
        "# HELP dpool_workers Worker processes of this node, busy or idle.",
        "# TYPE dpool_workers gauge",
        line("dpool_workers", workers[0], {"state": "busy"}),
        line("dpool_workers", workers[1], {"state": "idle"}),
        "# HELP dpool_cpus This node's CPUs, and those running tasks.",
        "# TYPE dpool_cpus gauge",
        line("dpool_cpus", status.get("cpus_total", 0), {"kind": "total"}),
        line("dpool_cpus", status.get("cpus_used", 0), {"kind": "used"}),
        "# HELP dpool_object_store_bytes This node's object store.",
        "# TYPE dpool_object_store_bytes gauge",
        line("dpool_object_store_bytes", status.get("store_used", 0), {"kind": "used"}),
        line("dpool_object_store_bytes", status.get("store_capacity", 0),
              {"kind": "capacity"}),
        line("dpool_object_store_bytes", spilled, {"kind": "spilled"}),
    ]
    if heartbeats:
        out += ["# HELP dpool_node_heartbeat_age_seconds Since each node's last heartbeat.",
                "# TYPE dpool_node_heartbeat_age_seconds gauge"]
        out += [line("dpool_node_heartbeat_age_seconds", age, {"node": node})
                for node, age in sorted(heartbeats.items())]
        out += ["# HELP dpool_nodes_alive Nodes the node table lists as alive.",
                "# TYPE dpool_nodes_alive gauge",
                line("dpool_nodes_alive", len(heartbeats))]
    return "\n".join(out) + "\n"


class MetricsServer:
    """``/metrics`` and ``/health`` at ``bind:port`` (0: any free port)."""

    def __init__(self, text: Callable[[], str], token: bytes, bind: str, port: int) -> None:
        self._text = text
        self._expect = b"Bearer " + token
        server = http.server.ThreadingHTTPServer((bind, port), _Handler)
        server.daemon_threads = True
        server.metrics = self  # type: ignore[attr-defined]
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, daemon=True,
                                        name="dpool-metrics")

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def authorized(self, header: Optional[str]) -> bool:
        return header is not None and hmac.compare_digest(header.encode(), self._expect)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Any

    def do_GET(self) -> None:
        m: MetricsServer = self.server.metrics
        if self.path == "/health":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
        elif self.path == "/metrics":
            if not m.authorized(self.headers.get("Authorization")):
                self._send(401, b"the cluster token is required (Authorization: Bearer)\n",
                           "text/plain; charset=utf-8")
                return
            try:
                body = m._text().encode()
            except Exception as exc:  # noqa: BLE001 - a scrape must not kill the node
                log.warning("dpool: /metrics failed: %s", exc)
                self._send(500, b"metrics unavailable\n", "text/plain; charset=utf-8")
                return
            self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return  # (scrapes every few seconds: not worth a log line each)


def heartbeat_ages(rows: list) -> dict:
    """node id -> seconds since its last heartbeat, of the live rows of the node table."""
    return {r["node_id"]: max(0.0, float(r.get("age", 0.0))) for r in rows if r.get("alive")}


def render_cluster(snap: dict) -> str:
    """The cluster as the dashboard's collector sees it (``Collector.snapshot``): each
    node's gauges, labelled by node, and the cluster's counts -- the head's ``/metrics``."""
    nodes = snap.get("nodes") or []
    out = ["# HELP dpool_node_up Whether the node table lists the node as alive.",
           "# TYPE dpool_node_up gauge"]
    out += [line("dpool_node_up", int(bool(n.get("alive"))), {"node": n.get("node_id")})
            for n in nodes]
    families: tuple = (
        ("dpool_node_cpus", "CPUs of each node, and those running tasks.",
         lambda n: [({"kind": "total"}, n.get("cpus_total") or 0),
                    ({"kind": "used"}, n.get("cpus_used") or 0)]),
        ("dpool_node_tasks_queued", "Tasks waiting on each node.",
         lambda n: [({}, n.get("queued") or 0)]),
        ("dpool_node_object_store_bytes", "Each node's object store.",
         lambda n: [({"kind": "used"}, n.get("store_used") or 0),
                    ({"kind": "capacity"}, n.get("store_capacity") or 0)]),
        ("dpool_node_heartbeat_age_seconds", "Since each node's last heartbeat.",
         lambda n: [({}, float(n.get("age") or 0.0))]),
    )
    for name, text, values in families:
        out += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
        for n in nodes:
            for labels, v in values(n):
                out.append(line(name, v, {"node": n.get("node_id"), **labels}))
    running = (snap.get("running") or {}).get("count", 0)
    out += [
        "# HELP dpool_nodes_alive Nodes the node table lists as alive.",
        "# TYPE dpool_nodes_alive gauge",
        line("dpool_nodes_alive", sum(1 for n in nodes if n.get("alive"))),
        "# HELP dpool_tasks_running Tasks running in the cluster.",
        "# TYPE dpool_tasks_running gauge",
        line("dpool_tasks_running", running),
        "# HELP dpool_global_schedulers_alive Global scheduler replicas alive.",
        "# TYPE dpool_global_schedulers_alive gauge",
        line("dpool_global_schedulers_alive",
             sum(1 for g in snap.get("global_schedulers") or [] if g.get("alive"))),
        "# HELP dpool_control_store_shards_alive Control-store shards answering.",
        "# TYPE dpool_control_store_shards_alive gauge",
        line("dpool_control_store_shards_alive",
             sum(1 for x in snap.get("shards") or [] if x.get("alive"))),
    ]
    return "\n".join(out) + "\n"
