"""joblib backends side by side: scikit-learn's n_jobs on loky, dpool, Ray and Dask.

    python bench/joblib_bench.py                 # writes bench/JOBLIB.md
    python bench/joblib_bench.py --reps 7 --quick --out /tmp/J.md
    python bench/joblib_bench.py --quick --reps 12 --workloads grid_search --peers loky,dpool
    bench/.venv-peers/bin/python bench/joblib_bench.py   # with Ray and Dask, if installed

Workloads (scikit-learn, small enough for a laptop; every one under
``parallel_config(backend=...)``):

- ``grid_search``: GridSearchCV(SVC, 12 candidates, cv=5, n_jobs=-1) on digits;
- ``cross_val_score``: LogisticRegression, cv=10, n_jobs=-1, on digits;
- ``random_forest``: RandomForestClassifier(200 trees, n_jobs=-1).fit on digits;
- ``short_tasks``: Parallel(n_jobs=-1) over 20,000 tiny calls (batch_size="auto": the
  per-batch cost of the backend).

How: each backend is warmed first (its workers started and scikit-learn imported in
them), then the workloads run ``--reps`` times, the backends alternating in a rotating
order; the figure is the median wall time, the ratio is to loky's in the same process.
loky and dpool run in one process. Ray and Dask start daemons that would compete for
the CPUs while the others run, so each runs in a process of its own *with loky again*,
alternating with it, and its ratio is to that loky's. Both are skipped, with the
reason, when not importable (they are not in dpool's test venv; a venv with them:
``bench/.venv-peers``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # dpool from the repo root

WORKLOADS = ("grid_search", "cross_val_score", "random_forest", "short_tasks")


def _data(quick: bool):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return (X[:600], y[:600]) if quick else (X, y)


def _tiny(i):
    return i + 1


def run_workload(name: str, backend: str, data, quick: bool) -> float:
    from joblib import Parallel, delayed, parallel_config

    X, y = data
    t0 = time.perf_counter()
    with parallel_config(backend=backend):
        if name == "grid_search":
            from sklearn.model_selection import GridSearchCV
            from sklearn.svm import SVC

            GridSearchCV(SVC(), {"C": [0.1, 1, 10, 100], "gamma": [1e-4, 1e-3, 1e-2]},
                         cv=5, n_jobs=-1).fit(X, y)
        elif name == "cross_val_score":
            from sklearn.linear_model import LogisticRegression
            from sklearn.model_selection import cross_val_score

            cross_val_score(LogisticRegression(max_iter=200), X, y, cv=10, n_jobs=-1)
        elif name == "random_forest":
            from sklearn.ensemble import RandomForestClassifier

            RandomForestClassifier(n_estimators=60 if quick else 200, random_state=0,
                                   n_jobs=-1).fit(X, y)
        elif name == "short_tasks":
            n = 5_000 if quick else 20_000
            out = Parallel(n_jobs=-1)(delayed(_tiny)(i) for i in range(n))
            assert out[-1] == n
        else:
            raise ValueError(name)
    return time.perf_counter() - t0


def _setup(peer: str) -> str:
    """Start ``peer``'s runtime if it has one; the joblib backend name."""
    if peer == "dpool":
        import dpool

        dpool.register_joblib()
        return "dpool"
    if peer == "ray":
        import ray
        from ray.util.joblib import register_ray

        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        register_ray()
        return "ray"
    if peer == "dask":
        from dask.distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=os.cpu_count(), threads_per_worker=1,
                               processes=True, dashboard_address=None)
        globals()["_dask_client"] = Client(cluster)
        return "dask"
    return peer


def measure(peers: list[str], reps: int, quick: bool,
            workloads: tuple = WORKLOADS) -> dict:
    """``{workload: {peer: [seconds...]}}``, peers alternating in this process."""
    backends = {p: _setup(p) for p in peers}
    data = _data(quick)
    for w in workloads:  # warm-up: workers started, imports done
        for p in peers:
            run_workload(w, backends[p], data, quick)
    times: dict = {w: {p: [] for p in peers} for w in workloads}
    for r in range(reps):
        order = peers[r % len(peers):] + peers[:r % len(peers)]
        for w in workloads:
            for p in order:
                times[w][p].append(run_workload(w, backends[p], data, quick))
    return times


def _importable(module: str) -> str:
    out = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                         text=True, timeout=120)
    return "" if out.returncode == 0 else out.stderr.strip().splitlines()[-1]


