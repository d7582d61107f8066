"""How a worker process ended: waiting for it (``reap``, killing it if it lingers) and
saying how it died (``describe_exit``, the kernel's OOM killer named when it was that)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Optional

    from dpool.scheduling._records import WorkerHandle


def describe_exit(code: Optional[int], oom: bool = False) -> str:
    if oom:
        return "signal SIGKILL from the kernel's out-of-memory killer (its OOM kill count " \
               "went up: the host or this cgroup ran out of memory)"
    if code is None:
        return "an unknown exit status"
    if code < 0:
        import signal

        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def reap(w: WorkerHandle, kill_after: float) -> Optional[int]:
    """Wait for a worker process to exit (killing it after ``kill_after`` s: its exit
    code then says SIGKILL, and ``w.killed_here`` is set)."""
    proc = w.process
    try:
        proc.join(kill_after)
        if proc.exitcode is None:
            w.killed_here = True
            proc.kill()
            proc.join(2.0)
        return proc.exitcode
    except (AssertionError, ValueError, OSError):  # not our child / already closed
        return None
