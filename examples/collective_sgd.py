"""Synchronous data-parallel SGD with ``dpool.collective``: replicas allreduce their
gradients, and survive one of them being killed.

Each of ``REPLICAS`` actors holds a copy of a linear model's weights and draws its own
batches; every step it computes its gradient with numpy, and the replicas average them
with ``allreduce`` -- member to member, no driver or parameter server on the path -- so
that every copy takes the same step. Half-way, one replica's process is SIGKILLed: the
others' ``allreduce`` fails with ``dpool.CollectiveError`` naming it (no hang). The
replica restarts (``max_restarts``), the driver forms the group again with the same
ranks, and rank 0 broadcasts its weights to everyone (the restarted copy lost its own);
training goes on.

    python examples/collective_sgd.py
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

import dpool
import dpool.collective as col
from dpool import ProcessPoolExecutor

DIM, REPLICAS, STEPS, BATCH, LR = 2000, 3, 40, 256, 0.1


class Replica:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.w = np.zeros(DIM)
        self.rng = np.random.default_rng(rank)

    @dpool.readonly
    def pid(self) -> int:
        return os.getpid()

    def step(self) -> float:
        x = self.rng.normal(size=(BATCH, DIM))
        y = x @ np.linspace(-1.0, 1.0, DIM)  # the hidden weights
        err = x @ self.w - y
        grad = col.allreduce(x.T @ err / BATCH) / REPLICAS  # the same in every replica
        self.w -= LR * grad
        return float(np.mean(err ** 2))

    def sync(self) -> float:
        """Take rank 0's weights (after the group was formed again)."""
        self.w = col.broadcast(self.w if self.rank == 0 else None, root=0)
        return float(np.abs(self.w).sum())


def main() -> None:
    with ProcessPoolExecutor(REPLICAS) as ex:
        replicas = [ex.options(max_restarts=1).actor(Replica, r) for r in range(REPLICAS)]
        col.create_group(replicas)
        losses, step, killed, recovered = [], 0, False, False
        t0 = time.perf_counter()
        while step < STEPS:
            if step == STEPS // 2 and not killed:
                os.kill(replicas[1].pid(), signal.SIGKILL)
                killed = True
            try:
                losses.append(np.mean([f.result(timeout=60) for f in
                                       [r.step.submit() for r in replicas]]))
                step += 1
            except dpool.CollectiveError as e:  # a replica died mid-step
                print(f"step {step}: {e.__class__.__name__}: rank {e.rank} was lost")
                col.create_group(replicas)  # the same ranks; the restarted one rejoins
                sums = {f.result(timeout=60) for f in [r.sync.submit() for r in replicas]}
                recovered = len(sums) == 1
                print("weights equal again:", recovered)
        per_step = (time.perf_counter() - t0) / STEPS
        print(f"loss: first step {losses[0]:.1f}, last step {losses[-1]:.3f} "
              f"({per_step * 1e3:.1f} ms a step)")
        print("learned:", losses[-1] < losses[0] / 10, "after losing a replica:", recovered)


if __name__ == "__main__":
    main()
