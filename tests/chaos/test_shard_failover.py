"""A control-store shard primary SIGKILLed under a running program (``--replicas 1``).

A loopback cluster: a head (two shards, a replica of each, three Sentinels, a global
scheduler, a node) and one more node. While a driver runs a stream of short tasks, the
primary of shard 0 or of shard 1 is SIGKILLed. Sentinel promotes its replica; the
program finishes with every result, ``dpool status`` lists every node afterwards, a new
node joins, and ``dpool stop`` leaves no redis-server or Sentinel behind.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dpool.control._redis_server import RedisServer
from dpool.control._sentinel_server import sentinel_address, start_replicated
from tests._parallel import host
from tests.cluster.conftest import (
    TIMEOUT,
    Cluster,
    base_env,
    dpool_cli,
    free_port,
    running,
    start_node,
    stop_cluster,
    wait_for_nodes,
)

DRIVER = textwrap.dedent("""
    import sys, time
    import dpool

    def square(x):
        time.sleep(0.02)
        return x * x

    if __name__ == "__main__":
        n = int(sys.argv[1])
        with dpool.ProcessPoolExecutor() as ex:
            assert list(ex.map(square, range(8))) == [x * x for x in range(8)]
            print("STARTED", flush=True)
            fs = [ex.submit(square, x) for x in range(n)]
            print("RESULT", sum(f.result(timeout=120) for f in fs), flush=True)
""")


def _status(c: Cluster) -> dict:
    env = base_env()
    env["DPOOL_STATE_DIR"] = c.head.state_dir
    out = dpool_cli(["status", "--json"], env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("shard", [0, 1])
def test_a_shard_primary_killed_mid_run(tmp_path, shard):
    head, token = start_node(tmp_path, host(2), head=True, num_cpus=2,
                             extra=("--shards", "2", "--replicas", "1"))
    c = Cluster(head, token, [head])
    servers = head.record["redis"]
    driver = None
    try:
        assert [r["role"] for r in servers].count("sentinel") == 3
        node, _ = start_node(tmp_path, host(3), head=False, address=head.address, token=token)
        c.nodes.append(node)
        wait_for_nodes(c, 2)
        primary = [r for r in servers if r["role"] == "primary"][shard]

        script = tmp_path / "driver_script.py"
        script.write_text(DRIVER)
        n = 1200
        driver = subprocess.Popen([sys.executable, str(script), str(n)], cwd=tmp_path,
                                  env=c.driver_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        assert driver.stdout is not None
        line = driver.stdout.readline()
        assert line.strip() == "STARTED", (line, driver.stderr.read() if driver.stderr else "")
        time.sleep(0.3)  # tasks in flight, lineage being written
        os.kill(primary["pid"], signal.SIGKILL)

        out, err = driver.communicate(timeout=TIMEOUT * 2)
        assert driver.returncode == 0, err
        assert out.strip() == f"RESULT {sum(x * x for x in range(n))}", (out, err)

        # every node is listed (and alive) once the replica took over
        status = wait_for_nodes(c, 2, timeout=30)
        assert {x["node_id"] for x in status["nodes"]} >= {head.address, node.address}
        row = status["shards"][shard]
        assert row["alive"] and row["primary"] != primary["address"], row

        # a new node joins
        new, _ = start_node(tmp_path, host(4), head=False, address=head.address, token=token)
        c.nodes.append(new)
        status = wait_for_nodes(c, 3, timeout=30)
        assert new.address in {x["node_id"] for x in status["nodes"]}
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
            driver.wait()
        stop_cluster(c)
    left = [r for r in servers if r["pid"] and running(r["pid"])]
    assert not left, f"redis/sentinel processes left behind: {left}"


@pytest.mark.timeout(120)
def test_a_shard_down_without_replicas_is_named(tmp_path):
    """No replicas: the dead shard stays down, and both `dpool status` and a node trying
    to join say which shard it is and what is out of reach (not a raw PING error)."""
    head, token = start_node(tmp_path, host(2), head=True, num_cpus=1,
                             extra=("--shards", "2"))
    c = Cluster(head, token, [head])
    servers = head.record["redis"]
    try:
        dead = servers[1]
        os.kill(dead["pid"], signal.SIGKILL)
        env = base_env()
        env["DPOOL_STATE_DIR"] = head.state_dir
        out = dpool_cli(["status"], env)
        assert out.returncode == 0, out.stderr
        assert f"redis shard 1 {dead['address']} alive=False DEGRADED: no replica" \
            in out.stdout, out.stdout
        assert "nodes cannot join" in out.stdout, out.stdout

        joining = base_env()
        joining["DPOOL_STATE_DIR"] = str(tmp_path / "state-joining")
        out = dpool_cli(["start", "--address", head.address, "--token", token,
                         "--node-ip", host(3), "--num-cpus", "1"], joining)
        assert out.returncode == 1
        assert f"cannot reach control-store shard {dead['address']} (shard 1 of 2, PING)" \
            in out.stderr, out.stderr
        assert "no replica of this shard" in out.stderr and "--replicas 1" in out.stderr
    finally:
        stop_cluster(c)
    left = [r for r in servers if r["pid"] and running(r["pid"])]
    assert not left, f"redis processes left behind: {left}"


@pytest.mark.timeout(120)
def test_a_head_on_an_external_sentinel_deployment(tmp_path):
    """``dpool start --head --redis-address sentinel://...``: the cluster's components
    reach the shards through those Sentinels; ``dpool stop`` leaves the deployment alone."""
    password = secrets.token_hex(16)
    ip = host(2)
    servers: list[RedisServer] = []
    c = None
    try:
        primaries = []
        for _ in range(2):
            server = RedisServer(free_port(ip), password, bind=ip)
            servers.append(server)
            primaries.append(server.start(timeout=20))
        _, sentinels = start_replicated(
            primaries, password, ports=[free_port(ip), free_port(ip)],
            sentinel_ports=[free_port(ip) for _ in range(3)], announce_ip=ip, bind=ip,
            started=servers)
        spec = sentinel_address([s.address for s in sentinels], 2)
        head, token = start_node(tmp_path, ip, head=True, num_cpus=1,
                                 extra=("--redis-address", spec, "--token", password))
        c = Cluster(head, token, [head])
        assert head.record["redis"] == []  # nothing of the deployment is dpool's to stop
        status = wait_for_nodes(c, 1)
        assert [s["primary"] for s in status["shards"]] == [p.address for p in primaries]
        assert all(s["alive"] and s["replicas"] == 1 for s in status["shards"])
        out = c.run_script("import dpool\nwith dpool.ProcessPoolExecutor() as ex:\n"
                           "    print(sum(ex.map(abs, range(-50, 50))))\n", tmp_path)
        assert out.returncode == 0 and out.stdout.strip() == "2500", out.stderr
    finally:
        if c is not None:
            stop_cluster(c)
        alive = [s for s in servers if s.running()]
        for s in reversed(servers):
            s.stop()
    assert len(alive) == len(servers), "dpool stop stopped a server it did not start"
