"""``dpool.collective``'s calls: forming and destroying groups, and the operations a
member calls on them (see the package's docstring)."""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import threading
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from dpool.collective import _arrays
from dpool.collective._group import Group
from dpool.collective._join import KV_PREFIX, Pending, rendezvous
from dpool.errors import CollectiveError

DEFAULT = "default"
_TIMEOUT_S = float(os.environ.get("DPOOL_COLLECTIVE_TIMEOUT_S", "300"))
_JOIN_TIMEOUT_S = 60.0

_groups: dict[str, Group] = {}  # this process's groups, by name
_pending: dict[str, Pending] = {}  # rank 0 of a group its driver is forming
_lock = threading.RLock()  # (``_claim`` destroys a failed group under it)


def _check_world(world_size: int, rank: int) -> None:
    for what, v in (("world_size", world_size), ("rank", rank)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{what} must be an int, not {v!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is out of range for world_size {world_size} "
                         f"(0..{world_size - 1})")


def _check_name(group_name: str) -> None:
    if not isinstance(group_name, str) or not group_name:
        raise TypeError(f"group_name must be a non-empty str, not {group_name!r}")


def _claim(group_name: str) -> None:
    old = _groups.get(group_name)
    if old is not None:
        if old.broken is None:
            raise ValueError(f"this process is a member of collective group "
                             f"{group_name!r} already: destroy_group({group_name!r}) first")
        destroy_group(group_name)  # (a failed group is formed again)


def _kv() -> Any:
    from dpool.runtime import current as _current

    client = _current.client()
    if not hasattr(client, "kv_get"):
        raise CollectiveError("init_group() is called in the members (actors or tasks); "
                              "from the driver, use create_group(actors)")
    return client


def init_group(world_size: int, rank: int, group_name: str = DEFAULT, *,
               timeout: Optional[float] = _TIMEOUT_S,
               join_timeout: float = _JOIN_TIMEOUT_S, transport: str = "auto") -> None:
    """Join collective group ``group_name`` as member ``rank`` of ``world_size``; returns
    once every member has joined (``CollectiveError`` after ``join_timeout`` s).
    ``timeout``: how long one operation may wait for the other members (None: for
    ever). ``transport``: ``"auto"`` (shared memory when every member is on one node,
    else TCP), ``"shm"`` (the same), or ``"tcp"`` (always). Call it in each member: an
    actor's method, or a task of a placement group."""
    _check_world(world_size, rank)
    _check_transport(transport)
    _check_name(group_name)
    with _lock:
        _claim(group_name)
    p = Pending(group_name, world_size, rank, transport=transport)
    key = KV_PREFIX + group_name
    kv = _kv() if world_size > 1 else None  # (one member: no rendezvous)

    def publish(address: tuple) -> None:
        if kv is not None:
            kv.kv_put(key, pickle.dumps((address, world_size)), join_timeout + 30.0)

    def lookup() -> Optional[tuple]:
        raw = kv.kv_get(key) if kv is not None else None
        if raw is None:
            return None
        address, world = pickle.loads(raw)  # noqa: S301 - rank 0's, through the runtime
        return address if world == world_size else None

    _form(p, None, timeout, join_timeout, transport, publish, lookup)


def _check_transport(transport: str) -> None:
    if transport not in ("auto", "shm", "tcp"):
        raise ValueError(f"transport must be 'auto', 'shm' or 'tcp', not {transport!r}")


def _form(p: Pending, root: Optional[tuple], timeout: Optional[float], join_timeout: float,
          transport: str, publish: Any = None, lookup: Any = None) -> None:
    from dpool.runtime import current as _current

    _current.at_worker_exit(_leave_all)  # (a worker runs no atexit handler)
    table, links = rendezvous(p, root, join_timeout, publish, lookup)
    try:
        g = Group(p.name, p.world, p.rank, table, links, p.token, timeout, transport)
    except BaseException as exc:
        from dpool.collective._wire import abort

        abort(list(links.values()), f"collective group {p.name!r}: rank {p.rank} could "
                                    f"not set up the group: {exc!r}", p.rank)
        for link in links.values():
            link.close()
        raise
    with _lock:
        _groups[p.name] = g


def open_group(group_name: str, world_size: int, transport: str = "auto") -> tuple:
    """(In rank 0's actor, from ``create_group``.) Listen for the others; its address."""
    with _lock:
        _claim(group_name)
        old = _pending.pop(group_name, None)
    if old is not None:
        old.close()
    p = Pending(group_name, world_size, 0, transport=transport)
    with _lock:
        _pending[group_name] = p
    return p.address


def join_group(group_name: str, world_size: int, rank: int, root: tuple,
               timeout: Optional[float], join_timeout: float, transport: str) -> str:
    """(In each actor, from ``create_group``.) Join; the transport the group uses."""
    if rank == 0:
        with _lock:
            p = _pending.pop(group_name, None)
        if p is None:
            raise CollectiveError(f"collective group {group_name!r}: rank 0 was not "
                                  "opened (its actor restarted meanwhile?)", group=group_name)
    else:
        with _lock:
            _claim(group_name)
        p = Pending(group_name, world_size, rank, token=root[2])
    _form(p, root if rank else None, timeout, join_timeout, transport)
    return _groups[group_name].transport


open_group.readonly = True  # type: ignore[attr-defined]  # (a restart does not replay it)
join_group.readonly = True  # type: ignore[attr-defined]


def create_group(actors: Sequence[Any], group_name: str = DEFAULT, *,
                 timeout: Optional[float] = _TIMEOUT_S,
                 join_timeout: float = _JOIN_TIMEOUT_S, transport: str = "auto") -> list:
    """From the driver: make ``actors`` (handles, in rank order) the members of
    collective group ``group_name``; returns once all have joined, with the transport
    each uses (``"shm"`` or ``"tcp"``). Each actor joins between its calls, in order
    with them. ``timeout``, ``transport``: as ``init_group``'s."""
    from dpool.actors import ActorHandle, run_in_actor

    _check_name(group_name)
    _check_transport(transport)
    actors = list(actors)
    if not actors or not all(isinstance(a, ActorHandle) for a in actors):
        raise TypeError("create_group takes a non-empty list of actor handles "
                        "(executor.actor(...))")
    world = len(actors)
    root = run_in_actor(actors[0], open_group, group_name, world, transport).result(
        join_timeout)
    fs = [run_in_actor(a, join_group, group_name, world, rank, root, timeout, join_timeout,
                       transport) for rank, a in enumerate(actors)]
    errors = []
    used = []
    for f in fs:
        try:
            used.append(f.result(join_timeout + 30.0))
        except Exception as exc:  # noqa: BLE001 - the first says why; all are waited for
            errors.append(exc)
    if errors:
        if isinstance(errors[0], CollectiveError):
            raise errors[0]
        raise CollectiveError(f"collective group {group_name!r} could not be formed: "
                              f"{errors[0]!r}", group=group_name) from errors[0]
    return used


def _group(group_name: str) -> Group:
    g = _groups.get(group_name)
    if g is None:
        raise CollectiveError(f"this process is not a member of collective group "
                              f"{group_name!r}: call init_group() in each member (or "
                              "create_group() from the driver) first, and the collectives "
                              "in the members", group=group_name)
    return g


def destroy_group(group_name: str = DEFAULT) -> None:
    """Leave group ``group_name`` in this member: its links close, its shared memory is
    freed. Its later calls here raise ``CollectiveError``."""
    with _lock:
        g = _groups.pop(group_name, None)
    if g is not None:
        g.close()


def is_group_initialized(group_name: str = DEFAULT) -> bool:
    return group_name in _groups


def get_rank(group_name: str = DEFAULT) -> int:
    return _group(group_name).rank


def get_world_size(group_name: str = DEFAULT) -> int:
    return _group(group_name).world


@contextlib.contextmanager
def _inputs(g: Group) -> Iterator[None]:
    """Checking this member's part of an operation: bad input raises here (its own
    type), and fails the operation in the other members too (they would wait)."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        g.abandon(exc)
        raise


def allreduce(array: Any, op: str = "sum", out: Any = None,
              group_name: str = DEFAULT) -> Any:
    """Every member's ``array`` reduced with ``op`` (``"sum"``, ``"prod"``, ``"min"``,
    ``"max"``); into ``out`` if given (a writable array of the same dtype and shape)."""
    g = _group(group_name)
    try:  # (``_inputs``, inline: the hot path)
        ufunc = _arrays.op_of(op)
        arr, back = _arrays.as_array(array)
        if out is None:
            target = np.empty_like(arr)
        else:
            target = out
            if not isinstance(out, np.ndarray) or out.shape != arr.shape or \
                    out.dtype != arr.dtype or not out.flags.c_contiguous or \
                    not out.flags.writeable:
                raise ValueError(f"out must be a writable C-contiguous numpy array of "
                                 f"shape {arr.shape} and dtype {arr.dtype}")
    except (TypeError, ValueError) as exc:
        g.abandon(exc)
        raise
    g.allreduce(arr, ufunc, op, target)
    return target if out is not None else back(target)


def reducescatter(array: Any, op: str = "sum", group_name: str = DEFAULT) -> Any:
    """Chunk ``rank`` (along axis 0, as ``numpy.array_split`` splits) of every member's
    ``array`` reduced with ``op``."""
    g = _group(group_name)
    with _inputs(g):
        ufunc = _arrays.op_of(op)
        arr, back = _arrays.as_array(array)
        _arrays.row_chunks(arr.shape, 1)  # (a 0-d array: ValueError at the call)
    return back(g.reducescatter(arr, ufunc, op))


def reduce(array: Any, root: int = 0, op: str = "sum",
           group_name: str = DEFAULT) -> Any:
    """The reduction of every member's ``array`` at ``root``; None in the others."""
    g = _group(group_name)
    with _inputs(g):
        _check_rank(g, root, "root")
    result = allreduce(array, op, group_name=group_name)
    return result if g.rank == root else None


