"""The node daemon: the papers' local scheduler in a process of its own.

    drivers on this host ──unix socket──┐
    drivers elsewhere ───────TCP────────┼──▶ NodeServer ──▶ LocalScheduler ──▶ workers
    other nodes (results) ───TCP────────┘     (auth)         + HostStore (/dev/shm)
                                                              │ spill ▲ placed tasks
                                              Links ──────────▼─────┴──▶ global schedulers
                                              ClusterAgent ── heartbeats ──▶ Redis shards

One per host. It owns the host's CPUs (``--num-cpus``: at most that many tasks run at
once, over every driver's executors), its workers and its shared-memory store; drivers
attach to it instead of starting workers of their own. In a cluster (``--redis`` on the
head, ``--join`` elsewhere) it registers in the node table, heartbeats its load, links to
the global schedulers, spills what would wait too long here (``node._spillback``) and
runs what others spill (``node._remote``).

Started by ``dpool start`` as ``python -m dpool.node ...`` with the token in
``$DPOOL_TOKEN`` (never on the command line, where ``ps`` would show it); it reports
readiness on ``--ready-fd`` and runs until SIGTERM/SIGINT, then stops its workers and
removes its store's segments.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import tempfile
import time
from typing import TYPE_CHECKING, Any, Optional

from dpool.control import ClusterControlStore, InProcessControlStore
from dpool.node import _process
from dpool.node._actor_calls import ActorCalls
from dpool.node._kv import KeyValues
from dpool.node._attach import DriverSessions, PeerHandle
from dpool.node._ids import IdPrefixes
from dpool.node._links import Links, dial, peer_hello, welcome_message
from dpool.node._placement_groups import NodePlacementGroups
from dpool.node._remote import RemoteRunner
from dpool.node._server import NodeServer
from dpool.node._spillback import Spillback, resource_grace_s
from dpool.node._workdirs import WorkdirCache
from dpool.protocol import Channel
from dpool.protocol import messages as m
from dpool.scheduling import LocalScheduler
from dpool.scheduling import detect as _detect
from dpool.transfer import pull as _pull

if TYPE_CHECKING:
    from dpool.node._agent import ClusterAgent

log = logging.getLogger("dpool.node")


class _FlushedInBackground:
    """The Redis store as the scheduler's control store: its flusher thread sends the
    batched writes, so the scheduler's IO thread never waits on the network (``flush``
    does nothing; every other call goes to the store)."""

    def __init__(self, store: ClusterControlStore) -> None:
        self.register_function = store.register_function
        self.add_task = store.add_task
        self.add_call_edge = store.add_call_edge
        self.set_task_state = store.set_task_state
        self.add_object = store.add_object
        self.remove_object = store.remove_object
        self.log_event = store.log_event
        self.backlog = store.backlog
        self.get_task = store.get_task
        self.get_function = store.get_function
        self.get_object = store.get_object
        self.events = store.events

    def flush(self) -> None:
        pass


class NodeDaemon:
    def __init__(self, token: bytes, node_ip: str, bind: str, port: int, num_cpus: int,
                 unix_path: Optional[str], object_store_memory: Optional[int] = None,
                 redis: Optional[list] = None, join: Optional[str] = None,
                 state_dir: Optional[str] = None, num_gpus: Optional[int] = None,
                 resources: Optional[dict] = None) -> None:
        self.token = token
        self.num_cpus = num_cpus
        self.redis: list = list(redis or [])
        self.scheduler = LocalScheduler(InProcessControlStore())
        # the fork server that forks this node's workers: now, while this process has
        # one thread and no socket (it would hold the node's port bound past its end)
        self.scheduler.fork_point()
        self.scheduler.cpu_limit = num_cpus
        # GPUs (declared or detected), memory and custom resources this node offers
        custom = dict(resources or {})
        mem = custom.pop("memory", None)
        custom.pop("CPU", None)
        gpus = custom.pop("GPU", num_gpus)
        self.ledger = self.scheduler.ledger = _detect.ledger(gpus, mem, custom)
        if object_store_memory:
            self.scheduler.set_store_capacity(object_store_memory)
        self.server = NodeServer(token, bind, port, unix_path, self._attach, self._peer,
                                 self._serve_segment, self._lease,
                                 self._receive_segment)
        self.address = f"{node_ip}:{self.server.address[1]}"
        self.node_id = self.address
        os.environ["DPOOL_NODE_ID"] = self.node_id  # inherited by the workers
        self.sessions = DriverSessions(self.scheduler, self.node_id, num_cpus)
        self.links = Links(token, peer_hello(self.node_id, self.address, num_cpus),
                           self.scheduler.io, self._unreachable)
        self.workdirs = WorkdirCache(os.path.join(
            state_dir or tempfile.mkdtemp(prefix="dpool-node-"),
            f"workdirs-{self.server.address[1]}"))
        self.sessions.workdir_cache = self.workdirs
        self.runner = RemoteRunner(self.scheduler, self.node_id, self.links.send,
                                   workdirs=self.workdirs)
        self.runner.token = token
        self.sessions.remote_origin = self.runner.origin_of
        self.sessions.send_to_node = self.links.send
        self.actor_calls = ActorCalls(self.scheduler, self.node_id, self.links.send)
        self.control: Optional[ClusterControlStore] = None
        self.agent: Optional[ClusterAgent] = None
        self.metrics: Any = None  # ``node._metrics.MetricsServer`` (--metrics-port)
        self.spillback: Optional[Spillback] = None
        self.placement_groups: Optional[NodePlacementGroups] = None  # (in a cluster)
        self.prefixes: Optional[IdPrefixes] = None
        if join:  # the head tells a joining node where the control store is
            chan, welcome = dial(join, token, peer_hello(self.node_id, self.address,
                                                         num_cpus))
            chan.close()
            self.redis = json.loads(welcome.info).get("redis", [])
        if self.redis:
            self._join_cluster()

    def _join_cluster(self) -> None:
        from dpool.control import RedisControlStore
        from dpool.node._agent import ClusterAgent

        store = RedisControlStore(self.redis, self.token.decode(), node_id=self.node_id)
        store.start_flusher()
        self.control = store
        self.scheduler.set_control(_FlushedInBackground(store))
        store.register_node(self.node_id, self.node_info())
        self.prefixes = IdPrefixes(store.new_id_prefix)
        self.scheduler.id_prefix = self.prefixes.take
        self.sessions.prefixes = self.prefixes
        self.runner.set_id_base(self.prefixes.take() << 40)
        self.agent = ClusterAgent(self, store)
        self.spillback = Spillback(
            self.scheduler, self.address, self.links.send, self.agent.linked_schedulers,
            local_groups=lambda g: (self.runner.is_mirror(g) or g.actor is not None
                                    or not self.sessions.allows_spillback(g)),
            mirror=self.runner.is_mirror)
        self.spillback.token = self.token
        self.placement_groups = NodePlacementGroups(
            self.scheduler, self.address, self.links.send, self.agent.linked_schedulers)
        self.actor_calls.control = store
        self.key_values = KeyValues(self.scheduler, store)
        self.actor_calls.alive_nodes = self._alive_nodes
        placement = self.actor_calls.placement
        placement.schedulers = self.agent.linked_schedulers
        placement.grace_s = resource_grace_s()
        placement.chain_answers()  # (after the spillback's handlers for those messages)
        placement.relay_to = self.runner.placed_locked
        placement.relay_failed = self.runner.relay_failed_locked
        self.actor_calls.origin_of = self.runner.origin_of
        self.actor_calls.take_origin = self.runner.take_origin_locked
        self.actor_calls.origin_call = self.runner.origin_call_locked
        self.actor_calls.hosted_id = self.runner.hosted_id
        self.spillback.actor_logs = self.actor_calls.rebuilds
        self.actor_calls.rebuilds.take_away = self.spillback.take_away_locked
        self.sessions.place_actor = placement.place_locked
        self.sessions.driver_closed_hooks.append(self.placement_groups.driver_closed_locked)
        self.runner.control = store
        self.sessions.peer_closed_hooks.append(self._peer_closed_locked)
        self.sessions.cluster_status = self._cluster_status
        self.sessions.output_log = store.log_output
        self.sessions.publish_workdir = store.put_workdir
        self.runner.fetch_workdir = store.get_workdir

    def _cluster_status(self, here: dict) -> dict:
        """Every node (from the node table), the global schedulers and the shards."""
        control = self.control
        if control is None:  # (only called once the node joined a cluster)
            return {"nodes": [here], "global_schedulers": [], "shards": []}
        try:
            gss, rows, _ = control.cluster_view()
        except Exception as exc:  # noqa: BLE001 - report what this node knows
            return {"nodes": [here], "global_schedulers": [], "shards": control.shard_info(),
                    "error": str(exc)}
        nodes = []
        for row in rows:
            load = row.get("load") or {}
            if isinstance(load, str):
                load = json.loads(load or "{}")
            node = {"node_id": row["node_id"], "alive": bool(row.get("alive")),
                    "cpus_total": int(row.get("num_cpus", 0)),
                    "cpus_used": load.get("cpus_used", 0), "queued": load.get("queued", 0),
                    "store_used": load.get("store_used", 0),
                    "store_capacity": load.get("store_capacity", 0),
                    "linked_schedulers": load.get("linked_schedulers", 0),
                    "resources": row.get("resources") or {}}
            if row["node_id"] == self.node_id:
                node.update({k: v for k, v in here.items() if k in node})
            nodes.append(node)
        return {"nodes": nodes,
                "global_schedulers": [{"address": g.get("address"), "alive": g.get("alive")}
                                      for g in gss],
                "shards": control.shard_info()}

    def _alive_nodes(self) -> set:
        """The nodes the node table says are alive (the actor directory's check)."""
        control = self.control
        if control is None:
            return {self.node_id}
        return {row["node_id"] for row in control.nodes() if row.get("alive")}

    def node_info(self) -> dict:
        return {"address": self.address, "num_cpus": self.num_cpus,
                "resources": self.ledger.offer(self.num_cpus),
                "hostname": socket.gethostname(), "pid": os.getpid()}

    # -- connections ---------------------------------------------------------------------
    def _attach(self, chan: Channel, hello: m.Attach) -> None:
        cpus = self.agent.fresh_cluster_cpus() if self.agent is not None \
            else self.sessions.cluster_cpus
        self.sessions.attach(chan, hello, cluster_cpus=cpus)

    def _lease(self, sock: socket.socket, req: m.LeaseRequest) -> None:
        """A driver of this host asks for a worker of its own (``node._leases``)."""
        self.sessions.leases.grant(sock, req)

    def _peer(self, chan: Channel, hello: m.PeerHello) -> None:
        """Another node links to this one (to send results of tasks spilled from here,
        or to learn where the control store is when it joins)."""
        chan.send(welcome_message(self.node_id, {"redis": self.redis}))
        h = PeerHandle(chan, hello.node_id, hello.address, outgoing=False)
        chan.set_blocking(False)
        self.scheduler.io.add(h)

    def _serve_segment(self, sock: socket.socket, req: m.FetchSegment) -> None:
        """Another node pulls (a range of) one of this store's values
        (``transfer._pull``): only segments of this node's store, never any other file."""
        name = req.name
        prefix = f"/dpool_{self.scheduler.store.owner_pid}_"
        if not name.startswith(prefix):  # another node's object this node keeps a copy of
            name = self.runner.copy_of(name) or name
        if not name.startswith(prefix) or not name[len(prefix):].isalnum():
            log.warning("refused to send %r: not a segment of this node's store", name)
            sock.sendall(b"\0" * 8)
            return
        t0 = time.monotonic()
        sent = _pull.serve(sock, name, req.offset, req.length)
        log.info("sent %s to a node in %.1f ms (%d bytes from %d)", name,
                 (time.monotonic() - t0) * 1e3, sent, req.offset)  # (bench/transfer.py)

    def _receive_segment(self, sock: socket.socket, req: m.PushSegment) -> None:
        """A driver that reaches this node over TCP uploads a large value into this
        store (``transfer._push``), in this connection's thread."""
        t0 = time.monotonic()
        self.sessions.receive_push(sock, req)
        log.info("received object %#x from a driver in %.1f ms (%d bytes from %d of %d)",
                 req.object_id, (time.monotonic() - t0) * 1e3,
                 (req.size - req.offset) if req.length < 0 else req.length, req.offset,
                 req.size)

    def _peer_closed_locked(self, h: PeerHandle) -> None:
        if h.outgoing:
            self.links.forget(h)
        if self.spillback is not None:
            self.spillback.peer_closed_locked(h)
            self.actor_calls.rebuilds.hosts_lost_locked(  # (the driver's actors there)
                {h.address, h.peer_id}, f"the link to its node {h.address} closed")
        if self.placement_groups is not None:
            self.placement_groups.peer_closed_locked(h)

    def _unreachable(self, address: str, msgs: list) -> None:
        s = self.scheduler
        with s.lock:
            if self.spillback is not None:
                self.spillback.unreachable_locked(address, msgs)
            out = s.take_out_locked()
        s.deliver(out)

    # -- lifetime ------------------------------------------------------------------------
    def drain(self, grace_s: float) -> None:
        """SIGTERM (a batch system's or Kubernetes' notice before a kill): take no more
        tasks -- 0 CPUs advertised, so global schedulers place nothing here, and tasks
        spilled here come back to their origins -- and hand back those not started; let
        the running ones finish for up to ``grace_s``; hand back what still runs then.
        Handed back, a task runs again elsewhere without being charged an attempt."""
        s = self.scheduler
        reason = f"node {self.node_id} is stopping"
        with s.lock:
            self.runner.draining = reason
            s.cpu_limit = 0
            self.sessions.num_cpus = 0
            back = self.runner.give_back_locked(reason, running_too=False)
            out = s.take_out_locked()
        s.deliver(out)
        if self.agent is not None:
            self.agent.nudge()  # (its load, 0 CPUs, goes out now)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with s.lock:  # (a worker lent to a driver is not running a task of ours)
                busy = sum(1 for g in s.groups_locked() for w in g.workers
                           if w.inflight and w.alive)
            if not busy:
                break
            time.sleep(0.05)
        with s.lock:
            back += self.runner.give_back_locked(
                f"{reason}; its grace period ({grace_s:g} s) ended first", running_too=True)
            out = s.take_out_locked()
        s.deliver(out)
        if back:
            log.info("node %s: gave %d task(s) back to their origins", self.node_id, back)
        self.links.flush(2.0)  # (those words reach their origins before the links close)

    def serve_metrics(self, bind: str, port: int) -> int:
        """``/metrics`` and ``/health`` on ``bind:port`` (``node._metrics``); the port."""
        from dpool.node._metrics import MetricsServer, TaskMetrics

        self.scheduler.count_tasks(TaskMetrics())
        self.metrics = MetricsServer(self._metrics_text, self.token, bind, port)
        self.metrics.start()
        return self.metrics.port

    def _metrics_text(self) -> str:
        from dpool.node._metrics import heartbeat_ages, render

        s = self.scheduler
        with s.lock:
            status = self.sessions.status_locked()
            workers = [w for g in s.groups_locked() for w in g.workers if w.alive]
            busy = sum(1 for w in workers if w.inflight or w.leased is not None)
            spilled = s.store.spilled_bytes
            tasks = s.task_metrics.copy()
        ages: dict = {}
        if self.control is not None:
            try:
                ages = heartbeat_ages(self.control.cluster_view()[1])
            except Exception:  # noqa: BLE001 - the rest still answers
                ages = {}
        return render(status, tasks, (busy, len(workers) - busy), spilled, ages)

    def serve(self) -> None:
        self.server.start()
        if self.agent is not None:
            self.agent.start()

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.agent is not None:
            self.agent.stop()
        if self.control is not None:
            # out of the node table before the links close: a global scheduler that sees
            # them close and finds nothing listening here must not declare a node dead
            # that left (``global_scheduler._watch``)
            try:
                self.control.remove_node(self.node_id)
            except Exception:  # noqa: BLE001 - the shards may be stopping too
                pass
        self.server.close()
        self.links.close()
        self.scheduler.shutdown()
        self.workdirs.clear()
        if self.control is not None:
            self.control.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dpool.node",
                                description="a dpool node daemon (started by `dpool start`)")
    p.add_argument("--node-ip", default="127.0.0.1")
    p.add_argument("--bind", default=None, help="listen address (default: --node-ip)")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--num-gpus", type=int, default=None)
    p.add_argument("--resources", default=None, help='JSON: {"name": amount, ...}')
    p.add_argument("--unix-path", default=None)
    p.add_argument("--object-store-memory", type=int, default=None)
    p.add_argument("--join", default=None, help="the head node's address")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve /metrics (Prometheus) and /health on this port (0: any)")
    p.add_argument("--drain-grace", type=float, default=8.0,
                   help="on SIGTERM, how long running tasks may finish before the node "
                        "hands them back to other nodes (default 8 s)")
    _process.add_arguments(p)
    return p


