"""``dpool.timeline`` on the embedded runtime: a valid Chrome trace whose spans are the
tasks that ran (ids, function names, attempts), failures and retries as instants."""

from __future__ import annotations

import json
import os
import time

import pytest

import dpool
from dpool import ProcessPoolExecutor
from dpool.observe._timeline import parse_duration
from tests.observe._trace_format import check_trace


def nap(x):
    time.sleep(0.005)
    return x


def other(x):
    return -x


def boom(x):
    raise ValueError(x)


def die_once(marker, value):
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)
    return value


def _mine(spans, futures):
    ids = {f.object_ref.id for f in futures}
    return [s for s in spans if s["args"]["task_id"] in ids]


def test_spans_match_the_tasks_that_ran(tmp_path):
    with ProcessPoolExecutor(2) as ex:
        naps = [ex.submit(nap, i) for i in range(12)]
        others = [ex.submit(other, i) for i in range(5)]
        assert [f.result(30) for f in naps] == list(range(12))
        assert [f.result(30) for f in others] == [-i for i in range(5)]
    path = tmp_path / "trace.json"
    doc = dpool.timeline(path)
    assert json.loads(path.read_text()) == json.loads(json.dumps(doc))
    spans = check_trace(doc)
    mine = _mine(spans, naps + others)
    assert len(mine) == 17
    by_id = {s["args"]["task_id"]: s for s in mine}
    assert {by_id[f.object_ref.id]["name"] for f in naps} == {"nap"}
    assert {by_id[f.object_ref.id]["name"] for f in others} == {"other"}
    for s in mine:
        assert s["args"]["attempt"] == 1 and s["args"]["outcome"] == "ok"
        assert s["args"]["wait_ms"] >= 0
    # one process (this host), a thread per worker: two workers ran them
    assert len({s["pid"] for s in mine}) == 1
    assert 1 <= len({s["tid"] for s in mine}) <= 2
    assert any(s["dur"] >= 5000 for s in mine if s["name"] == "nap")  # 5 ms naps


def test_failures_and_retries_are_instants(tmp_path):
    with ProcessPoolExecutor(1) as ex:
        bad = ex.submit(boom, 1)
        assert isinstance(bad.exception(30), ValueError)
        again = ex.submit(die_once, str(tmp_path / "m"), "ok")
        assert again.result(30) == "ok"
    doc = dpool.timeline()
    spans = check_trace(doc)
    bad_id, again_id = bad.object_ref.id, again.object_ref.id
    [failed] = [s for s in spans if s["args"]["task_id"] == bad_id]
    assert failed["name"] == "boom" and failed["args"]["outcome"] == "error"
    attempts = sorted((s for s in spans if s["args"]["task_id"] == again_id),
                      key=lambda s: s["args"]["attempt"])
    assert [s["args"]["outcome"] for s in attempts] == ["lost", "ok"]
    instants = {(e["name"], e["args"]["task_id"]) for e in doc["traceEvents"]
                if e["ph"] == "i"}
    assert ("failed: boom", bad_id) in instants
    assert ("worker lost", again_id) in instants
    assert ("retry: die_once", again_id) in instants


def test_last_keeps_only_recent_tasks():
    with ProcessPoolExecutor(1) as ex:
        old = ex.submit(nap, 1)
        old.result(30)
        time.sleep(1.5)
        new = ex.submit(nap, 2)
        new.result(30)
    spans = check_trace(dpool.timeline(last=1.0))
    ids = {s["args"]["task_id"] for s in spans}
    assert new.object_ref.id in ids and old.object_ref.id not in ids
    with pytest.raises(ValueError, match="duration"):
        dpool.timeline(last="ten minutes")
    with pytest.raises(TypeError):
        dpool.timeline(last=[1])


def test_parse_duration():
    assert parse_duration("90") == 90 and parse_duration("10m") == 600
    assert parse_duration("2h") == 7200 and parse_duration("1.5s") == 1.5
    for bad in ("", "m", "-1s", "x10"):
        with pytest.raises(ValueError):
            parse_duration(bad)


class _Sleeper:
    def nap(self, s):
        time.sleep(s)
        return s


def test_an_actors_calls_at_once_get_a_lane_each():
    with ProcessPoolExecutor(1) as ex:
        a = ex.options(max_concurrency=3).actor(_Sleeper)
        calls = [a.nap.submit(s) for s in (0.3, 0.1, 0.2)]  # the later end first
        assert [f.result(30) for f in calls] == [0.3, 0.1, 0.2]
        one = ex.actor(_Sleeper)
        serial = [one.nap.submit(0.02) for _ in range(3)]
        [f.result(30) for f in serial]
    doc = dpool.timeline()
    spans = check_trace(doc)  # (no two spans of one lane overlap)
    mine = _mine(spans, calls)
    assert len(mine) == 3 and {s["name"] for s in mine} == {"MethodCall"}
    assert len({s["tid"] for s in mine}) >= 2  # they ran at once: on threads of a lane each
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(", thread " in names[s["tid"]] for s in mine)
    assert len({s["tid"] for s in _mine(spans, serial)}) == 1  # one at a time: one lane
