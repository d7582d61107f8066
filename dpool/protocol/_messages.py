"""Typed messages of the dpool wire protocol (version in ``_codec.PROTOCOL_VERSION``).

Direction is noted on each class: S = local scheduler, W = worker, D = a driver attached
to a node daemon (cluster mode; it speaks the worker's messages for submitting, getting,
putting and releasing, plus its group messages in ``_messages_cluster``). Payloads
are opaque ``bytes`` produced by ``dpool.objects`` serialization; ids are ints (object
id == id of the task that produces it). Keep fields positional and append-only: the codec
sends them as a tuple in declaration order, so reordering a field is a protocol version
bump.

The cluster's own messages (nodes and global schedulers: peer handshakes, load reports,
spilled tasks, transfers, placement groups; an attached driver's groups and worker
leases) are in ``_messages_cluster``; they are re-exported here, so ``m.Load`` names
one as before, and ``ALL_MESSAGES`` holds both. That module loads on first use of one of
its names (a program on the embedded runtime sends none): ``EMBEDDED_MESSAGES`` are this
module's own.
"""

from __future__ import annotations

from dpool.protocol._record import Slotted

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import ClassVar, Optional

    from dpool.protocol._messages_cluster import *  # noqa: F403 - re-exported: m.Load...
    from dpool.protocol._messages_cluster import CLUSTER_MESSAGES  # noqa: F401

    ALL_MESSAGES: tuple[type, ...]

# A dependency value shipped with a task: (object id, ok, payload). ok=False means the
# payload is a serialized exception the task must fail with instead of running.
DepValue = tuple  # (int, bool, bytes)


class Hello(Slotted):
    """W->S who the worker is; sent once its initializer ran (it is ready: a task it
    was sent is charged an attempt for its death only from here on)."""

    CODE: ClassVar[int] = 1
    version: int
    worker_id: int
    pid: int


class InitFailed(Slotted):
    """W->S the initializer raised; the worker exits after sending this."""

    CODE: ClassVar[int] = 2
    error: bytes  # serialized (exception, traceback text)


class RegisterFunction(Slotted):
    """S->W (or W->S for functions first seen in a worker): function table entry."""

    CODE: ClassVar[int] = 3
    fn_id: int
    payload: bytes


class ExecuteTask(Slotted):
    """S->W run a task. ``args`` is None for a call without arguments."""

    CODE: ClassVar[int] = 4
    task_id: int
    fn_id: int
    args: Optional[bytes]
    deps: Optional[tuple]  # tuple[DepValue, ...] for top-level ObjectRef/Future arguments


class TaskDone(Slotted):
    """W->S a task finished. ok=False: payload is a serialized (exception, traceback)."""

    CODE: ClassVar[int] = 5
    task_id: int
    ok: bool
    payload: bytes
    duration: float  # seconds spent in the user function


class SubmitTask(Slotted):
    """W->S a task submitted from inside a task (dynamic task graph)."""

    CODE: ClassVar[int] = 6
    task_id: int
    fn_id: int
    args: Optional[bytes]
    dep_ids: Optional[tuple]  # object ids of top-level ref arguments
    group_id: int
    req: Optional[tuple] = None  # its resource request (``_resources.to_wire``); None: 1 CPU


class Blocked(Slotted):
    """W->S the running task waits on other tasks: give its CPU slot back.

    ``returned`` lists tasks the worker had received but not started; the scheduler
    queues them again (otherwise they could wait behind the blocked task forever).
    """

    CODE: ClassVar[int] = 7
    returned: tuple


class Unblocked(Slotted):
    """W->S the waiting task resumed; its slot is taken again."""

    CODE: ClassVar[int] = 8


class ReturnTasks(Slotted):
    """W->S tasks that arrived while the worker was blocked, handed back unstarted; with
    ``retire``, the worker went past its memory limit and hands back all it holds (then
    waits for ``Shutdown``)."""

    CODE: ClassVar[int] = 9
    task_ids: tuple
    retire: bool = False


class GetObjects(Slotted):
    """W->S send me these objects' values when they are ready."""

    CODE: ClassVar[int] = 10
    object_ids: tuple


