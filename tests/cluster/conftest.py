"""A dpool cluster on this machine, for real: node daemons started with ``dpool start``
on their own loopback addresses (127.0.0.2, 127.0.0.3, ...) and state directories, as
separate hosts would be. Everything started here is stopped at teardown, even when a
test fails (``dpool stop``, then SIGKILL of whatever is left)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def base_env() -> dict:
    env = dict(os.environ)
    for k in ("DPOOL_ADDRESS", "DPOOL_TOKEN", "DPOOL_STATE_DIR"):
        env.pop(k, None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def dpool_cli(args: list, env: dict, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpool", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


@dataclass
class Node:
    """One simulated host: its state dir, its node's address and pid."""

    ip: str
    state_dir: str
    address: str = ""
    pid: int = 0
    env: dict = field(default_factory=dict)

    def stop(self) -> None:
        dpool_cli(["stop", "--timeout", "5"], self.env)
        _kill_tree(self.pid)


@dataclass
class Cluster:
    head: Node
    token: str
    nodes: list = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.head.address

    def driver_env(self, **extra: str) -> dict:
        env = base_env()
        env.update(DPOOL_ADDRESS=self.address, DPOOL_TOKEN=self.token)
        env.update(extra)
        return env

    def run_script(self, code: str, tmp_path: Path, *args: str,
                   env: dict | None = None, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
        script = tmp_path / "driver_script.py"
        script.write_text(code)
        return subprocess.run([sys.executable, str(script), *args], cwd=tmp_path,
                              env=env or self.driver_env(), capture_output=True, text=True,
                              timeout=timeout, check=False)


def _kill_tree(pid: int) -> None:
    if not pid:
        return
    try:
        proc = psutil.Process(pid)
        family = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return
    for p in family:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(family, timeout=5)


def start_node(tmp: Path, ip: str, *, head: bool, address: str = "", token: str = "",
               num_cpus: int = 2) -> tuple[Node, str]:
    state = tmp / f"state-{ip}"
    env = base_env()
    env["DPOOL_STATE_DIR"] = str(state)
    node = Node(ip, str(state), env=env)
    if head:
        args = ["start", "--head", "--port", str(free_port(ip)), "--node-ip", ip]
    else:
        args = ["start", "--address", address, "--token", token, "--node-ip", ip]
    out = dpool_cli([*args, "--num-cpus", str(num_cpus)], env)
    assert out.returncode == 0, out.stderr
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    import json

    record = json.loads((state / "cluster.json").read_text())
    node.address = record["node"]["address"]
    node.pid = record["node"]["pid"]
    return node, values.get("DPOOL_TOKEN", token)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A one-node cluster (head on 127.0.0.2, 2 CPUs), shared by a module's tests."""
    tmp = tmp_path_factory.mktemp("cluster")
    head, token = start_node(tmp, "127.0.0.2", head=True)
    c = Cluster(head, token, [head])
    try:
        yield c
    finally:
        for n in c.nodes:
            n.stop()
