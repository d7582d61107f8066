"""Collective operations among the members of a group: actors (or tasks of a placement
group) that reduce, gather and broadcast numpy arrays together, member to member.

    # in each member (an actor's method):
    dpool.collective.init_group(world_size=4, rank=r, group_name="g")
    total = dpool.collective.allreduce(grads, op="sum", group_name="g")

    # or from the driver, for a list of actors:
    dpool.collective.create_group([a0, a1, a2, a3], group_name="g")

Operations (in the members, each with ``group_name=``): ``allreduce``, ``reduce``,
``broadcast``, ``allgather``, ``reducescatter``, ``barrier``, ``send``/``recv``; then
``destroy_group``. Members on one node exchange through shared memory; across nodes,
over direct TCP links (a ring for large arrays). A member that dies mid-operation makes
it fail in every other member with ``dpool.CollectiveError`` naming it; the group can
then be formed again (a restarted actor rejoins with its rank).

- ``_api``: the calls above; ``_group``: one member's view of a group; ``_join``: the
  rendezvous and the links; ``_shm``: the operations through shared memory; ``_mesh``:
  over TCP; ``_wire``: frames and moving them; ``_arrays``: arrays and reductions.
"""

from dpool._lazy import front_door

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.collective._api import (
        allgather,
        allreduce,
        barrier,
        broadcast,
        create_group,
        destroy_group,
        get_rank,
        get_world_size,
        init_group,
        is_group_initialized,
        recv,
        reduce,
        reducescatter,
        send,
    )
    from dpool.errors import CollectiveError

_LAZY = {
    **dict.fromkeys(("allgather", "allreduce", "barrier", "broadcast", "create_group",
                     "destroy_group", "get_rank", "get_world_size", "init_group",
                     "is_group_initialized", "recv", "reduce", "reducescatter", "send"),
                    "dpool.collective._api"),
    "CollectiveError": "dpool.errors",
}
_MODULES: dict = {}

__all__ = [
    "CollectiveError",
    "allgather",
    "allreduce",
    "barrier",
    "broadcast",
    "create_group",
    "destroy_group",
    "get_rank",
    "get_world_size",
    "init_group",
    "is_group_initialized",
    "recv",
    "reduce",
    "reducescatter",
    "send",
]

__getattr__, __dir__ = front_door(__name__, _LAZY, _MODULES)
