"""Actors: asynchronous simulation with stateful simulators (scatter-gather with wait).

Each simulator keeps its environment's state between calls; the driver keeps every
simulator busy, giving each its next rollout as soon as it returns one, and a task scores
each rollout as it arrives (futures of actor calls are task arguments).

    python examples/actors.py
"""

from __future__ import annotations

import random

import dpool
from dpool import ProcessPoolExecutor


class Simulator:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.position = 0.0
        self.steps = 0

    def rollout(self, policy: float, length: int = 2000) -> list[float]:
        """Run ``length`` steps from where the last rollout ended."""
        trace = []
        for _ in range(length):
            self.position += policy + self.rng.gauss(0.0, 1.0)
            trace.append(self.position)
        self.steps += length
        return trace

    @dpool.readonly
    def progress(self) -> int:
        return self.steps


def score(trace: list[float]) -> float:
    return sum(trace) / len(trace)


def main() -> None:
    with ProcessPoolExecutor(2) as ex:
        sims = [ex.actor(Simulator, seed) for seed in range(4)]
        pending = {sim.rollout.submit(0.1): sim for sim in sims}
        scores = []
        while len(scores) < 20:
            done, _ = dpool.wait(list(pending), num_returns=1)
            for f in done:
                sim = pending.pop(f)
                scores.append(ex.submit(score, f))  # the rollout's value goes to a task
                pending[sim.rollout.submit(0.1)] = sim  # and its simulator goes on at once
        print(f"{len(scores)} rollouts scored, mean {sum(s.result() for s in scores) / 20:.1f}")
        print("steps per simulator:", [sim.progress() for sim in sims])


if __name__ == "__main__":
    main()
