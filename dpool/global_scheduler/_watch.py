"""A global scheduler's watch over the nodes: its heartbeat, which nodes are alive, and
declaring the dead ones dead.

One thread (``NodeWatch``), off the IO thread, so a slow shard never stalls placement. It
heartbeats every ``BEAT_S`` and reads both registries (``cluster_view``, its heartbeat in
the same pipeline) only when a read can tell something new: when the stalest node alive
in the last read would age past ``DEAD_AFTER`` had it not beaten since
(``next_read_s``), and soon after a node links or reports that the last read did not
show alive (``heard``: at most once a beat per node). It keeps ``alive``, the node
addresses alive in the node table (a node linked but not heartbeating gets no task), and
marks a node whose heartbeat aged out dead, which publishes the notice on which every
node retries what it sent there. A refused heartbeat, or a read that does not list this
scheduler, registers it again. Idle cost and reaction times: bench/IDLE.md.

A node's link that closes (``link_closed``) makes the watch connect to the node's
address: a refused connection (the host answers, nothing listens) declares the node
dead at once. A connection accepted twice, ``PROBE_AGAIN_S`` apart (the second try
because a process being killed closes its sockets one by one), or one that times out
(the host unreachable, maybe partitioned), leaves the verdict to the heartbeats.

``_lock`` guards the suspects and the read requests that other threads hand over.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from typing import Optional

from dpool.control import BEAT_S, ClusterControlStore, next_read_s

log = logging.getLogger("dpool.global_scheduler")

PROBE_TIMEOUT_S = 1.0
PROBE_AGAIN_S = 0.2  # an accepted probe is tried again this much later


class NodeWatch:
    def __init__(self, control: ClusterControlStore, gs_id: str,
                 register: Callable[[], None]) -> None:
        self._control = control
        self._gs_id = gs_id
        self._register = register  # registers this scheduler again
        self.alive: Optional[set] = None  # node addresses alive in the node table
        self._stop = threading.Event()
        self._wake = threading.Event()  # stop, a suspect to probe, a node to look up
        self._suspects: dict[str, str] = {}  # node address -> node id
        self._read_by = math.inf  # (monotonic) a read asked for by a node heard (``heard``)
        self._asked: dict[str, float] = {}  # node address -> when it last asked for a read
        self.reads = 0  # reads of the node table done
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="dpool-gs-heartbeat")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def link_closed(self, node_id: str, address: str) -> None:
        """A node's current link closed (any thread): probe it soon."""
        with self._lock:
            self._suspects[address] = node_id
        self._wake.set()

    def heard(self, address: str) -> None:
        """A node linked or reported its load (any thread; on every report, so cheap):
        when the last read did not show it alive (it joined, or registered again after
        it was declared dead) read the node table now, or it would get no task until the
        next read. At most once a beat per node (one alive on its link but not in the
        table -- its heartbeats fail -- reports ten times a second while busy): a report
        within the beat sets the read for the beat's end, not never (the one that follows
        its registering again must count)."""
        alive = self.alive
        if alive is None or address in alive:
            return
        now = time.monotonic()
        with self._lock:
            asked = self._asked.get(address)
            at = now if asked is None or now - asked >= BEAT_S else asked + BEAT_S
            if at >= self._read_by:
                return  # a read comes by then anyway
            self._asked[address] = self._read_by = at
        self._wake.set()

    def _run(self) -> None:
        now = time.monotonic()
        next_beat = next_read = now  # (the first beat is a read)
        while True:
            self._wake.wait(max(0.0, min(next_beat, next_read, self._read_by)
                                - time.monotonic()))
            if self._stop.is_set():
                return
            self._wake.clear()
            with self._lock:
                suspects, self._suspects = self._suspects, {}
            if suspects:
                self._probe(suspects)
            now = time.monotonic()
            with self._lock:
                asked = now >= self._read_by
                if asked:
                    self._read_by = math.inf
            if asked or now >= next_read:
                wait = self._read()
                now = time.monotonic()  # (after the read: never before a verdict is due)
                next_read = now + wait
                next_beat = now + BEAT_S  # (the read carried a heartbeat)
            elif now >= next_beat:
                next_beat = now + BEAT_S
                self._beat()

    def _beat(self) -> None:
        try:
            if not self._control.heartbeat_global_scheduler(self._gs_id):
                self._register()  # a failover of the shard lost the row
        except Exception as exc:  # noqa: BLE001 - keep placing while Redis is away
            log.warning("control store unreachable: %s", exc)

    def _read(self) -> float:
        """Heartbeat and read the node table; seconds until the next read."""
        control = self._control
        try:
            view = control.cluster_view(gs_beat=self._gs_id)
            # re-assert the row and its listing if a failover of the shard lost them
            if not view.beat or all(g["gs_id"] != self._gs_id for g in view.global_schedulers):
                self._register()
            self.alive = alive = {n.get("address") for n in view.nodes if n.get("alive")}
            self.reads += 1
            old = time.monotonic() - BEAT_S  # (an ask older than a beat limits nothing)
            with self._lock:
                self._asked = {a: t for a, t in self._asked.items()
                               if a not in alive and t > old}
            for n in view.nodes:
                if not n.get("alive") and not n.get("dead"):
                    control.mark_node_dead(n["node_id"])  # (once: HSETNX)
        except Exception as exc:  # noqa: BLE001 - keep placing while Redis is away
            log.warning("control store unreachable: %s", exc)
            return BEAT_S
        return next_read_s(view.nodes)

    def _probe(self, suspects: dict[str, str]) -> None:
        """Connect to each suspect's address (``{address: node id}``); a refused
        connection declares it dead. The ones that accepted are tried once more,
        ``PROBE_AGAIN_S`` later, all together: a process being killed closes its sockets
        one by one, and its link may close a moment before its listener does."""
        accepted = {a: n for a, n in suspects.items() if self._knock(n, a)}
        if not accepted or self._stop.wait(PROBE_AGAIN_S):
            return
        for address, node_id in accepted.items():
            self._knock(node_id, address)  # (accepted twice: the heartbeats decide)

    def _knock(self, node_id: str, address: str) -> bool:
        """One connection to a node's address: True if accepted; refused: declared dead
        (False); no answer (the host unreachable, maybe a partition): False, the
        heartbeats decide."""
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
            return True
        except ConnectionRefusedError:
            pass
        except (OSError, ValueError) as exc:
            log.info("node %s (%s) unlinked and did not answer a probe (%s): its "
                     "heartbeats decide", node_id, address, exc)
            return False
        try:
            if self._control.mark_node_dead(node_id):
                log.warning("node %s (%s) unlinked and refuses connections: declared dead",
                            node_id, address)
        except Exception as exc:  # noqa: BLE001 - the heartbeats still decide
            log.warning("could not declare node %s dead: %s", node_id, exc)
        return False