def main(argv: Optional[list] = None) -> int:
    args = _parser().parse_args(argv)
    proc = _process.DaemonProcess("dpool node", args)
    if (status := proc.missing_token()) is not None:
        return status
    num_cpus = args.num_cpus if args.num_cpus is not None else _detect.cpus()
    bind = args.bind or args.node_ip
    try:
        resources = _detect.parse_resources(args.resources, "--resources") \
            if args.resources else None
        daemon = NodeDaemon(proc.token.encode(), args.node_ip, bind, args.port, num_cpus,
                            args.unix_path, args.object_store_memory, proc.redis, args.join,
                            os.path.dirname(args.unix_path) if args.unix_path else None,
                            args.num_gpus, resources)
    except Exception as exc:  # noqa: BLE001 - reported to `dpool start`
        return proc.failed(f"cannot listen on {bind}:{args.port}: {exc}"
                           if isinstance(exc, OSError) else str(exc))
    daemon.serve()
    if args.metrics_port is not None:
        try:
            port = daemon.serve_metrics(bind, args.metrics_port)
        except OSError as exc:
            daemon.close()
            return proc.failed(f"cannot serve metrics on {bind}:{args.metrics_port}: {exc}")
        log.info("node %s: metrics on http://%s:%d/metrics", daemon.node_id, bind, port)
    log.info("node %s serving (%d CPUs, unix socket %s)", daemon.node_id, num_cpus,
             args.unix_path)
    proc.serving(f"{daemon.node_id} {socket.gethostname()}")
    try:
        proc.run_until_stopped()
        daemon.drain(args.drain_grace)
    finally:
        daemon.close()
        log.info("node %s stopped", daemon.node_id)
    return 0
