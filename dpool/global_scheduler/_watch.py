"""A global scheduler's watch over the nodes: its heartbeat, which nodes are alive, and
declaring the dead ones dead.

One thread, off the IO thread (a slow shard must never stall placement). Every
``HEARTBEAT_S`` it reads both registries with its own heartbeat in the same pipeline
(``cluster_view``: 3 round trips with 2 shards), keeps the set of node addresses alive
in the node table (a node whose link is open but which stopped heartbeating gets
nothing), and marks a node that stopped heartbeating dead, which publishes the notice on
which every node retries what it sent there. The nodes read the tables less often: the
global schedulers are the ones that notice a silent node first.

A node's link that closes is a reason to look at once instead of waiting for its
heartbeat to age: the watch connects to the node's address, and a refused connection (the
host answers, nothing listens: the daemon died) declares the node dead within
milliseconds. A connection that is accepted (the link dropped, the node lives: it links
again) or that times out (the host is unreachable: maybe a partition, maybe slow) leaves
the verdict to the heartbeats. (A node's address must take connections from its peers
anyway: they fetch objects from it.)
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Optional

from dpool.control._interface import ClusterControlStore

log = logging.getLogger("dpool.global_scheduler")

HEARTBEAT_S = 0.5
PROBE_TIMEOUT_S = 1.0


class NodeWatch:
    def __init__(self, control: ClusterControlStore, gs_id: str,
                 register: Callable[[], None]) -> None:
        self._control = control
        self._gs_id = gs_id
        self._register = register  # registers this scheduler again
        self.alive: Optional[set] = None  # node addresses alive in the node table
        self._stop = threading.Event()
        self._wake = threading.Event()  # stop, or a suspect to probe
        self._suspects: dict[str, str] = {}  # node address -> node id
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

    def _run(self) -> None:
        next_beat = time.monotonic() + HEARTBEAT_S
        while True:
            self._wake.wait(max(0.0, next_beat - time.monotonic()))
            if self._stop.is_set():
                return
            self._wake.clear()
            with self._lock:
                suspects, self._suspects = self._suspects, {}
            for address, node_id in suspects.items():
                self._probe(node_id, address)
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + HEARTBEAT_S
                self._beat()

    def _beat(self) -> None:
        control = self._control
        try:
            view = control.cluster_view(gs_beat=self._gs_id)
            # re-assert the row and its listing if a failover of the shard lost them
            if not view.beat or all(g["gs_id"] != self._gs_id for g in view.global_schedulers):
                self._register()
            self.alive = {n.get("address") for n in view.nodes if n.get("alive")}
            for n in view.nodes:
                if not n.get("alive") and not n.get("dead"):
                    control.mark_node_dead(n["node_id"])  # (once: HSETNX)
        except Exception as exc:  # noqa: BLE001 - keep placing while Redis is away
            log.warning("control store unreachable: %s", exc)

    def _probe(self, node_id: str, address: str) -> None:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
            return  # something listens there: the heartbeats decide
        except ConnectionRefusedError:
            pass
        except (OSError, ValueError) as exc:
            log.info("node %s (%s) unlinked and did not answer a probe (%s): its "
                     "heartbeats decide", node_id, address, exc)
            return
        try:
            if self._control.mark_node_dead(node_id):
                log.warning("node %s (%s) unlinked and refuses connections: declared dead",
                            node_id, address)
        except Exception as exc:  # noqa: BLE001 - the heartbeats still decide
            log.warning("could not declare node %s dead: %s", node_id, exc)
