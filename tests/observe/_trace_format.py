"""A checker of the Chrome trace-event format (the subset dpool writes), shared by the
embedded and cluster timeline tests."""

from __future__ import annotations

import json

PHASES = {"X", "i", "M"}


def check_trace(doc: dict) -> list[dict]:
    """Assert ``doc`` is a valid trace-event document (JSON round trip included); return
    its complete ("X") events."""
    doc = json.loads(json.dumps(doc))  # plain JSON values only
    assert isinstance(doc["traceEvents"], list)
    for e in doc["traceEvents"]:
        assert e["ph"] in PHASES, e
        assert isinstance(e["name"], str) and e["name"], e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e.get("args", {}), dict), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name"), e
            assert isinstance(e["args"]["name"], str), e
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        else:
            assert e["s"] in ("t", "p", "g"), e
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    named = {(e["pid"], e["tid"]) for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    procs = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "M"
             and e["name"] == "process_name"}
    for s in spans:  # every lane is a named thread of a named process
        assert (s["pid"], s["tid"]) in named and s["pid"] in procs, s
    lanes: dict = {}
    for s in sorted(spans, key=lambda s: s["ts"]):  # one task at a time per worker lane
        lane = (s["pid"], s["tid"])
        assert s["ts"] >= lanes.get(lane, 0) - 0.01, (s, lanes.get(lane))
        lanes[lane] = s["ts"] + s["dur"]
    return spans
