"""``dpool up hosts.yaml`` / ``dpool down hosts.yaml`` over a real ``sshd`` listening on
this worker's loopback addresses, each address a host of its own: the head and two
workers start, a program's tasks run on them, a second ``up`` finds them running, a host
that cannot be reached is reported as failed without stopping the others, ``down``
stops everything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cluster.conftest import ROOT, TIMEOUT, base_env, free_port, host, nodes_used
from tests.cluster.ssh_helpers import SshUnavailable, start_sshd

yaml = pytest.importorskip("yaml")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    d = tmp_path_factory.mktemp("sshd")
    ips = [host(2), host(3), host(4)]
    try:
        s = start_sshd(d, ips, free_port(ips[0]), {"PYTHONPATH": str(ROOT)})
    except SshUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield s, ips
    finally:
        s.stop()


def _hosts_file(path, sshd, ips, extra_workers=()) -> str:
    s, _ = sshd
    cfg = {
        "cluster_name": "test",
        "python": sys.executable,
        "ssh": {"user": "root", "port": s.port, "identity_file": str(s.key),
                "options": ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null",
                            "LogLevel=ERROR"]},
        "head": {"host": ips[0], "port": free_port(ips[0], span=12), "num_cpus": 1},
        "workers": [{"host": ip, "num_cpus": 1} for ip in ips[1:]] + list(extra_workers),
    }
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _dpool(args, timeout=TIMEOUT * 3):
    return subprocess.run([sys.executable, "-m", "dpool", *args], env=base_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_up_runs_a_cluster_on_ssh_hosts_and_down_stops_it(sshd, tmp_path):
    s, ips = sshd
    cfg = _hosts_file(tmp_path / "hosts.yaml", sshd, ips)
    try:
        up = _dpool(["up", cfg])
        assert up.returncode == 0, up.stdout + up.stderr
        lines = up.stdout.splitlines()
        assert lines[0].startswith(f"{ips[0]}: head started")
        assert all(any(x.startswith(f"{ip}: node started") for x in lines) for ip in ips[1:])
        values = dict(x.split("=", 1) for x in lines if "=" in x)
        assert nodes_used({**base_env(), **values}, tmp_path) >= 2
        again = _dpool(["up", cfg])  # idempotent
        assert again.returncode == 0, again.stdout + again.stderr
        assert sum("already running" in x for x in again.stdout.splitlines()) == 3
        assert dict(x.split("=", 1) for x in again.stdout.splitlines() if "=" in x) == values
    finally:
        down = _dpool(["down", cfg])
    assert down.returncode == 0, down.stdout + down.stderr
    for ip in ips:
        assert not os.path.exists(s.dir / f"state-{ip}" / "cluster.json")


def test_a_host_that_fails_is_reported_and_the_others_come_up(sshd, tmp_path):
    s, ips = sshd
    cfg = _hosts_file(tmp_path / "hosts.yaml", sshd, ips[:2],
                      extra_workers=[{"host": ips[2], "python": "/nonexistent/python"}])
    try:
        up = _dpool(["up", cfg])
        assert up.returncode == 1
        lines = up.stdout.splitlines()
        assert any(x.startswith(f"{ips[2]}: FAILED") for x in lines), up.stdout
        assert any(x.startswith(f"{ips[1]}: node started") for x in lines), up.stdout
    finally:
        _dpool(["down", cfg])


def test_a_bad_hosts_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("head: {}\n")
    out = _dpool(["up", str(bad)])
    assert out.returncode == 2 and "head: needs a host" in out.stderr
    out = _dpool(["up", str(tmp_path / "missing.yaml")])
    assert out.returncode == 2 and "cannot read" in out.stderr
