"""Throughput of a steady stream of 50 ms tasks while a node is SIGKILLed and later re-added.

    python bench/recovery.py [--cpus 4] [--duration 45] [--kill-at 10] [--add-at 25]
                             [--no-ray] [--out bench/RECOVERY.md]

The shape of the OSDI 2018 Ray paper's Fig. 11a, on one machine: three nodes on loopback
addresses (dpool: a head on 127.0.50.1 with 2 Redis shards and a global scheduler, nodes
on 127.0.50.2 and .3; Ray: ``ray start --head`` on 127.0.51.1, ``ray start --address`` on
.2 and .3), ``--cpus`` CPUs each. A driver on the head's host keeps twice as many 50 ms
tasks outstanding as the cluster has CPUs. At ``--kill-at`` seconds the node on .3 is
SIGKILLed -- its daemon (raylet) and every process of it at once: a crash of the whole
node, though the kernel still closes its sockets, as a host that loses power would not --
and at ``--add-at`` a fresh node joins on .4. Ray runs the same script shape in
the same run (``bench/.venv-peers`` or ``$DPOOL_BENCH_RAY_PYTHON``), unless ``--no-ray``.

Each task appends ``start``/``end`` lines to a log (O_APPEND, one write each), so a task
that ran twice, or was cut short and run again, shows up; the driver records every
future's outcome and when it saw it. Writes ``recovery.json`` (throughput per 0.5 s bin,
in all and per node, events, figures) and ``recovery.png`` (``bench/plots.py``) beside
``--out``, and the section "A node SIGKILLed and re-added" of ``--out`` (its other
sections are kept). ``--report-only`` redraws both from ``recovery.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from cluster import _cli, _env, _free_port, _ray_python
from recovery_report import analyse, levels, report, write_section

TASK = r"""
import os, sys, time

def task(i, log, node):
    t0 = time.monotonic()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"start {i} {node} {os.getpid()} {t0:.6f}\n".encode())
        time.sleep(0.05)
        t1 = time.monotonic()
        os.write(fd, f"end {i} {node} {os.getpid()} {t1:.6f}\n".encode())
    finally:
        os.close(fd)
    return i, node
"""
LOOP = r"""
def stream(submit, wait_some, log, duration, window, drain_s):
    records, errors = [], []
    pending, nxt = {}, 0
    for _ in range(3):  # warm-up: workers started on every node
        for x in wait_some([submit(-1 - k, log) for k in range(window)], None, all_=True):
            pass
    t0 = time.monotonic()
    print("START", t0, flush=True)
    while True:
        now = time.monotonic()
        if now - t0 < duration:
            while len(pending) < window:
                pending[submit(nxt, log)] = nxt
                nxt += 1
        elif not pending or now - t0 > duration + drain_s:
            break
        for f, result, exc in wait_some(list(pending), 0.1):
            i = pending.pop(f)
            seen = time.monotonic() - t0
            if exc is None:
                records.append([i, round(seen, 4), result[1]])
            else:
                errors.append([i, round(seen, 4), repr(exc)[:300]])
    return {"t0": t0, "submitted": nxt, "records": records, "errors": errors,
            "unfinished": sorted(pending.values())}
"""
DPOOL_DRIVER = TASK + LOOP + r"""
import json
from concurrent.futures import FIRST_COMPLETED, ALL_COMPLETED, wait
import dpool

def node_task(i, log):
    return task(i, log, os.environ.get("DPOOL_NODE_ID", "?"))

log, duration, window, slots, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), sys.argv[5]
with dpool.ProcessPoolExecutor(slots) as ex:
    def wait_some(fs, timeout, all_=False):
        done, _ = wait(fs, timeout, ALL_COMPLETED if all_ else FIRST_COMPLETED)
        return [(f, f.result() if f.exception() is None else None, f.exception())
                for f in done]
    res = stream(lambda i, lg: ex.submit(node_task, i, lg), wait_some, log, duration,
                 window, 120.0)
    with open(out, "w") as fh:
        json.dump(res, fh)
    os._exit(0)  # do not wait for futures left unfinished (they are reported)
"""
RAY_DRIVER = TASK + LOOP + r"""
import json
import ray

log, duration, window, address, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), \
    sys.argv[4], sys.argv[5]
ray.init(address=address, logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=1)
def node_task(i, log):
    return task(i, log, ray.util.get_node_ip_address())

def wait_some(refs, timeout, all_=False):
    ready, _ = ray.wait(refs, num_returns=len(refs) if all_ else 1, timeout=timeout)
    if ready and not all_:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
    out = []
    for r in ready:
        try:
            out.append((r, ray.get(r), None))
        except Exception as exc:  # noqa: BLE001 - recorded
            out.append((r, None, exc))
    return out

res = stream(lambda i, lg: node_task.remote(i, lg), wait_some, log, duration, window, 120.0)
with open(out, "w") as fh:
    json.dump(res, fh)
