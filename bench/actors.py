"""Actors: dpool against Ray's actors and the stdlib's ``multiprocessing.Manager``.

    python bench/actors.py [--rounds 3] [--ray-python bench/.venv-peers/bin/python]
                           [--out bench/ACTORS.md]

Each peer runs in a process of its own (Ray's daemons would share the CPUs with the
others), ``--rounds`` times, peers alternating; each round measures, on a warm runtime:

- ``create_ms``: a new actor until its first call returned (dpool: ``ex.actor``; Ray:
  ``Cls.remote()``; Manager: a registered class's proxy from a manager started once --
  no process per object -- and, as ``manager_start_ms``, a manager's ``start()``);
- ``call_us``: a plain call's round trip (dpool ``h.ping()``, Manager ``proxy.ping()``,
  Ray ``ray.get(h.ping.remote())``), median of 2,000;
- ``submit_us``: ``h.ping.submit().result()`` (Ray: the same as a call);
- ``tput1`` / ``tput8``: 20,000 calls submitted at once to 1 actor / round-robin to 8,
  then every result (calls/s; the Manager's proxies are synchronous: one caller thread
  per actor);
- ``array64_ms``: a method returns a 64 MB array and a task reads it (its sum).

Writes ``bench/ACTORS.md`` (medians over the rounds, ratios to dpool) and prints JSON.
Timings only; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_CALL = 2000
N_TPUT = 20000
ARRAY = 8 * 1024 * 1024  # float64s: 64 MB


class Echo:
    def __init__(self) -> None:
        self.n = 0

    def ping(self, x: int = 0) -> int:
        self.n += 1
        return x

    def array(self) -> object:
        import numpy as np

        return np.ones(ARRAY)


def _total(a: object) -> float:
    return float(a.sum())  # type: ignore[attr-defined]


def _median_call(fn, n: int = N_CALL) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


# -- dpool ----------------------------------------------------------------------------------
def run_dpool() -> dict:
    sys.path.insert(0, ROOT)
    from dpool import ProcessPoolExecutor

    out: dict = {}
    with ProcessPoolExecutor(2) as ex:
        ex.submit(abs, 1).result()  # the runtime warm
        warm = ex.actor(Echo)
        warm.ping()
        t = time.perf_counter()
        a = ex.actor(Echo)
        a.ping()
        out["create_ms"] = (time.perf_counter() - t) * 1e3
        for _ in range(200):
            a.ping()
        out["call_us"] = _median_call(a.ping)
        out["submit_us"] = _median_call(lambda: a.ping.submit().result())
        t = time.perf_counter()
        fs = [a.ping.submit(i) for i in range(N_TPUT)]
        for f in fs:
            f.result()
        out["tput1"] = N_TPUT / (time.perf_counter() - t)
        eight = [ex.actor(Echo) for _ in range(8)]
        for h in eight:
            h.ping()
        t = time.perf_counter()
        fs = [eight[i % 8].ping.submit(i) for i in range(N_TPUT)]
        for f in fs:
            f.result()
        out["tput8"] = N_TPUT / (time.perf_counter() - t)
        ex.submit(_total, a.array.submit()).result()  # (warm: numpy loaded in both)
        t = time.perf_counter()
        ex.submit(_total, a.array.submit()).result()
        out["array64_ms"] = (time.perf_counter() - t) * 1e3
    return out


# -- the stdlib's Manager -------------------------------------------------------------------
def run_manager() -> dict:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing.managers import BaseManager

    class M(BaseManager):
        pass

    M.register("Echo", Echo)
    out: dict = {}
    t = time.perf_counter()
    m = M()
    m.start()
    out["manager_start_ms"] = (time.perf_counter() - t) * 1e3
    try:
        m.Echo().ping()
        t = time.perf_counter()
        a = m.Echo()
        a.ping()
        out["create_ms"] = (time.perf_counter() - t) * 1e3
        for _ in range(200):
            a.ping()
        out["call_us"] = _median_call(a.ping)
        t = time.perf_counter()
        for i in range(N_TPUT):
            a.ping(i)
        out["tput1"] = N_TPUT / (time.perf_counter() - t)
        eight = [m.Echo() for _ in range(8)]

        def caller(h: object, n: int) -> None:
            for i in range(n):
                h.ping(i)  # type: ignore[attr-defined]

        threads = [threading.Thread(target=caller, args=(h, N_TPUT // 8)) for h in eight]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        out["tput8"] = N_TPUT / (time.perf_counter() - t)
        with ProcessPoolExecutor(2) as ex:
            ex.submit(abs, 1).result()
            ex.submit(_total, a.array()).result()
            t = time.perf_counter()
            ex.submit(_total, a.array()).result()
            out["array64_ms"] = (time.perf_counter() - t) * 1e3
    finally:
        m.shutdown()
    return out


# -- Ray ------------------------------------------------------------------------------------
def run_ray() -> dict:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        RemoteEcho = ray.remote(num_cpus=0)(Echo)
        total = ray.remote(_total)
        out: dict = {}
        ray.get(total.remote(ray.put(1.0 * __import__("numpy").ones(1))))
        w = RemoteEcho.remote()
        ray.get(w.ping.remote())
        t = time.perf_counter()
        a = RemoteEcho.remote()
        ray.get(a.ping.remote())
        out["create_ms"] = (time.perf_counter() - t) * 1e3
        for _ in range(200):
            ray.get(a.ping.remote())
        out["call_us"] = _median_call(lambda: ray.get(a.ping.remote()))
        out["submit_us"] = out["call_us"]
        t = time.perf_counter()
        ray.get([a.ping.remote(i) for i in range(N_TPUT)])
        out["tput1"] = N_TPUT / (time.perf_counter() - t)
        eight = [RemoteEcho.remote() for _ in range(8)]
        ray.get([h.ping.remote() for h in eight])
        t = time.perf_counter()
        ray.get([eight[i % 8].ping.remote(i) for i in range(N_TPUT)])
        out["tput8"] = N_TPUT / (time.perf_counter() - t)
        ray.get(total.remote(a.array.remote()))
        t = time.perf_counter()
        ray.get(total.remote(a.array.remote()))
        out["array64_ms"] = (time.perf_counter() - t) * 1e3
        return out
    finally:
        ray.shutdown()


PEERS = {"dpool": run_dpool, "manager": run_manager, "ray": run_ray}
METRICS = [("create_ms", "actor creation (ms)", "lower"),
           ("call_us", "plain call round trip (us)", "lower"),
           ("submit_us", "submit().result() (us)", "lower"),
           ("tput1", "calls/s, 1 actor", "higher"),
           ("tput8", "calls/s, 8 actors", "higher"),
           ("array64_ms", "64 MB result read by a task (ms)", "lower")]


def _child(peer: str, python: str) -> dict:
    cmd = [python, os.path.abspath(__file__), "--child", peer]
    env = dict(os.environ, PYTHONPATH=ROOT)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0:
        return {"error": res.stderr.strip().splitlines()[-1] if res.stderr.strip() else
                f"exit {res.returncode}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ray-python", default=os.path.join(ROOT, "bench", ".venv-peers", "bin",
                                                          "python"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "ACTORS.md"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(PEERS[args.child]()))
        return
    pythons = {"dpool": sys.executable, "manager": sys.executable, "ray": args.ray_python}
    samples: dict = {p: [] for p in PEERS}
    load0 = os.getloadavg()[0]
    for _ in range(args.rounds):
        for peer in PEERS:
            if peer == "ray" and not os.path.exists(args.ray_python):
                samples[peer].append({"error": f"no {args.ray_python}"})
                continue
            samples[peer].append(_child(peer, pythons[peer]))
    med: dict = {}
    for peer, rows in samples.items():
        good = [r for r in rows if "error" not in r]
        if not good:
            med[peer] = {"error": rows[0].get("error", "?")}
            continue
        med[peer] = {k: statistics.median(r[k] for r in good if k in r)
                     for k in {k for r in good for k in r}}
    print(json.dumps({"medians": med, "samples": samples}, indent=1))
    _write(args, med, samples, load0)


def _write(args: argparse.Namespace, med: dict, samples: dict, load0: float) -> None:
    d = med["dpool"]
    lines = [
        "# Actors: dpool vs Ray's actors and the stdlib's Manager",
        "",
        f"`python bench/actors.py --rounds {args.rounds}` (Ray from `{args.ray_python}`), "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load average {load0:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after. Medians over the rounds; each peer in a process "
        "of its own, peers alternating. Ratio: the peer's figure / dpool's (for times, "
        "above 1 means dpool is faster; for calls/s, below 1).",
        "",
        "| measure | dpool | Manager | Manager/dpool | Ray | Ray/dpool |",
        "|---|---|---|---|---|---|",
    ]
    for key, label, _better in METRICS:
        row = [label, _fmt(d.get(key))]
        for peer in ("manager", "ray"):
            v = med[peer].get(key)
            row += [_fmt(v), f"{v / d[key]:.2f}x" if v is not None and d.get(key) else "-"]
        lines.append("| " + " | ".join(row) + " |")
    if "manager_start_ms" in med["manager"]:
        lines.append("")
        lines.append(f"A Manager's `start()` (its server process): "
                     f"{med['manager']['manager_start_ms']:.1f} ms; its objects live in that "
                     "one process, so creating one starts none (the Manager row above).")
    for peer in ("manager", "ray"):
        if "error" in med[peer]:
            lines.append(f"\n{peer}: not run ({med[peer]['error']}).")
    lines += _recovery_section()
    lines += ["", "Samples:", "", "```", json.dumps(samples), "```", ""]
    kept = ""  # the applications' section (``bench/actor_apps.py``), if it was run
    marker = "\n## Applications: parameter server, asynchronous simulation\n"
    if os.path.exists(args.out):
        with open(args.out) as fh:
            old = fh.read()
        if marker in old:
            kept = marker + old.split(marker, 1)[1]
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines) + kept)


def _recovery_section() -> list[str]:
    """From ``bench/actor_recovery.json`` (``bench/actor_recovery.py``), if it was run."""
    path = os.path.join(ROOT, "bench", "actor_recovery.json")
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        rec = json.load(fh)
    out = ["", "## Recovery: replay against checkpoints", "",
           f"`{rec['command']}`, {rec['date']}, {rec['cpus']} CPUs. An actor "
           "(`max_restarts=-1`) runs N calls of a method that updates its state, its "
           "process is SIGKILLed, and the time until the next call's result is its "
           "recovery: a new process boots from the last checkpoint (or the constructor) and "
           "replays the calls after it. The state after is checked against the state "
           "before. Median of the repetitions.", "",
           "| calls before the kill | checkpoint_every | calls replayed | recovery (ms) |",
           "|---|---|---|---|"]
    for r in rec["rows"]:
        out.append(f"| {r['calls']:,} | {r['checkpoint_every'] or 'none'} | "
                   f"{r['replayed']:,} | {r['recovery_s'] * 1e3:.1f} |")
    out += ["", "![actor recovery](actor_recovery.png)"]
    return out


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    v = float(v)  # type: ignore[arg-type]
    return f"{v:,.0f}" if v >= 1000 else f"{v:.1f}"


if __name__ == "__main__":
    main()
