"""The stdlib's worker lists, as programs read them: ``executor._processes``, ``pool._pool``.

dpool starts workers on demand, but code (CPython's own tests among it) counts these lists
right after submitting or after ``Pool(n)``, and checks that each process is alive, when
the stdlib would already have started its processes. So the executor starts the workers
the stdlib would have by then when a list is read (``Driver.start_workers``), and a list
shows the workers running now, each a ``WorkerProcess``. See compat/DIFFERENCES.md,
"Private attributes".
"""

from __future__ import annotations

import time

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Optional


class WorkerProcess:
    """One worker process, as the stdlib's ``executor._processes``/``pool._pool`` show it.

    A compatibility shim over the runtime's own process object: ``pid``, ``name``,
    ``ident``, ``daemon``, ``sentinel``, ``exitcode``, ``is_alive()``, ``join(timeout)``,
    ``terminate()`` and ``kill()`` behave as ``multiprocessing.Process``'s do. Killing a
    worker through it is an ordinary worker death for dpool: its task is retried (see
    ``max_attempts``) and the worker replaced.
    """

    __slots__ = ("_process", "pid")

    def __init__(self, process: Any, pid: Optional[int]) -> None:
        self._process = process
        self.pid = pid

    name = property(lambda self: self._process.name)
    ident = property(lambda self: self.pid)
    daemon = property(lambda self: self._process.daemon)
    sentinel = property(lambda self: self._process.sentinel)

    @property
    def exitcode(self) -> Optional[int]:
        """None while the process runs; its exit code, or ``-signal``, once it has ended."""
        return self._process.exitcode

    def is_alive(self) -> bool:
        return self._process.is_alive()

    def terminate(self) -> None:
        """Send SIGTERM (the task it was running is retried)."""
        self._process.terminate()

    def kill(self) -> None:
        """Send SIGKILL (the task it was running is retried)."""
        self._process.kill()

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait until the process has ended, at most ``timeout`` seconds."""
        # The runtime reaps its workers itself, so this waits on the process's sentinel
        # rather than in waitpid (two waiters on one pid would race), then briefly for the
        # exit code the reaper records.
        from multiprocessing.connection import wait

        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            sentinel = self._process.sentinel
        except ValueError:  # the process object was closed: it has ended
            return
        if not wait([sentinel], timeout):
            return
        while self._process.exitcode is None:
            if deadline is not None and time.monotonic() >= deadline:
                return
            time.sleep(0.001)

    def __repr__(self) -> str:
        code = self.exitcode
        status = "started" if code is None else f"stopped exitcode={code}"
        return f"<WorkerProcess name={self.name!r} pid={self.pid} {status}>"


class ProcessViews:
    """Keeps one executor's views stable from one read to the next."""

    __slots__ = ("_views",)

    def __init__(self) -> None:
        self._views: dict[int, WorkerProcess] = {}

    def read(self, workers: list) -> dict[int, WorkerProcess]:
        """``{pid: view}`` of ``workers`` (the group's handles) that have started."""
        views = self._views
        live: dict[int, WorkerProcess] = {}
        for w in list(workers):
            if w.process is None or w.pid is None:
                continue
            view = views.get(w.pid)
            if view is None or view._process is not w.process:
                view = WorkerProcess(w.process, w.pid)
            live[w.pid] = view
        self._views = live
        return dict(live)
