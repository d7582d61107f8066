"""The node's link to the rest of the cluster: heartbeats, load reports, discovery.

A thread, off every task's path: every ``load_s`` it pushes this node's load (queue,
busy and total CPUs, average task time) to each linked global scheduler -- when the
scheduler's IO loop read anything since the last push (tasks, results, drivers: what
changes a load), else the schedulers have it already and nothing is sent. Then it
sleeps until the next thing it must do -- a heartbeat, a read of the tables (below) --
unless input comes in (the IO loop wakes it: ``on_input``) or a global scheduler is
linked (``Links.on_linked``), so an idle node's agent wakes for its heartbeats only
(it woke ten times a second, and pushed as many identical reports: issue 21).

Every ``beat_s`` it heartbeats the same load into the node table (pushing it too if it
differs from the last one pushed) and looks who is registered there, in one wait; it
reads the rows of the global schedulers and nodes when those changed or when one of
them may have stopped heartbeating (``control._watch``: at the first moment one could
count as dead, so a death is seen as soon as it can be), links to schedulers it has not
linked yet, and refreshes the cluster's CPU count that drivers see. A control store
that is briefly unreachable costs warnings, not tasks: the local path never waits on it.

A node that stops heartbeating is declared dead by whoever notices first (a node or a
global scheduler marks it in the node table, which publishes a node-death notice). This
node acts on the notice at once (``_on_death_notice``: the tasks it sent there are retried
elsewhere) and on its own next poll of the node table, which catches notices pub/sub lost.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Optional

from dpool.control import _keys as K
from dpool.control._interface import ClusterControlStore, Subscription
from dpool.control._watch import TableWatch
from dpool.protocol import _messages as m
from dpool.scheduling import _resources

if TYPE_CHECKING:
    from dpool.node._daemon import NodeDaemon

log = logging.getLogger("dpool.node")


class ClusterAgent:
    def __init__(self, daemon: NodeDaemon, control: ClusterControlStore,
                 load_s: float = 0.1, beat_s: float = 0.5) -> None:
        self._d = daemon
        self._control = control
        self.load_s = load_s
        self.beat_s = beat_s
        self.schedulers: list[str] = []  # global schedulers alive in the node table
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dpool-node-agent",
                                        daemon=True)
        self._pushed: Optional[m.Load] = None  # the load the schedulers were told last
        self._told: set[str] = set()  # the schedulers told it
        self._buried: set[str] = set()  # nodes declared dead (until they come back)
        self._bury_lock = threading.Lock()  # the agent thread and the notice listener
        self._notices: Optional[Subscription] = None
        self._watch = TableWatch(control)
        self._wake = threading.Event()  # input came in, or a link: do not sleep on
        self._asleep = False  # waiting without a pace: input must wake it (``_kick``)

    def start(self) -> None:
        self._d.scheduler.io.on_input = self._kick
        self._d.links.on_linked = lambda address: self._kick()
        self._beat()
        try:
            self._notices = self._control.subscribe([K.CH_NODE_DEAD], self._on_death_notice)
        except Exception as exc:  # noqa: BLE001 - the poll of the node table still buries
            log.warning("no node-death notices (polling the node table only): %s", exc)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._notices is not None:
            self._notices.stop()
        self._thread.join(timeout=5)

    def _on_death_notice(self, channel: str, data: bytes) -> None:
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
            busy_groups = [g for g in s.groups_locked() if g.queue]
            avg = (sum(s.batch.estimate(g.queue[0].fn_id) for g in busy_groups)
                   / len(busy_groups)) if busy_groups else s.batch.target_s
        status["avg_task_s"] = avg
        status["linked_schedulers"] = len(self.linked_schedulers())
        status["holds"] = d.runner.holds()
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

    def _push_load(self, load: dict, to_all: bool = True) -> None:
        """Tell the linked global schedulers ``load``: every one (``to_all``: each report
        also clears what a scheduler placed here since the last), else those it is news
        to -- it changed, or they linked since."""
        msg = m.Load(load["queued"], load["cpus_used"], load["cpus_total"], load["avg_task_s"],
                     load["holds"], self._resources())
        if msg != self._pushed:
            self._pushed, self._told, to_all = msg, set(), True
        for address in self.linked_schedulers():
            if to_all or address not in self._told:
                self._told.add(address)
                self._d.links.send(address, [msg])

    def _tell_new_links(self) -> None:
        """A scheduler linked since the last push gets the load at once (its placement
        knows nothing of this node's resources until then)."""
        told = self._told
        if any(a not in told for a in self.linked_schedulers()):
            self._push_load(self._load(), to_all=False)

    def _beat(self) -> None:
        d = self._d
        with d.scheduler.lock:
            d.runner.tick_locked()  # retire idle mirror groups
        load = self._load()
        self._push_load(load, to_all=False)  # a change no input showed (e.g. a lease)
        try:
            if d.prefixes is not None:
                d.prefixes.top_up()
        except Exception as exc:  # noqa: BLE001 - taken from the store when needed instead
            log.warning("could not reserve id prefixes: %s", exc)
        try:
            known, members = self._control.heartbeat_and_members(d.node_id, load)
            if not known:
                self._control.register_node(d.node_id, d.node_info())
            read = self._watch.saw(members)
        except Exception as exc:  # noqa: BLE001 - keep serving while Redis is away
            log.warning("control store unreachable: %s", exc)
            return
        if read:
            self._tables_read()
        for address in self.schedulers:
            if not d.links.connected(address):
                d.links.connect_soon(address)

    def _read_due_tables(self) -> None:
        """Between heartbeats: the rows, once one of them may say a member died."""
        if not self._watch.due():
            return
        try:
            self._watch.read_if_due()
        except Exception as exc:  # noqa: BLE001 - keep serving while Redis is away
            log.warning("control store unreachable: %s", exc)
            return
        self._tables_read()

    def _tables_read(self) -> None:
        """The rows were read: who is alive, what died, the cluster's CPUs."""
        d = self._d
        gss = [g for g in self._watch.global_schedulers if g.get("alive")]
        all_nodes = self._watch.nodes
        nodes = [n for n in all_nodes if n.get("alive")]
        self.schedulers = [g["address"] for g in gss]
        self._bury([n for n in all_nodes if not n.get("alive")])
        d.sessions.cluster_cpus = sum(int(n.get("num_cpus", 0)) for n in nodes) or d.num_cpus

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
            if d.spiller is not None:
                d.spiller.node_lost_locked(address)
            out = s.take_out_locked()
        s.deliver(out)

    def _kick(self) -> None:
        """Input came in (the IO thread) or a link is up: end the agent's sleep."""
        if self._asleep:
            self._asleep = False
            self._wake.set()

    def _run(self) -> None:
        next_beat = time.monotonic() + self.beat_s
        io = self._d.scheduler.io
        seen = -1  # the IO loop's input count at the last push
        while not self._stop.is_set():
            active = False
            try:
                inputs = io.inputs
                if inputs != seen:  # something came in: the load may have changed
                    seen = inputs
                    active = True
                    self._push_load(self._load())
                else:
                    self._tell_new_links()
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.beat_s
                    self._beat()
                else:
                    self._read_due_tables()
            except Exception:  # noqa: BLE001 - the agent must outlive one bad round
                log.exception("dpool node agent: a heartbeat round failed")
            if active:  # input is coming in: report again after ``load_s``, as it comes
                self._wake.wait(self.load_s)
            else:  # until the next heartbeat or read of the tables, or until woken; the
                # flag goes up before the last look at the input count, and the IO loop
                # looks at the flag after counting its input, so none is slept through
                self._asleep = True
                if io.inputs == seen:
                    self._wake.wait(max(0.0, min(next_beat, self._watch.due_at)
                                        - time.monotonic()))
                self._asleep = False
            self._wake.clear()
