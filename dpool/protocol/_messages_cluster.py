"""The cluster's messages: between nodes (N), global schedulers (G) and the nodes' spill
and transfer services -- peer handshakes, load reports, spilled tasks and their results,
object transfers, placement groups, the stranded-task safety net -- and those of a driver
attached to a node (D: its groups, status, worker leases). The local scheduler's and its
workers' messages are in ``_messages``, which re-exports these (``m.Load``) and loads
this module when one is first used; the same rules hold: fields positional and
append-only, one ``CODE`` per class.
"""

from __future__ import annotations

from dpool.protocol._record import Slotted

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import ClassVar, Optional


class PeerHello(Slotted):
    """N->N, N->G first frame after the handshake from another node (or from a node to a
    global scheduler): who it is, where it listens, what it offers."""

    CODE: ClassVar[int] = 25
    version: int
    node_id: str
    address: str
    num_cpus: int


class PeerWelcome(Slotted):
    """N->N, G->N answer to ``PeerHello``: the answering process's id and the cluster's
    description as JSON (Redis shards, global schedulers)."""

    CODE: ClassVar[int] = 26
    peer_id: str
    info: str


class Load(Slotted):
    """N->G the node's load, pushed when it changes (at least every 5 s, and at once to a
    scheduler newly linked): placement uses the freshest."""

    CODE: ClassVar[int] = 27
    queued: int
    busy: int
    num_cpus: int
    avg_task_s: float
    holds: tuple  # ("holder address|segment name", ...): inputs it has copies of now
    resources: tuple = ()  # ((name, total, free), ...): its GPUs, memory, custom ones
    # the tasks it had got over this link when it counted the rest (-1: not counted): the
    # scheduler's placements past that are not in this report yet
    received: int = -1


class RemoteTask(Slotted):
    """N->G a task spilled by its node (``origin``); G->N the same task placed on a node.

    Self-contained: the function's pickle, the arguments and the dependency values travel
    inline, with the configuration of the group (executor) it belongs to:
    ``group_cfg`` = (max_workers, start_method, initializer, max_tasks, max_attempts).
    N->N a call of an actor the receiving node hosts (``group_cfg`` is ``()``; the group
    is the actor's own), sent by a node whose worker or driver made it."""

    CODE: ClassVar[int] = 28
    task_id: int
    origin: str  # the origin node's address: results go back there
    group_id: int
    group_cfg: tuple
    fn_id: int
    fn_payload: bytes
    args: Optional[bytes]
    deps: Optional[tuple]
    cwd: str
    sys_path: tuple
    workdir: tuple  # (digest, the driver's directory) of the group's shipped code, or ()
    req: Optional[tuple] = None  # its resource request (``_resources.to_wire``); None: 1 CPU


class SpillbackRejected(Slotted):
    """G->N no other node can take this spilled task now: run or retry it at home."""

    CODE: ClassVar[int] = 29
    task_id: int
    reason: str


class Accepted(Slotted):
    """N->N the executing node has the task (the origin now knows where it runs)."""

    CODE: ClassVar[int] = 30
    task_id: int
    node_id: str


class TaskResult(Slotted):
    """N->N a spilled task's outcome, sent by the node that ran it to the origin."""

    CODE: ClassVar[int] = 31
    task_id: int
    ok: bool
    payload: bytes
    duration: float


class DropGroup(Slotted):
    """N->N the origin's group is gone (its driver left, or it was terminated): stop its
    tasks here and the mirror group's workers."""

    CODE: ClassVar[int] = 33
    origin: str
    group_id: int
    reason: str


class WorkingDir(Slotted):
    """D->S the driver's working directory, packed (``protocol._workdir``), sent once per
    content digest before the groups that use it."""

    CODE: ClassVar[int] = 34
    digest: str
    root: str
    archive: bytes


class FetchSegment(Slotted):
    """N->N a request on an object-transfer connection (its first frame, and any later
    one): send me ``length`` bytes (-1: to the end) of this segment from ``offset``
    (``transfer._pull``); the answer is raw (the segment's whole size, then the bytes)."""

    CODE: ClassVar[int] = 35
    version: int
    name: str
    offset: int = 0
    length: int = -1


