"""``build_trace`` on hand-made event logs: the corner cases a run produces only by chance."""

from __future__ import annotations

from dpool.observe._trace import build_trace
from tests.observe._trace_format import check_trace


def test_a_task_sent_again_before_its_busy_worker_was_free_is_not_a_span():
    # worker 30 runs task 1 (0.0 -> 0.5 s); task 2 is batched behind it at 0.1 s and sent
    # to worker 31 at 0.2 s, before worker 30 was free: it never ran on worker 30
    events = [(1, "submit", 0.0, 0, ""), (2, "submit", 0.0, 0, ""),
              (1, "start", 0.0, 30, ""), (2, "start", 0.1, 30, ""),
              (2, "start", 0.2, 31, ""), (2, "end", 0.3, 31, ""),
              (1, "end", 0.5, 30, "")]
    doc = build_trace(events, {1: 7, 2: 8}, {7: "slow", 8: "quick"})
    spans = check_trace(doc)  # lanes never overlap
    assert sorted((s["args"]["task_id"], s["tid"], s["args"]["outcome"]) for s in spans) == [
        (1, 30, "ok"), (2, 31, "ok")]
    [again] = [e for e in doc["traceEvents"] if e["name"] == "sent again: quick"]
    assert again["tid"] == 30 and again["ts"] == 200000.0


def test_a_worker_that_dies_running_a_task_leaves_a_lost_span():
    events = [(1, "submit", 0.0, 0, ""), (1, "start", 0.0, 30, ""),
              (1, "start", 0.4, 31, ""), (1, "end", 0.5, 31, "")]
    doc = build_trace(events, {1: 7}, {7: "f"})
    spans = sorted(check_trace(doc), key=lambda s: s["args"]["attempt"])
    assert [(s["tid"], s["args"]["outcome"], s["dur"]) for s in spans] == [
        (30, "lost", 400000.0), (31, "ok", 100000.0)]
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "i"}
    assert names == {"worker lost", "retry: f"}
