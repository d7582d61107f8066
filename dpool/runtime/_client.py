"""The interface between the public API and this process's runtime: ``Client``, ``Driver``.

    executor / Pool / dpool.wait,get,put ──▶ Client ◀── WorkerClient (inside a task)
                                              ▲
                                           Driver ◀── DriverRuntime (embedded)
                                                  ◀── ClusterRuntime (attached to a node)

``Client`` is what futures, ``dpool.wait``/``get``/``put`` and an executor's ``submit``
call: every process that runs user code has one (``_current.client()``). ``Driver`` adds
what only a driver does: own worker groups (one per executor or Pool) and the settings of
its runtime. The public API calls nothing else of the runtime; it never sees a scheduler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, TypeVar

from dpool._task_future import FutureClient

if TYPE_CHECKING:
    from dpool._task_future import ObjectRef, TaskFuture
    from dpool.runtime._functions import FunctionTable
    from dpool.scheduling import WorkerGroupConfig, resources

T = TypeVar("T")


class WorkerGroup(Protocol):
    """A driver's worker group, as an executor reads it (the scheduler's or the node's)."""

    broken: Optional[str]  # why it cannot run tasks (None while it can)
    workers: list  # its worker records (``.process``, ``.pid``); the node's are not here
    max_tasks: Optional[int]  # tasks per worker before it is replaced (None: no limit)


class Client(FutureClient, Protocol):
    """This process's runtime, as user code reaches it: submit, put, get, release."""

    gives_back_slot: bool  # True in a worker: waiting hands its CPU slot back
    owner_pid: int  # the pid that names the shared-memory segments this process writes
    functions: FunctionTable  # functions pickled once, by id

    def new_id(self) -> int:
        """A fresh object id (a task's result, a put value, a function)."""

    def submit(self, group: Any, fn: Callable[..., Any], args: tuple, kwargs: dict,
               req: Optional[resources.Request], future_type: type[TaskFuture]) -> TaskFuture:
        """Run ``fn(*args, **kwargs)`` in ``group`` (a driver's ``WorkerGroup``; inside a task,
        the id of the group running it), asking ``req`` (a resource request) if not None.
        The future is a ``future_type`` (``dpool.futures.Future`` for an executor, the
        plain ``TaskFuture`` for a ``Pool``), except where the client needs its own kind
        (a cluster driver's, which also cancels on the node: always a ``Future``)."""

    def put(self, value: Any) -> ObjectRef:
        """Store ``value`` once; the ref holds it alive."""

    def future_for(self, ref: ObjectRef) -> TaskFuture:
        """A future that gets ``ref``'s value."""

    def release(self, object_id: int) -> None:
        """Drop one handle of the object (from ``__del__``: takes no lock)."""

    def actor_route(self, group_id: int, node: str, name: str) -> None:
        """Before the first call of an actor that cluster node ``node`` hosts, through a
        handle that came from elsewhere: this process's node (if any) learns where its
        calls go."""

    def find_actor(self, name: str) -> Optional[tuple]:
        """The live actor named ``name``: (group id, label, methods, node), or None."""

    def kill_actor(self, group_id: int, node: str, reason: str) -> None:
        """End the actor of group ``group_id`` (hosted by ``node``) for ``reason``."""

    def lead(self, future: TaskFuture, timeout: Optional[float]) -> Optional[float]:
        """Wait a while for ``future`` by reading its result on this thread (where the
        runtime can); what is left of ``timeout``."""

    def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (a wait); in a worker, with its slot given back meanwhile."""


class Driver(Client, Protocol):
    """A driver's runtime (embedded or attached to a node): it also owns worker groups.

    A group is passed back as the handle ``add_group`` returned, of the runtime's own type
    (the scheduler's ``WorkerGroup``, a cluster driver's ``RemoteGroup``): typed ``Any``
    in the methods below, as each runtime takes only its own."""

    pid: int  # the process it was started in (a fork starts its own)
    stops_running_tasks: bool  # ``cancel(force=True)``, ``shutdown(cancel_running=True)``

    def add_group(self, cfg: WorkerGroupConfig, executor: object) -> WorkerGroup:
        """A new worker group for ``executor`` (as ``cfg``, a ``scheduling.WorkerGroupConfig``,
        says); the executor is shut down when the driver closes. The calls below take the
        group this returned."""

    def name_actor(self, name: str, record: tuple) -> None:
        """Give the actor ``record`` (group id, label, methods, node) ``name`` where every
        driver finds it; ``ValueError`` if a live actor has it."""

    def foreign_actor(self, group_id: int, label: str, node: str) -> Any:
        """What this driver submits the calls of another driver's actor to (on a
        cluster: a group record of its own for it, ``node`` hosts the actor)."""

    def group_of(self, group_id: int) -> Any:
        """The group ``add_group`` made with this id, while this runtime knows it (None
        after, and for another driver's)."""

    def start_workers(self, group: Any, n: int) -> None:
        """Have ``n`` of ``group``'s workers running on this host (at most its
        ``max_workers``; on a cluster, where the nodes run them, nothing)."""

    def fork_point(self) -> None:
        """About to start a thread: fork what forks the workers now, if it is not yet
        (``LocalScheduler.fork_point``)."""

    def close_group_soon(self, group: Any) -> None:
        """Close ``group`` once it is idle (from a finalizer: takes no lock)."""

    def close_group(self, group: Any) -> None:
        """No more tasks for ``group``; its workers exit once its tasks are done."""

    def cancel_queued(self, group: Any) -> None:
        """Cancel the futures of ``group``'s tasks not yet started."""

    def cancel_running(self, task_id: int, recursive: bool) -> bool:
        """Stop a started task (its future is cancelled already): its worker is killed
        and replaced; with ``recursive``, the tasks it submitted are cancelled too."""

    def cancel_group_running(self, group: Any) -> list:
        """Stop every running task of ``group``; returns their futures (to cancel)."""

    def wait_group_exited(self, group: Any) -> None:
        """Until ``group``'s tasks are done and its workers have exited."""

    def terminate_group(self, group: Any, reason: str) -> None:
        """Kill ``group``'s workers now; its unfinished futures fail with ``reason``."""

    def is_io_thread(self) -> bool:
        """Whether this thread is the runtime's own (a done-callback runs there)."""

    def estimate(self, fn_id: int, default: Any = ...) -> Any:
        """Measured run time of one call of function ``fn_id`` (``default`` if never
        measured)."""

    def set_store_capacity(self, capacity: int) -> None:
        """Bytes the host's object store may hold (``object_store_memory``)."""

    def set_resource_offer(self, spec: Optional[dict]) -> None:
        """What the runtime offers every executor (``runtime_resources``, as
        ``scheduling._resources.spec`` gives it); None: detect."""

    def reserve_placement_group(self, pg_id: int, bundles: list, strategy: str,
                                on_state: Callable[[str, tuple, str], None]) -> None:
        """Reserve the bundles (``Request``s) of placement group ``pg_id``, all or none;
        ``on_state(state, nodes, reason)`` is called (on any thread) with "ready" and
        the node of each bundle, "failed" (it can never be reserved) or "lost"."""

    def remove_placement_group(self, pg_id: int) -> None:
        """Free placement group ``pg_id``'s bundles (or stop waiting for them)."""

    def close(self) -> None:
        """End of the driver: shut its executors down (as the stdlib does at exit)."""
