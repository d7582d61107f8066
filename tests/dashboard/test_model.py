"""The dashboard without processes: the accounting of the event stream (``_activity``),
function names read from payloads without unpickling them (``_fnname``), and the page's
HTML (``_render``): escaped, self-contained, nodes marked alive or dead."""

from __future__ import annotations

import os.path
import pickle
import re

import pytest

from dpool.dashboard import _render
from dpool.dashboard._activity import Activity
from dpool.control._fnname import function_name
from dpool.objects import _payload

DRIVER = -1  # a driver's submit names it with a negative worker id; a spilled run, 0


def test_rate_counts_each_finished_and_failed_task_once_per_bucket():
    a = Activity(window_s=60, bucket_s=10)
    a.add([(1, "submit", 100.0, DRIVER), (1, "start", 101.0, 7), (1, "end", 102.0, 0),
           (2, "submit", 100.0, DRIVER), (2, "start", 101.0, 8), (2, "error", 115.0, 0),
           (3, "start", 112.0, 9), (3, "end", 113.0, 0)])
    a.add([(3, "end", 113.0, 0)])  # a batch logged twice (a retried flush)
    rate = a.rate(now=119.0)
    assert rate["bucket_s"] == 10 and len(rate["done"]) == 6
    assert rate["done"][-2:] == [0.1, 0.1] and rate["failed"][-2:] == [0.0, 0.1]
    assert sum(rate["done"]) == pytest.approx(0.2) and not a.running
    assert [f.task_id for f in a.recent_failures(5)] == [2]


def test_a_spilled_task_counts_once_and_fails_once_at_home():
    a = Activity(window_s=60, bucket_s=10)
    home, run = 10, 99  # the home node's task; its run on the node it was spilled to
    a.add([(home, "submit", 100.0, DRIVER), (home, "spill", 100.1, 0),
           (run, "submit", 100.2, 0), (run, "start", 100.3, 4)])
    assert set(a.running) == {run} and a.spilled_here(run) and not a.spilled_here(home)
    a.add([(run, "error", 101.0, 0), (home, "error", 101.1, 0)])
    assert sum(a.rate(now=105.0)["failed"]) == pytest.approx(0.1)  # one failure, not two
    assert [f.task_id for f in a.recent_failures(5)] == [home]


def test_running_tasks_follow_starts_retries_and_late_events():
    a = Activity()
    a.add([(5, "end", 20.0, 0)])
    a.add([(5, "start", 10.0, 3)])  # read after its end: not running
    a.add([(6, "start", 11.0, 3), (7, "start", 12.0, 4), (7, "start", 14.0, 5)])
    assert set(a.running) == {6, 7}
    assert a.running[7].starts == 2 and a.running[7].worker_id == 5  # retried
    assert [r.task_id for r in a.longest_running(1)] == [6]
    a.forget([6])
    assert set(a.running) == {7}


def test_old_buckets_leave_the_window_and_memory_is_bounded():
    a = Activity(window_s=20, bucket_s=10, max_tracked=3)
    a.add([(i, "end", 5.0, 0) for i in range(10)])
    assert sum(a.rate(now=15.0)["done"]) == pytest.approx(1.0)
    assert sum(a.rate(now=100.0)["done"]) == 0
    a.add([(100 + i, "start", float(i), 1) for i in range(10)])
    assert len(a.running) == 3 and set(a.running) == {107, 108, 109}
    with pytest.raises(ValueError):
        Activity(window_s=5, bucket_s=10)


def _g(x):
    return x


@pytest.mark.parametrize("fn, name", [
    (os.path.join, "posixpath.join"),
    (_g, f"{__name__}._g"),
    (lambda y: y, f"{__name__}.<lambda>"),
])
def test_function_names_come_from_the_payload(fn, name):
    assert function_name(_payload.dumps_function(fn)) == name


class _Boom:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))  # what unpickling it would do


