"""Helpers of the compat suite: outcomes, leak checks, running a scenario in isolation."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import psutil
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Outcome:
    """What a call did: returned ``value``, or raised ``exc`` (kept for detailed checks)."""

    ok: bool
    value: Any = None
    exc: Optional[BaseException] = None

    @property
    def kind(self) -> str:
        return "ok" if self.ok else "raise"

    def raised(self, *types: type) -> bool:
        return not self.ok and isinstance(self.exc, types)

    def __repr__(self) -> str:
        if self.ok:
            return f"Outcome(ok, {self.value!r})"
        return f"Outcome(raise {type(self.exc).__module__}.{type(self.exc).__qualname__}: " \
               f"{self.exc})"


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
    try:
        return Outcome(True, fn(*args, **kwargs))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit from a task is an outcome too
        return Outcome(False, None, exc)


def _children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if "resource_tracker" in cmd or "forkserver" in cmd:
            continue  # multiprocessing's own helpers, shared by the whole session
        try:  # dpool's fork server: lives as long as this process's runtime
            if p.name() == "dpool-zygote" and p.ppid() == os.getpid():
                continue
        except psutil.Error:
            continue
        out.append(p)
    return out


def _own_segments(pids: set[int]) -> set[str]:
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return set()
    out = set()
    for name in names:
        parts = name.split("_")
        if len(parts) >= 3 and parts[0] == "dpool" and parts[1].isdigit() and int(parts[1]) in pids:
            out.add(name)
    return out


@contextlib.contextmanager
def check_no_leaks() -> Iterator[None]:
    """Fail if the block leaves a child process or a dpool segment of this process."""
    me = os.getpid()
    before = {p.pid for p in _children()}
    yield
    deadline = time.monotonic() + 5.0
    left = [p for p in _children() if p.pid not in before]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in _children() if p.pid not in before]
    described = []
    for p in left:  # do not poison the next tests
        with contextlib.suppress(psutil.Error):
            described.append((p.pid, " ".join(p.cmdline())[:80]))
            p.kill()
    assert not left, f"processes left behind: {described}"
    gc.collect()  # futures release their objects when collected, asynchronously
    segments = _own_segments({me})
    while segments and time.monotonic() < deadline + 2.0:
        time.sleep(0.05)
        segments = _own_segments({me})
    assert not segments, f"shared-memory segments left behind: {sorted(segments)}"


HANG = "HANG"


def run_isolated(code: str, timeout: float) -> str:
    """Run ``code`` in a fresh interpreter (cwd compat/); its stdout, or ``HANG``.

    For stdlib scenarios that hang or leave the pool unusable for good (a dead result
    thread makes even ``terminate()`` fail): they must not run in the test process.
    """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=HERE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out.strip()
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return HANG


def skip_stdlib_without_max_tasks_per_child(impl: str) -> None:
    """The stdlib's executor takes ``max_tasks_per_child`` from Python 3.11 (dpool's on
    every version it supports)."""
    if impl == "stdlib" and sys.version_info < (3, 11):
        pytest.skip("the stdlib's ProcessPoolExecutor has max_tasks_per_child from 3.11")