class ReleaseLent(Slotted):
    """N->N the sender no longer needs the receiver to keep segment ``name``: a result
    the receiver lent it (it has its own copy now, or gave up), or an object of the
    sender's that the receiver copied for its tasks (freed: its last reference died)."""

    CODE: ClassVar[int] = 36
    name: str


class PushSegment(Slotted):
    """D->N a request on an object-transfer connection (its first frame, or any later
    one): a driver that reaches its node over TCP uploads ``length`` bytes (-1: all)
    from ``offset`` of a large value, ``size`` bytes in the store's segment layout, to
    be object ``object_id`` of the node's store (``transfer._push``). The node answers
    raw: go ahead (or why not), then, after the bytes, the name of the segment that
    holds them (or why it does not). A large value comes in ranges on several
    connections at once: the range at offset 0 creates the segment and is answered
    last, once every range is in; the others are sent after its go-ahead."""

    CODE: ClassVar[int] = 37
    version: int
    object_id: int
    size: int
    offset: int = 0
    length: int = -1


class PlacementFailed(Slotted):
    """G->N this spilled task can never be placed as it asks (a hard ``NodeAffinity`` to
    a node not in the cluster): the origin fails it with ``PlacementError``."""

    CODE: ClassVar[int] = 100
    task_id: int
    reason: str


class RunHere(Slotted):
    """G->N the placement strategy this spilled task asked for chose its origin (e.g.
    ``"spread"``'s turn came to it): the origin takes it back and runs it there."""

    CODE: ClassVar[int] = 101
    task_id: int


class PlacementGroupReserve(Slotted):
    """D->N->G reserve a placement group (``dpool.placement_group``): all its bundles
    or none. The node fills in ``origin`` (its address) and forwards it to one global
    scheduler, which answers with ``PlacementGroupState``."""

    CODE: ClassVar[int] = 102
    pg_id: int
    origin: str
    bundles: tuple  # each bundle's request in wire form (``_resources.to_wire``)
    strategy: str  # "pack" | "spread" | "strict_spread"


class PlacementGroupRemove(Slotted):
    """D->N->G free a placement group's bundles (or stop waiting for them)."""

    CODE: ClassVar[int] = 103
    pg_id: int
    origin: str


class PlacementGroupState(Slotted):
    """G->N->D (and in a node) what became of a placement group: ``state`` is
    "ready" (``nodes``: the node holding each bundle), "failed" (it can never be
    reserved: ``reason``) or "lost" (a node holding a bundle died: ``reason``)."""

    CODE: ClassVar[int] = 104
    pg_id: int
    state: str
    nodes: tuple
    reason: str


class BundleHold(Slotted):
    """G->N hold (``hold=True``) or free one bundle of a placement group: the node takes
    its CPUs and resources out of what its other tasks may use."""

    CODE: ClassVar[int] = 105
    pg_id: int
    index: int
    req: tuple  # the bundle's request in wire form
    hold: bool
    attempt: int  # which try of the global scheduler's at holding the group


class BundleHeld(Slotted):
    """N->G the answer to ``BundleHold(hold=True)``: ``ok`` False if the node cannot hold
    it now (``reason``): the global scheduler frees the group's other bundles and tries
    again later."""

    CODE: ClassVar[int] = 106
    pg_id: int
    index: int
    ok: bool
    reason: str
    attempt: int  # as in the ``BundleHold`` it answers


class TasksQuery(Slotted):
    """N->N the origin asks a node that accepted these spilled tasks (the origin's task
    ids) a while ago which of them it still has (``node._spillback``'s safety net)."""

    CODE: ClassVar[int] = 120
    origin: str
    task_ids: tuple


class TasksKnown(Slotted):
    """N->N the answer to ``TasksQuery``, sent after any ``TaskResult`` already sent on
    the same link: the tasks the node still has (queued, running, fetching their inputs
    or code) and those it has no trace of (the origin offers those again)."""

    CODE: ClassVar[int] = 121
    node_id: str
    known: tuple
    unknown: tuple