def broadcast(array: Any, root: int = 0, group_name: str = DEFAULT) -> Any:
    """``root``'s ``array`` in every member (the others' ``array`` is not used: None
    will do)."""
    g = _group(group_name)
    with _inputs(g):
        _check_rank(g, root, "root")
        if g.rank == root:
            arr, back = _arrays.as_array(array)
        else:
            arr, back = None, (_arrays.as_array(array)[1] if array is not None
                               else (lambda a: a))
    return back(g.broadcast(arr, root))


def allgather(array: Any, group_name: str = DEFAULT) -> list:
    """Every member's ``array``, in rank order."""
    g = _group(group_name)
    with _inputs(g):
        arr, back = _arrays.as_array(array)
    return [back(a) for a in g.allgather(arr)]


def barrier(group_name: str = DEFAULT) -> None:
    """Wait until every member called it."""
    _group(group_name).barrier()


def send(array: Any, dst: int, group_name: str = DEFAULT) -> None:
    """Send ``array`` to member ``dst`` (its ``recv(src=<this rank>)`` returns it)."""
    g = _group(group_name)
    with _inputs(g):
        _check_rank(g, dst, "dst", self_ok=False)
        arr, _back = _arrays.as_array(array)
    g.send(arr, dst)


def recv(src: int, group_name: str = DEFAULT) -> Any:
    """The next array member ``src`` sends to this one."""
    g = _group(group_name)
    with _inputs(g):
        _check_rank(g, src, "src", self_ok=False)
    return g.recv(src)


def _check_rank(g: Group, r: Any, what: str, self_ok: bool = True) -> None:
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < g.world:
        raise ValueError(f"{what}={r!r} is not a rank of collective group {g.name!r} "
                         f"(0..{g.world - 1})")
    if not self_ok and r == g.rank:
        raise ValueError(f"{what}={r} is this member's own rank")


@atexit.register
def _leave_all() -> None:
    for name in list(_groups):
        try:
            destroy_group(name)
        except Exception:  # noqa: BLE001, S110 - exiting: what can be freed is
            pass
