"""dpool benchmark harness: dpool and its peers side by side, one run.

    python bench/run.py [--quick] [--only executor,objects,pool]
                        [--peers dpool,ppe,mp,loky,ray,dask,mpire]

Each (group, peer) pair runs in its own subprocess (``peer_main.py``) with
``bench/`` and the repo root on ``PYTHONPATH``; results are streamed back as
JSON lines, collected here, and written to ``bench/results.json`` and
``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

from params import DEFAULT, QUICK, Params  # noqa: E402
from procs import run_child  # noqa: E402
from recorder import MARKER  # noqa: E402
from report import render  # noqa: E402
from spec import ALL_PEERS, DISPLAY, FLOOR_GROUPS, GROUPS  # noqa: E402

DISTRIBUTIONS = ("numpy", "cloudpickle", "psutil", "loky", "ray", "dask", "distributed", "mpire", "dpool")


def _csv(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad:
        raise SystemExit(f"unknown {what}: {', '.join(bad)} (choose from {', '.join(allowed)})")
    return items


def machine_info() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for dist in DISTRIBUTIONS:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "python_impl": platform.python_implementation(),
        "packages": versions,
        "loadavg_start": list(os.getloadavg()),
    }


def _child_env(tmpdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    # Everything the peer writes to the temp dir (Ray sessions, dask scratch
    # space, multiprocessing sockets) lands in a dir we delete afterwards.
    # Kept short: Ray puts AF_UNIX sockets (107-byte limit) under it.
    env["TMPDIR"] = str(tmpdir)
    path = [str(BENCH_DIR), str(REPO_ROOT)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def collect(stdout: str) -> dict[str, Any]:
    """Fold the child's JSON lines into one peer record."""
    rec: dict[str, Any] = {"status": "incomplete", "metrics": {}, "notes": []}
    metrics: dict[str, dict[str, Any]] = rec["metrics"]
    for line in stdout.splitlines():
        if not line.startswith(MARKER):
            continue
        try:
            ev = json.loads(line[len(MARKER) :])
        except json.JSONDecodeError:
            continue
        kind = ev.pop("type")
        if kind == "meta":
            rec.update(ev)
        elif kind == "skip":
            rec["status"] = "skipped"
            rec["notes"].append(ev["reason"])
        elif kind == "note":
            rec["notes"].append(ev["text"])
        elif kind == "done":
            rec["status"] = "ok"
        elif ev["key"] in metrics:
            # The first outcome of a metric wins; a later error (e.g. in
            # shutdown, reported for all keys of a block) becomes a note.
            if kind == "metric_error" and "value" in metrics[ev["key"]]:
                note = f"after {ev['key']}: {ev['error']}"
                if note not in rec["notes"]:
                    rec["notes"].append(note)
        elif kind == "metric":
            metrics[ev["key"]] = {"value": ev["value"], **ev["extra"]}
        elif kind == "metric_skipped":
            metrics[ev["key"]] = {"skipped": ev["reason"]}
        elif kind == "metric_error":
            metrics[ev["key"]] = {"error": ev["error"]}
    return rec


def run_peer(group: str, peer: str, params: Params) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(BENCH_DIR / "peer_main.py"),
        "--group",
        group,
        "--peer",
        peer,
        "--params",
        json.dumps(params.to_json()),
    ]
    work = Path(tempfile.mkdtemp(prefix="dpb-"))
    load_before = os.getloadavg()[0]
    limit = params.timeout_s  # the child dumps its stacks 3 s before
    try:
        out = run_child(cmd, cwd=work, env=_child_env(work), timeout_s=limit, out_dir=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rec = collect(out.stdout)
    rec["wall_s"] = round(out.wall_s, 2)
    rec["returncode"] = out.returncode
    rec["loadavg_1m_before"] = load_before
    if out.timed_out:
        rec["status"] = "timeout"
        rec["notes"].append(f"killed after {limit:.0f}s; stderr tail:\n{_tail(out.stderr, 25)}")
    elif rec["status"] == "incomplete":
        rec["status"] = "crashed"
        rec["notes"].append(f"exit code {out.returncode}; stderr tail:\n{_tail(out.stderr, 25)}")
    if out.leftovers:
        rec["notes"].append(f"killed {len(out.leftovers)} leftover process(es): {', '.join(out.leftovers[:8])}")
    if any("error" in m for m in rec["metrics"].values()):
        rec["stderr_tail"] = _tail(out.stderr, 25)
    return rec


def run_floor(params: Params) -> dict[str, Any]:
    """The socketpair ping-pong floor (``floor.py``), in a child like the peers'."""
    cmd = [sys.executable, str(BENCH_DIR / "floor.py"), "--params", json.dumps(params.to_json())]
    work = Path(tempfile.mkdtemp(prefix="dpb-"))
    load_before = os.getloadavg()[0]
    try:
        out = run_child(cmd, cwd=work, env=_child_env(work), timeout_s=params.timeout_s, out_dir=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rec = collect(out.stdout)
    rec["wall_s"] = round(out.wall_s, 2)
    rec["loadavg_1m_before"] = load_before
    if rec["status"] != "ok":
        rec["notes"].append(f"exit code {out.returncode}; stderr tail:\n{_tail(out.stderr, 25)}")
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes: ~1 min with all peers, ~30 s without Ray/dask")
    ap.add_argument("--only", default=",".join(GROUPS), help="groups to run (comma-separated)")
    ap.add_argument("--peers", default=",".join(ALL_PEERS), help="peers to run (comma-separated)")
    ap.add_argument("--timeout", type=float, default=None, help="per (group, peer) time limit, seconds")
    ap.add_argument("--out", type=Path, default=BENCH_DIR, help="where results.json / RESULTS.md go")
    args = ap.parse_args(argv)

    groups = _csv(args.only, tuple(GROUPS), "group")
    peers = _csv(args.peers, ALL_PEERS, "peer")
    params = QUICK if args.quick else DEFAULT
    if args.timeout is not None:
        params = dataclasses.replace(params, timeout_s=args.timeout)

    results: dict[str, Any] = {
        "machine": machine_info(),
        "settings": {"quick": args.quick, "groups": groups, "peers": peers, "params": params.to_json()},
        "groups": {},
    }
    for gname in groups:
        group = GROUPS[gname]
        gres: dict[str, Any] = {"reference": group.reference, "peers": {}}
        results["groups"][gname] = gres
        if gname in FLOOR_GROUPS:
            print(f"[{gname}] socketpair floor ...", file=sys.stderr, flush=True)
            gres["floor"] = run_floor(params)
        for peer in group.peers:
            if peer not in peers:
                continue
            print(f"[{gname}] {DISPLAY[peer]} ...", file=sys.stderr, flush=True)
            rec = run_peer(gname, peer, params)
            gres["peers"][peer] = rec
            done = sum(1 for m in rec["metrics"].values() if "value" in m)
            extra = f" — {rec['notes'][0].splitlines()[0]}" if rec["notes"] else ""
            print(
                f"[{gname}] {DISPLAY[peer]}: {rec['status']} in {rec['wall_s']:.1f}s, {done} metric(s){extra}",
                file=sys.stderr,
                flush=True,
            )

    results["machine"]["loadavg_end"] = list(os.getloadavg())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "RESULTS.md").write_text(render(results))
    print(f"wrote {args.out / 'results.json'} and {args.out / 'RESULTS.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
