"""Fixtures for cluster tests: real ``redis-server`` shards on loopback, always stopped."""

from __future__ import annotations

import secrets

import pytest
from redis_helpers import assert_gone, start_server

from dpool.control._redis_server import RedisServer


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
