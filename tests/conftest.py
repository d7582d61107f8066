"""Shared fixtures: every test must leave no worker process and no shm segment behind."""

from __future__ import annotations

import gc
import os
import time

import psutil
import pytest

from tests._started import STARTED_PIDS


def _dpool_segments() -> set[str]:
    """This run's segments: owned (``dpool_<owner pid>_...``) by this process, one of its
    descendants, a daemon it started, or a process gone. Another test run on the same
    machine (a colleague's) owns the rest."""
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
    for n in names:
        owner = n.split("_")[1] if n.count("_") >= 1 else ""
        if not owner.isdigit() or int(owner) in ours or not psutil.pid_exists(int(owner)):
            out.add(n)
    return out


def _live_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            # multiprocessing's own resource tracker lives as long as the test process
            # once any spawn-context process started (stdlib behaviour, not a leak).
            if any("resource_tracker" in part for part in p.cmdline()):
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
    from dpool.objects._accounting import default_capacity
    from dpool.runtime import _current

    runtime = _current._driver
    before = runtime.scheduler.store.capacity if runtime is not None else default_capacity()
    yield
    runtime = _current._driver
    if runtime is not None and runtime.pid == os.getpid():
        runtime.scheduler.set_store_capacity(before)

