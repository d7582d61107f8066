"""The local scheduler's records: ``Task``, ``ObjectEntry``, ``WorkerHandle``, ``WorkerGroup``
and the ``WorkerGroupConfig`` a group is made from.

Plain data, read and written under the scheduler's lock (the node's services too:
``SchedulerAPI``). A task's ``state`` moves only as ``_states.TRANSITIONS`` allows
(``transition``, or the same table lookup inline on the hot path); a worker's only through
its ``mark_*`` methods (``_states.WORKER_TRANSITIONS``).
"""

from __future__ import annotations

from collections import deque

from dpool.protocol import Channel, field, record
from dpool.scheduling._limits import NO_LIMITS
from dpool.scheduling._states import (
    CLOSED,
    HELLO,
    NEW,
    STOP,
    W_READY,
    W_STARTING,
    W_STOPPING,
    worker_transition,
)

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Optional

    from dpool.scheduling._actors import ActorConfig
    from dpool.scheduling._resources import Allocation, Request


class Task:
    """A task the local scheduler has accepted and not yet finished."""

    __slots__ = ("task_id", "fn_id", "args", "dep_ids", "group", "owner", "future",
                 "attempts", "started", "missing", "deps", "estimate_s", "deps_counted", "req",
                 "alloc", "bounced", "state", "timeout", "retry_timeout")

    def __init__(self, task_id: int, fn_id: int, args: Optional[bytes],
                 dep_ids: Optional[tuple], group: "WorkerGroup", owner: Optional["WorkerHandle"],
                 future: Any) -> None:
        self.task_id = task_id
        self.fn_id = fn_id
        self.args = args
        self.dep_ids = dep_ids
        self.group = group
        self.owner = owner  # None: the driver in this process; else the submitting worker
        self.future = future  # driver-side Future, or None
        self.attempts = 0
        self.started = False  # future moved to RUNNING (done once, at first dispatch)
        self.missing = 0  # dependencies not ready yet
        self.deps: Optional[tuple] = None  # (oid, ok, payload) once all are ready
        self.estimate_s = 0.0  # estimated run time, set when dispatched
        self.deps_counted = False  # holds a reference on each of dep_ids (released at finish)
        self.req: Optional[Request] = None  # None: one CPU, nothing else (the default)
        self.alloc: Optional[Allocation] = None  # while it holds resources (running)
        self.bounced = 0  # times a worker holding it first died running no task
        self.state = NEW  # ``_states``: where it is (waiting, queued, running, ...)
        self.timeout = 0.0  # its own timeout (``options(timeout=)``, ``_limits``); 0: none
        self.retry_timeout = False


class ObjectEntry:
    """An object table entry (the value of a task's result or of a put)."""

    __slots__ = ("ready", "ok", "payload", "refs", "waiters")

    def __init__(self) -> None:
        self.ready = False
        self.ok = True
        self.payload: Optional[bytes] = None
        self.refs = 0  # handles (owner future, worker refs) + pending tasks that need it
        self.waiters: Optional[list] = None  # Tasks or callables waiting for readiness

    def add_waiter(self, waiter: Any) -> None:
        if self.waiters is None:
            self.waiters = []
        self.waiters.append(waiter)


class WorkerHandle:
    """A worker process of a group, or a connection handled like one (an attached
    driver, a peer node). Its lifecycle is ``state`` (``_states``: starting, ready,
    stopping, dead), moved only by the ``mark_*`` methods."""

    __slots__ = ("worker_id", "group", "process", "chan", "inflight", "load", "blocked",
                 "functions", "assigned", "retiring", "pid", "state", "alive", "owned",
                 "fenced", "gpus", "sees", "extra_cpus", "leased", "killed_here", "slot", "fate", "oom_base")
    remote_values = False  # an attached driver (``_attach.DriverHandle``) says True

    def __init__(self, worker_id: int, group: "WorkerGroup", process: Any, chan: Channel) -> None:
        self.worker_id = worker_id
        self.group = group
        self.process = process
        self.chan = chan
        self.inflight: dict[int, Task] = {}
        self.load = 0.0  # estimated seconds of work in `inflight`
        self.blocked = False
        self.functions: set[int] = set()
        self.assigned = 0  # tasks ever sent (for max_tasks_per_child)
        self.retiring = False  # will exit after its in-flight tasks (max_tasks reached)
        self.pid = getattr(process, "pid", None)
        self.state = W_STARTING
        # It takes tasks: starting or ready (``state`` below stopping). Kept beside the
        # state, written only by ``mark_stopping``/``mark_closed``: read in every dispatch.
        self.alive = True
        self.owned: set[int] = set()  # objects this worker holds a handle to (nested futures, puts)
        # Resources (``_resource_dispatch``): a fenced worker takes no task without a resource
        # request -- it is bound to GPUs (``gpus``: device indexes, for good), runs a task
        # that holds resources, or can see a GPU another task holds (``sees``: the
        # devices visible to it; None: all of them, as the stdlib's workers).
        self.fenced = False
        self.gpus: Optional[tuple] = None
        self.sees: Optional[frozenset] = None
        self.extra_cpus = 0  # CPUs beyond one that its running task holds (num_cpus - 1)
        # the attached driver this worker is lent to (cluster mode): it sends the tasks;
        # the node's dispatch leaves the worker alone and counts it busy until it ends
        self.leased: Any = None
        self.killed_here = False  # SIGKILLed by ``_exits.reap``, not from outside
        self.slot = -1  # where it says which task it runs (``protocol._running``); -1: none
        # killed by ``_limits``: (task id, the error it fails with, whether it runs again)
        self.fate: Optional[tuple] = None
        self.oom_base = 0  # the kernel's OOM kill count when it started (``_limits``)

    @property
    def ready(self) -> bool:
        """It said Hello (its initializer ran) and was not told to stop since."""
        return self.state == W_READY

    def mark_ready(self) -> None:
        """It said Hello (a Hello that crosses an order to stop changes nothing)."""
        worker_transition(self, HELLO)

    def mark_stopping(self) -> bool:
        """It is told to exit, or its connection is being closed here: it takes no more
        tasks. False if it was not taking any already (stopping, or dead)."""
        if self.state >= W_STOPPING:
            return False
        worker_transition(self, STOP)
        self.alive = False
        return True

    def mark_closed(self) -> int:
        """Its connection closed (the process exited or died): dead. Returns the state
        it left (starting: it died before its Hello). Once only."""
        left = worker_transition(self, CLOSED)
        self.alive = False
        return left


