"""Shared fixtures: every test must leave no worker process and no shm segment behind.
Run in several processes (``-n 3``), see ``tests/_parallel.py``."""

from __future__ import annotations

import gc
import os
import time

import psutil
import pytest

from tests import _bytecode, _parallel
from tests._started import STARTED_PIDS


def pytest_configure(config: pytest.Config) -> None:
    _bytecode.compile_once(config)
    _parallel.install(config)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What exists once the tests are collected (modules, pytest's own objects) lives to
    the end: keep it out of the garbage collector's way. ``no_leaks`` collects after every
    test; a full collection then takes ~2 ms instead of ~30 ms."""
    gc.collect()
    gc.freeze()


def _dpool_segments() -> set[str]:
    """This test process's segments: owned (``dpool_<owner pid>_...``) by this process,
    one of its descendants, a daemon it started, or a process gone -- unless another
    test process of this run (xdist) started it. Another test run on the same machine (a
    colleague's) owns the rest."""
    try:
        names = [n for n in os.listdir("/dev/shm") if n.startswith("dpool")]
    except FileNotFoundError:  # pragma: no cover - non-Linux
        return set()
    ours = {os.getpid(), *STARTED_PIDS}
    try:
        ours.update(p.pid for p in psutil.Process().children(recursive=True))
    except psutil.Error:
        pass
    out = set()
    elsewhere = None
    for n in names:
        owner = n.split("_")[1] if n.count("_") >= 1 else ""
        if not owner.isdigit() or int(owner) in ours:
            out.add(n)
        elif not psutil.pid_exists(int(owner)):
            if elsewhere is None:
                elsewhere = _parallel.started_elsewhere()
            if int(owner) not in elsewhere:
                out.add(n)
    return out


def _live_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            # multiprocessing's own resource tracker and fork server live as long as the
            # test process once a spawn- or forkserver-context process started (stdlib
            # behaviour, not a leak; compat/ tests start them in the same process)
            if any(h in part for part in p.cmdline() for h in ("resource_tracker", "forkserver")):
                continue
            # dpool's fork server lives as long as this process's runtime (scheduling/_zygote)
            if p.name() == "dpool-zygote" and p.ppid() == os.getpid():
                continue
            out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail a test that leaves worker processes or /dev/shm segments behind."""
    segments_before = _dpool_segments()
    children_before = {p.pid for p in _live_children()}
    yield
    deadline = time.monotonic() + 5.0
    while True:
        extra = [p for p in _live_children() if p.pid not in children_before]
        if not extra or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    gc.collect()  # futures/refs of the test release their objects asynchronously
    while True:
        leaked_segments = _dpool_segments() - segments_before
        if not leaked_segments or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for p in extra:
        p.kill()
    assert not extra, f"test left processes behind: {[p.pid for p in extra]}"
    assert not leaked_segments, f"test left /dev/shm segments behind: {leaked_segments}"


@pytest.fixture(autouse=True)
def restore_store_capacity():
    """``object_store_memory=`` sets the process-wide store's cap (the last value given
    applies, as documented): give the next test the cap this one started with."""
    from dpool.objects._hoststore import default_capacity
    from dpool.runtime import _current

    runtime = _current._driver
    before = runtime.scheduler.store.capacity if runtime is not None else default_capacity()
    yield
    runtime = _current._driver
    if runtime is not None and runtime.pid == os.getpid():
        runtime.scheduler.set_store_capacity(before)

