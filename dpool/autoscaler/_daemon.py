"""The autoscaler's loop and process (``dpool start --head --autoscale MIN:MAX`` starts it
beside the head; ``dpool stop`` stops it, and it stops every node it added).

Every ``period_s`` it asks the head for the cluster's status (``dpool status``'s), turns
it into a ``ClusterView`` -- each live node's queued tasks and busy CPUs, which nodes it
added (by their addresses) and since when each has been idle, how many it is still
starting -- asks the policy for a ``Decision`` and applies it through the provider:
nodes to add are started in the background, nodes to remove are stopped (drained). Each
decision is logged; a node that fails to start is logged with why, and its slot is free
again.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from typing import Any, Optional

from dpool.autoscaler._policy import AutoscalePolicy, ClusterView, NodeSeen, QueueTarget
from dpool.autoscaler._providers import (
    NodeProvider,
    ProviderError,
    load_provider,
    read_config,
)
from dpool.node import process as _process

log = logging.getLogger("dpool.autoscaler")

_LOST_AFTER_S = 60.0  # after its start ended, a node never seen alive this long is given up


class Autoscaler:
    def __init__(self, status: Any, provider: NodeProvider, policy: AutoscalePolicy,
                 period_s: float = 1.0, requested: Any = None,
                 min_nodes: Optional[int] = None, max_nodes: Optional[int] = None) -> None:
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self._asked = 0  # the standing request's CPUs, as last read
        self._stops: list = []  # threads stopping nodes
        self._status = status  # () -> the cluster's status dict (``dpool status --json``)
        self._requested = requested  # (status) -> CPUs a standing request asks; None: 0
        self.provider = provider
        self.policy = policy
        self.period_s = period_s
        self._idle: dict[str, float] = {}  # node id -> since when it ran nothing
        self._lost: list = []  # its nodes gone from the cluster (the last ``view``)
        self.decisions: list[tuple[float, int, list]] = []  # (when, added, removed)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def view(self, now: float) -> ClusterView:
        status = self._status()
        provided = [n for n in self.provider.nodes() if not n.terminating]
        ours = {n.node_id for n in provided if n.node_id}
        stopping = {n.node_id for n in self.provider.nodes() if n.terminating}
        seen = []
        for n in status.get("nodes", ()):
            if not n.get("alive") or n["node_id"] in stopping:
                continue  # (a node being drained is no capacity any more)
            nid = n["node_id"]
            busy = bool(n.get("cpus_used") or n.get("queued"))
            if busy:
                self._idle.pop(nid, None)
            else:
                self._idle.setdefault(nid, now)
            seen.append(NodeSeen(nid, int(n.get("cpus_total", 0)), int(n.get("cpus_used", 0)),
                                 int(n.get("queued", 0)), nid in ours, self._idle.get(nid)))
        live = {x.node_id for x in seen}
        for nid in [k for k in self._idle if k not in live]:
            del self._idle[nid]  # (gone: a later node under its id starts busy)
        pending = 0
        self._lost = []
        for n in provided:
            if n.error:
                continue
            if n.node_id in live:
                n.seen_live = True
            elif n.started.is_set() and (n.seen_live or now - n.created > _LOST_AFTER_S):
                self._lost.append(n)  # it died, or never came up: forgotten (below)
            else:
                pending += 1
        if self._requested is not None:
            try:
                self._asked = int(self._requested(status))
            except Exception as exc:  # noqa: BLE001 - the last one read stands meanwhile
                log.debug("autoscaler: reading the standing request: %s", exc)
        return ClusterView(seen, pending, len(provided) - len(self._lost), now, self._asked)

    def step(self) -> None:
        """One round: look, decide, act."""
        forget = getattr(self.provider, "forget_failed", None)
        for failed in forget() if forget is not None else ():
            log.warning("autoscaler: a node on %s failed to start: %s", failed.key,
                        failed.error)
        view = self.view(time.monotonic())
        for n in self._lost:
            log.warning("autoscaler: node %s (%s) is gone from the cluster; forgetting it",
                        n.node_id or "?", n.key)
            self._terminate(n)
        d = self.policy.decide(view)
        room = self.max_nodes - view.ours if self.max_nodes is not None else d.add
        d.add = max(0, min(d.add, room))  # (whatever a policy says: within MIN..MAX)
        if self.min_nodes is not None:
            d.remove = d.remove[:max(0, view.ours - self.min_nodes)]
        if not d.add and not d.remove:
            return
        log.info("autoscaler: +%d -%d (%s; %d queued, %d node(s) of ours, %d starting)",
                 d.add, len(d.remove), d.why, view.queued, view.ours, view.pending)
        self.decisions.append((time.time(), d.add, list(d.remove)))
        for _ in range(d.add):
            try:
                self.provider.create_node()
            except ProviderError as exc:
                log.warning("autoscaler: %s", exc)
                break
        by_id = {n.node_id: n for n in self.provider.nodes() if n.node_id}
        for nid in d.remove:
            node = by_id.get(nid)
            if node is not None:  # (only nodes it added)
                self._idle.pop(nid, None)
                self._terminate(node)

    def _terminate(self, node: Any) -> None:
        if node.terminating:
            return  # (once)
        node.terminating = True

        def stop() -> None:
            try:
                self.provider.terminate_node(node)
            finally:
                node.terminating = False  # (stopped and forgotten, or to try again)

        t = threading.Thread(target=stop, daemon=True, name="dpool-autoscale-stop")
        self._stops.append(t)
        t.start()

    def run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - the next round looks again
                log.warning("autoscaler: a round failed: %s", exc)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="dpool-autoscaler", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 50.0) -> None:
        """Stop the loop, then every node it added (drained, in parallel), within
        ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        if self._thread is not None:
            self._thread.join(min(self.period_s + 10, timeout))
        for n in self.provider.nodes():
            self._terminate(n)
        for t in list(self._stops):
            t.join(max(0.0, deadline - time.monotonic()))