@record(init=False)  # (its own ``__init__``, below: no compiling at run time)
class WorkerGroup:
    """The workers of one executor (or Pool): its own size, initializer and limits."""

    group_id: int
    max_workers: int
    mp_context: Any
    initializer: Optional[bytes]
    max_tasks: Optional[int]
    max_attempts: int
    workers: list = field(default_factory=list)
    queue: deque = field(default_factory=deque)
    outstanding: int = 0  # accepted, not yet finished
    n_blocked: int = 0  # workers blocked in a nested wait (their slots are given back)
    closed: bool = False  # no more submissions
    broken: Optional[str] = None  # why the group cannot run tasks (initializer failed)
    on_idle: list = field(default_factory=list)  # callables run when outstanding hits 0
    cwd: Optional[str] = None  # workers' directory and sys.path (default: this process's)
    sys_path: Optional[list] = None
    owner: Any = None  # the attached driver whose group this is (cluster mode)
    workdir: tuple = ()  # (digest, driver's directory) of the driver's shipped code
    # initargs given to each worker's Process (``WorkerGroupConfig``)
    inherited: Optional[tuple] = None
    # Resources (``_resource_dispatch``): tasks with a request wait in ``by_request`` until
    # what they need is free; ``extra`` is the CPUs their running tasks hold beyond one
    # worker each, ``n_fenced`` the workers that take no task without a request.
    by_request: dict = field(default_factory=dict)  # Request -> deque of tasks asking it
    extra: int = 0
    n_fenced: int = 0
    starved: bool = False  # a task in ``by_request`` waits for CPUs or a worker slot only
    # workers that died by themselves before saying Hello since one last did
    # (``_workers._died_starting_locked``: at a limit the group breaks)
    start_failures: int = 0
    actor: Any = None  # an actor's group: its ``_actors.ActorState`` (one worker)
    limits: Any = NO_LIMITS  # its ``_limits.GroupLimits`` (task_timeout=, ...)
    watch: bool = False  # its workers are watched (``_limits``): it has limits, or had a
    # task with a timeout

    def __init__(self, group_id: int, max_workers: int, mp_context: Any,
                 initializer: Optional[bytes], max_tasks: Optional[int],
                 max_attempts: int) -> None:
        self.group_id = group_id
        self.max_workers = max_workers
        self.mp_context = mp_context
        self.initializer = initializer
        self.max_tasks = max_tasks
        self.max_attempts = max_attempts
        self.workers = []
        self.queue = deque()
        self.outstanding = 0
        self.n_blocked = 0
        self.closed = False
        self.broken = None
        self.on_idle = []
        self.cwd = None
        self.sys_path = None
        self.owner = None
        self.workdir = ()
        self.inherited = None
        self.by_request = {}
        self.extra = 0
        self.n_fenced = 0
        self.starved = False
        self.start_failures = 0
        self.actor = None
        self.limits = NO_LIMITS
        self.watch = False


@record
class WorkerGroupConfig:
    """How to make a worker group (``LocalScheduler.add_group``): an executor's, a
    Pool's or an actor's settings."""


    max_workers: int
    mp_context: Any
    initializer: Optional[bytes] = None
    max_tasks: Optional[int] = None
    max_attempts: int = 3
    working_dir: Optional[str] = None  # cluster mode: the directory shipped to the nodes
    # ``initargs`` that only process creation may hand over (a multiprocessing Lock,
    # Queue, Value...): given to every worker as an argument of its Process, as the
    # stdlib does; ``initializer`` then carries ``(fn, None)``.
    inherited: Optional[tuple] = None
    actor: Optional[ActorConfig] = None  # an actor's group (``_actors``): one worker
    limits: Optional[tuple] = None  # its ``_limits.GroupLimits`` (task_timeout=, ...)
