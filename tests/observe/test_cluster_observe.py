"""Timeline, logs and objects of a real loopback cluster (a head and a second node):
``dpool timeline`` has one process per node and a span per task, ``dpool logs`` prints
task output with node and pid prefixes, ``dpool objects`` lists a put with its size and
holder; without a cluster each says so with exit status 2."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.cluster.conftest import base_env, dpool_cli, start_cluster, stop_cluster
from tests.observe._trace_format import check_trace

DRIVER = textwrap.dedent("""
    import json, os, sys, time
    import dpool
    from dpool import ProcessPoolExecutor

    def work(i):
        time.sleep(0.05)
        print(f"hello from task {i}", flush=True)
        return dpool.node_id()

    def ones(n):
        import numpy as np
        return np.ones(n)

    if __name__ == "__main__":
        import numpy as np
        with ProcessPoolExecutor(4) as ex:
            fs = [ex.submit(work, i) for i in range(16)]
            nodes = [f.result(60) for f in fs]
            big = ex.submit(ones, 1 << 19)  # 4 MiB, through shared memory
            big.result(60)
        ref = dpool.put(b"x" * (3 << 20))
        arr = dpool.put(np.ones(1 << 20))  # 8 MiB, through shared memory
        print(json.dumps({"ids": [f.object_ref.id for f in fs], "nodes": nodes,
                          "ref": ref.id, "arr": arr.id, "big": big.object_ref.id}))
        sys.stdout.flush()
        sys.stdin.readline()  # keep the ref alive until the test is done looking
""")


@pytest.mark.timeout(240)
def test_timeline_logs_and_objects_on_a_cluster(tmp_path):
    import subprocess
    import sys

    c = start_cluster(tmp_path, n_nodes=2, head_cpus=2, cpus=2)
    driver = None
    try:
        script = tmp_path / "driver.py"
        script.write_text(DRIVER)
        driver = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path,
                                  env=c.driver_env(), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        info = None
        for line in driver.stdout:
            if line.startswith("{"):
                info = json.loads(line)
                break
        assert info is not None, driver.stderr.read() if driver.poll() is not None else ""
        env = c.driver_env()

        # -- timeline: one process per node that ran tasks, a span per task
        out = dpool_cli(["timeline", "--out", str(tmp_path / "t.json")], env)
        assert out.returncode == 0, out.stderr
        doc = json.loads((tmp_path / "t.json").read_text())
        spans = check_trace(doc)
        ids = set(info["ids"])
        mine = [s for s in spans if s["args"]["task_id"] in ids and s["args"]["outcome"] == "ok"]
        assert sorted(s["args"]["task_id"] for s in mine) == sorted(ids)
        # one function: one name, read from its payload (drivers register functions
        # through their node without a name: control._fnname)
        assert {s["name"] for s in mine} == {"__main__.work"}, {s["name"] for s in mine}
        procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "process_name"}
        ran_on = {procs[s["pid"]] for s in mine}
        assert ran_on == {f"node {n}" for n in set(info["nodes"])}
        assert len(procs) == len(set(procs.values()))  # one process per node

        # -- logs: task output with node and pid prefixes, and the head's daemon log
        out = dpool_cli(["logs"], {**env, "DPOOL_STATE_DIR": c.head.state_dir})
        assert out.returncode == 0, out.stderr
        printed = [line for line in out.stdout.splitlines() if "hello from task" in line]
        assert len(printed) == 16, out.stdout
        for line in printed:
            assert line.startswith("[node ") and " pid " in line, line
        assert f"[node {c.head.record['node']['address']} pid" in out.stdout
        one = info["ids"][5]
        out = dpool_cli(["logs", "--task", str(one)], env)
        assert out.returncode == 0, out.stderr
        # (by time on its worker: a neighbour's line that reached the node late may join)
        texts = [line.split("] ", 1)[1] for line in out.stdout.splitlines()]
        assert "hello from task 5" in texts and len(texts) <= 3, out.stdout

        # -- objects: the put, its size, its holder, still referenced
        out = dpool_cli(["objects", "--json"], env)
        assert out.returncode == 0, out.stderr
        rows = {r["object_id"]: r for r in json.loads(out.stdout)}
        put = rows[info["ref"]]
        assert put["size"] >= 3 << 20 and put["holders"] and put["referenced"]
        assert put["kind"] == "put"
        # issue 31: a put array was listed at its envelope's size (41 B), a result the
        # node holds with size "?" -- every object shows what it takes in the store
        assert rows[info["arr"]]["size"] >= 8 << 20, rows[info["arr"]]
        assert rows[info["big"]]["size"] >= 4 << 20, rows[info["big"]]
        assert all(rows[i]["size"] is not None for i in info["ids"]), rows
        out = dpool_cli(["objects"], env)
        assert out.returncode == 0 and f"{info['ref']:#018x}" in out.stdout
    finally:
        if driver is not None:
            driver.kill()
            driver.wait(10)
        stop_cluster(c)


@pytest.mark.parametrize("command", ["timeline", "logs", "objects"])
def test_commands_without_a_cluster_say_so(tmp_path, command):
    env = base_env()
    env["DPOOL_STATE_DIR"] = str(tmp_path / "nothing")
    out = dpool_cli([command], env)
    assert out.returncode == 2
    assert "no cluster" in out.stderr and "DPOOL_ADDRESS" in out.stderr
