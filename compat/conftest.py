"""Fixtures of the differential conformance suite.

Each scenario runs once per implementation (``impl`` is ``"stdlib"`` or ``"dpool"``) and
asserts the *same* expected observation for both -- so the two are compared with each
other and pinned to what the stdlib documents. Where dpool differs on purpose, the test
spells out both expectations and names the entry of ``compat/DIFFERENCES.md``.

Every test is checked for leaks: no child process and no ``/dev/shm/dpool_*`` segment of
this process may outlive it. Run in several processes (``-n 3``): see tests/_parallel.py.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing.pool
import os
import sys
from typing import Any

import pytest

import dpool

sys.path.insert(0, os.path.dirname(__file__))  # compat_tasks, importable by stdlib workers

from compat_helpers import check_no_leaks
from tests import _bytecode, _parallel

IMPLS = ("stdlib", "dpool")


def pytest_configure(config: pytest.Config) -> None:
    _bytecode.compile_once(config)
    _parallel.install(config)


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def Executor(impl: str) -> type:  # the class under test
    return cf.ProcessPoolExecutor if impl == "stdlib" else dpool.ProcessPoolExecutor


@pytest.fixture
def Pool(impl: str) -> type:  # the class under test
    return multiprocessing.pool.Pool if impl == "stdlib" else dpool.Pool


@pytest.fixture(autouse=True)
def no_leaks() -> Any:
    """Fail a test that leaves a worker process or a dpool shm segment behind."""
    with check_no_leaks():
        yield
