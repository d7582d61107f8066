"""The real local scheduler driven by a test, event by event, with no process and no IO
thread: its workers are the test's ends of socket pairs.

Events go in as the scheduler's own entry points (``submit``; a worker's frames through
``_on_frames``, its death through ``_on_closed``), in the order the test chooses --
the order that caused a race, say. Instructions come out as what the scheduler sends
each worker (``SimWorker.take()``: decoded messages), the workers it starts
(``SimScheduler.started``) and the futures it completes. Each test runs in milliseconds.
"""

from __future__ import annotations

import socket
from concurrent.futures import Future
from typing import Any, Optional

from dpool.control import InProcessControlStore
from dpool.objects import _payload
from dpool.protocol import PROTOCOL_VERSION, _running
from dpool.protocol import _messages as m
from dpool.protocol._channel import Channel
from dpool.protocol._codec import decode_batch, encode_batch
from dpool.scheduling import LocalScheduler, WorkerGroupConfig, WorkerHandle


class _NoIO:
    """Stands for the IO loop: the test is the only thread, and it reads the sockets."""

    idle = False
    started = False
    before_start = None

    def add(self, handle: Any) -> None:
        pass

    def want_write(self, handle: Any) -> None:
        raise AssertionError("a worker's socket buffer filled up in a test")

    def poke(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def is_io_thread(self) -> bool:
        return False

    def call_soon(self, fn: Any) -> None:
        fn()

    def stop(self) -> None:
        pass


class _Exited:
    """A worker 'process' that has exited (what ``_reap`` needs)."""

    def __init__(self, pid: int, exitcode: int) -> None:
        self.pid = pid
        self.exitcode = exitcode
        self.sentinel = -1

    def join(self, timeout: Optional[float] = None) -> None:
        pass

    def kill(self) -> None:
        pass


class SimWorker:
    """The test's end of one worker's socket."""

    def __init__(self, sched: SimScheduler, handle: WorkerHandle, sock: socket.socket) -> None:
        self.sched = sched
        self.handle = handle
        self.chan = Channel(sock, blocking=False)

    def take(self) -> list:
        """Every message the scheduler sent this worker since the last call."""
        out: list = []
        while True:  # (everything sent is in the socket already: sends do not block)
            frames = self.chan.recv_ready()
            if not frames:
                return out
            for frame in frames:
                out.extend(decode_batch(frame))

    def tasks(self) -> list[int]:
        """The ids of the tasks sent since the last call (other messages dropped)."""
        return [msg.task_id for msg in self.take() if isinstance(msg, m.ExecuteTask)]

    def send(self, *msgs: Any) -> None:
        self.sched._on_frames(self.handle, [encode_batch(list(msgs))])

    def hello(self) -> None:
        h = self.handle
        self.send(m.Hello(PROTOCOL_VERSION, h.worker_id, h.pid or 0))

    def done(self, task_id: int, value: Any = None, duration: float = 0.001) -> None:
        self.send(m.TaskDone(task_id, True, _payload.dumps(value), duration))

    def dies(self, exitcode: int = -9, running: int = 0) -> None:
        """Its process ends, running task ``running`` (0: none) by the board of running
        tasks (``protocol._running``), where a forked worker writes it."""
        h = self.handle
        h.process = _Exited(h.pid or 0, exitcode)
        if h.slot >= 0:
            write = _running.writer(h.slot)
            assert write is not None
            write(running)
        self.sched._on_closed(h)


class SimScheduler(LocalScheduler):
    """``LocalScheduler`` whose ``spawn_locked`` makes a ``SimWorker`` instead of a
    process, with ``_NoIO`` for its IO loop."""

    def __init__(self) -> None:
        super().__init__(InProcessControlStore())
        self.io = _NoIO()  # type: ignore[assignment]
        self.started: list[SimWorker] = []
        self._pids = iter(range(10_000, 20_000))
        self._next_task = iter(range(1, 1 << 30))

    def fork_point(self) -> None:  # no fork server: no process is forked
        pass

    def spawn_locked(self, g: Any, gpus: Optional[tuple] = None,
                     lease: Optional[socket.socket] = None) -> WorkerHandle:
        ours, theirs = socket.socketpair()
        wid = next(self._worker_ids)
        w = WorkerHandle(wid, g, _Exited(next(self._pids), 0), Channel(ours, blocking=False))
        w.pid = w.process.pid
        w.slot = _running.take()
        g.workers.append(w)
        self.started.append(SimWorker(self, w, theirs))
        return w

    # -- driver side -------------------------------------------------------------------
    def group(self, max_workers: int = 2, max_attempts: int = 3) -> Any:
        return self.add_group(WorkerGroupConfig(max_workers, None, None, None, max_attempts))

    def task(self, g: Any, fn_id: int = 1, deps: Optional[tuple] = None) -> tuple[int, Future]:
        """Submit a task (function ``fn_id``; ``deps``: ids it takes as inputs)."""
        if fn_id not in self._functions:
            self.register_function(fn_id, f"fn{fn_id}", _payload.dumps(len))
        tid = next(self._next_task)
        f: Future = Future()
        self.submit(g, tid, fn_id, _payload.dumps(((), {})), deps, f)
        return tid, f
