"""Cold start: a whole short program with dpool against the same with the stdlib.

Each program imports the pool class, starts it with 2 workers, gets one result and shuts
down (issue 21, item 1)::

    executor: from X import ProcessPoolExecutor; with it(2) as ex: ex.submit(f, 1).result()
    pool:     from X import Pool;                with Pool(2) as p: p.apply(f, (1,))

Every run is a fresh ``python script.py`` (the same interpreter as this script's, so the
same site-packages), in pairs that alternate which side goes first; the figures are
medians over the pairs, and each ratio is the median of the pairs' own dpool/stdlib
ratios (the two runs of a pair are adjacent in time, so a machine whose speed drifts
during the run -- a shared 2-CPU VM's moves by 10-20 % within a minute here -- skews a
ratio of the two sides' medians, not the pairs' ratios):

- wall: ``time.perf_counter`` around starting the process and waiting for it;
- CPU: user + system time from ``resource.getrusage(RUSAGE_CHILDREN)`` deltas -- the
  program and every process it waited for (its workers: both sides reap theirs);
- peak RSS: ``ru_maxrss`` of the child as ``os.wait4`` reports it -- the largest resident
  set of the program and its reaped processes (the driver, in practice), sampled by the
  kernel, no polling.

Both sides import from bytecode caches (written by a warm-up run of each program under a
private ``PYTHONPYCACHEPREFIX``), as an installed package would, even where the
environment sets ``PYTHONDONTWRITEBYTECODE``.

    python bench/coldstart.py                    # 15 pairs each, writes bench/COLDSTART.md
    python bench/coldstart.py --pairs 10 --no-write
    python bench/coldstart.py --dpool-path /tmp/before-21   # another checkout's dpool

``--dpool-path`` puts that directory first on the dpool programs' ``PYTHONPATH`` (an
editable install's finder comes after ``sys.path``), and the report shows which
``dpool/__init__.py`` the programs imported.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent

_PROGRAMS = {
    "executor": '''\
from {module} import ProcessPoolExecutor


def f(x):
    return x + 1


if __name__ == "__main__":
    with ProcessPoolExecutor(max_workers=2) as ex:
        assert ex.submit(f, 1).result() == 2
''',
    "pool": '''\
from {module} import Pool


def f(x):
    return x + 1


if __name__ == "__main__":
    with Pool(2) as p:
        assert p.apply(f, (1,)) == 2
''',
}
_MODULES = {
    ("executor", "dpool"): "dpool", ("executor", "stdlib"): "concurrent.futures",
    ("pool", "dpool"): "dpool", ("pool", "stdlib"): "multiprocessing",
}


def _run_once(script: Path, env: dict) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS bytes) of one whole run of ``script``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(script)], env=env, cwd=script.parent,
                            stdin=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{script.name} exited with {proc.returncode}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, usage.ru_maxrss * 1024  # Linux: KiB


def _which_dpool(env: dict, cwd: str) -> str:
    out = subprocess.run([sys.executable, "-c", "import dpool; print(dpool.__file__)"],
                         env=env, cwd=cwd, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def measure(pairs: int, dpool_path: str | None) -> tuple[dict, str]:
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="dpool-coldstart-") as tmp:
        env = dict(os.environ)
        env.pop("DPOOL_ADDRESS", None)  # the embedded runtime, as a new user's first try
        # Both sides import from bytecode caches, as an installed package does (a checkout
        # run with PYTHONDONTWRITEBYTECODE would compile dpool's source on every run);
        # the warm-up runs write them, under this run's own prefix.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
        dpool_env = dict(env)
        if dpool_path:
            dpool_env["PYTHONPATH"] = os.pathsep.join(
                p for p in (dpool_path, env.get("PYTHONPATH")) if p)
        which = _which_dpool(dpool_env, tmp)  # the programs run there too
        scripts = {}
        for (case, side), module in _MODULES.items():
            path = Path(tmp) / f"{case}_{side}.py"
            path.write_text(_PROGRAMS[case].format(module=module))
            scripts[case, side] = path
        for case in _PROGRAMS:
            samples: dict = {"dpool": [], "stdlib": []}
            for side in ("dpool", "stdlib"):  # one warm-up each (page cache, .pyc files)
                _run_once(scripts[case, side], dpool_env if side == "dpool" else env)
            for i in range(pairs):
                order = ("dpool", "stdlib") if i % 2 == 0 else ("stdlib", "dpool")
                for side in order:
                    samples[side].append(_run_once(
                        scripts[case, side], dpool_env if side == "dpool" else env))
            results[case] = samples
    return results, which


def _medians(samples: list) -> tuple[float, float, float]:
    return tuple(statistics.median(s[k] for s in samples) for k in range(3))  # type: ignore


def _pair_ratios(mine: list, theirs: list) -> tuple[float, float, float]:
    """Median over the pairs of (this pair's dpool figure / its stdlib figure)."""
    return tuple(statistics.median(a[k] / b[k] for a, b in zip(mine, theirs, strict=True))
                 for k in range(3))  # type: ignore


def report(results: dict, which: str, pairs: int) -> str:
    lines = [
        "| program | dpool wall | stdlib wall | ratio | dpool CPU | stdlib CPU | ratio "
        "| dpool peak RSS | stdlib peak RSS | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, samples in results.items():
        dw, dc, dm = _medians(samples["dpool"])
        sw, sc, sm = _medians(samples["stdlib"])
        rw, rc, rm = _pair_ratios(samples["dpool"], samples["stdlib"])
        lines.append(
            f"| {case} | {dw * 1e3:.1f} ms | {sw * 1e3:.1f} ms | {rw:.2f}x "
            f"| {dc * 1e3:.1f} ms | {sc * 1e3:.1f} ms | {rc:.2f}x "
            f"| {dm / 2**20:.1f} MiB | {sm / 2**20:.1f} MiB | {rm:.2f}x |")
    load = os.getloadavg()
    lines.append("")
    lines.append(f"{pairs} alternating pairs per program, medians (ratios: medians of the "
                 f"pairs' ratios); dpool from `{which}`; "
                 f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
                 f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--dpool-path", default=None,
                    help="directory to put first on the dpool programs' PYTHONPATH")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--out", default=str(_HERE / "COLDSTART.md"))
    args = ap.parse_args()
    results, which = measure(args.pairs, args.dpool_path)
    table = report(results, which, args.pairs)
    print(table)
    if not args.no_write:
        write(Path(args.out), table)


_BEGIN, _END = "<!-- coldstart.py: begin -->", "<!-- coldstart.py: end -->"


def write(path: Path, table: str) -> None:
    """Put ``table`` between the markers of ``path`` (the notes around them stay), or
    write a new file."""
    block = f"{_BEGIN}\n{table}\n{_END}"
    text = path.read_text() if path.exists() else ""
    if _BEGIN in text and _END in text:
        head, rest = text.split(_BEGIN, 1)
        text = head + block + rest.split(_END, 1)[1]
    else:
        text = ("# Cold start: dpool against the stdlib\n\n"
                "Written by `python bench/coldstart.py` (its docstring says how each figure "
                "is taken).\n\n" + block + "\n")
    path.write_text(text)


if __name__ == "__main__":
    main()
