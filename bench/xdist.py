"""pytest-xdist backend: ``pytest -n 2`` against ``pytest -n 2 --dpool`` on real suites.

    python bench/xdist.py                      # set up bench/.venv-xdist, run everything
    python bench/xdist.py --rounds 5 --projects attrs,boltons
    python bench/xdist.py --only startup       # start-up figures only

Sets up its own virtual environment (``bench/.venv-xdist``, git-ignored; not CI): this
checkout of dpool (editable, so the ``pytest11`` entry point is registered), pytest,
pytest-xdist, and the third-party projects below, each installed from its sdist (from
the registry with pip), whose own test suite then runs from the unpacked sdist (in
``$DPOOL_BENCH_XDIST_PROJECTS``, default ``$TMPDIR/dpool-bench-xdist-projects``). For each
project it runs ``pytest -n 2`` and ``pytest -n 2 --dpool`` alternately (``--rounds``
times each) and reports the passed/failed/skipped counts of every run and the ratio of
median wall times. Then start-up: a suite of one trivial test per worker, with 2, 8 and
32 workers, plain and ``--dpool``; and pytest's own start-up (``--collect-only`` of one
trivial test, serial) with the plugin loaded and with it blocked (``-p no:dpool``).
Writes the figures as JSON (``--json``) and prints a Markdown summary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VENV = HERE / ".venv-xdist"
# The unpacked sdists live outside this repository: inside it, pytest would take dpool's
# own pyproject.toml for the ini file of projects that have none, and rootdir would be
# dpool's checkout.
WORK = Path(os.environ.get("DPOOL_BENCH_XDIST_PROJECTS") or
            Path(tempfile.gettempdir()) / "dpool-bench-xdist-projects")

# name: (requirement pinned, test dependencies, where the tests are in the sdist, args)
PROJECTS = {
    "attrs": ("attrs==26.1.0", ["hypothesis", "pympler"], "tests", []),
    # (python-dateutil 4.0.0 is left out: plain ``pytest -n 2`` stops with an xdist
    # INTERNALERROR on its suite, KeyError in worker_workerfinished)
    "more-itertools": ("more-itertools==11.2.1", [], "tests", []),
    "boltons": ("boltons==26.2.0", [], "tests", []),
    "toolz": ("toolz==1.2.0", [], "toolz", []),
}
BASE = ["pytest==9.2.0", "pytest-xdist==3.8.0", "execnet==2.1.2"]

_COUNT = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|deselected)")


def python() -> str:
    return str(VENV / "bin" / "python")


def sh(cmd: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def setup(names: list[str]) -> dict[str, Path]:
    """The venv and each project's unpacked sdist (reused when already there)."""
    if not (VENV / "bin" / "python").exists():
        sh([sys.executable, "-m", "venv", str(VENV)])
        sh([python(), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    deps = sorted({d for n in names for d in PROJECTS[n][1]})
    sh([python(), "-m", "pip", "install", "-q", "-e", f"{REPO}[cluster]", "psutil", *BASE,
        *deps])
    WORK.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in names:
        req = PROJECTS[name][0]
        done = [p for p in WORK.iterdir() if p.is_dir() and
                p.name.lower().replace("_", "-").startswith(req.split("==")[0] + "-" +
                                                            req.split("==")[1])]
        if not done:
            with tempfile.TemporaryDirectory() as tmp:
                sh([python(), "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                    ":all:", "-d", tmp, req])
                (sdist,) = Path(tmp).iterdir()
                with tarfile.open(sdist) as tf:
                    tf.extractall(WORK, filter="data")
            done = [p for p in WORK.iterdir() if p.is_dir() and
                    p.name.lower().replace("_", "-").startswith(
                        req.split("==")[0] + "-" + req.split("==")[1])]
        src = done[0]
        sh([python(), "-m", "pip", "install", "-q", "--no-deps", str(src)])
        out[name] = src
    return out


def env() -> dict:
    e = {k: v for k, v in os.environ.items()
         if k in ("DPOOL_ADDRESS", "DPOOL_TOKEN") or
         not k.startswith(("DPOOL_", "PYTEST_")) and k != "PYTHONPATH"}
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    return e


_cpu: list = []  # CPU seconds (user + sys) of the last run's whole process tree


def run(cwd: Path, args: list, timeout: float = 900) -> tuple[float, dict, int, str]:
    """One pytest run: wall seconds, counts, exit code, output tail. Its CPU time (every
    process of the run, reaped in turn by its parent) goes to ``_cpu``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run([python(), "-m", "pytest", *args], cwd=cwd, env=env(),
                       capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    _cpu[:] = [round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 3)]
    lines = [ln for ln in p.stdout.splitlines() if _COUNT.search(ln) and " in " in ln]
    counts = {k.rstrip("s") if k.startswith("error") else k: int(n)
              for n, k in _COUNT.findall(lines[-1])} if lines else {}
    return wall, counts, p.returncode, p.stdout[-1500:] + p.stderr[-1500:]


def bench_projects(srcs: dict[str, Path], rounds: int, workers: int) -> list[dict]:
    results = []
    for name, src in srcs.items():
        _, _, testpath, extra = PROJECTS[name]
        common = ["-n", str(workers), "-p", "no:cacheprovider", "-q", "-o", "addopts=",
                  *extra, testpath]
        if name == "attrs":  # its addopts, less what needs a plugin we don't install
            common[common.index("addopts=")] = "addopts=--import-mode=importlib"
        row: dict = {"project": name, "version": PROJECTS[name][0], "plain": [],
                     "dpool": []}
        for r in range(rounds):
            order = ("plain", "dpool") if r % 2 == 0 else ("dpool", "plain")
            for kind in order:
                args = common + (["--dpool"] if kind == "dpool" else [])
                wall, counts, rc, tail = run(src, args)
                row[kind].append({"wall": round(wall, 3), "cpu": _cpu[0], "counts": counts,
                                  "rc": rc})
                print(f"{name:16} {kind:6} round {r}: {wall:7.2f} s wall {_cpu[0]:7.2f} s "
                      f"CPU  {counts}  rc={rc}", flush=True)
                if not counts:
                    print(tail)
        plain = statistics.median(x["wall"] for x in row["plain"])
        ours = statistics.median(x["wall"] for x in row["dpool"])
        row["median_plain"] = round(plain, 3)
        row["median_dpool"] = round(ours, 3)
        row["ratio"] = round(ours / plain, 3)
        row["median_cpu_plain"] = statistics.median(x["cpu"] for x in row["plain"])
        row["median_cpu_dpool"] = statistics.median(x["cpu"] for x in row["dpool"])
        row["same_counts"] = all(x["counts"] == row["plain"][0]["counts"]
                                 for x in row["plain"] + row["dpool"])
        results.append(row)
    return results


_BRINGUP = '''
import time

_t0 = []
_ready = []


def pytest_configure(config):
    _t0.append(time.monotonic())


def pytest_testnodeready(node):
    _ready.append(time.monotonic())
    if len(_ready) == len(node.nodemanager.specs):
        print("BRINGUP %.3f" % (_ready[-1] - _t0[0]), flush=True)
'''


def bench_startup(rounds: int, sizes: tuple = (2, 8, 32)) -> list[dict]:
    """Wall time of ``pytest -n N`` on N trivial tests, and its bring-up: from the
    controller's ``pytest_configure`` to the N-th worker ready (a conftest records it)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        (where / "conftest.py").write_text(_BRINGUP)
        for n in sizes:
            (where / "test_trivial.py").write_text(
                "import pytest\n\n@pytest.mark.parametrize('i', range(%d))\n"
                "def test_trivial(i):\n    pass\n" % n)
            row: dict = {"workers": n, "plain": [], "dpool": [], "bringup_plain": [],
                         "bringup_dpool": []}
            for r in range(rounds):
                order = ("plain", "dpool") if r % 2 == 0 else ("dpool", "plain")
                for kind in order:
                    args = ["-n", str(n), "-q", "-s", "-p", "no:cacheprovider"] + (
                        ["--dpool"] if kind == "dpool" else [])
                    wall, counts, _, tail = run(where, args)
                    assert counts == {"passed": n}, tail
                    row[kind].append(round(wall, 3))
                    m = re.search(r"BRINGUP ([0-9.]+)", tail)
                    row["bringup_" + kind].append(float(m.group(1)) if m else None)
            for kind in ("plain", "dpool"):
                row["median_" + kind] = round(statistics.median(row[kind]), 3)
                got = [x for x in row["bringup_" + kind] if x is not None]
                row["median_bringup_" + kind] = round(statistics.median(got), 3) \
                    if got else None
            print(f"start-up, {n:2} workers: wall plain {row['median_plain']:.2f} s, "
                  f"--dpool {row['median_dpool']:.2f} s; bring-up plain "
                  f"{row['median_bringup_plain']} s, --dpool "
                  f"{row['median_bringup_dpool']} s", flush=True)
            out.append(row)
    return out


def bench_plugin_load(rounds: int) -> dict:
    """pytest's start-up (serial ``--collect-only`` of one test) with the plugin loaded
    through its entry point, and with it blocked."""
    out: dict = {"loaded": [], "blocked": []}
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        (where / "test_one.py").write_text("def test_one():\n    pass\n")
        for r in range(rounds):
            order = ("loaded", "blocked") if r % 2 == 0 else ("blocked", "loaded")
            for kind in order:
                args = ["-p", "no:xdist", "--collect-only", "-q", "-p", "no:cacheprovider"]
                if kind == "blocked":
                    args += ["-p", "no:dpool"]
                wall, _, rc, tail = run(where, args)
                assert rc == 0, tail
                out[kind].append(round(wall, 4))
    out["median_loaded"] = round(statistics.median(out["loaded"]), 4)
    out["median_blocked"] = round(statistics.median(out["blocked"]), 4)
    print(f"pytest start-up: plugin loaded {out['median_loaded']:.3f} s, blocked "
          f"{out['median_blocked']:.3f} s", flush=True)
    return out


def bench_cluster(srcs: dict[str, Path], nodes: int = 3, cpus: int = 2) -> list[dict]:
    """Counts of ``pytest -n <all CPUs> --dpool`` on a cluster of ``nodes`` node daemons
    on loopback (tests/cluster/conftest.py's), against plain ``pytest -n 2``. Runs
    itself again under the bench venv's python (the nodes run that interpreter)."""
    with tempfile.NamedTemporaryFile("r", suffix=".json") as f:
        sh([python(), str(Path(__file__).resolve()), "--cluster-inner", f.name,
            "--projects", ",".join(srcs), "--nodes", str(nodes), "--cpus", str(cpus)],
           env={**env(), "PYTHONPATH": str(REPO)})
        return json.loads(Path(f.name).read_text())


def _cluster_inner(path: str, names: list[str], nodes: int, cpus: int) -> None:
    sys.path.insert(0, str(REPO))
    from tests.cluster.conftest import start_cluster, stop_cluster

    srcs = {n: next(p for p in WORK.iterdir() if p.is_dir() and p.name.lower().replace(
        "_", "-").startswith(PROJECTS[n][0].replace("==", "-"))) for n in names}
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        c = start_cluster(Path(tmp), nodes, head_cpus=cpus, cpus=cpus)
        try:
            for name, src in srcs.items():
                _, _, testpath, extra = PROJECTS[name]
                addopts = "addopts=--import-mode=importlib" if name == "attrs" else "addopts="
                common = ["-p", "no:cacheprovider", "-q", "-o", addopts, *extra, testpath]
                _, plain, _, _ = run(src, ["-n", "2", *common])
                saved = dict(os.environ)
                os.environ.update(DPOOL_ADDRESS=c.address, DPOOL_TOKEN=c.token)
                try:
                    wall, ours, _, tail = run(src, ["-n", str(nodes * cpus), "--dpool",
                                                    *common])
                finally:
                    os.environ.clear()
                    os.environ.update(saved)
                print(f"{name:16} cluster ({nodes} nodes x {cpus} CPUs): {ours} "
                      f"(plain -n 2: {plain}) in {wall:.1f} s", flush=True)
                if not ours:
                    print(tail)
                out.append({"project": name, "plain": plain, "cluster": ours,
                            "wall": round(wall, 2), "same_counts": plain == ours})
        finally:
            stop_cluster(c)
    Path(path).write_text(json.dumps(out))


def markdown(res: dict) -> str:
    lines = [("| project | counts (`-n 2`, every run) | same counts | median `-n 2` | "
              "median `-n 2 --dpool` | ratio | CPU s, plain / --dpool |"),
             "|---|---|---|---|---|---|---|"] \
        if res.get("projects") else []
    for row in res.get("projects", []):
        counts = ", ".join(f"{v} {k}" for k, v in row["plain"][0]["counts"].items())
        lines.append(f"| {row['version']} | {counts} | {row['same_counts']} | "
                     f"{row['median_plain']:.2f} s | {row['median_dpool']:.2f} s | "
                     f"{row['ratio']:.2f}x | {row['median_cpu_plain']:.1f} / "
                     f"{row['median_cpu_dpool']:.1f} |")
    if res.get("cluster"):
        lines += ["", "| project | plain `-n 2` | `--dpool` on 3 nodes (`-n 6`) | same |",
                  "|---|---|---|---|"]
        for row in res["cluster"]:
            lines.append(f"| {row['project']} | {row['plain']} | {row['cluster']} | "
                         f"{row['same_counts']} |")
    if res.get("startup"):
        lines += ["", ("| workers | wall `-n N` | wall `-n N --dpool` | bring-up `-n N` | "
                       "bring-up `--dpool` |"), "|---|---|---|---|---|"]
        for row in res["startup"]:
            lines.append(f"| {row['workers']} | {row['median_plain']:.2f} s | "
                         f"{row['median_dpool']:.2f} s | {row['median_bringup_plain']} s | "
                         f"{row['median_bringup_dpool']} s |")
    if res.get("plugin_load"):
        p = res["plugin_load"]
        lines += ["", (f"pytest start-up (serial `--collect-only`, one test): plugin "
                       f"loaded {p['median_loaded'] * 1000:.0f} ms, blocked "
                       f"(`-p no:dpool`) {p['median_blocked'] * 1000:.0f} ms")]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--projects", default="attrs,more-itertools,boltons,toolz")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--startup-rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", choices=("projects", "cluster", "startup"), default=None)
    ap.add_argument("--json", default=None, help="write the raw figures here")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--cpus", type=int, default=2, help="CPUs per simulated node")
    ap.add_argument("--cluster-inner", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    names = [n for n in a.projects.split(",") if n]
    if a.cluster_inner:
        _cluster_inner(a.cluster_inner, names, a.nodes, a.cpus)
        return
    srcs = setup(names if a.only != "startup" else [])
    res: dict = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    if a.only in (None, "projects"):
        res["projects"] = bench_projects(srcs, a.rounds, a.workers)
    if a.only in (None, "cluster"):
        res["cluster"] = bench_cluster(srcs, a.nodes, a.cpus)
    if a.only in (None, "startup"):
        res["startup"] = bench_startup(a.startup_rounds)
        res["plugin_load"] = bench_plugin_load(max(10, a.startup_rounds))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    print()
    print(markdown(res))


if __name__ == "__main__":
    main()