os._exit(0)
"""


def _procs_matching(pattern: re.Pattern) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if p.pid != os.getpid() and pattern.search(" ".join(p.info["cmdline"] or ())):
            found.append(p)
    return found


def _procs_using(path: str) -> list[psutil.Process]:
    """Processes holding a file under ``path`` open (Ray's agents rename themselves, so
    their command line no longer says which cluster they belong to; their logs do)."""
    found = []
    for p in psutil.process_iter():
        try:
            if any(f.path.startswith(path) for f in p.open_files()):
                found.append(p)
        except psutil.Error:
            pass
    return found


def _ip_pattern(*ips: str, extra: str = "") -> re.Pattern:
    alts = [re.escape(ip) + r"(?![0-9])" for ip in ips] + ([re.escape(extra)] if extra else [])
    return re.compile(r"(?<![0-9.])(?:" + "|".join(alts) + ")")


def _kill_all(procs: list[psutil.Process]) -> list[str]:
    """SIGKILL ``procs`` and their descendants at once; their names."""
    family = {p.pid: p for p in procs}
    for p in procs:
        try:
            family.update((c.pid, c) for c in p.children(recursive=True))
        except psutil.Error:
            pass
    names = []
    for p in family.values():
        try:
            names.append(p.name())
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(list(family.values()), timeout=5)
    return sorted(names)


def _dpool_tree(pid: int) -> list[psutil.Process]:
    try:
        proc = psutil.Process(pid)
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def _drive(cmd: list, env: dict, out: str, kill, add, kill_at: float, add_at: float,
           duration: float) -> tuple[dict, dict]:
    """Run the driver; kill/add the nodes at their times (seconds after its START)."""
    events: dict = {}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    err: list = []
    threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True).start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("START "):
                t0 = float(line.split()[1])
                break
        else:
            proc.wait(30)
            raise RuntimeError(f"the driver did not start: {''.join(err)[-3000:]}")
        time.sleep(max(0.0, t0 + kill_at - time.monotonic()))
        events["kill"] = time.monotonic() - t0
        events["killed_processes"] = kill()
        time.sleep(max(0.0, t0 + add_at - time.monotonic()))
        events["add"] = time.monotonic() - t0
        try:
            add()
        except Exception as exc:  # noqa: BLE001 - a node that cannot join is a figure too
            events["add_error"] = str(exc)[-1500:]
        events["add_returned"] = time.monotonic() - t0
        proc.wait(duration + 200)
    finally:
        if proc.poll() is None:
            _kill_all(_dpool_tree(proc.pid))
    if proc.returncode != 0 or not os.path.exists(out):
        time.sleep(0.2)
        raise RuntimeError(f"driver exit {proc.returncode}: {''.join(err)[-3000:]}")
    return json.loads(Path(out).read_text()), events


def run_dpool(tmp: str, cpus: int, args) -> tuple[dict, dict]:
    ips = ["127.0.50.1", "127.0.50.2", "127.0.50.3", "127.0.50.4"]
    states = [os.path.join(tmp, f"dpool-{i}") for i in range(4)]
    port = _free_port(ips[0])
    address = f"{ips[0]}:{port}"
    pids: list = []
    started: list = []
    crashed: list = []  # the killed node's processes: their shared memory stays behind
    try:
        started.append(states[0])
        out = _cli(["start", "--head", "--port", str(port), "--node-ip", ips[0], "--num-cpus",
                    str(cpus), "--shards", "2", "--global-schedulers", "1"], states[0])
        token = next(x for x in out.stdout.splitlines() if x.startswith("DPOOL_TOKEN="))[12:]
        record = json.loads(Path(states[0], "cluster.json").read_text())
        pids += [r["pid"] for r in record.get("redis", []) + record.get("global_schedulers", [])]

        def join(i: int) -> None:
            started.append(states[i])
            _cli(["start", "--address", address, "--token", token, "--node-ip", ips[i],
                  "--num-cpus", str(cpus)], states[i])
            pids.append(json.loads(Path(states[i], "cluster.json").read_text())["node"]["pid"])

        join(1)
        join(2)
        pids.append(record["node"]["pid"])
        time.sleep(1.5)  # the nodes link to the global scheduler at their first heartbeat
        victim = json.loads(Path(states[2], "cluster.json").read_text())["node"]["pid"]
        env = _env(DPOOL_ADDRESS=address, DPOOL_TOKEN=token, DPOOL_STATE_DIR=states[0])
        log, out_json = os.path.join(tmp, "dpool-tasks.log"), os.path.join(tmp, "dpool.json")
        res, events = _drive(
            [sys.executable, "-c", DPOOL_DRIVER, log, str(args.duration), str(6 * cpus),
             str(3 * cpus), out_json], env, out_json,
            lambda: _kill_all(crashed.extend(_dpool_tree(victim)) or crashed),
            lambda: join(3), args.kill_at, args.add_at, args.duration)
        res["log"] = Path(log).read_text()
        res["nodes"] = {"killed": f"{ips[2]}:", "added": f"{ips[3]}:"}
        return res, events
    finally:
        for state in reversed(started):
            with contextlib.suppress(Exception):  # what is left is killed below
                _cli(["stop"], state)
        for pid in pids:
            _kill_all(_dpool_tree(pid))
        _kill_all(_procs_matching(_ip_pattern(*ips)))  # anything of ours still there
        for proc in crashed:
            for leftover in Path("/dev/shm").glob(f"dpool_{proc.pid}_*"):
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    leftover.unlink(missing_ok=True)


def run_ray(py: str, tmp: str, cpus: int, args) -> tuple[dict, dict]:
    ray = str(Path(py).parent / "ray")
    ips = ["127.0.51.1", "127.0.51.2", "127.0.51.3", "127.0.51.4"]
    port = _free_port(ips[0])
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_TOKEN=secrets.token_hex(32))
    env.pop("DPOOL_ADDRESS", None)
    ray_tmp = tempfile.mkdtemp(prefix="rayrec-")
    ours = _ip_pattern(*ips, extra=ray_tmp)
    try:
        def ray_start(*extra: str) -> None:
            out = subprocess.run([ray, "start", "--num-cpus", str(cpus), *extra], env=env,
                                 capture_output=True, text=True, timeout=120, check=False)
            if out.returncode != 0:
                raise RuntimeError(f"ray start {' '.join(extra)}: {out.stderr[-1500:]}"
                                   f"{out.stdout[-1500:]}")

        ray_start("--head", "--port", str(port), "--node-ip-address", ips[0],
                  "--disable-usage-stats", "--include-dashboard", "false", "--temp-dir", ray_tmp)

        def join(i: int) -> None:
            ray_start("--address", f"{ips[0]}:{port}", "--node-ip-address", ips[i])

        join(1)
        join(2)
        log, out_json = os.path.join(tmp, "ray-tasks.log"), os.path.join(tmp, "ray.json")
        res, events = _drive(
            [py, "-c", RAY_DRIVER, log, str(args.duration), str(6 * cpus), f"{ips[0]}:{port}",
             out_json], env, out_json, lambda: _kill_all(_procs_matching(_ip_pattern(ips[2]))),
            lambda: join(3), args.kill_at, args.add_at, args.duration)
        res["log"] = Path(log).read_text()
        res["nodes"] = {"killed": ips[2], "added": ips[3]}
        return res, events
    finally:
        _kill_all(_procs_matching(ours))
        _kill_all(_procs_using(ray_tmp))
        shutil.rmtree(ray_tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpus", type=int, default=4, help="CPUs of each of the 3 nodes")
    ap.add_argument("--duration", type=float, default=45.0)
    ap.add_argument("--kill-at", type=float, default=10.0)
    ap.add_argument("--add-at", type=float, default=25.0)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--no-dpool", action="store_true", help="Ray only (to try the script)")
    ap.add_argument("--out", default=str(ROOT / "bench/RECOVERY.md"))
    ap.add_argument("--json", default=None,
                    help="raw figures (default: recovery.json beside --out)")
    ap.add_argument("--report-only", action="store_true",
                    help="re-render the page and the plot from --json, run nothing")
    args = ap.parse_args()
    args.json = args.json or str(Path(args.out).with_name("recovery.json"))
    if args.report_only:
        result = json.loads(Path(args.json).read_text())
        for run in result["runs"].values():
            run.update(levels(run, result["duration"]))
        Path(args.json).write_text(json.dumps(result, indent=1))
        return _publish(result, args)
    slots = 3 * args.cpus
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus_per_node": args.cpus,
                    "machine_cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
                    "duration": args.duration, "kill_at": args.kill_at,
                    "add_at": args.add_at, "runs": {}}
    tmp = tempfile.mkdtemp(prefix="dpool-recovery-")
    try:
        if not args.no_dpool:
            res, events = run_dpool(tmp, args.cpus, args)
            result["runs"]["dpool"] = analyse(res, events, slots, args.duration)
        py = None if args.no_ray else _ray_python()
        if py is None:
            result["ray_error"] = "skipped" if args.no_ray else "ray is not installed"
        else:
            try:
                res, events = run_ray(py, tmp, args.cpus, args)
                result["runs"]["ray"] = analyse(res, events, slots, args.duration)
                result["ray_version"] = subprocess.run(
                    [py, "-c", "import ray; print(ray.__version__)"], capture_output=True,
                    text=True, check=False).stdout.strip()
            except Exception as exc:  # noqa: BLE001 - report it, keep dpool's figures
                result["ray_error"] = str(exc)[-1000:]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["loadavg_end"] = os.getloadavg()
    Path(args.json).write_text(json.dumps(result, indent=1))
    return _publish(result, args)


def _publish(result: dict, args) -> int:
    from plots import plot_recovery  # matplotlib only when it is needed

    plot_recovery(result, Path(args.out).with_name("recovery.png"))
    write_section(Path(args.out), report(result))
    summary = {k: {kk: vv for kk, vv in v.items() if not kk.startswith("bins_")}
               for k, v in result["runs"].items()}
    print(json.dumps(summary, indent=1))
    print("ray:", result.get("ray_error", "ok"))
    return 0

if __name__ == "__main__":
    sys.exit(main())
