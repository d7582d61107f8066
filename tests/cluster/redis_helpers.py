"""Helpers for cluster tests (imported by conftest and tests; not a conftest itself)."""

from __future__ import annotations

import socket

import psutil

from dpool.control._redis_server import RedisServer
from dpool.errors import ControlStoreError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(password: str, tries: int = 3) -> RedisServer:
    """A started shard on a free port (another test may take the port between our probe
    and the server's bind: then try another)."""
    for attempt in range(tries):
        server = RedisServer(free_port(), password)
        try:
            return server.start(timeout=20)
        except ControlStoreError as e:
            if "already in use" not in str(e) or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def assert_gone(pids: list[int]) -> None:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    assert not alive, f"redis-server processes left behind: {alive}"