class ObjectValue(Slotted):
    """S->W an object's value (result of a task the worker owns, or one it asked for)."""

    CODE: ClassVar[int] = 11
    object_id: int
    ok: bool
    payload: bytes


class Release(Slotted):
    """W->S the worker dropped its last handle to these objects."""

    CODE: ClassVar[int] = 12
    object_ids: tuple


class Shutdown(Slotted):
    """S->W finish nothing more; exit now."""

    CODE: ClassVar[int] = 13


class PutObject(Slotted):
    """W->S store this value under this id (``dpool.put`` inside a task)."""

    CODE: ClassVar[int] = 14
    object_id: int
    payload: bytes


class Forget(Slotted):
    """S->W these large segments were freed: unmap any cached mapping of them."""

    CODE: ClassVar[int] = 15
    names: tuple


class ActorCheckpoint(Slotted):
    """W->S an actor's state after the calls whose results this worker sent before this
    message (``state``: the pickled instance); a restart starts from it and replays only
    the calls after it."""

    CODE: ClassVar[int] = 38
    state: bytes


class ActorRoute(Slotted):
    """W->S, D->N the actor of group ``group_id`` (named ``name``) lives on node
    ``node``: this node's calls of it go there (``node._actor_calls``). Sent before the
    first call through a handle that came from elsewhere; ignored by the hosting node.
    An embedded runtime (an executor made inside a task) cannot reach it: its calls
    fail there (``LocalScheduler._on_actor_route_locked``)."""

    CODE: ClassVar[int] = 39
    group_id: int
    node: str
    name: str


class ActorFind(Slotted):
    """W->S, D->N which live actor is named ``name`` (``dpool.get_actor``)? Answered with
    ``ObjectValue(request_id)``: ``(group id, label, methods, node)``, or None."""

    CODE: ClassVar[int] = 40
    request_id: int
    name: str


class KillActor(Slotted):
    """W->S, D->N, N->N end the actor of group ``group_id`` now (``dpool.kill``) for
    ``reason``; a node that does not host it passes it on to ``node``, which does."""

    CODE: ClassVar[int] = 41
    group_id: int
    node: str
    reason: str


class KVPut(Slotted):
    """W->S, D->N set ``key`` to ``value`` in the runtime's (a node's: the cluster's)
    small key-value table, for ``ttl_s`` seconds (the rendezvous of collective groups,
    ``dpool.collective``). Answered with ``ObjectValue(request_id)``: None."""

    CODE: ClassVar[int] = 42
    request_id: int
    key: str
    value: bytes
    ttl_s: float


class KVGet(Slotted):
    """W->S, D->N the value of ``key`` in that table? Answered with
    ``ObjectValue(request_id)``: the bytes, or None."""

    CODE: ClassVar[int] = 43
    request_id: int
    key: str


class Output(Slotted):
    """W->S what a worker wrote to its stdout (1) or stderr (2); S->D and N->N the same,
    on its way to the driver whose task it ran: the group (the driver's id), the worker's
    pid and its node (empty for the driver's own node)."""

    CODE: ClassVar[int] = 32
    group_id: int
    pid: int
    node: str
    stream: int
    data: bytes


EMBEDDED_MESSAGES = (
    Hello,
    InitFailed,
    RegisterFunction,
    ExecuteTask,
    TaskDone,
    SubmitTask,
    Blocked,
    Unblocked,
    ReturnTasks,
    GetObjects,
    ObjectValue,
    Release,
    Shutdown,
    PutObject,
    Forget,
    Output,
    ActorCheckpoint,
    ActorRoute,
    ActorFind,
    KillActor,
    KVPut,
    KVGet,
)


def __getattr__(name: str) -> object:
    """The cluster's messages (``m.Load``...) and ``ALL_MESSAGES``, on first use."""
    from dpool.protocol import _messages_cluster as cluster

    if name == "ALL_MESSAGES":
        value: object = EMBEDDED_MESSAGES + cluster.CLUSTER_MESSAGES
    elif name in cluster.__all__:
        value = getattr(cluster, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # looked up once
    return value
