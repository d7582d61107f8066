"""The worker process's main loop.

    scheduler ──ExecuteTask/RegisterFunction──▶ socket ──▶ _Worker.run (main thread)
         ▲                                                   │ runs the user function
         └───────────── TaskDone (batched) ◀─────────────────┘

One task runs at a time, on the main thread. Messages are read on the main thread too,
between tasks (no thread hop on the fast path). Results are sent at once when the task
was long or nothing else is waiting, and batched while short tasks are queued locally.

A task that submits tasks switches the worker to *threaded receive*: a receiver thread
(see ``_client``) starts reading the socket, so results of nested tasks arrive while the
task runs, and the main loop takes its tasks from that thread from then on.

A watchdog thread exits the process when its parent dies, so killing the driver never
leaves orphans (a forked sibling may hold our socket's other end open, so EOF alone is not
a reliable signal).
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque

from dpool import _log, errors
from dpool.objects import payload as _payload
from dpool.protocol import (
    PROTOCOL_VERSION,
    Channel,
    ChannelClosed,
    WorkerConfig,
    decode_batch,
    encode_batch,
)
from dpool.protocol import messages as m
from dpool.protocol import running as _running
from dpool.worker import _watchdog

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

log = _log.getLogger("dpool.worker")

_FLUSH_AFTER_TASK_S = 200e-6  # a task longer than this sends its result at once
_FLUSH_AGE_S = 2e-3  # no buffered result waits longer than this
_FLUSH_COUNT = 256
# After a short task that came alone, with nothing queued, a worker polls its socket this
# long before it blocks: a caller that waits for each result (a plain actor call,
# submit().result() in a loop) sends the next call within tens of microseconds, and
# waking a blocked process costs ~7 us of that round trip on this VM (bench/NOTES.md).
_SPIN_S = float(os.environ.get("DPOOL_WORKER_SPIN_S", "100e-6"))
_SPIN = _SPIN_S > 0
_SPIN_AFTER_TASK_S = 200e-6



def _forget(names: tuple) -> None:
    """Unmap this process's cached mappings of ``names`` (freed segments). A worker that
    never read a stored value has none, and need not load the mapping cache to say so."""
    mapping = sys.modules.get("dpool.objects._mapping")
    if mapping is not None:
        mapping.forget(names)

class _Worker:
    def __init__(self, chan: Channel, cfg: WorkerConfig) -> None:
        self.chan = chan
        self.cfg = cfg
        self.fns: dict[int, Callable[..., Any]] = {}
        self.fn_payloads: dict[int, bytes] = {}
        self.pending: deque = deque()
        self.results: list = []
        self.first_result_t = 0.0
        self.done_count = 0
        self.client = None  # set by _client when the first nested call happens
        self.lease: Any = None  # _lease.LeaseLink while lent to a driver (cluster mode)
        self.output: Any = None  # _output.OutputForwarder on a node (cluster mode)
        self.inherited: Optional[tuple] = None  # initargs handed over at process creation
        # called with this worker after each task (an actor's checkpoints), or None
        self.after_task: Optional[Callable[[_Worker], None]] = None
        self.threads: Any = None  # a thread pool that runs the tasks (``run_concurrently``)
        # where it says which task it runs (``protocol._running``), None: nowhere
        self.running = _running.writer(cfg.slot)
        self.spin = False  # poll a moment before blocking for the next message

    # -- messages ------------------------------------------------------------------------
    def send(self, msgs: list) -> None:
        self.chan.send(encode_batch(msgs))

    def handle(self, msg: Any) -> None:
        code = msg.CODE
        if code == m.ExecuteTask.CODE:
            self.pending.append(msg)
        elif code == m.RegisterFunction.CODE:
            self.fn_payloads[msg.fn_id] = msg.payload
        elif code == m.Forget.CODE:
            _forget(msg.names)
        elif code == m.Shutdown.CODE:
            self.flush()
            raise SystemExit(0)
        elif self.client is not None and self.client.handle(msg):
            pass
        else:
            from dpool.errors import ProtocolError

            raise ProtocolError(f"worker got unexpected message {type(msg).__name__}")

    def receive(self) -> None:
        """Block until at least one message arrives; handle what came."""
        if self.lease is not None:
            self.lease.receive()
            return
        if self.client is not None and self.client.receiving:
            for msg in self.client.next_messages():
                self.handle(msg)
            return
        if self.spin:  # the last task was short: its caller may send the next at once
            self.spin = False
            _spin_for_input(self.chan.fileno)  # (nothing came: block below)
        for frame in self.chan.recv_frames():
            for msg in decode_batch(frame):
                self.handle(msg)

    def flush(self) -> None:
        if self.results:
            batch, self.results = self.results, []
            if self.output is not None:  # what the tasks printed goes first
                batch = self.output.drain() + batch
            if self.client is not None:
                batch += self.client.take_releases()  # handles the task dropped
            self.send(batch)

    # -- tasks ---------------------------------------------------------------------------
    def function(self, fn_id: int) -> Callable[..., Any]:
        fn = self.fns.get(fn_id)
        if fn is None:
            fn = _payload.loads(self.fn_payloads[fn_id])  # kept if it fails: the next call
            self.fns[fn_id] = fn  # fails the same way
            del self.fn_payloads[fn_id]
        return fn

    def execute(self, task: m.ExecuteTask) -> None:
        running = self.running
        if running is not None:
            running(task.task_id)  # from here, this worker's death is this task's
        done = self.outcome(task)
        if running is not None:
            running(0)  # its result may wait in ``results``: the task is done
        self.done_count += 1
        lease = self.lease
        if lease is not None and task.task_id in lease.tasks:
            lease.send_done(done)  # straight back to the driver it is lent to
            return
        if not self.results:
            self.first_result_t = time.perf_counter()
        self.results.append(done)

    def outcome(self, task: m.ExecuteTask) -> m.TaskDone:
        """Run ``task``; its outcome, as the message that reports it."""
        t0 = time.perf_counter()
        try:
            try:
                fn = self.function(task.fn_id)
                if task.args is None:
                    args, kwargs = (), {}
                else:
                    args, kwargs = _payload.loads(task.args)
            except BaseException as exc:  # noqa: BLE001 - SystemExit too (BrokenProcessPool)
                raise errors.DeserializationError.wrap(
                    "the call's function or arguments in the worker", exc) from exc
            if task.deps:
                args, kwargs = _payload.resolve_inputs(args, kwargs, task.deps)
            t0 = time.perf_counter()
            value = fn(*args, **kwargs)
            dt = time.perf_counter() - t0
            try:
                done = m.TaskDone(task.task_id, True, _payload.dumps_value(
                    value, task.task_id, self.cfg.parent_pid), dt)
            except BaseException as exc:  # the result does not pickle: the stdlib reports it
                done = m.TaskDone(task.task_id, False, _payload.dumps_error(exc), dt)
            del value
        except BaseException as exc:  # noqa: BLE001 - user code may raise anything, as in the stdlib
            done = m.TaskDone(task.task_id, False, _payload.dumps_error(exc),
                              time.perf_counter() - t0)
        return done

    def run_concurrently(self, threads: int) -> None:
        """From now on, run up to ``threads`` tasks at once, on threads of their own,
        each result sent as its task ends (an actor's ``max_concurrency``)."""
        from concurrent.futures import ThreadPoolExecutor

        self.threads = ThreadPoolExecutor(threads, thread_name_prefix="dpool-call")

    def _execute_on_thread(self, task: m.ExecuteTask) -> None:
        done = self.outcome(task)
        try:
            self.send([done])
        except ChannelClosed:
            pass  # the scheduler is gone: the watchdog ends the process

    def run(self) -> None:
        if self.cfg.initializer is not None:
            try:
                init, initargs = _payload.loads(self.cfg.initializer)
                init(*(initargs if initargs is not None else self.inherited or ()))
            except BaseException as exc:  # noqa: BLE001
                log.error("worker %d: initializer failed", self.cfg.worker_id, exc_info=True)
                self.send([m.InitFailed(_payload.dumps_error(exc))])
                return
        # Ready: the scheduler charges a task an attempt for this worker's death only
        # from here on (a worker that dies while starting ran nothing it was sent)
        self.send([m.Hello(PROTOCOL_VERSION, self.cfg.worker_id, os.getpid())])
        if self.lease is not None:
            self.lease.ready()
        max_tasks = self.cfg.max_tasks
        max_memory = self.cfg.max_memory
        pending = self.pending
        while True:
            if not pending:
                self.flush()
                self.receive()
                continue
            if self.threads is not None:
                task = pending.popleft()
                try:
                    self.function(task.fn_id)  # (loaded here, once: not by two threads)
                except BaseException:  # noqa: BLE001, S110 - its thread reports it
                    pass
                self.threads.submit(self._execute_on_thread, task)
                continue
            self.execute(pending.popleft())
            if self.after_task is not None:
                self.after_task(self)
            if max_tasks is not None and self.done_count >= max_tasks:
                self.flush()
                return
            if max_memory and _resident() > max_memory:
                self.retire()  # (until the scheduler's Shutdown)
                return
            results = self.results
            if not results:
                continue  # a leased task's result went to its driver already
            if not pending and len(results) == 1 \
                    and results[0].duration < _SPIN_AFTER_TASK_S:
                self.spin = _SPIN  # (one short task, alone: a caller waiting on each)
            if (
                not pending
                or results[-1].duration > _FLUSH_AFTER_TASK_S
                or len(results) >= _FLUSH_COUNT
                or time.perf_counter() - self.first_result_t > _FLUSH_AGE_S
            ):
                self.flush()


    def retire(self) -> None:
        """Past ``max_memory_per_worker`` after a task: send the results, hand back every
        task not started (and each that arrives after), until the scheduler's
        ``Shutdown`` (a new worker takes this one's place)."""
        self.flush()
        while True:
            pending = self.pending
            self.send([m.ReturnTasks(tuple(t.task_id for t in pending), True)])
            pending.clear()
            while not pending:
                self.receive()  # (``Shutdown`` ends the process here)


_pollers: dict = {}  # fd -> its select.poll (a worker reads one socket)


def _spin_for_input(fd: int) -> bool:
    """Poll ``fd`` without sleeping for up to ``_SPIN_S``; whether input came."""
    poller = _pollers.get(fd)
    if poller is None:
        import select

        poller = _pollers[fd] = select.poll()
        poller.register(fd, select.POLLIN)
    poll, now = poller.poll, time.perf_counter
    end = now() + _SPIN_S
    while now() < end:
        if poll(0):
            return True
    return False


def _resident() -> int:
    """This process's resident memory in bytes (one ``pread`` of ``/proc/self/statm``,
    opened once: after every task of a worker with ``max_memory_per_worker``)."""
    global _statm
    pid = os.getpid()
    if _statm[0] != pid:  # (a process forked from this one opens its own)
        _statm = (pid, os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
    return int(os.pread(_statm[1], 128, 0).split()[1]) * _PAGE


_PAGE = os.sysconf("SC_PAGE_SIZE")
_statm = (0, -1)  # (pid, descriptor): /proc/self names the process that opened it


def _client_of(worker: _Worker) -> Any:
    """The runtime API of the task code of this worker, made when a task first submits,
    waits or puts (most never do: its module is not imported before)."""
    from dpool.worker._client import WorkerClient

    return WorkerClient(worker)


def worker_entry(sock: Any, cfg: WorkerConfig, lease: Any = None,
                 initargs: Optional[tuple] = None) -> None:
    """Process target: set up like the driver, connect, serve until told to stop."""
    if cfg.env:
        # First of all: CUDA reads CUDA_VISIBLE_DEVICES once, when first used, so the
        # worker's GPUs must be set before any code of the user's runs (initializer too).
        os.environ.update(cfg.env)
    # A forked worker inherits the driver's other sockets. They are not closed here: the
    # inherited Python objects still own those fd numbers, and closing them by number
    # would let a later close() of a reused fd hit the wrong file. Orphan-safety comes
    # from the parent watchdog instead.
    if cfg.cwd:
        try:
            os.chdir(cfg.cwd)
        except OSError:
            pass
    for p in reversed(cfg.sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    from dpool.objects import mainref as _mainref
    from dpool.runtime import current as _current

    _current.enter_worker(cfg)
    from dpool.scheduling import resources as _resources

    # A function pickled by value keeps its @dpool.resources, but its module's decorator
    # never ran here: nested submits look for requests on every function.
    _resources.decorated = True
    _mainref.set_worker_namespace()  # the script's globals, shared by its functions here
    from dpool.objects import values as _values

    _values.set_capacity_limit(cfg.store_capacity)
    _watchdog.start(cfg.parent_pid)
    chan = Channel(sock, blocking=True)
    output = None
    if cfg.capture_output:  # a node daemon's worker: its output goes to the driver
        from dpool.worker._output import OutputForwarder

        output = OutputForwarder(chan)
    worker = _Worker(chan, cfg)
    worker.output = output
    worker.inherited = initargs
    if lease is not None:
        from dpool.worker._lease import LeaseLink

        worker.lease = LeaseLink(worker, lease)
    _current.set_worker(worker, _client_of)
    try:
        worker.run()
    except ChannelClosed:
        _watchdog.connection_lost()  # if the driver died: remove what it left
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        try:
            worker.flush()
        except Exception:  # noqa: BLE001 - the scheduler may be gone already
            pass
        _current.run_worker_exits()
        if output is not None:
            output.stop()
        chan.close()
