"""Starting and stopping the daemons of ``dpool start``: detached, with a readiness pipe."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from typing import Optional

import psutil


class StartError(Exception):
    """A daemon did not come up; the message says why (shown to the user as is)."""


def launch(module: str, args: list, log_path: str, env_extra: dict,
           timeout: float = 30.0) -> tuple[subprocess.Popen, str]:
    """Start ``python -m module args`` in a session of its own (it outlives this command)
    and wait for the line it writes to ``--ready-fd``; returns (process, that line)."""
    r, w = os.pipe()
    env = dict(os.environ)
    env.pop("DPOOL_ADDRESS", None)  # a daemon is never a driver
    env.update(env_extra)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args, "--ready-fd", str(w)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            pass_fds=(w,), env=env, start_new_session=True, close_fds=True)
    os.close(w)
    try:
        line = _read_line(r, timeout)
    finally:
        os.close(r)
    if not line.startswith("READY"):
        if proc.poll() is None:
            stop_pid(proc.pid, timeout=5)
        proc.wait()
        detail = line.removeprefix("ERROR").strip() or (
            f"it exited with status {proc.returncode}" if proc.returncode is not None
            else f"it did not report ready within {timeout:g} s")
        raise StartError(f"{module} did not start: {detail} (log: {log_path})")
    return proc, line


def _read_line(fd: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace").strip()


def started_at(pid: Optional[int]) -> Optional[float]:
    """A process's start time: with its pid, what names it (pids are reused)."""
    try:
        return psutil.Process(pid).create_time() if pid else None
    except psutil.Error:
        return None


def same_process(pid: Optional[int], started: Optional[float]) -> bool:
    """Whether ``pid`` still runs and is the process started at ``started`` (None: any)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - started) > 0.01:
            return False  # the pid now belongs to another process
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_pid(pid: Optional[int], timeout: float = 10.0,
             started: Optional[float] = None) -> bool:
    """SIGTERM ``pid`` and its children, SIGKILL what is left after ``timeout``.
    True if something was running. With ``started``, a pid that now names another
    process is left alone."""
    if not pid or not same_process(pid, started):
        return False
    try:
        proc = psutil.Process(pid)
        family = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return False
    for p in family:
        try:
            p.send_signal(signal.SIGTERM) if p is proc else None
        except psutil.Error:
            pass
    alive = _wait_exited(family, timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    _wait_exited(alive, 5)
    return True


def _exited(p: psutil.Process) -> bool:
    """Whether ``p`` has exited. A zombie has: only its parent's reaping is left, and a
    daemon's parent is init, which reaps slowly on some machines (every ~2 s seen here)
    and never in a container without one. ``psutil.wait_procs`` counts a zombie as
    running, so ``dpool stop`` waited its whole timeout and then "killed" a zombie."""
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def _wait_exited(procs: list, timeout: float) -> list:
    """Wait up to ``timeout`` for ``procs`` to exit; the ones still running."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not _exited(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if not _exited(p)]
    return alive
