"""The seeds' actor applications, timed on dpool and on Ray: the same programs, each peer in
a process of its own.

    python bench/actor_apps.py [--rounds 3] [--ray-python bench/.venv-peers/bin/python]

- ``ps``: a sharded parameter server (``examples/parameter_server.py``'s shape): the weights
  of a linear model over 4 shard actors; each of 20 steps, 4 tasks take the shards'
  current weights (futures / object refs) and compute a numpy gradient on a batch, and the
  driver pushes each gradient shard to its actor.
- ``sim``: asynchronous simulation (``examples/actors.py``'s shape): 4 simulator actors
  with state; the driver keeps each busy with ``wait``-driven scatter-gather, handing a
  simulator its next rollout as soon as it returns one, 40 rollouts in all, each scored
  by a task.

Wall time of each program on a warm runtime (the runtime's start not counted; actor
creation counted), median over the rounds. Appends its table to ``bench/ACTORS.md``
(replacing an earlier one) and prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIM, SHARDS, WORKERS, STEPS, BATCH = 4000, 4, 4, 20, 256
SIMS, ROLLOUTS, LENGTH = 4, 40, 3000


class ParameterShard:
    def __init__(self, size: int, lr: float) -> None:
        import numpy as np

        self.weights = np.zeros(size)
        self.lr = lr

    def apply(self, *gradients: object) -> int:
        import numpy as np

        self.weights -= self.lr * np.mean(gradients, axis=0)
        return len(gradients)

    def get(self) -> object:
        return self.weights


def gradient(seed: int, *shards: object) -> tuple:
    import numpy as np

    w = np.concatenate(shards)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH, DIM))
    err = x @ w - x @ np.linspace(-1.0, 1.0, DIM)
    return float(np.mean(err ** 2)), np.array_split(x.T @ err / BATCH, len(shards))


class Simulator:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.position = 0.0

    def rollout(self, policy: float) -> list:
        trace = []
        for _ in range(LENGTH):
            self.position += policy + self.rng.gauss(0.0, 1.0)
            trace.append(self.position)
        return trace


def score(trace: list) -> float:
    return sum(trace) / len(trace)


# -- dpool ----------------------------------------------------------------------------------
def dpool_ps(ex: object) -> float:
    import numpy as np

    sizes = [len(p) for p in np.array_split(np.zeros(DIM), SHARDS)]
    shards = [ex.actor(ParameterShard, n, 0.05) for n in sizes]  # type: ignore[attr-defined]
    loss = 0.0
    for step in range(STEPS):
        weights = [s.get.submit() for s in shards]
        grads = [ex.submit(gradient, step * WORKERS + k, *weights)  # type: ignore[attr-defined]
                 for k in range(WORKERS)]
        results = [g.result() for g in grads]
        loss = results[0][0]
        for i, s in enumerate(shards):
            s.apply.submit(*[parts[i] for _, parts in results])
    [s.get() for s in shards]  # every update applied
    return loss


def dpool_sim(ex: object) -> float:
    import dpool

    sims = [ex.actor(Simulator, k) for k in range(SIMS)]  # type: ignore[attr-defined]
    pending = {s.rollout.submit(0.1): s for s in sims}
    scores, started = [], SIMS
    while pending:
        done, _ = dpool.wait(list(pending), num_returns=1)
        for f in done:
            sim = pending.pop(f)
            scores.append(ex.submit(score, f))  # type: ignore[attr-defined]
            if started < ROLLOUTS:
                pending[sim.rollout.submit(0.1)] = sim
                started += 1
    return sum(s.result() for s in scores)


def run_dpool(app: str) -> float:
    sys.path.insert(0, ROOT)
    from dpool import ProcessPoolExecutor

    with ProcessPoolExecutor(2) as ex:
        ex.submit(abs, 1).result()
        ex.submit(gradient, 0, *[__import__("numpy").zeros(DIM)]).result()  # numpy loaded
        t = time.perf_counter()
        (dpool_ps if app == "ps" else dpool_sim)(ex)
        return time.perf_counter() - t


# -- Ray ------------------------------------------------------------------------------------
def run_ray(app: str) -> float:
    import numpy as np
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        grad_r, score_r = ray.remote(gradient), ray.remote(score)
        ray.get(grad_r.remote(0, np.zeros(DIM)))
        t = time.perf_counter()
        if app == "ps":
            Shard = ray.remote(num_cpus=0)(ParameterShard)
            sizes = [len(p) for p in np.array_split(np.zeros(DIM), SHARDS)]
            shards = [Shard.remote(n, 0.05) for n in sizes]
            for step in range(STEPS):
                weights = [s.get.remote() for s in shards]
                results = ray.get([grad_r.remote(step * WORKERS + k, *weights)
                                   for k in range(WORKERS)])
                for i, s in enumerate(shards):
                    s.apply.remote(*[parts[i] for _, parts in results])
            ray.get([s.get.remote() for s in shards])
        else:
            Sim = ray.remote(num_cpus=0)(Simulator)
            sims = [Sim.remote(k) for k in range(SIMS)]
            pending = {s.rollout.remote(0.1): s for s in sims}
            scores, started = [], SIMS
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    sim = pending.pop(ref)
                    scores.append(score_r.remote(ref))
                    if started < ROLLOUTS:
                        pending[sim.rollout.remote(0.1)] = sim
                        started += 1
            sum(ray.get(scores))
        return time.perf_counter() - t
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ray-python", default=os.path.join(ROOT, "bench", ".venv-peers", "bin",
                                                          "python"))
    args = ap.parse_args()
    if args.child:
        peer, app = args.child
        print(json.dumps((run_dpool if peer == "dpool" else run_ray)(app)))
        return
    samples: dict = {f"{p}/{a}": [] for a in ("ps", "sim") for p in ("dpool", "dpool1", "ray")}
    for _ in range(args.rounds):
        for key in samples:
            peer, app = key.split("/")
            py = sys.executable if peer.startswith("dpool") else args.ray_python
            env = dict(os.environ, PYTHONPATH=ROOT)
            if peer == "dpool1":  # one BLAS thread per process, as Ray sets for its workers
                env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
            res = subprocess.run([py, os.path.abspath(__file__), "--child", peer[:5], app],
                                 capture_output=True, text=True, timeout=600, env=env)
            if res.returncode == 0:
                samples[key].append(json.loads(res.stdout.strip().splitlines()[-1]))
            else:
                print(res.stderr[-2000:], file=sys.stderr)
    med = {k: statistics.median(v) for k, v in samples.items() if v}
    print(json.dumps({"medians_s": med, "samples_s": samples}, indent=1))
    _write(args, med, samples)


def _write(args: argparse.Namespace, med: dict, samples: dict) -> None:
    path = os.path.join(ROOT, "bench", "ACTORS.md")
    text = open(path).read() if os.path.exists(path) else ""
    marker = "\n## Applications: parameter server, asynchronous simulation\n"
    text = text.split(marker)[0].rstrip("\n") + "\n"
    rows = [marker, f"`python bench/actor_apps.py --rounds {args.rounds}`, "
            f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, 2 workers each. "
            f"Wall time of the program on a warm runtime (actors created inside it), median "
            f"of the rounds; each run in a process of its own. `ps`: {SHARDS} shard actors, "
            f"{WORKERS} gradient tasks per step ({BATCH}x{DIM} numpy batches), {STEPS} steps. "
            f"`sim`: {SIMS} simulator actors, {ROLLOUTS} rollouts of {LENGTH} steps, "
            "wait-driven, each scored by a task.", "",
            "| program | dpool | dpool, 1 BLAS thread | Ray | Ray/dpool | Ray/dpool (1 BLAS "
            "thread) |", "|---|---|---|---|---|---|"]
    for app, label in (("ps", "parameter server"), ("sim", "asynchronous simulation")):
        d, d1, r = (med.get(f"{p}/{app}") for p in ("dpool", "dpool1", "ray"))
        cells = [f"{v * 1e3:.0f} ms" if v else "-" for v in (d, d1, r)]
        cells += [f"{r / v:.2f}x" if r and v else "-" for v in (d, d1)]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    rows += ["", "Ray runs its workers with `OMP_NUM_THREADS=1` (one BLAS thread per task); "
             "dpool, as the stdlib's pool, leaves the environment as it is, so two workers "
             "doing numpy matrix products on 2 cores each start as many BLAS threads as "
             "cores: the column with one BLAS thread sets the same variables for dpool's "
             "run (`OMP_NUM_THREADS`, `OPENBLAS_NUM_THREADS`, `MKL_NUM_THREADS` = 1)."]
    rows += ["", "Samples (s): `" + json.dumps(samples) + "`", ""]
    with open(path, "w") as fh:
        fh.write(text + "\n".join(rows))


if __name__ == "__main__":
    main()
