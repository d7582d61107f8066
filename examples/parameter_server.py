"""A sharded parameter server: actors hold the weights, tasks compute gradients.

The weights of a linear model are split over ``SHARDS`` actors. Each step, every worker
task pulls the current weights (futures of the shards' ``get`` calls, passed as
arguments: the task runs once they are ready), computes the gradient of the squared loss
on its own batch with numpy, and the driver pushes each gradient shard to its actor,
which applies it. The loss falls as the model learns the hidden weights.

    python examples/parameter_server.py
"""

from __future__ import annotations

import numpy as np

import dpool
from dpool import ProcessPoolExecutor

DIM, SHARDS, WORKERS, STEPS, BATCH = 1000, 4, 4, 30, 256


class ParameterShard:
    def __init__(self, size: int, lr: float) -> None:
        self.weights = np.zeros(size)
        self.lr = lr

    def apply(self, *gradients: np.ndarray) -> int:
        self.weights -= self.lr * np.mean(gradients, axis=0)
        return len(gradients)

    @dpool.readonly
    def get(self) -> np.ndarray:
        return self.weights


def gradient(seed: int, *shards: np.ndarray) -> tuple[float, list[np.ndarray]]:
    """Loss and gradient of a batch drawn from the hidden model, split like the shards."""
    w = np.concatenate(shards)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH, DIM))
    y = x @ np.linspace(-1.0, 1.0, DIM)  # the hidden weights
    err = x @ w - y
    grad = x.T @ err / BATCH
    return float(np.mean(err ** 2)), np.array_split(grad, len(shards))


def main() -> None:
    with ProcessPoolExecutor(2) as ex:
        sizes = [len(part) for part in np.array_split(np.zeros(DIM), SHARDS)]
        shards = [ex.actor(ParameterShard, n, 0.1) for n in sizes]
        losses = []
        for step in range(STEPS):
            weights = [s.get.submit() for s in shards]  # futures: the tasks wait for them
            grads = [ex.submit(gradient, step * WORKERS + k, *weights) for k in range(WORKERS)]
            results = [g.result() for g in grads]
            losses.append(float(np.mean([loss for loss, _ in results])))
            for i, s in enumerate(shards):
                s.apply.submit(*[parts[i] for _, parts in results])
        print(f"loss: first step {losses[0]:.1f}, last step {losses[-1]:.3f}")
        print("learned:", losses[-1] < losses[0] / 10)


if __name__ == "__main__":
    main()
