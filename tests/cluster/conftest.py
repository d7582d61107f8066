"""A dpool cluster on this machine, for real: node daemons started with ``dpool start``
on their own loopback addresses (``host(2)``, ``host(3)``, ...: 127.0.0.2, 127.0.0.3, ...
without xdist; each xdist worker has a block of its own, tests/_parallel.py) and state
directories, as separate hosts would be. Everything started here is stopped at teardown,
even when a test fails (``dpool stop``, then SIGKILL of whatever is left)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from dpool.control._redis_server import RedisServer
from tests import _started
from tests._parallel import INDEX, host
from tests.cluster.redis_helpers import assert_gone, start_server

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60


# Ports the tests choose come from a block of this xdist worker's own, below the kernel's
# ephemeral range (which it draws from for every socket bound to port 0 and every outgoing
# connection: a port taken from there, then released, could be handed out again before
# the server meant for it listens -- a head's Redis shard found its port taken).
_PORTS_PER_WORKER = 2500
_FIRST_PORT = 20000 + (INDEX % 5) * _PORTS_PER_WORKER
_cursor = _FIRST_PORT


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(ip: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


def free_port(ip: str = "127.0.0.1", span: int = 1) -> int:
    """A free port on ``ip``, with the ``span - 1`` ports after it free too (a head puts
    its Redis shards, replicas and Sentinels there): this worker's ports in turn, so no
    earlier call, no other worker and no port-0 socket takes it meanwhile."""
    global _cursor
    if _FIRST_PORT + _PORTS_PER_WORKER > _ephemeral_low():  # an unusual machine
        with socket.socket() as s:
            s.bind((ip, 0))
            return s.getsockname()[1]
    for _ in range(_PORTS_PER_WORKER):
        port = _cursor
        _cursor += span
        if _cursor >= _FIRST_PORT + _PORTS_PER_WORKER:
            _cursor = _FIRST_PORT
        if port + span <= _FIRST_PORT + _PORTS_PER_WORKER and \
                all(_bindable(ip, p) for p in range(port, port + span)):
            return port
    raise RuntimeError(f"no {span} free ports in a row on {ip} from {_FIRST_PORT}")


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not). A process that exits between two psutil
    calls counts as gone -- asking twice is a race."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_gone(procs: list, timeout: float) -> None:
    """Wait up to ``timeout`` for ``procs`` to exit. A zombie has: a daemon's parent is
    init, which may take seconds to reap it (``psutil.wait_procs`` would wait for that)."""
    deadline = time.monotonic() + timeout
    while any(running(p.pid) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)


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
    record: dict = field(default_factory=dict)

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

    def run_script(self, code: str, tmp_path: Path, *args: str, env: dict | None = None,
                   timeout: float = TIMEOUT, unchanged: bool = False,
                   ) -> subprocess.CompletedProcess:
        """Run ``code`` as a driver script; ``unchanged``: a stdlib program, under
        ``python -m dpool run``."""
        script = tmp_path / "driver_script.py"
        script.write_text(code)
        prefix = [sys.executable, "-m", "dpool", "run"] if unchanged else [sys.executable]
        return subprocess.run([*prefix, str(script), *args], cwd=tmp_path,
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
    _wait_gone(family, 5)


def start_node(tmp: Path, ip: str, *, head: bool, address: str = "", token: str = "",
               num_cpus: int = 2, extra: tuple = ()) -> tuple[Node, str]:
    state = tmp / f"state-{ip}"
    env = base_env()
    env["DPOOL_STATE_DIR"] = str(state)
    node = Node(ip, str(state), env=env)
    if head:
        # (the node's port, then its shards', replicas' and Sentinels')
        args = ["start", "--head", "--port", str(free_port(ip, span=12)), "--node-ip", ip]
    else:
        args = ["start", "--address", address, "--token", token, "--node-ip", ip]
    out = dpool_cli([*args, "--num-cpus", str(num_cpus), *extra], env)
    assert out.returncode == 0, out.stderr
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)

    record = json.loads((state / "cluster.json").read_text())
    node.address = record["node"]["address"]
    node.pid = record["node"]["pid"]
    _started.add(node.pid)
    node.record = record
    return node, values.get("DPOOL_TOKEN", token)


def start_cluster(tmp: Path, n_nodes: int = 3, head_cpus: int = 2, cpus: int = 2,
                  global_schedulers: int = 1, shards: int = 2, extra: tuple = (),
                  node_extra: tuple = ()) -> Cluster:
    """A head on ``host(2)`` (Redis shards, global schedulers, a node; ``extra``: more
    ``dpool start --head`` flags) and nodes joining it from ``host(3)``, ``host(4)``, ...
    (started at once; ``node_extra``: more flags for each); stop with ``stop_cluster``."""
    head, token = start_node(tmp, host(2), head=True, num_cpus=head_cpus,
                             extra=("--shards", str(shards), "--global-schedulers",
                                    str(global_schedulers), *extra))
    c = Cluster(head, token, [head])
    try:
        with ThreadPoolExecutor(max(1, n_nodes - 1)) as pool:
            joining = [pool.submit(start_node, tmp, host(2 + i), head=False,
                                   address=head.address, token=token, num_cpus=cpus,
                                   extra=node_extra)
                       for i in range(1, n_nodes)]
        # (all have finished here) keep every node that started, so that all are stopped
        c.nodes += [f.result()[0] for f in joining if f.exception() is None]
        for f in joining:
            f.result()  # the first failure, if any
        wait_for_nodes(c, n_nodes)
    except BaseException:
        stop_cluster(c)
        raise
    return c


@contextlib.contextmanager
def daemon_env(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` while daemons start (they inherit it), as it was
    after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def wait_for_nodes(c: Cluster, n: int, timeout: float = 20.0) -> dict:
    """The head's status once ``n`` nodes are alive and linked to a global scheduler."""
    env = base_env()
    env["DPOOL_STATE_DIR"] = c.head.state_dir
    deadline = time.monotonic() + timeout
    status: dict = {}
    while time.monotonic() < deadline:
        out = dpool_cli(["status", "--json"], env)
        if out.returncode == 0:
            status = json.loads(out.stdout)
            alive = [x for x in status["nodes"] if x["alive"]]
            if len(alive) >= n and all(x.get("linked_schedulers", 1) for x in alive):
                return status
        time.sleep(0.2)
    raise AssertionError(f"the cluster did not come up with {n} nodes: {status}")


