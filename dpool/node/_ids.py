"""Cluster-unique id prefixes for what a node starts: driver sessions, workers, the tasks
it runs for other nodes.

Every id in the cluster is ``prefix << 40 | counter`` (``control._keys.make_id``) with a
prefix no other process got, so ids are made locally, without a round trip per id. The
node reserves prefixes in blocks (one INCRBY on the control store per ``block``) and hands
one to each driver that attaches and each worker it starts; the agent tops the block up
in the background before it runs out, so taking one almost never waits on the network.
Without a control store (a lone node) prefixes simply count from 1.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional


class IdPrefixes:
    def __init__(self, reserve: Optional[Callable[[int], int]] = None,
                 block: int = 1024) -> None:
        self._reserve = reserve
        self.block = block
        self._lock = threading.Lock()
        self._blocks: list[list[int]] = []  # [next, end) ranges not yet handed out
        if reserve is None:
            self._blocks.append([1, 1 << 24])
        else:
            self._add_block()

    def _left(self) -> int:
        return sum(end - nxt for nxt, end in self._blocks)

    def top_up(self) -> None:
        """Reserve another block if less than half of one is left (agent thread)."""
        if self._reserve is not None and self._left() < self.block // 2:
            self._add_block()

    def take(self) -> int:
        while True:
            with self._lock:
                while self._blocks:
                    rng = self._blocks[0]
                    if rng[0] < rng[1]:
                        rng[0] += 1
                        return rng[0] - 1
                    self._blocks.pop(0)
            self._add_block()  # used up before the agent topped it up: reserve now

    def _add_block(self) -> None:
        if self._reserve is None:
            raise RuntimeError("no id prefixes left and no control store to reserve more")
        first = self._reserve(self.block)
        with self._lock:
            self._blocks.append([first, first + self.block])
