"""A cluster driver's record of one of its worker groups (an executor or a ``Pool``),
which lives on the node: its limits, whether it broke or exited, its ``CreateGroup``
(sent again when the driver moves, ``_move``) and the worker the node may lend it
(``_lease``). Owned by ``_cluster.ClusterRuntime``.
"""

from __future__ import annotations

import threading
from typing import Any, Optional


class RemoteGroup:
    """A worker group (executor or Pool) that lives on the node."""

    __slots__ = ("group_id", "broken", "exited", "cancelled", "workers", "max_workers",
                 "max_tasks", "lease", "lease_asked", "lease_retry_at", "lease_closed",
                 "lease_recalled", "max_attempts", "create", "closing", "actor", "host")

    def __init__(self, group_id: int, max_workers: int, max_tasks: Optional[int],
                 max_attempts: int = 3) -> None:
        self.group_id = group_id
        self.max_workers = max_workers
        self.max_tasks = max_tasks
        self.max_attempts = max_attempts
        self.create: Any = None  # its CreateGroup (sent again after a move: ``_move``)
        self.closing = ""  # the close op sent ("close", "close_notify"), if any
        self.actor = ""  # an actor's group: the actor's name (it lives on the node)
        self.host = ""  # another driver's actor (``foreign_actor``): the node it names
        self.broken: Optional[str] = None
        self.exited = threading.Event()
        self.cancelled = threading.Event()
        self.workers: list = []  # they are the node's processes, not this one's
        self.lease: Any = None  # _lease.Lease: a worker the node lent us
        self.lease_asked = False
        self.lease_recalled = False  # recalled before it arrived
        self.lease_retry_at = 0.0
        # never to lease (again): shut down, or the node's workers do not suit leases
        self.lease_closed = max_tasks is not None

    @property
    def closed(self) -> bool:
        """Shut down (closing or exited), as the embedded ``WorkerGroup.closed``."""
        return bool(self.closing) or self.exited.is_set()