def _child(peers: str, reps: int, quick: bool, workloads: str) -> dict:
    cmd = [sys.executable, __file__, "--child", peers, "--reps", str(reps),
           "--workloads", workloads]
    if quick:
        cmd.append("--quick")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{peers}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def _versions() -> dict:
    import joblib
    import sklearn

    v = {"python": platform.python_version(), "joblib": joblib.__version__,
         "scikit-learn": sklearn.__version__}
    for m in ("ray", "dask", "distributed"):
        try:
            v[m] = __import__(m).__version__
        except Exception:  # noqa: BLE001 - not installed
            pass
    return v


def report(groups: dict, notes: list, args: argparse.Namespace) -> str:
    med = {g: {w: {p: statistics.median(ts) for p, ts in per.items()}
               for w, per in res.items()} for g, res in groups.items()}
    cmd = "python bench/joblib_bench.py" + (" --quick" if args.quick else "") + \
        f" --reps {args.reps}"
    if args.workloads != ",".join(WORKLOADS):
        cmd += f" --workloads {args.workloads}"
    if args.peers != "loky,dpool,ray,dask":
        cmd += f" --peers {args.peers}"
    lines = [
        "# joblib backends: scikit-learn's n_jobs on loky, dpool, Ray, Dask",
        "",
        f"`{cmd}` ({sys.executable.replace(str(HERE.parent) + '/', '')}), "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average "
        f"{args.load_before:.2f} before, {os.getloadavg()[0]:.2f} after; versions "
        f"{_versions()}.",
        "",
        f"Median wall time of {args.reps} warm runs per backend, backends alternating in "
        "one process; ratio = backend / loky in the same process (lower is faster; "
        "target for dpool: <= 1.0x). Ray and Dask each ran in a process of their own "
        "with loky again (their daemons would otherwise share the CPUs with the others).",
        "",
        "| workload | loky | dpool | dpool/loky | Ray | Ray/loky | Dask | Dask/loky |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in WORKLOADS:
        if w not in args.workloads.split(","):
            continue
        row = [w]
        main = med.get("main", {}).get(w, {})
        loky = main.get("loky")
        row += [f"{loky:.3f} s" if loky else "-"]
        d = main.get("dpool")
        row += [f"{d:.3f} s" if d else "-", f"{d / loky:.2f}x" if d and loky else "-"]
        for peer in ("ray", "dask"):
            res = med.get(peer, {}).get(w)
            if res:
                row += [f"{res[peer]:.3f} s", f"{res[peer] / res['loky']:.2f}x"]
            else:
                row += ["-", "-"]
        lines.append("| " + " | ".join(row) + " |")
    paired = []
    for g, res in groups.items():
        for w, per in res.items():
            for peer, ts in per.items():
                if peer != "loky" and "loky" in per:
                    r = statistics.median(t / lk for t, lk in zip(ts, per["loky"]))
                    paired.append(f"{w} {peer} {r:.2f}x")
    lines += ["", "Paired ratios (median over the rounds of backend / loky, each pair "
              "run one after the other in the same round): "
              + ", ".join(paired) + "."]
    lines += ["", "Samples (seconds), per group:", "", "```",
              json.dumps({g: {w: {p: [round(t, 4) for t in ts] for p, ts in per.items()}
                              for w, per in res.items()} for g, res in groups.items()},
                         indent=None), "```"]
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--peers", default="loky,dpool,ray,dask")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help="comma-separated, of: " + ", ".join(WORKLOADS))
    ap.add_argument("--out", default=str(HERE / "JOBLIB.md"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    workloads = tuple(args.workloads.split(","))
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        ap.error(f"unknown workload(s) {sorted(unknown)}; choose among {list(WORKLOADS)}")
    if args.child:
        times = measure(args.child.split(","), args.reps, args.quick, workloads)
        print(json.dumps(times))
        return 0
    args.load_before = os.getloadavg()[0]
    wanted = args.peers.split(",")
    groups: dict = {}
    notes: list = []
    main_peers = [p for p in ("loky", "dpool") if p in wanted]
    groups["main"] = _child(",".join(main_peers), args.reps, args.quick, args.workloads)
    for peer, module in (("ray", "ray.util.joblib"), ("dask", "dask.distributed")):
        if peer not in wanted:
            continue
        why = _importable(module)
        if why:
            notes.append(f"{peer}: not run, `import {module}` failed here ({why}); "
                         f"run this script with an interpreter that has it "
                         f"(e.g. bench/.venv-peers/bin/python).")
            continue
        try:
            groups[peer] = _child(f"loky,{peer}", args.reps, args.quick, args.workloads)
        except Exception as exc:  # noqa: BLE001 - reported in the output
            notes.append(f"{peer}: failed: {str(exc)[-600:]}")
    text = report(groups, notes, args)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