class ActorName(Slotted):
    """D->N register ``name`` for the actor ``record`` (group id, label, methods, node)
    in the cluster's actor directory, unless a live actor has it. Answered with
    ``ObjectValue(request_id)``: None, or the ``ValueError`` that says it is taken."""

    CODE: ClassVar[int] = 107
    request_id: int
    name: str
    record: tuple


class ActorEnded(Slotted):
    """N->N the actor of group ``group_id``, which a global scheduler placed on the
    sending node for the receiving node's driver, ended (``reason``): its proxy there
    ends too (``node._actor_calls``)."""

    CODE: ClassVar[int] = 108
    group_id: int
    reason: str


class ActorSaved(Slotted):
    """N->N a checkpoint of the actor of group ``group_id``, which the sending node hosts
    for the receiving node's driver: ``state`` (the pickled instance) holds the calls
    up to and including the receiver's task ``through``. The receiver keeps it, and the
    calls after it, to rebuild the actor on another node if the sender dies
    (``node._actor_rebuild``)."""

    CODE: ClassVar[int] = 109
    group_id: int
    state: bytes
    through: int


class Attach(Slotted):
    """D->S first frame after the handshake: who the driver is and where its code lives."""

    CODE: ClassVar[int] = 16
    version: int
    pid: int
    hostname: str
    cwd: str
    sys_path: tuple


class Attached(Slotted):
    """S->D the node accepted the driver. ``id_prefix`` makes the driver's ids unique on
    the node (``prefix << 40 | counter``); ``cluster_cpus`` is what ``cpu_count()`` says."""

    CODE: ClassVar[int] = 17
    node_id: str
    id_prefix: int
    num_cpus: int
    cluster_cpus: int
    store_owner: int  # the node's store (its pid) for a driver on its host, else 0


class CreateGroup(Slotted):
    """D->S a new executor or pool: a worker group with this (driver-chosen) id."""

    CODE: ClassVar[int] = 18
    group_id: int
    max_workers: int
    start_method: str
    initializer: Optional[bytes]
    max_tasks: Optional[int]
    max_attempts: int
    workdir: tuple  # (digest, the driver's directory) of its shipped code, or ()
    # an actor's group: (name, max_restarts, checkpoint_every, max_concurrency,
    # detached, its resource request in wire form or None); its ``initializer`` is then
    # ``(boot, (ctor, ...))`` (``dpool.actors``); () otherwise
    actor: tuple = ()
    # its limits (``scheduling._limits.GroupLimits``: task_timeout=, ...); () for none
    limits: tuple = ()


class GroupOp(Slotted):
    """D->S ``op`` on a group: "cancel_queued", "close", "close_notify" (close and answer
    ``GroupExited`` once its workers are gone) or "terminate" (``arg``: the reason).
    S->D "cancelled": the answer to "cancel_queued", after its ``CancelTask`` list."""

    CODE: ClassVar[int] = 19
    group_id: int
    op: str
    arg: str


class GroupExited(Slotted):
    """S->D the closed group is idle and its workers exited (``shutdown(wait=True)``)."""

    CODE: ClassVar[int] = 20
    group_id: int


class GroupBroken(Slotted):
    """S->D the group can run no more tasks (its initializer failed): ``reason``."""

    CODE: ClassVar[int] = 21
    group_id: int
    reason: str


class CancelTask(Slotted):
    """D->S the driver cancelled these futures: drop the tasks that have not started.
    S->D (answering ``GroupOp("cancel_queued")``): the queued tasks it dropped."""

    CODE: ClassVar[int] = 22
    task_ids: tuple


class StatusRequest(Slotted):
    """D->S describe this node (``dpool status``)."""

    CODE: ClassVar[int] = 23


class StatusReply(Slotted):
    """S->D the node's state as JSON: id, CPUs used/total, queue, store, drivers."""

    CODE: ClassVar[int] = 24
    status: str


# -- worker leases (codes from 50: a same-host driver talks to a worker directly) --------


