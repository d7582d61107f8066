"""Where tasks run, asked per call or per executor: ``scheduling="spread"``,
``dpool.NodeAffinity(node, soft=...)``, or ``"default"`` (the cluster's policy).

On one machine (the embedded runtime) there is one node, this host (``"local"``): every
strategy runs here, and a hard affinity to any other node fails with
``dpool.PlacementError``::

    python examples/scheduling_strategies.py

On a loopback cluster the same program spreads its tasks over the nodes, pins some to
the last node and shows the error for a node that is not there::

    dpool start --head --port 6390 --node-ip 127.0.0.2          # prints DPOOL_TOKEN=...
    DPOOL_STATE_DIR=/tmp/n3 dpool start --address 127.0.0.2:6390 --token T --node-ip 127.0.0.3
    DPOOL_STATE_DIR=/tmp/n4 dpool start --address 127.0.0.2:6390 --token T --node-ip 127.0.0.4
    DPOOL_ADDRESS=127.0.0.2:6390 DPOOL_TOKEN=T python examples/scheduling_strategies.py
    dpool stop; DPOOL_STATE_DIR=/tmp/n3 dpool stop; DPOOL_STATE_DIR=/tmp/n4 dpool stop
"""

from __future__ import annotations

import collections
import os
import sys

import dpool
from dpool import NodeAffinity, ProcessPoolExecutor


def where(i: int) -> str:
    return dpool.node_id()


def main() -> None:
    cluster = bool(os.environ.get("DPOOL_ADDRESS"))
    with ProcessPoolExecutor(4) as ex:
        spread = collections.Counter(ex.options(scheduling="spread").map(where, range(12)))
        print("spread:", dict(sorted(spread.items())))
        # pin to a node by its address or id (the last one the spread used; here: local)
        target = max(spread)
        pinned = set(ex.options(scheduling=NodeAffinity(target)).map(where, range(4)))
        print(f"pinned to {target}:", sorted(pinned) == [target])
        soft = ex.options(scheduling=NodeAffinity("10.255.0.1:6380", soft=True))
        print("soft affinity to a missing node ran on:", soft.submit(where, 0).result())
        try:
            ex.options(scheduling=NodeAffinity("10.255.0.1:6380")).submit(where, 0).result()
        except dpool.PlacementError as exc:
            print("hard affinity to a missing node: PlacementError:", exc)
    # every task of an executor, the same way
    with ProcessPoolExecutor(2, scheduling="spread") as ex:
        print("executor-wide spread over", len(set(ex.map(where, range(6)))), "node(s)",
              "(a cluster)" if cluster else "(embedded: one)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
