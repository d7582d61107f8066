"""The recorded task events -> a Chrome trace-event document (Perfetto, chrome://tracing).

Input: the control store's event log, ``(task_id, kind, t, worker_id, node)`` with kinds
``submit`` (the scheduler accepted the task), ``start`` (sent to worker ``worker_id``),
``end`` / ``error`` (its outcome came back), ``spill`` (sent to a global scheduler),
``remote`` (a node runs another node's task: the origin's task id in the worker field);
and each task's function id and the functions' names.

Output: one trace process per node (``pid``), one thread lane per worker (``tid`` = the
worker's id; lane 0 is the node's scheduler), a complete event (``ph: "X"``) per task
attempt named by its function, and instant events (``ph: "i"``) for failures, retries,
attempts whose worker was lost, and spills. Times are µs since the first event
(``otherData.t0`` holds that epoch time in seconds).

A "start" is logged when the task is *sent* to its worker, and a busy worker may be sent
several at once (batching), which it runs one after another: a span therefore starts at
the later of its start event and the end of the previous span on the same worker lane,
so lanes never overlap (``args.sent_us`` keeps the send time). An attempt sent again
before its worker was free never ran there: it is an instant ("sent again"), not a span.
A worker that runs several at once (an actor with ``max_concurrency``) shows it by a span
that ended before the one ahead of it on its lane: it goes to another lane of that worker
("worker 7, thread 2"), the first one free at its send time.
"""

from __future__ import annotations

import collections
from typing import Any

Event = tuple[int, str, float, int, str]  # task id, kind, t (s), worker id, node id


def _us(t: float, t0: float) -> float:
    return round((t - t0) * 1e6, 3)


