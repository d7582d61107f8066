"""The global scheduler: a stateless replica that places the tasks nodes spill.

    node A ──RemoteTask──▶ GlobalScheduler ──RemoteTask──▶ node B (least estimated wait)
    nodes ──Load (when it changes)───▶ │           └──SpillbackRejected──▶ A (no other node)

Every node links to every global scheduler (finding them in the control store) and
pushes its load over the link; placement uses those reports, through the cluster's
placement policy (``dpool.placement``: the built-in least-wait rule unless
``--placement-policy module:Class`` names another). A task the policy can never place
as asked (a hard ``NodeAffinity`` to a node not linked) goes back as ``PlacementFailed``.
It keeps no task: a spilled task is forwarded as soon as it arrives, and the origin node
keeps the task's record until its result comes back, so killing a replica loses nothing
(the origin takes back what was not yet placed and spills it through another). It
registers itself and heartbeats in the control store, where nodes and ``dpool status``
find it.
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Optional

from dpool.control import ClusterControlStore
from dpool.errors import PlacementError
from dpool.global_scheduler._placement_groups import PlacementGroupTable
from dpool.global_scheduler._watch import NodeWatch
from dpool.node import NodeServer, PeerHandle, welcome_message
from dpool.node import process as _process
from dpool.placement import (
    Demand,
    InBundle,
    LeastWait,
    NodeLoad,
    PlacementPolicy,
    strategy_from_wire,
)
from dpool.protocol import Channel, ChannelClosed, IOLoop, decode_batch, encode_batch
from dpool.protocol import messages as m
from dpool.scheduling import resources as _resources
from dpool.transfer import pull as _pull

log = logging.getLogger("dpool.global_scheduler")


class GlobalScheduler:
    def __init__(self, token: bytes, bind: str, port: int,
                 control: Optional[ClusterControlStore] = None, gs_id: str = "",
                 advertise: str = "", policy: Optional[PlacementPolicy] = None) -> None:
        self._lock = threading.Lock()
        self.policy: PlacementPolicy = policy if policy is not None else LeastWait()
        self._fallback = LeastWait()  # when a loaded policy raises something unexpected
        self._nodes: dict[str, tuple[PeerHandle, NodeLoad]] = {}
        self._control = control
        self.placed = 0
        self.rejected = 0
        self._io = IOLoop(self._on_frames, self._on_closed, self._on_tick)
        self.server = NodeServer(token, bind, port, None, None, self._on_peer)
        self.address = f"{advertise or bind}:{self.server.address[1]}"
        self.gs_id = gs_id or f"gs-{self.address}"
        # its heartbeat, the nodes alive in the node table, declaring dead ones dead
        self._watch = None if control is None else NodeWatch(
            control, self.gs_id, lambda: control.register_global_scheduler(self.gs_id,
                                                                           self.address))
        # the placement groups it reserved (``_placement_groups``)
        self.placement_groups = PlacementGroupTable(self._send_to)

    def serve(self) -> None:
        self.server.start()
        if self._control is not None:
            self._control.register_global_scheduler(self.gs_id, self.address)
        if self._watch is not None:
            self._watch.start()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        self.server.close()
        self._io.stop()
        with self._lock:
            for h, _ in self._nodes.values():
                h.chan.close()
            self._nodes.clear()
        if self._control is not None:
            try:
                self._control.unregister_global_scheduler(self.gs_id)
            except Exception:  # noqa: BLE001 - the store may be gone first at shutdown
                pass

    # -- connections ---------------------------------------------------------------------
    def _on_peer(self, chan: Channel, hello: m.PeerHello) -> None:
        h = PeerHandle(chan, hello.node_id, hello.address, outgoing=False)
        chan.send(welcome_message(self.gs_id))
        chan.set_blocking(False)
        with self._lock:
            old = self._nodes.get(hello.address)
            self._nodes[hello.address] = (h, NodeLoad(hello.address, hello.num_cpus,
                                                      node_id=hello.node_id))
        if old is not None:
            old[0].mark_stopping()
            old[0].chan.close()  # the node linked again: its old link is dead
        self._io.add(h)
        if self._watch is not None:
            self._watch.heard(hello.address)
        log.info("node %s linked (%d CPUs)", hello.node_id, hello.num_cpus)

    def _on_closed(self, h: PeerHandle) -> None:
        with self._lock:
            entry = self._nodes.get(h.address)
            if entry is not None and entry[0] is h:
                del self._nodes[h.address]
                self.placement_groups.node_lost(h.address, self._loads_locked())
                if self._watch is not None:
                    self._watch.link_closed(h.peer_id, h.address)
        h.mark_closed()
        h.chan.close()
        log.info("node %s unlinked", h.peer_id)

    def _send_to(self, address: str, msgs: list) -> None:
        """To a linked node by address (dropped if it is not linked: its link closed, and
        what it held is accounted for by ``_on_closed``)."""
        entry = self._nodes.get(address)
        if entry is not None:
            self._send(entry[0], msgs)

    def _loads_locked(self) -> list:
        alive = None if self._watch is None else self._watch.alive
        return [load for _, load in self._nodes.values()
                if alive is None or load.address in alive]

    def _send(self, h: PeerHandle, msgs: list) -> bool:
        """False: ``h``'s link is closed (nothing was sent)."""
        try:
            if not h.chan.send(encode_batch(msgs)):
                self._io.want_write(h)
        except ChannelClosed:
            return False
        return True

    # -- messages ------------------------------------------------------------------------
    def _on_frames(self, h: PeerHandle, frames: list) -> None:
        out: dict = {}  # handle -> messages: one frame per node for this read
        for frame in frames:
            for msg in decode_batch(frame):
                if isinstance(msg, m.RemoteTask):
                    target, fwd = self._place(h, msg)
                    out.setdefault(target, []).append(fwd)
                elif isinstance(msg, m.Load):
                    with self._lock:
                        entry = self._nodes.get(h.address)
                        if entry is not None:
                            load = entry[1]
                            load.queued, load.busy = msg.queued, msg.busy
                            load.cpus, load.avg_task_s = msg.num_cpus, msg.avg_task_s
                            load.holds = frozenset(msg.holds)
                            load.resources = {k: total for k, total, _ in msg.resources}
                            load.free = {k: free for k, _, free in msg.resources}
                            # placements the report does not show yet (sent after the
                            # node counted, or crossing the report): still pending there
                            load.pending = 0 if msg.received < 0 else \
                                max(0, entry[0].tasks_out - msg.received)
                            self.placement_groups.on_load(self._loads_locked())
                    if self._watch is not None:
                        self._watch.heard(h.address)
                elif isinstance(msg, (m.PlacementGroupReserve, m.PlacementGroupRemove,
                                      m.BundleHeld)):
                    with self._lock:
                        self.placement_groups.on_message(msg, self._loads_locked())
                else:
                    raise ValueError(f"global scheduler got unexpected {type(msg).__name__}")
        for target, msgs in out.items():
            if not self._send(target, msgs) and target is not h:
                # the chosen node's link closed under it: its origin tries again now
                # rather than after its place timeout
                back = [m.SpillbackRejected(x.task_id, f"node {target.address} went away as "
                                        "the task was sent to it")
                        for x in msgs if isinstance(x, m.RemoteTask)]
                if back:
                    self._send(h, back)

    def _place(self, origin: PeerHandle, msg: m.RemoteTask) -> tuple:
        """(where to send, what): the chosen node and the task, or the origin and a
        ``SpillbackRejected``."""
        size = 0
        inputs = []  # large inputs by reference: (holder, segment, size)
        for p in [msg.args, *(p for _, ok, p in msg.deps or () if ok)]:
            ref = _pull.parse_remote(p)
            if ref is not None:
                inputs.append((ref[1], ref[2], ref[0]))
            else:
                size += len(p or b"")
        req = _resources.from_wire(msg.req)
        # a strategy travels after the request's four fields (absent: the default rule)
        wire = msg.req
        strategy = strategy_from_wire(wire[4]) if wire is not None and len(wire) > 4 else None
        demand = Demand(msg.origin, req, tuple(inputs), size, strategy)
        with self._lock:
            if isinstance(strategy, InBundle):  # to the node holding its bundle
                node, why = self.placement_groups.place(strategy, msg.origin)
                entry = self._nodes.get(node) if node is not None else None
                self.rejected += 1
                if node == msg.origin:  # (spilled from its queue before it was routed:
                    # back home, where its bundle is -- not RunHere, which drops it)
                    return origin, m.SpillbackRejected(msg.task_id, "its bundle is on its origin")
                if entry is None:
                    return origin, m.PlacementFailed(msg.task_id, why or (
                        f"the node holding its bundle ({node}) is not linked"))
                self.rejected -= 1
                self.placed += 1
                entry[0].tasks_out += 1
                return entry[0], msg
            loads = self._loads_locked()
            try:
                best = self.policy.place(demand, loads)
            except PlacementError as exc:
                self.rejected += 1
                return origin, m.PlacementFailed(msg.task_id, str(exc))
            except Exception:  # a loaded policy's bug must not stop placing
                log.exception("placement policy %r failed: using the built-in rule",
                              self.policy)
                best = self._fallback.place(demand, loads)
            entry = self._nodes.get(best.address) if best is not None else None
            target = entry[0] if entry is not None else None
            home = best is not None and best.address == msg.origin  # (a strategy chose it)
            # A task sent back to its origin (``RunHere``) is not pending there: it is no
            # RemoteTask, so the origin's reports never count it as received, and it may
            # start and end between two of them -- the next report is then the last one
            # again, which the origin sends only every 5 s (``node._agent._REFRESH_S``).
            # Counted, it kept the origin looking busy that long after its CPUs were free,
            # and a placement group that needs them waiting with it.
            if target is not None and not home:
                best.pending += 1  # type: ignore[union-attr]
                target.tasks_out += 1
        if target is None or not target.alive:
            self.rejected += 1
            if req is not None:
                offers = "; ".join(f"{n.address} {n.describe()}"
                                   for n in sorted(loads, key=lambda n: n.address))
                return origin, m.SpillbackRejected(
                    msg.task_id, f"the task asks for {req} but no node has it (the nodes "
                    f"offer: {offers or 'none linked'})")
            return origin, m.SpillbackRejected(
                msg.task_id, "no other node with CPUs is linked to this global scheduler")
        self.placed += 1
        if home:
            return origin, m.RunHere(msg.task_id)
        return target, msg

    def _on_tick(self) -> bool:
        return False  # nothing periodic: the IO loop sleeps until input (``_ioloop``)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dpool.global_scheduler")
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--advertise", default="", help="the address nodes reach it at "
                   "(default: --bind)")
    p.add_argument("--placement-policy", default="", metavar="MODULE:CLASS",
                   help="where spilled tasks go: 'default', 'spread' or MODULE:CLASS "
                   "(a dpool.PlacementPolicy)")
    _process.add_arguments(p)
    return p


def main(argv: Optional[list] = None) -> int:
    args = _parser().parse_args(argv)
    proc = _process.DaemonProcess("dpool global scheduler", args)
    if (status := proc.missing_token()) is not None:
        return status
    control = None
    try:
        if proc.redis:
            from dpool.control import RedisControlStore

            control = RedisControlStore(proc.redis, proc.token)
        from dpool.placement import load as load_policy

        policy = load_policy(args.placement_policy or None)
        gs = GlobalScheduler(proc.token.encode(), args.bind, args.port, control,
                             advertise=args.advertise, policy=policy)
        gs.serve()
    except Exception as exc:  # noqa: BLE001 - reported to `dpool start`
        return proc.failed(str(exc))
    log.info("global scheduler %s serving", gs.address)
    proc.serving(gs.address)
    proc.run_until_stopped()
    gs.close()
    log.info("global scheduler %s stopped (placed %d, rejected %d)", gs.address, gs.placed,
             gs.rejected)
    return 0
