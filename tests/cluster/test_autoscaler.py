"""The autoscaler with the local provider, for real: a head that runs no tasks
(``--num-cpus 0``) and ``--autoscale 0:2``; twenty 1 s tasks make it start two nodes on
their own loopback addresses, every task finishes, a large result left on an added node
is still readable after that node is removed, and the cluster shrinks back to the head
once idle. Bad settings fail at ``dpool start``, saying why."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from tests.cluster.conftest import (
    TIMEOUT,
    Cluster,
    base_env,
    dpool_cli,
    free_port,
    host,
    start_node,
    stop_cluster,
)

IDLE_S = 3.0


@pytest.fixture(scope="module")
def elastic(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("elastic")
    cfg = tmp / "provider.json"
    cfg.write_text(json.dumps({"num_cpus": 1, "addresses": [host(7), host(8)]}))
    head, token = start_node(tmp, host(2), head=True, num_cpus=0,
                             extra=("--shards", "1", "--autoscale", "0:2",
                                    "--provider-config", str(cfg),
                                    "--idle-timeout", str(IDLE_S)))
    c = Cluster(head, token, [head])
    try:
        yield c
    finally:
        stop_cluster(c)


def _alive_nodes(c: Cluster) -> list:
    out = dpool_cli(["status", "--json"], c.head.env)
    if out.returncode != 0:
        return []
    return [n["node_id"] for n in json.loads(out.stdout)["nodes"] if n["alive"]]


PROGRAM = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import dpool

    def work(t):
        time.sleep(t)
        return os.environ.get("DPOOL_NODE_ID")

    def big(marks):
        node = os.environ.get("DPOOL_NODE_ID")
        open(os.path.join(marks, f"{time.monotonic()} {node}"), "w").close()
        return np.arange(2**20, dtype=np.int64)  # 8 MB: kept on the node that made it

    def total(arr):
        return int(arr.sum())

    if __name__ == "__main__":
        marks = sys.argv[1]
        with dpool.ProcessPoolExecutor(4) as ex:
            fs = [ex.submit(work, 1.0) for _ in range(20)]
            keep = ex.submit(big, marks)
            print("NODES", " ".join(sorted({f.result(timeout=120) for f in fs})), flush=True)
            dpool.wait([keep], timeout=120)  # (done; its value not read yet)
            print("BIG ON", sorted(os.listdir(marks))[0].split()[1], flush=True)
            sys.stdin.readline()  # (the test waits for the scale-down meanwhile)
            ok = ex.submit(total, keep).result(timeout=120) == (2**20 - 1) * 2**19
            print("BIG OK", ok, flush=True)
""")


def test_grows_for_a_burst_and_shrinks_when_idle(elastic, tmp_path):
    c = elastic
    assert _alive_nodes(c) == [c.head.address]  # MIN 0: only the head
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), str(marks)], env=c.driver_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = set()
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:
            seen |= set(_alive_nodes(c)) - {c.head.address}
            time.sleep(0.2)
        assert {n.split(":")[0] for n in seen} == {host(7), host(8)}  # grew to 2
        line = proc.stdout.readline().split()
        assert line[0] == "NODES", proc.stderr.read() if proc.poll() is not None else line
        assert {n.split(":")[0] for n in line[1:]} == {host(7), host(8)}  # all 20 finished
        big_on = proc.stdout.readline().split()[2]
        deadline = time.monotonic() + IDLE_S + 30
        while _alive_nodes(c) != [c.head.address] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive_nodes(c) == [c.head.address]  # shrank back to the head
        assert big_on != c.head.address
        out, err = proc.communicate("\n", timeout=TIMEOUT * 2)
        assert proc.returncode == 0, err
        assert out.strip() == "BIG OK True"  # the removed node's only copy was not lost
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_request_resources_grows_ahead_of_work_and_withdrawing_shrinks(elastic, tmp_path):
    c = elastic
    deadline = time.monotonic() + IDLE_S + 30
    while _alive_nodes(c) != [c.head.address] and time.monotonic() < deadline:
        time.sleep(0.2)  # (after the test before: back to the head alone)
    ask = "import dpool, sys; dpool.request_resources(num_cpus=int(sys.argv[1]))"
    out = subprocess.run([sys.executable, "-c", ask, "2"], env=c.driver_env(),
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 30
    while len(_alive_nodes(c)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(_alive_nodes(c)) == 3  # the head and two nodes, with no task queued
    time.sleep(IDLE_S + 2)
    assert len(_alive_nodes(c)) == 3  # idle, but asked for: kept
    out = subprocess.run([sys.executable, "-c", ask, "0"], env=c.driver_env(),
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + IDLE_S + 30
    while _alive_nodes(c) != [c.head.address] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive_nodes(c) == [c.head.address]


@pytest.mark.parametrize("extra, why", [
    (("--autoscale", "3:1"), "MIN <= MAX"),
    (("--autoscale", "0:2", "--provider", "cloud9"), "unknown provider"),
    (("--autoscale", "0:2", "--provider-config", "BAD"), "unknown config keys"),
])
def test_bad_autoscaler_settings_fail_at_start(tmp_path, extra, why):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"num_cpu": 2}))
    extra = tuple(str(bad) if x == "BAD" else x for x in extra)
    env = {**base_env(), "DPOOL_STATE_DIR": str(tmp_path / "state")}
    out = dpool_cli(["start", "--head", "--node-ip", host(2), "--port",
                     str(free_port(host(2), span=12)), "--shards", "1", *extra], env)
    try:
        assert out.returncode != 0
        assert why in out.stderr, out.stderr
    finally:
        dpool_cli(["stop"], env)