# -- worker leases (codes from 50: a same-host driver talks to a worker directly) --------
class LeaseRequest(Slotted):
    """D->N first frame of a lease connection (on the node's unix socket): lend me a
    worker of this group. The node starts one with this very connection as its lease
    channel (granted: the worker says ``LeaseReady`` on it) or answers ``LeaseDenied``."""

    CODE: ClassVar[int] = 50
    version: int
    group_id: int


class LeaseDenied(Slotted):
    """N->D no worker to lend now (the group or the node's CPUs are in use)."""

    CODE: ClassVar[int] = 51
    reason: str


class LeaseReady(Slotted):
    """W->D over the lease channel: the leased worker is up (initializer done). The
    driver sends it ``RegisterFunction``/``ExecuteTask`` and gets ``TaskDone`` back."""

    CODE: ClassVar[int] = 52
    worker_id: int
    pid: int


class LeasedResult(Slotted):
    """D->N the outcome of a task that ran on a leased worker: the node keeps the value
    in its object table (owned by the driver, like a put) for later tasks and peers."""

    CODE: ClassVar[int] = 53
    object_id: int
    ok: bool
    payload: bytes


class LeaseRecall(Slotted):
    """N->D the node needs the CPU a lease holds (tasks are queued): end the lease of
    this group once its task is done."""

    CODE: ClassVar[int] = 54
    group_id: int


class LeaseEnded(Slotted):
    """W->N the driver closed the lease channel: this worker serves the node again."""

    CODE: ClassVar[int] = 55


class LeaseLost(Slotted):
    """N->D the worker lent for this group exited. (The driver may not see its lease
    connection close: a worker forked meanwhile can hold a copy of the worker's end.)"""

    CODE: ClassVar[int] = 56
    group_id: int
    worker_id: int


class LeasedTask(Slotted):
    """D->N a task went to a leased worker: its result will come (``LeasedResult``).
    Until then the node holds a pending object for it, so a later task (or a worker)
    that needs it waits for it as for any task's result."""

    CODE: ClassVar[int] = 57
    object_id: int


class LeasedLost(Slotted):
    """D->N the leased worker died with this task (the driver sends it to the node next):
    remove what it may have written of the result."""

    CODE: ClassVar[int] = 58
    object_id: int


CLUSTER_MESSAGES = (
    Attach,
    Attached,
    CreateGroup,
    GroupOp,
    GroupExited,
    GroupBroken,
    CancelTask,
    StatusRequest,
    StatusReply,
    LeaseRequest,
    LeaseDenied,
    LeaseReady,
    LeasedResult,
    LeaseRecall,
    LeaseEnded,
    LeaseLost,
    LeasedTask,
    LeasedLost,
    PeerHello,
    PeerWelcome,
    Load,
    RemoteTask,
    SpillbackRejected,
    Accepted,
    TaskResult,
    DropGroup,
    WorkingDir,
    FetchSegment,
    ReleaseLent,
    PushSegment,
    PlacementFailed,
    RunHere,
    PlacementGroupReserve,
    PlacementGroupRemove,
    PlacementGroupState,
    BundleHold,
    BundleHeld,
    TasksQuery,
    TasksKnown,
    ActorName,
    ActorEnded,
    ActorSaved,
)

__all__ = [
    "CLUSTER_MESSAGES", "Accepted", "ActorEnded", "ActorName", "ActorSaved", "Attach",
    "Attached", "BundleHeld", "BundleHold", "CancelTask", "CreateGroup", "DropGroup",
    "FetchSegment", "GroupBroken", "GroupExited", "GroupOp", "LeaseDenied", "LeaseEnded",
    "LeaseLost", "LeaseReady", "LeaseRecall", "LeaseRequest", "LeasedLost", "LeasedResult",
    "LeasedTask", "Load", "PeerHello", "PeerWelcome", "PlacementFailed", "PlacementGroupRemove",
    "PlacementGroupReserve", "PlacementGroupState", "PushSegment", "ReleaseLent",
    "RemoteTask", "RunHere", "SpillbackRejected", "StatusReply", "StatusRequest",
    "TaskResult", "TasksKnown", "TasksQuery", "WorkingDir",
]
