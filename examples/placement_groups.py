"""Gang placement: reserve bundles of resources together -- all of them or none -- then
run one task in each, e.g. the workers of a training job that must start together.

On one machine (the embedded runtime) every bundle is held on this host: ``pack`` and
``spread`` run unchanged, ``strict_spread`` with two bundles can never be met::

    python examples/placement_groups.py

On a loopback cluster the bundles land on different nodes, and a second group that does
not fit beside the first waits until it is removed::

    dpool start --head --port 6390 --node-ip 127.0.0.2            # prints DPOOL_TOKEN=...
    DPOOL_STATE_DIR=/tmp/n3 dpool start --address 127.0.0.2:6390 --token T --node-ip 127.0.0.3
    DPOOL_STATE_DIR=/tmp/n4 dpool start --address 127.0.0.2:6390 --token T --node-ip 127.0.0.4
    DPOOL_ADDRESS=127.0.0.2:6390 DPOOL_TOKEN=T python examples/placement_groups.py
    dpool stop; DPOOL_STATE_DIR=/tmp/n3 dpool stop; DPOOL_STATE_DIR=/tmp/n4 dpool stop
"""

from __future__ import annotations

import sys

import dpool
from dpool import ProcessPoolExecutor


def worker(rank: int) -> str:
    return f"rank {rank} on {dpool.node_id()}"


def main() -> None:
    n = min(dpool.cpu_count(), 3)  # a gang as large as the machine (or cluster) allows
    with ProcessPoolExecutor(n) as ex:
        with dpool.placement_group([{"CPU": 1}] * n, strategy="spread") as gang:
            gang.ready().result(timeout=30)  # every bundle held, or an exception
            print(f"gang of {n} ready on", gang.bundle_nodes)
            ranks = [ex.options(placement_group=gang, bundle=i).submit(worker, i)
                     for i in range(n)]
            for f in ranks:
                print(" ", f.result())
            # a second gang that needs one CPU more than is left waits, holding nothing
            more = dpool.cpu_count() - n + 1
            other = dpool.placement_group([{"CPU": 1}] * more, strategy="spread")
            print("second gang ready while the first holds its CPUs:", other.wait(1.0))
        # (leaving the ``with`` removed the first gang: the second gets its CPUs)
        print("second gang ready after the first was removed:", other.wait(30))
        other.remove()
    try:
        dpool.placement_group([{"CPU": 1}] * 4, strategy="strict_spread").ready().result(30)
        print("strict_spread of 4: ready")
    except dpool.PlacementError as exc:
        print("strict_spread of 4: PlacementError:", exc)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
