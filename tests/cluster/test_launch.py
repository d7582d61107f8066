"""Entry points for launchers: ``dpool start --block`` (a foreground head or node that
stops what it started on SIGTERM) and ``dpool status --wait-nodes N`` (a readiness probe),
as real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from tests.cluster.conftest import TIMEOUT, base_env, dpool_cli, free_port, host


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_block_runs_until_sigterm_and_wait_nodes_probes_readiness(tmp_path):
    ip = host(2)
    env = base_env()
    env["DPOOL_STATE_DIR"] = str(tmp_path / "head")
    head = subprocess.Popen(
        [sys.executable, "-m", "dpool", "start", "--head", "--block", "--node-ip", ip,
         "--port", str(free_port(ip, span=12)), "--num-cpus", "1", "--shards", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = dpool_cli(["status", "--wait-nodes", "1", "--timeout", "60"], env)
        assert ready.returncode == 0, ready.stderr
        record = os.path.join(env["DPOOL_STATE_DIR"], "cluster.json")
        assert os.path.exists(record)
        import json

        pids = [json.load(open(record))["node"]["pid"]]
        pids += [r["pid"] for r in json.load(open(record))["redis"]]
        too_many = dpool_cli(["status", "--wait-nodes", "2", "--timeout", "1"], env)
        assert too_many.returncode == 1 and "1 of 2" in too_many.stderr
        assert head.poll() is None  # still in the foreground
        head.send_signal(signal.SIGTERM)
        out, err = head.communicate(timeout=TIMEOUT)
        assert head.returncode == 0, err
        assert "SIGTERM" in out and "stopped" in out
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids)
        assert not os.path.exists(record)
    finally:
        if head.poll() is None:
            head.kill()
            head.wait()
        dpool_cli(["stop"], env)


def test_wait_nodes_without_a_cluster_fails_after_its_timeout(tmp_path):
    env = base_env()
    env["DPOOL_STATE_DIR"] = str(tmp_path / "none")
    out = dpool_cli(["status", "--wait-nodes", "1", "--timeout", "0.5"], env)
    assert out.returncode == 1 and "0 of 1" in out.stderr
