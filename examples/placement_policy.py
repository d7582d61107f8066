"""A placement policy of your own, plugged into a cluster without touching dpool.

``FillFirst`` fills the nodes one after the other (in address order, each up to its
CPUs) instead of spreading -- what you want when idle nodes can be switched off. It is
a ``dpool.PlacementPolicy``: ``keep`` says how many queued tasks a node keeps (here:
what it can start at once; the rest spill), ``place`` where a spilled task goes (a node,
or ``None``: not now).

On one machine (the embedded runtime) it only shows its decisions on made-up nodes::

    python examples/placement_policy.py

On a loopback cluster, the global scheduler places every spilled task with it::

    cd examples; export PYTHONPATH=$PWD     # where the daemons import the policy from
    dpool start --head --port 6390 --node-ip 127.0.0.2 --num-cpus 0 \\
        --placement-policy placement_policy:FillFirst        # prints DPOOL_TOKEN=...
    DPOOL_STATE_DIR=/tmp/n3 dpool start --address 127.0.0.2:6390 --token T --node-ip 127.0.0.3
    DPOOL_STATE_DIR=/tmp/n4 dpool start --address 127.0.0.2:6390 --token T --node-ip 127.0.0.4
    DPOOL_ADDRESS=127.0.0.2:6390 DPOOL_TOKEN=T python placement_policy.py
    dpool stop; DPOOL_STATE_DIR=/tmp/n3 dpool stop; DPOOL_STATE_DIR=/tmp/n4 dpool stop

(``--placement-policy spread`` is the built-in round-robin; ``default`` the least
estimated wait.)
"""

from __future__ import annotations

import collections
import time
from typing import Optional, Sequence

import dpool


class FillFirst(dpool.LeastWait):
    def keep(self, q: dpool.LocalQueue) -> int:
        return q.free  # what cannot start here at once goes to the global scheduler

    def place(self, demand: dpool.Demand,
              nodes: Sequence[dpool.NodeLoad]) -> Optional[dpool.NodeLoad]:
        if demand.strategy is not None:  # a task that asked for a strategy gets it
            return super().place(demand, nodes)
        fit = sorted((n for n in nodes if n.address != demand.origin
                      and n.can_hold(demand.req)), key=lambda n: n.address)
        for n in fit:
            if n.has_free(demand.req):
                return n
        return fit[0] if fit else None  # all busy: queue on the first


def where(i: int) -> str:
    time.sleep(0.1)
    return dpool.node_id()


def main() -> None:
    policy = FillFirst()
    nodes = [dpool.NodeLoad("10.0.0.2:6380", cpus=2), dpool.NodeLoad("10.0.0.3:6380", cpus=2)]
    picks = []
    for _ in range(5):
        n = policy.place(dpool.Demand(origin="10.0.0.9:6380"), nodes)
        assert n is not None
        n.pending += 1  # (the global scheduler counts a placement until the next load report)
        picks.append(n.address)
    print("FillFirst places 5 tasks on 2 nodes of 2 CPUs:", picks)
    with dpool.ProcessPoolExecutor(4) as ex:
        ran = collections.Counter(ex.map(where, range(12)))
    print("12 tasks ran on:", dict(sorted(ran.items())))


if __name__ == "__main__":
    main()