def build_trace(events: list[Event], fn_of: dict[int, int], names: dict[int, str],
                node_names: dict[str, str] | None = None) -> dict[str, Any]:
    """The trace document for ``events`` (see the module docstring)."""
    # a task spilled to another node runs there under a local id: its "remote" event
    # names the origin's task (in the worker-id field); its events count as that task's
    alias = {e[0]: e[3] for e in events if e[1] == "remote"}
    if alias:
        events = [(alias.get(e[0], e[0]), *e[1:]) for e in events if e[1] != "remote"]
    events = sorted(events, key=lambda e: e[2])
    t0 = events[0][2] if events else 0.0
    nodes = sorted({e[4] for e in events})
    pid_of = {node: i + 1 for i, node in enumerate(nodes)}
    node_names = node_names or {}
    out: list[dict] = []

    per_task: dict[int, dict[str, list]] = collections.defaultdict(
        lambda: {"submit": [], "start": [], "done": []})
    instants: list[dict] = []
    for tid, kind, t, wid, node in events:
        rec = per_task[tid]
        if kind == "submit":
            rec["submit"].append((t, node))
        elif kind == "start":
            rec["start"].append((t, wid, node))
        elif kind in ("end", "error"):
            rec["done"].append((t, kind, node))
        elif kind == "spill":
            instants.append({"name": "spill", "cat": "scheduler", "ph": "i", "s": "t",
                             "ts": _us(t, t0), "pid": pid_of[node], "tid": 0,
                             "args": {"task_id": tid}})
        else:  # a kind this reader does not know: keep it visible
            instants.append({"name": kind, "cat": "event", "ph": "i", "s": "t",
                             "ts": _us(t, t0), "pid": pid_of[node], "tid": wid,
                             "args": {"task_id": tid}})

    # one raw span per attempt: (node, worker, sent, end, task, attempt, outcome)
    raw = []
    for tid, rec in per_task.items():
        starts = rec["start"]
        submitted = min((s[0] for s in rec["submit"]), default=None)
        for i, (t, wid, node) in enumerate(starts):
            nxt = starts[i + 1][0] if i + 1 < len(starts) else None
            done = next((d for d in rec["done"] if d[0] >= t and (nxt is None or d[0] <= nxt)
                         and (d[2] == node or not d[2] or not node)), None)
            if done is not None:
                end, outcome = done[0], ("ok" if done[1] == "end" else "error")
            elif nxt is not None:
                end, outcome = nxt, "lost"  # run again: this attempt never finished
            else:
                continue  # still running (or its end not recorded yet)
            raw.append((node, wid, t, end, tid, i + 1, len(starts), outcome, submitted))

    lanes: dict[tuple, float] = {}
    used_lanes: set[tuple] = set()
    extra: dict[tuple, list] = {}  # (node, worker) -> [free at, tid] of its other threads
    next_tid = max((r[1] for r in raw), default=0) + 1
    extra_names: list[tuple] = []  # (node, tid, worker, thread number)
    for node, wid, sent, end, tid, attempt, attempts, outcome, submitted in sorted(
            raw, key=lambda r: (r[0], r[1], r[2], r[3])):
        lane = (node, wid)
        used_lanes.add(lane)
        fn = fn_of.get(tid)
        name = names.get(fn, f"function {fn}") if fn is not None else "task"
        free = lanes.get(lane, sent)
        lane_tid = wid
        if outcome != "lost" and end < free:  # it ran beside the span ahead: a thread
            threads = extra.setdefault(lane, [])
            slot = next((s for s in threads if s[0] <= sent), None)
            if slot is None:
                slot = [sent, next_tid]
                threads.append(slot)
                extra_names.append((node, next_tid, wid, len(threads) + 1))
                next_tid += 1
            lane_tid, free, slot[0] = slot[1], sent, end
        if outcome == "lost" and end <= free:
            # sent behind a busy worker's running task and sent elsewhere before that
            # finished (taken back, or the worker died first): it never ran on this lane
            out.append({"name": f"sent again: {name}", "cat": "scheduler", "ph": "i",
                        "s": "t", "ts": _us(end, t0), "pid": pid_of[node], "tid": wid,
                        "args": {"task_id": tid, "attempt": attempt}})
            continue
        begin = min(max(sent, free), end)
        if lane_tid == wid:
            lanes[lane] = max(free, end)
        args: dict[str, Any] = {"task_id": tid, "attempt": attempt, "attempts": attempts,
                                "outcome": outcome, "sent_us": _us(sent, t0)}
        if submitted is not None:
            args["wait_ms"] = round((begin - submitted) * 1e3, 3)
        pid = pid_of[node]
        out.append({"name": name, "cat": "task", "ph": "X", "ts": _us(begin, t0),
                    "dur": _us(end, begin), "pid": pid, "tid": lane_tid, "args": args})
        if outcome == "error":
            out.append({"name": f"failed: {name}", "cat": "failure", "ph": "i", "s": "t",
                        "ts": _us(end, t0), "pid": pid, "tid": lane_tid,
                        "args": {"task_id": tid, "attempt": attempt}})
        elif outcome == "lost":
            out.append({"name": "worker lost", "cat": "failure", "ph": "i", "s": "t",
                        "ts": _us(end, t0), "pid": pid, "tid": lane_tid,
                        "args": {"task_id": tid, "attempt": attempt}})
        if attempt > 1:
            out.append({"name": f"retry: {name}", "cat": "retry", "ph": "i", "s": "t",
                        "ts": _us(sent, t0), "pid": pid, "tid": lane_tid,
                        "args": {"task_id": tid, "attempt": attempt}})
    out.extend(instants)

    meta: list[dict] = []
    for node, pid in pid_of.items():
        label = node_names.get(node) or (f"node {node}" if node else "this host")
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"name": label}})
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"name": "scheduler"}})
    for node, wid in sorted(used_lanes):
        if wid:
            meta.append({"name": "thread_name", "ph": "M", "pid": pid_of[node], "tid": wid,
                         "args": {"name": f"worker {wid}"}})
    for node, lane_tid, wid, k in extra_names:
        meta.append({"name": "thread_name", "ph": "M", "pid": pid_of[node], "tid": lane_tid,
                     "args": {"name": f"worker {wid}, thread {k}"}})
    return {"traceEvents": meta + out, "displayTimeUnit": "ms",
            "otherData": {"t0": t0, "source": "dpool"}}
