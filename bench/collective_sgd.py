"""Synchronous data-parallel SGD, time per step: replicas that allreduce their gradients
(``dpool.collective``) against the same model and batches with a parameter server of
actors (a shard actor holds the weights; each step the replicas pull them, compute
their gradients, and the server averages and applies them).

    python bench/collective_sgd.py [--steps 30] [--replicas 3] [--dim 20000]

Each replica's data shard is drawn once (64 rows): a step is two matrix-vector products
and the exchange of the gradient (8 MB at the default size). Same machine, same run, one
BLAS thread per process (as Ray's workers; the replicas'
matrix products would otherwise contend for the cores). Prints the median step time of
each way, after two warm-up steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

import dpool.collective as col  # noqa: E402
from dpool import ProcessPoolExecutor  # noqa: E402

BATCH, LR = 64, 0.1


class Replica:
    def __init__(self, rank: int, n: int, dim: int) -> None:
        self.rank, self.n, self.dim = rank, n, dim
        self.w = np.zeros(dim)
        rng = np.random.default_rng(rank)
        self.x = rng.normal(size=(BATCH, dim))  # this replica's shard of the data
        self.y = self.x @ np.linspace(-1.0, 1.0, dim)  # (the hidden weights)

    def _grad(self, w: np.ndarray) -> np.ndarray:
        err = self.x @ w - self.y
        return self.x.T @ err / BATCH

    def step(self) -> None:  # allreduce: no server, every replica applies the same step
        self.w -= LR * col.allreduce(self._grad(self.w)) / self.n

    def grad(self, w: np.ndarray) -> np.ndarray:  # the parameter server's worker
        return self._grad(w)


class Server:
    def __init__(self, dim: int) -> None:
        self.w = np.zeros(dim)

    def get(self) -> np.ndarray:
        return self.w

    def apply(self, *grads: np.ndarray) -> None:
        self.w -= LR * np.mean(grads, axis=0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--dim", type=int, default=1_000_000)
    a = ap.parse_args()
    with ProcessPoolExecutor(a.replicas) as ex:
        rs = [ex.actor(Replica, r, a.replicas, a.dim) for r in range(a.replicas)]
        col.create_group(rs)
        times = []
        for _ in range(a.steps + 2):
            t = time.perf_counter()
            [f.result() for f in [r.step.submit() for r in rs]]
            times.append(time.perf_counter() - t)
        ar = statistics.median(times[2:])
        server = ex.actor(Server, a.dim)
        times = []
        for _ in range(a.steps + 2):
            t = time.perf_counter()
            w = server.get.submit()
            grads = [r.grad.submit(w) for r in rs]  # (the weights' future: passed along)
            server.apply.submit(*grads).result()
            times.append(time.perf_counter() - t)
        ps = statistics.median(times[2:])
    print(f"{a.replicas} replicas, {a.dim} weights, batches of {BATCH}: allreduce "
          f"{ar * 1e3:.1f} ms a step, parameter server {ps * 1e3:.1f} ms a step "
          f"({ps / ar:.2f}x)")


if __name__ == "__main__":
    main()
