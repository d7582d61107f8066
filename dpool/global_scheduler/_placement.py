"""Where a global scheduler puts a spilled task: the node with the lowest estimated wait.

Pure policy over load reports (unit-tested without processes). A node's estimated wait
for one more task is the work queued ahead of it spread over its CPUs,

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

DEFAULT_BANDWIDTH = 1e9  # bytes/s, until transfers are measured


@dataclass
class NodeLoad:
    address: str
    cpus: int
    busy: int = 0
    queued: int = 0
    avg_task_s: float = 0.002
    pending: int = 0
    holds: frozenset = frozenset()  # "holder|segment" of the inputs it has copies of
    resources: dict = field(default_factory=dict)  # GPU, memory, custom: what it has
    free: dict = field(default_factory=dict)  # the same, free at its last load report

    def offers(self) -> dict:
        return {"CPU": self.cpus, **self.resources}

    def can_hold(self, req: Any) -> bool:
        """Whether ``req`` fits this node at all (whatever runs there now)."""
        res = self.resources
        return (req.cpus <= self.cpus and req.gpus <= res.get("GPU", 0) + 1e-9
                and req.memory <= res.get("memory", 0)
                and all(a <= res.get(k, 0.0) + 1e-9 for k, a in req.custom))

    def has_free(self, req: Any) -> bool:
        free = self.free
        return (req.cpus <= self.cpus - self.busy - self.pending
                and req.gpus <= free.get("GPU", 0) + 1e-9
                and req.memory <= free.get("memory", 0)
                and all(a <= free.get(k, 0.0) + 1e-9 for k, a in req.custom))

    def estimated_wait(self, input_bytes: int = 0,
                       bandwidth: float = DEFAULT_BANDWIDTH) -> float:
        ahead = max(0, self.queued + self.pending + self.busy - self.cpus + 1)
        return ahead * self.avg_task_s / max(1, self.cpus) + input_bytes / bandwidth


def missing_bytes(n: NodeLoad, inputs: Iterable[tuple[str, str, int]]) -> int:
    """Bytes of ``inputs`` ((holder, segment, size) of a task's large inputs held on other
    nodes) that node ``n`` would have to pull: those it neither holds nor has a copy of."""
    return sum(size for holder, name, size in inputs
               if holder != n.address and f"{holder}|{name}" not in n.holds)


def choose(nodes: Iterable[NodeLoad], origin: str, input_bytes: int = 0,
           inputs: tuple = (), req: Any = None) -> Optional[NodeLoad]:
    """The best node for a task spilled by ``origin`` (None: no other node has CPUs, or
    none has what ``req`` asks for). ``inputs``: its large inputs by reference -- a node
    that has them already saves their transfer; ``input_bytes``: the rest, which every
    node gets inside the message."""
    best: Optional[NodeLoad] = None
    best_key: tuple = ()
    for n in nodes:
        if n.cpus <= 0 or n.address == origin:
            continue
        busy_now = 0
        if req is not None:
            if not n.can_hold(req):
                continue
            busy_now = 0 if n.has_free(req) else 1
        key = (busy_now, n.estimated_wait(input_bytes + missing_bytes(n, inputs)),
               n.busy + n.pending + n.queued, n.address)
        if best is None or key < best_key:
            best, best_key = n, key
    return best
