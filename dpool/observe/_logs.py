"""``dpool logs``: what the cluster's tasks printed, and this host's daemon logs, as lines
prefixed with their node and process id.

Task output is what each node kept of its workers' stdout and stderr (the control
store's ``dpool:out:<node>`` streams, capped); a task's own lines (``task=``) are those
its worker printed while it ran (its spans in the event log). Daemon logs are the files
``dpool start`` wrote on this host (its node, and on the head the global schedulers).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from dpool.observe._trace import build_trace

_SLACK_S = 0.05  # output reaches the node a little after the worker wrote it


def format_output(rows: Iterable[dict]) -> list[str]:
    """Output rows (``output_log``) -> ``"[node N pid P] line"`` (``err`` for stderr).
    A line may come in several chunks (text, then its newline): chunks of one worker
    stream are joined before they are cut into lines."""
    lines = []
    partial: dict[tuple, str] = {}
    for r in rows:
        key = (r["node"], r["pid"], r["stream"])
        text = partial.pop(key, "") + r["data"].decode("utf-8", "replace")
        *done, rest = text.split("\n")
        tag = f"[node {r['node']} pid {r['pid']}{' err' if r['stream'] == 2 else ''}]"
        lines += [f"{tag} {line.rstrip(chr(13))}" for line in done]
        if rest:
            partial[key] = rest
    for (node, pid, stream), rest in partial.items():  # a last line without its newline
        lines.append(f"[node {node} pid {pid}{' err' if stream == 2 else ''}] {rest}")
    return lines


def task_windows(store: Any, task_id: int) -> list[tuple[str, int, float, float]]:
    """``(node, worker id, start, end)`` of each attempt of ``task_id`` (epoch seconds)."""
    events, fns = store.event_log()
    mine = [e for e in events if e[0] == task_id]
    if not mine:
        return []
    doc = build_trace(mine, fns, {})
    t0 = doc["otherData"]["t0"]
    pid_node = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
                if e.get("name") == "process_name"}
    node_of = {pid: (name[len("node "):] if name.startswith("node ") else "")
               for pid, name in pid_node.items()}
    out = []
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            start = t0 + e["ts"] / 1e6
            out.append((node_of[e["pid"]], e["tid"], start, start + e["dur"] / 1e6))
    return out


def task_output(store: Any, node: str | None = None, task: int | None = None,
                since: float | None = None, after: dict | None = None) -> list[dict]:
    """Output rows of the cluster, of one node's workers, or of one task's attempts."""
    rows = store.output_log(since=since, after=after)
    if node is not None:
        rows = [r for r in rows if r["node"] == node]
    if task is not None:
        windows = task_windows(store, task)
        rows = [r for r in rows if any(
            r["node"] == n and r["worker"] == w and t0 <= r["t"] <= t1 + _SLACK_S
            for n, w, t0, t1 in windows)]
    return rows


def daemon_logs(record: dict | None, node: str | None = None) -> list[tuple[str, str]]:
    """``(prefix, path)`` of this host's daemon log files that exist (``record``: what
    ``dpool start`` wrote here)."""
    if not record:
        return []
    out = []
    n = record.get("node") or {}
    if n.get("log") and (node is None or node == n.get("address")):
        out.append((f"[node {n.get('address')} pid {n.get('pid')} daemon]", n["log"]))
    if node is None:
        state = os.path.dirname(n.get("log", "")) if n.get("log") else ""
        for i, gs in enumerate(record.get("global_schedulers", [])):
            path = os.path.join(state, f"global-scheduler-{i}.log")
            out.append((f"[global-scheduler {gs.get('address')} pid {gs.get('pid')}]", path))
    return [(prefix, path) for prefix, path in out if os.path.exists(path)]


def read_log(path: str, offset: int = 0) -> tuple[list[str], int]:
    """The complete lines of ``path`` from byte ``offset``, and the offset after them."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    cut = data.rfind(b"\n") + 1
    lines = data[:cut].decode("utf-8", "replace").splitlines()
    return lines, offset + cut
