"""Run a peer subprocess in its own session and make sure nothing outlives it.

While the child runs we remember its descendants (polling ~1/s). When it has
exited we wait briefly for stragglers, then terminate/kill whatever is still
alive from its session or from the remembered descendants, and report them:
a clean peer leaves nothing behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil


@dataclass
class ChildOutcome:
    returncode: int | None
    timed_out: bool
    wall_s: float
    stdout: str
    stderr: str
    leftovers: list[str] = field(default_factory=list)


def _session_members(sid: int) -> list[psutil.Process]:
    found: list[psutil.Process] = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid:
                found.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def _reap(procs: list[psutil.Process], grace_s: float) -> list[str]:
    """Wait up to ``grace_s`` for ``procs`` to exit, then terminate → kill."""
    alive = [p for p in procs if p.is_running()]
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    if not alive:
        return []
    names: list[str] = []
    for p in alive:
        try:
            names.append(f"{p.name()}[{p.pid}]")
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=3.0)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=3.0)
    return names


def run_child(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout_s: float, out_dir: Path) -> ChildOutcome:
    out_path, err_path = out_dir / "stdout.txt", out_dir / "stderr.txt"
    seen: dict[int, psutil.Process] = {}
    t0 = time.perf_counter()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        child = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True
        )
        root = psutil.Process(child.pid)
        timed_out = False
        while True:
            try:
                child.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                pass
            try:
                for p in root.children(recursive=True):
                    seen.setdefault(p.pid, p)
            except psutil.Error:
                pass
            if time.perf_counter() - t0 > timeout_s:
                timed_out = True
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.wait()
                break
    wall = time.perf_counter() - t0
    # Descendants may still be shutting down asynchronously: give them a moment.
    stragglers = {p.pid: p for p in _session_members(child.pid)}
    stragglers.update({pid: p for pid, p in seen.items() if p.is_running()})
    leftovers = _reap(list(stragglers.values()), grace_s=0.5 if timed_out else 3.0)
    return ChildOutcome(
        returncode=child.returncode,
        timed_out=timed_out,
        wall_s=wall,
        stdout=out_path.read_text(errors="replace"),
        stderr=err_path.read_text(errors="replace"),
        leftovers=leftovers,
    )
