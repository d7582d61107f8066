"""The node and global-scheduler tables as a heartbeating process watches them, cheaply.

A node daemon must notice when another node stops heartbeating (it declares it dead and
takes back the tasks it sent there), and when nodes or global schedulers join or leave;
a global scheduler must know which nodes are alive. Reading every row every heartbeat
(0.5 s) cost each idle node daemon and global scheduler most of its CPU time (issue
21). Yet a row read tells exactly when it can next say something new: a member whose
heartbeat is ``age`` seconds old cannot count as dead before ``dead_after - age``
seconds from now. So ``TableWatch`` reads

- the members (who is registered) at every heartbeat, in the heartbeat's round trip
  (``saw()``) -- a join or a departure is seen as soon as before;
- the rows when the members changed, and otherwise only once the first moment has come
  at which some member that stopped heartbeating would count as dead (its last
  heartbeat + ``dead_after``, read a little after: ``_MARGIN_S``) -- ``due()``, which the
  caller asks often (the node's agent: every 0.1 s) -- so a death is seen within that
  margin and the asking pace of the deadline, never later than a poll every 0.5 s saw it;
- and at the latest every ``dead_after`` seconds, whatever the rows said.

A member marked dead by another process is told by the node-death notice (pub/sub) as
before, and by the next read of the rows.
"""

from __future__ import annotations

import time
from typing import Optional

from dpool.control._interface import ClusterControlStore

_MARGIN_S = 0.02  # past a deadline, so that the member's age is past ``dead_after`` too


class TableWatch:
    def __init__(self, control: ClusterControlStore, dead_after: Optional[float] = None
                 ) -> None:
        self._control = control
        if dead_after is None:
            from dpool.control._redis import DEAD_AFTER

            dead_after = DEAD_AFTER
        self.dead_after = dead_after
        self.global_schedulers: list[dict] = []  # rows as last read (``tables``)
        self.nodes: list[dict] = []
        self._members: Optional[tuple[list[str], list[str]]] = None
        self._due = 0.0  # (monotonic) when the rows must be read again

    def due(self) -> bool:
        """Whether the rows may say something new now (a member's deadline passed)."""
        return time.monotonic() >= self._due

    @property
    def due_at(self) -> float:
        """When ``due()`` turns true (``time.monotonic()``)."""
        return self._due

    def saw(self, members: tuple[list[str], list[str]]) -> bool:
        """The members as the caller just read them (with its heartbeat, in the same
        round trip); the rows are read if they changed or are due. True: the rows were
        read (``nodes`` and ``global_schedulers`` are fresh). Raises what the control
        store raises."""
        if members != self._members:
            self._members = members
            self._due = 0.0
        return self.read_if_due()

    def read_if_due(self) -> bool:
        """The rows, if ``due()``; True if they were read."""
        if not self.due():
            return False
        t0 = time.monotonic()
        self.global_schedulers, self.nodes = self._control.tables(self.dead_after,
                                                                 self._members)
        ages = [r["age"] for r in self.global_schedulers + self.nodes if r.get("alive")]
        wait = self.dead_after - max(ages) if ages else self.dead_after
        self._due = t0 + max(0.0, min(wait, self.dead_after)) + _MARGIN_S
        return True