def test_a_payload_is_read_never_unpickled(tmp_path):
    made = tmp_path / "made-by-unpickling"
    assert function_name(pickle.dumps(_Boom(str(made)))) == "posix.mkdir"
    assert not made.exists()
    assert function_name(b"not a pickle") is None and function_name(b"") is None


def _snapshot(**over) -> dict:
    snap = {
        "cluster": "127.0.0.2:6380", "updated": 1000.0, "errors": [],
        "nodes": [
            {"node_id": "127.0.0.2:6380", "hostname": "h", "alive": True, "dead": False,
             "age": 0.2, "cpus_used": 1, "cpus_total": 2, "queued": 3, "workers": 2,
             "drivers": 1, "store_used": 2**20, "store_capacity": 2**30,
             "resources": {"GPU": {"total": 2, "used": 1.5}, "TPU": {"total": 4,
                                                                     "used": None}}},
            {"node_id": "<img src=x onerror=alert(1)>", "hostname": "h", "alive": False,
             "dead": False, "age": 12.0, "cpus_used": 0, "cpus_total": 2, "queued": 0,
             "store_used": 0, "store_capacity": 0, "resources": {}}],
        "global_schedulers": [{"address": "127.0.0.2:7000", "alive": True, "age": 0.1}],
        "shards": [{"address": "127.0.0.2:6381", "alive": True, "used_memory": 10**6,
                    "keys": 5}, {"address": "127.0.0.2:6382", "alive": False,
                                 "error": "cannot reach"}],
        "rate": {"bucket_s": 5.0, "start": 700.0, "done": [0.0] * 59 + [4.0],
                 "failed": [0.0] * 58 + [0.2, 0.0]},
        "running": {"count": 1, "tasks": [{"task_id": 0x10, "started": 990.0,
                                           "worker_id": 3, "function": "mod.f",
                                           "node": "127.0.0.2:6380", "attempts": 1}]},
        "failed": [{"task_id": 0x11, "at": 995.0, "function": "mod.<script>",
                    "node": "127.0.0.2:6380", "attempts": 3,
                    "traceback": "Traceback (most recent call last):\n  <b>ValueError</b>"}],
    }
    snap.update(over)
    return snap


def test_the_page_shows_each_part_of_the_cluster_escaped():
    page = _render.page(_snapshot(), 2000)
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "mod.&lt;script&gt;" in page and "&lt;b&gt;ValueError&lt;/b&gt;" in page
    states = re.findall(r"<tr class=node data-node='([^']*)' data-state='(\w+)'>", page)
    assert states == [("127.0.0.2:6380", "alive"),
                      ("&lt;img src=x onerror=alert(1)&gt;", "dead")]
    assert "GPU 1.5/2" in page and "TPU ?/4" in page and "1.0 MiB/1.0 GiB" in page
    assert "no heartbeat; last heartbeat 12 s ago" in page
    assert page.count("<tr class=gs>") == 1 and page.count("<tr class=shard>") == 2
    assert "cannot reach" in page and page.count("<span class=bad>down</span>") == 1
    assert "0x10" in page and "0x11" in page and "<details>" in page
    assert "id='done'" in page and "id='failed'" in page  # the chart's two series


def test_the_page_fetches_nothing_from_elsewhere():
    page = _render.page(_snapshot(), 2000)
    # the only URL is the SVG namespace (an identifier, never fetched)
    assert re.findall(r"https?://[^'\" ]+", page) == ["http://www.w3.org/2000/svg"]
    assert "src=" not in page.replace("&lt;img src=x", "") and "<link" not in page
    assert page.count("<script>") == 1 and "fetch('fragment'" in page


def test_an_empty_cluster_and_read_errors_render():
    snap = _snapshot(nodes=[], global_schedulers=[], shards=[], failed=[],
                     running={"count": 0, "tasks": []}, rate={"bucket_s": 5.0, "done": [],
                                                              "failed": []},
                     errors=["node table: shard 0 <down>"])
    html = _render.fragment(snap)
    assert "no node registered" in html and "shard 0 &lt;down&gt;" in html
    assert "<polygon" not in html