def stop_cluster(c: Cluster) -> None:
    """Stop every node (those that joined at once, then the head), then whatever of the
    head's global schedulers and Redis shards is left."""
    with ThreadPoolExecutor(max(1, len(c.nodes) - 1)) as pool:
        list(pool.map(Node.stop, c.nodes[1:]))
    for n in c.nodes[:1]:
        n.stop()
    for gs in c.head.record.get("global_schedulers", []):
        _kill_tree(gs.get("pid", 0))
    for shard in c.head.record.get("redis", []):
        _kill_tree(shard.get("pid", 0))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A one-node cluster (head on ``host(2)``, 2 CPUs), shared by a module's tests."""
    tmp = tmp_path_factory.mktemp("cluster")
    head, token = start_node(tmp, host(2), head=True)
    c = Cluster(head, token, [head])
    try:
        yield c
    finally:
        for n in c.nodes:
            n.stop()


@pytest.fixture(scope="module")
def shards():
    """Two shards with a random password: ``(addresses, password, servers)``."""
    password = secrets.token_hex(16)
    servers: list[RedisServer] = []
    try:
        for _ in range(2):
            servers.append(start_server(password))
        yield [s.address for s in servers], password, servers
    finally:
        pids = [s.pid for s in servers if s.pid is not None]
        for s in servers:
            s.stop()
        assert_gone(pids)


_SPREAD = """
import os, time
import dpool

def where(t):
    time.sleep(t)
    return os.environ.get("DPOOL_NODE_ID")

if __name__ == "__main__":
    with dpool.ProcessPoolExecutor() as ex:
        print(len(set(ex.map(where, [0.3] * 24))))
"""


def nodes_used(env: dict, tmp: Path) -> int:
    """How many nodes a program's 24 tasks of 0.3 s ran on, run with ``env`` (its
    ``DPOOL_ADDRESS``/``DPOOL_TOKEN``) as a driver from ``tmp``."""
    prog = tmp / "spread.py"
    prog.write_text(_SPREAD)
    out = subprocess.run([sys.executable, str(prog)], env=env, capture_output=True,
                         text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)
