"""The node's link to the rest of the cluster: heartbeats, load reports, discovery.

A thread, off every task's path: every ``load_s`` while the node reads input, it pushes
this node's load (queue, busy and total CPUs, average task time) to each linked global
scheduler when it changed (and at least every ``_REFRESH_S``); idle, it sleeps until
the next heartbeat or the first input (``IOLoop.on_input``); every ``beat_s``
(``BEAT_S``) it heartbeats the same load into the node table; every ``_READ_S`` it
reads the global schedulers and nodes registered there (``cluster_view``: a round trip
for the listings and one per shard holding rows), links to schedulers it has not linked
yet, and refreshes the cluster's CPU count that drivers see. A global scheduler that
registers is announced (``CH_SCHEDULER_UP``, with its address): the node links to it on
the notice. A heartbeat refused (its row is gone, or marked dead) or a node table that does
not list this node registers it again, and its next load report goes to every
scheduler at once (so they count it alive again): after a control-store failover lost
those writes, the node re-asserts them (``control._sentinel``). A control store that is
briefly unreachable costs warnings, not tasks: the local path never waits on it.

A node that stops heartbeating is declared dead by whoever notices first -- a global
scheduler, which reads the node table when a heartbeat could first have aged out, or a
node --: it marks it in the node table, which publishes a node-death notice. This node
acts on the notice at once (``_on_notice``: the tasks it sent there are retried
elsewhere) and on its own next read of the node table, which catches notices pub/sub
lost; with no global scheduler alive it reads at its first beat after a heartbeat could
first have aged out.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Optional

from dpool.control import BEAT_S, ClusterControlStore, Subscription, next_read_s
from dpool.control import keys as K
from dpool.protocol import messages as m
from dpool.scheduling import resources as _resources

if TYPE_CHECKING:
    from dpool.node._daemon import NodeDaemon

log = logging.getLogger("dpool.node")

_REFRESH_S = 5.0  # a load report unchanged this long is sent again anyway (a safety net:
# a report goes whenever the load changes, and to a scheduler linked since the last one)
# how often the scheduler and node tables are read (after the first two beats): the
# global schedulers declare silent nodes dead (a notice reaches this node at once) and
# announce themselves; this read finds notices pub/sub lost, and the cluster's CPUs (read
# afresh for each attaching driver anyway)
_READ_S = 4.0


def _pool_cpus(cpus: int) -> int:
    """What drivers attaching here are told the cluster's CPUs are (``cpu_count()``, the
    default ``max_workers``): never 0. A 0-CPU head whose agent has not yet seen the
    node that joined a moment ago would size a driver's pool at 0 workers, and every
    task of that pool would stay queued on the head for good."""
    return max(1, cpus)


class ClusterAgent:
    def __init__(self, daemon: NodeDaemon, control: ClusterControlStore,
                 load_s: float = 0.1, beat_s: float = BEAT_S) -> None:
        self._d = daemon
        self._control = control
        self.load_s = load_s
        self.beat_s = beat_s
        self.schedulers: list[str] = []  # global schedulers alive in the node table
        # announced (``CH_SCHEDULER_UP``) and not yet listed by a read: address -> when
        self._announced: dict[str, float] = {}
        self._schedulers_lock = threading.Lock()  # the agent thread and the notice listener
        self._stop = threading.Event()
        self._wake = threading.Event()  # stop, or input while asleep (``_on_input``)
        self._sleeping = False
        self._beats = 0
        self._next_read = 0.0  # (monotonic) when the tables are read next
        self._thread = threading.Thread(target=self._run, name="dpool-node-agent",
                                        daemon=True)
        self._buried: set[str] = set()  # nodes declared dead (until they come back)
        self._bury_lock = threading.Lock()  # the agent thread and the notice listener
        self._notices: Optional[Subscription] = None
        self._pushed: dict[str, tuple] = {}  # scheduler -> (last report pushed, when)
        daemon.sessions.cluster_cpus = _pool_cpus(daemon.sessions.cluster_cpus)

    def start(self) -> None:
        self._beat()
        try:
            self._notices = self._control.subscribe([K.CH_NODE_DEAD, K.CH_SCHEDULER_UP],
                                                    self._on_notice)
        except Exception as exc:  # noqa: BLE001 - the poll of the node table still buries
            log.warning("no node-death notices (polling the node table only): %s", exc)
        self._thread.start()

    def nudge(self) -> None:
        """Report the load now (it changed: a draining node's)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._notices is not None:
            self._notices.stop()
        self._thread.join(timeout=5)

    def _on_notice(self, channel: str, data: bytes) -> None:
        if channel == K.CH_SCHEDULER_UP:  # link to it now (the next read lists it too)
            address = K.parse_scheduler_up(data)
            with self._schedulers_lock:
                self._announced[address] = time.monotonic()
                if address not in self.schedulers:
                    self.schedulers = [*self.schedulers, address]
            if not self._d.links.connected(address):
                self._d.links.connect_soon(address)
            return
        node_id = K.parse_node_dead(data)
        self._bury_one({"node_id": node_id, "dead": True}, "its death was announced")

    def linked_schedulers(self) -> list[str]:
        links = self._d.links
        return [a for a in self.schedulers if links.connected(a)]

    def _load(self) -> dict:
        d = self._d
        s = d.scheduler
        with s.lock:
            status = d.sessions.status_locked()
            status["queued"] += d.runner.fetching_locked()
            received = d.links.tasks_in()  # the tasks this report's counts include
            busy_groups = [g for g in s.groups_locked() if g.queue]
            avg = (sum(s.batch.estimate(g.queue[0].fn_id) for g in busy_groups)
                   / len(busy_groups)) if busy_groups else s.batch.target_s
        status["avg_task_s"] = avg
        status["received"] = received
        status["linked_schedulers"] = len(self.linked_schedulers())
        status["holds"] = d.runner.holds()
        # what its tasks hold now, of each resource (the dashboard's "GPU 1/2")
        status["resources_used"] = {n: t - f for n, t, f in self._resources()}
        return status

    def _resources(self) -> tuple:
        """((name, total, free), ...) of the node's GPUs, memory and custom resources."""
        s = self._d.scheduler
        with s.lock:
            led = s.resources_locked()
            gpus = (("GPU", led.num_gpus, sum(led.gpu_free) / _resources.GPU_UNIT),)
            mem = (("memory", led.memory, led.memory_free),)
            return gpus + mem + tuple((k, v, led.custom_free.get(k, 0.0))
                                      for k, v in led.custom.items())

    def _push_load(self, load: dict) -> None:
        """Send the load to the linked global schedulers: when it changed, to a scheduler
        linked since the last push, and at least every ``_REFRESH_S`` (an unchanged
        report is not sent again sooner: an idle node costs no CPU, bench/IDLE.md)."""
        base = (load["queued"], load["cpus_used"], load["cpus_total"], load["avg_task_s"],
                load["holds"], self._resources())
        received = load.get("received", {})
        now = time.monotonic()
        pushed: dict[str, tuple] = {}
        for address in self.linked_schedulers():
            msg = m.Load(*base, received.get(address, -1))
            last = self._pushed.get(address)
            if last is None or last[0] != msg or now - last[1] >= _REFRESH_S:
                self._d.links.send(address, [msg])
                last = (msg, now)
            pushed[address] = last
        self._pushed = pushed

    def _beat(self, load: dict | None = None) -> None:
        """``load``: this round's (``_load()``), else read now."""
        d = self._d
        with d.scheduler.lock:
            d.runner.tick_locked()  # retire idle mirror groups
        load = dict(load or self._load())
        del load["received"]  # (the global schedulers' business, not the node table's)
        try:
            if d.prefixes is not None:
                d.prefixes.top_up()
        except Exception as exc:  # noqa: BLE001 - taken from the store when needed instead
            log.warning("could not reserve id prefixes: %s", exc)
        self._beats += 1
        try:
            if not self._control.heartbeat(d.node_id, load):
                self._register()
            if time.monotonic() < self._next_read and self._beats > 2:
                return  # (each read is a round trip per shard: reads are rare so that
                # an idle node costs no CPU, bench/IDLE.md)
            view = self._control.cluster_view()
            gss = [g for g in view.global_schedulers if g.get("alive")]
            all_nodes = view.nodes
            if all(n["node_id"] != d.node_id for n in all_nodes):
                # the node set lost this node (a failover of its shard lost the write):
                # the owner re-asserts its row (control._sentinel)
                self._register()
            nodes = [n for n in all_nodes if n.get("alive")]
        except Exception as exc:  # noqa: BLE001 - keep serving while Redis is away
            log.warning("control store unreachable: %s", exc)
            return
        # with no global scheduler alive, nobody else notices a silent node
        self._next_read = time.monotonic() + (_READ_S if gss else
                                              min(_READ_S, next_read_s(all_nodes)))
        self._set_schedulers([g["address"] for g in gss])
        self._bury([n for n in all_nodes if not n.get("alive")])
        for address in self.schedulers:
            if not d.links.connected(address):
                d.links.connect_soon(address)
        self._set_cluster_cpus(nodes)

    def _set_schedulers(self, listed: list[str]) -> None:
        """The global schedulers a read found alive, and those announced since that the
        read may have missed (for ``2 * _READ_S`` at most: one that died at once)."""
        now = time.monotonic()
        with self._schedulers_lock:
            self._announced = {a: t for a, t in self._announced.items()
                               if a not in listed and now - t < 2 * _READ_S}
            self.schedulers = listed + list(self._announced)

    def _register(self) -> None:
        """Register again (the row is gone or marked dead); the next load report goes to
        every linked scheduler at once, which reads the node table on it."""
        d = self._d
        self._control.register_node(d.node_id, d.node_info())
        self._pushed = {}
        self._wake.set()

    def _set_cluster_cpus(self, alive: list) -> None:
        d = self._d
        d.sessions.cluster_cpus = _pool_cpus(sum(int(n.get("num_cpus", 0)) for n in alive)
                                             or d.num_cpus)

    def fresh_cluster_cpus(self) -> int:
        """The cluster's CPUs for a driver attaching now, read from the node table: a node
        that joined since the agent's last read (up to ``_READ_S`` ago) counts,
        or ``ProcessPoolExecutor()`` would size its pool without it. The last value read
        when the control store does not answer."""
        try:
            self._set_cluster_cpus([n for n in self._control.nodes() if n.get("alive")])
        except Exception as exc:  # noqa: BLE001 - the agent's last read will do
            log.debug("cluster CPUs not read for an attaching driver: %s", exc)
        return self._d.sessions.cluster_cpus

    def _bury(self, dead: list) -> None:
        """Nodes that stopped heartbeating: mark them dead (once, cluster-wide) and retry
        the tasks this node had sent them."""
        for n in dead:
            self._bury_one(n, f"stopped heartbeating ({n.get('age', 0.0):.1f} s ago)")
        still_dead = {n.get("address") or n["node_id"] for n in dead}
        with self._bury_lock:
            self._buried &= still_dead  # a node that comes back may die again later

    def _bury_one(self, n: dict, why: str) -> None:
        d = self._d
        address = n.get("address") or n["node_id"]
        with self._bury_lock:
            if address in self._buried or address == d.address:
                return
            self._buried.add(address)
        if not n.get("dead"):
            try:
                self._control.mark_node_dead(n["node_id"])
            except Exception:  # noqa: BLE001 - another node may do it
                pass
        log.warning("node %s %s: declared dead", address, why)
        s = d.scheduler
        with s.lock:
            if d.spillback is not None:
                d.spillback.node_lost_locked(address)
            d.actor_calls.node_lost_locked(address)  # (actors its drivers had here end)
            out = s.take_out_locked()
        s.deliver(out)

    def _run(self) -> None:
        """Every ``load_s`` while the node reads input (what changes its load), else
        asleep until the next heartbeat or the first input (an idle node's agent does
        not wake for nothing: bench/IDLE.md)."""
        io = self._d.scheduler.io
        io.on_input = self._on_input
        next_beat = time.monotonic() + self.beat_s
        seen = io.inputs
        timeout = self.load_s
        while True:
            self._wake.wait(timeout)
            self._sleeping = False
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                load = self._load()
                self._push_load(load)
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + self.beat_s
                    self._beat(load)
            except Exception:  # noqa: BLE001 - the agent must outlive one bad round
                log.exception("dpool node agent: a heartbeat round failed")
            active, seen = io.inputs != seen, io.inputs
            if active:
                timeout = self.load_s
            else:  # (the flag before the last look: an input after it wakes us)
                self._sleeping = True
                timeout = self.load_s if io.inputs != seen else \
                    max(0.0, next_beat - time.monotonic())

    def _on_input(self) -> None:
        """The IO loop read input (any thread; cheap while the agent is awake)."""
        if self._sleeping:
            self._sleeping = False
            self._wake.set()