class _RequestReader:
    """The standing ``dpool.request_resources`` (CPUs), read from the control store whose
    shards the status names."""

    def __init__(self, token: str) -> None:
        self._token = token
        self._store: Any = None

    def __call__(self, status: dict) -> int:
        import json

        from dpool.control import RedisControlStore
        from dpool.control import keys as _keys

        if self._store is None:
            shards = [s["address"] for s in status.get("shards", ())]
            if not shards:
                return 0
            self._store = RedisControlStore(shards, self._token)
        try:
            raw = self._store.get_value(_keys.AUTOSCALE_REQUEST)
        except Exception:
            self._store = None  # (connect afresh next time: a failover, say)
            raise
        return int(json.loads(raw).get("num_cpus", 0)) if raw else 0


def parse_range(text: str) -> tuple[int, int]:
    """``MIN:MAX`` as two ints (``ValueError`` saying what is wrong)."""
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--autoscale takes MIN:MAX (e.g. 0:4), got {text!r}") from None
    if not 0 <= lo <= hi:
        raise ValueError(f"--autoscale MIN:MAX needs 0 <= MIN <= MAX, got {text!r}")
    return lo, hi


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dpool.autoscaler",
                                description="dpool's autoscaler (started by `dpool start "
                                            "--head --autoscale`)")
    p.add_argument("--head", required=True, help="the head node's address")
    p.add_argument("--autoscale", required=True, metavar="MIN:MAX")
    p.add_argument("--provider", default="local")
    p.add_argument("--provider-config", default=None)
    p.add_argument("--idle-timeout", type=float, default=60.0)
    p.add_argument("--period", type=float, default=1.0)
    p.add_argument("--state", required=True, help="its folder (its nodes' state folders)")
    _process.add_arguments(p)
    return p


def main(argv: Optional[list] = None) -> int:
    args = _parser().parse_args(argv)
    proc = _process.DaemonProcess("dpool autoscaler", args)
    if (status := proc.missing_token()) is not None:
        return status
    try:
        lo, hi = parse_range(args.autoscale)
        provider = load_provider(args.provider, read_config(args.provider_config),
                                 args.head, proc.token, args.state)
        policy = QueueTarget(lo, hi, provider.cpus_per_node, args.idle_timeout)
    except (ValueError, ProviderError) as exc:
        return proc.failed(str(exc))
    from dpool.observe import node_status
    from dpool.runtime import address as _address

    target = _address.resolve(args.head, proc.token)
    scaler = Autoscaler(lambda: node_status(target), provider, policy, args.period,
                        _RequestReader(proc.token), lo, hi)
    scaler.start()
    log.info("autoscaler for %s serving (%d..%d nodes, provider %s)", args.head, lo, hi,
             args.provider)
    proc.serving(f"autoscaler {args.head}")
    try:
        proc.run_until_stopped()
    finally:
        scaler.close()
        log.info("autoscaler stopped (%d decisions)", len(scaler.decisions))
    return 0
