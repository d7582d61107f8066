"""What a worker process is told when it starts (picklable, for spawn-style starts), and
how it is started: by the name of its entry module (``WORKER_ENTRY``), so the scheduler
that starts workers never imports worker code (the worker imports the runtime, which
imports the scheduler: importing the worker from the scheduler made a cycle)."""

from __future__ import annotations

from dpool.protocol._record import field, record

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Optional


@record(slots=True, init=False)  # (its own ``__init__``, below: no compiling at run time)
class WorkerConfig:
    worker_id: int
    group_id: int
    parent_pid: int
    initializer: Optional[bytes] = None  # cloudpickled (initializer, initargs)
    max_tasks: Optional[int] = None
    cwd: str = ""
    sys_path: list = field(default_factory=list)
    store_capacity: Optional[int] = None
    capture_output: bool = False  # on a node daemon: stdout/stderr go to the task's driver
    id_base: int = 0  # first id of the worker's own (cluster-unique on a node); 0: per host
    env: Optional[dict] = None  # set before anything else runs (CUDA_VISIBLE_DEVICES)
    gpu_ids: tuple = ()  # the GPUs it is bound to, as CUDA_VISIBLE_DEVICES names them
    slot: int = -1  # its slot on the board of running tasks (``_running``); -1: none
    max_memory: int = 0  # bytes of resident memory after a task that retire it; 0: none

    def __init__(self, worker_id: int, group_id: int, parent_pid: int,
                 initializer: Optional[bytes] = None, max_tasks: Optional[int] = None,
                 cwd: str = "", sys_path: Optional[list] = None,
                 store_capacity: Optional[int] = None, capture_output: bool = False,
                 id_base: int = 0, env: Optional[dict] = None, gpu_ids: tuple = (),
                 slot: int = -1, max_memory: int = 0) -> None:
        self.worker_id = worker_id
        self.group_id = group_id
        self.parent_pid = parent_pid
        self.initializer = initializer
        self.max_tasks = max_tasks
        self.cwd = cwd
        self.sys_path = [] if sys_path is None else sys_path
        self.store_capacity = store_capacity
        self.capture_output = capture_output
        self.id_base = id_base
        self.env = env
        self.gpu_ids = gpu_ids
        self.slot = slot
        self.max_memory = max_memory


WORKER_ENTRY = "dpool.worker._main"


def preload_worker() -> None:
    """Import the worker's code in this process, before it forks workers: each forked
    child then finds it loaded. Importing it in the child cost the first task ~2.5 ms
    (each page the import writes is copied after a fork) where importing it here costs
    ~0.5 ms, once."""
    import importlib

    importlib.import_module(WORKER_ENTRY)


def start_worker(sock: object, cfg: WorkerConfig, lease: object = None,
                 initargs: object = None) -> None:
    """A worker process's target: import the worker by name, run it. ``lease``: the
    connection of a driver this worker is lent to (``scheduling._workers``), if any;
    ``initargs``: the initializer's arguments when only process creation may hand them
    over (multiprocessing's synchronization objects), else None."""
    import importlib

    importlib.import_module(WORKER_ENTRY).worker_entry(sock, cfg, lease, initargs)
