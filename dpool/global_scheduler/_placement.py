"""Where a global scheduler puts a spilled task: the built-in rule, the node with the
lowest estimated wait (``placement.LeastWait``, one placement policy
among others; a cluster may load another: ``--placement-policy``).

A node's estimated wait for one more task is the work queued ahead of it spread over
its CPUs,

    wait = max(0, queued + pending + busy - cpus + 1) * avg_task_s / cpus
           + remote input bytes / bandwidth,

with ``pending`` the tasks this scheduler placed there since the node's last load report
(so a burst of spills spreads out instead of piling onto the node that looked idlest a
moment ago). Remote input bytes are those of the task's large inputs the node has no copy
of yet (nodes report their copies with their load), so a node that already pulled a
task's inputs is preferred by their transfer time. Nodes without CPUs, and the origin
itself, are not candidates.

A task with a resource request (``_resources.Request``) goes only to a node that has
them at all (its CPUs, GPUs, memory, custom resources: ``NodeLoad.resources``); among
those, the ones that have them free now (``free``, from the last load report) first.

``choose`` is that rule as one call (kept for its callers and tests).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from dpool.placement import (
    DEFAULT_BANDWIDTH,
    Demand,
    LeastWait,
    NodeLoad,
    missing_bytes,
)

__all__ = ["DEFAULT_BANDWIDTH", "NodeLoad", "choose", "missing_bytes"]

_RULE = LeastWait()


def choose(nodes: Iterable[NodeLoad], origin: str, input_bytes: int = 0,
           inputs: tuple = (), req: Any = None) -> Optional[NodeLoad]:
    """The best node for a task spilled by ``origin`` (None: no other node has CPUs, or
    none has what ``req`` asks for). ``inputs``: its large inputs by reference -- a node
    that has them already saves their transfer; ``input_bytes``: the rest, which every
    node gets inside the message."""
    return _RULE.least_wait(Demand(origin, req, tuple(inputs), input_bytes), nodes)
