"""An idle cluster: what a head and two nodes doing nothing cost, and how fast they react.

    python bench/idle.py                     # 15 s idle, then the reaction checks
    python bench/idle.py --seconds 15 --no-react --json out.json
    python bench/idle.py --seconds 15 --replicas 1   # with shard replicas and 3 Sentinels
    cd /tmp/other-checkout && python /work/main/bench/idle.py   # that checkout's dpool

Starts a 3-node loopback cluster as ``tests/cluster/conftest.py`` does -- a head on
127.0.70.2 (``dpool start --head``: 2 Redis shards, 1 global scheduler, a node) and two
nodes joining it from 127.0.70.3 and 127.0.70.4, 2 CPUs each, every one with its own state
directory --, waits until every node is alive and linked to the global scheduler, lets it
settle (``--settle``), then reads the CPU time of every process it started -- node
daemons and their workers, the global scheduler, the Redis shards (with ``--replicas 1``,
``dpool start --head --replicas 1``: also a replica of each shard and three Redis
Sentinels, and every process reaches the shards through the Sentinels) -- at the start and
the end of ``--seconds``, and prints each one's share of one core over that time, the
total, and each one's RSS at the end. CPU time twice: user + system from psutil (clock
ticks of 10 ms, so +-0.07 % of a core per process over 15 s), and the run time of the
process's threads from ``/proc/PID/task/*/schedstat`` (nanoseconds).

Then (unless ``--no-react``), on the same cluster after its idle time, how fast it
reacts (each figure a median where there are several):

- *work*: a driver on another "host" (TCP, ``DPOOL_ADDRESS`` = the head) -- time from
  creating the executor to the first result, then the round trip of sequential no-op
  tasks (run on the head's node);
- *spilled work*: the same for tasks asking a resource only the node on 127.0.70.4 has,
  so each goes head -> global scheduler -> that node -> back;
- *dead driver*: a driver attached to the node on 127.0.70.3 (unix socket) runs two
  tasks that never end; it is SIGKILLed: time until both workers running them exited;
- *frozen node*: the node on 127.0.70.3 is SIGSTOPped (its links stay open; only its
  heartbeats stop): time until the node table marks it dead; then SIGCONT: time until
  it is no longer marked (it registers again);
- *a replaced global scheduler*: it is SIGKILLed, and 4 s later another is started with
  the same command line: time from its listening socket to all three nodes linked to it;
- *node death*: the node on 127.0.70.4 is SIGKILLed: time until the node table marks it
  dead (read from the Redis shards every 10 ms).

Which dpool runs: the directory given by ``--dpool-path``, else the current directory
if it holds ``dpool/``, else this script's checkout; it goes first on every process's
``PYTHONPATH``, and the report names the ``dpool/__init__.py`` the daemons imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

_HERE = Path(__file__).resolve().parent

HEAD, NODE_B, NODE_C = "127.0.70.2", "127.0.70.3", "127.0.70.4"  # (tests use 127.0.0-1.x)
FAR = "idle_bench_far"  # a resource only NODE_C offers: its tasks must be spilled there

WORK = r"""
import json, statistics, sys, time
from dpool import ProcessPoolExecutor

def noop(*a):
    return None

far = len(sys.argv) > 2
t0 = time.perf_counter()
with ProcessPoolExecutor(2) as ex:
    run = ex.options(resources={sys.argv[2]: 1}) if far else ex
    run.submit(noop).result()
    first = time.perf_counter() - t0
    lat = []
    for _ in range(int(sys.argv[1])):
        t1 = time.perf_counter()
        run.submit(noop).result()
        lat.append(time.perf_counter() - t1)
print(json.dumps({"first_ms": first * 1e3, "rtt_ms": statistics.median(lat) * 1e3}))
"""

HOLD = r"""
import os, sys, time
import dpool

def hold(folder):
    with open(os.path.join(folder, str(os.getpid())), "w"):
        pass
    time.sleep(600)

with dpool.ProcessPoolExecutor(2) as ex:
    fs = [ex.submit(hold, sys.argv[1]) for _ in range(2)]
    time.sleep(600)
"""


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, tmp: str, dpool_path: str, replicas: int = 0) -> None:
        self.tmp = tmp
        self.dpool_path = dpool_path
        self.replicas = replicas
        self.states: dict[str, str] = {}
        self.token = ""
        self.address = ""
        self.records: dict[str, dict] = {}

    def env(self, **extra: str) -> dict:
        env = dict(os.environ)
        for k in ("DPOOL_ADDRESS", "DPOOL_TOKEN", "DPOOL_STATE_DIR"):
            env.pop(k, None)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (self.dpool_path, os.environ.get("PYTHONPATH")) if p)
        env.update(extra)
        return env

    def workdir(self) -> str:
        """An empty directory for the drivers (their working directory is shipped to the
        nodes: the state directories beside it are not theirs)."""
        path = os.path.join(self.tmp, "driver")
        os.makedirs(path, exist_ok=True)
        return path

    def cli(self, args: list, ip: str, timeout: float = 120) -> str:
        out = subprocess.run([sys.executable, "-m", "dpool", *args],
                             env=self.env(DPOOL_STATE_DIR=self.states[ip]),
                             cwd=self.dpool_path, capture_output=True, text=True,
                             timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"dpool {' '.join(args)}: {out.stderr[-2000:]}")
        return out.stdout

    def start(self) -> None:
        for ip in (HEAD, NODE_B, NODE_C):
            self.states[ip] = os.path.join(self.tmp, f"state-{ip}")
        port = _free_port(HEAD)
        out = self.cli(["start", "--head", "--port", str(port), "--node-ip", HEAD,
                        "--num-cpus", "2", "--shards", "2", "--global-schedulers", "1",
                        *(["--replicas", str(self.replicas)] if self.replicas else [])], HEAD)
        self.token = [x for x in out.splitlines() if x.startswith("DPOOL_TOKEN=")][0][12:]
        self.address = f"{HEAD}:{port}"
        for ip, extra in ((NODE_B, []), (NODE_C, ["--resources", json.dumps({FAR: 100})])):
            self.cli(["start", "--address", self.address, "--token", self.token,
                      "--node-ip", ip, "--num-cpus", "2", *extra], ip)
        for ip in self.states:
            self.records[ip] = json.loads(Path(self.states[ip], "cluster.json").read_text())
        deadline = time.monotonic() + 30
        while True:
            status = json.loads(self.cli(["status", "--json"], HEAD))
            alive = [n for n in status["nodes"] if n["alive"]]
            if len(alive) == 3 and all(n.get("linked_schedulers", 1) for n in alive):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not come up: {status}")
            time.sleep(0.2)

    def processes(self) -> dict[str, psutil.Process]:
        """Every process this cluster runs now, by a readable name."""
        out: dict[str, psutil.Process] = {}
        head = self.records[HEAD]
        counts: dict[str, int] = {}
        for r in head.get("redis", []):
            # role: "primary", "replica", "sentinel" (no role: a checkout from before them)
            kind = {"replica": "redis replica", "sentinel": "redis sentinel"}.get(
                r.get("role", ""), "redis shard")
            i = counts[kind] = counts.get(kind, -1) + 1
            out[f"{kind} {i}"] = psutil.Process(r["pid"])
        for i, g in enumerate(head.get("global_schedulers", [])):
            out[f"global scheduler {i}"] = psutil.Process(g["pid"])
        for ip, rec in self.records.items():
            try:
                node = psutil.Process(rec["node"]["pid"])
            except psutil.NoSuchProcess:
                continue
            out[f"node {ip}"] = node
            for j, child in enumerate(node.children(recursive=True)):
                out[f"node {ip} worker {j}"] = child
        return out

    def stop(self) -> None:
        for ip in (NODE_C, NODE_B, HEAD):
            if ip in self.states:
                try:
                    self.cli(["stop", "--timeout", "5"], ip, timeout=60)
                except Exception as exc:  # noqa: BLE001 - stop the others all the same
                    print(f"stopping {ip}: {exc}", file=sys.stderr)
        for rec in self.records.values():  # whatever is left
            pids = [rec.get("node", {}).get("pid")]
            pids += [x.get("pid") for x in rec.get("redis", []) + rec.get("global_schedulers", [])]
            for pid in pids:
                try:
                    p = psutil.Process(pid)
                    for c in p.children(recursive=True) + [p]:
                        c.kill()
                except (psutil.Error, TypeError):
                    pass


def _run_ns(pid: int) -> int:
    """Nanoseconds the process's threads ran (``/proc/PID/task/*/schedstat``): exact,
    where psutil's CPU times count clock ticks (10 ms: 0.07 % of a core over 15 s)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def measure_idle(c: Cluster, seconds: float) -> dict:
    procs = c.processes()
    before = {}
    for name, p in procs.items():
        try:
            t = p.cpu_times()
            before[name] = (t.user + t.system, _run_ns(p.pid))
        except (psutil.Error, OSError):
            pass
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    rows = {}
    for name, p in procs.items():
        try:
            t = p.cpu_times()
            ns = _run_ns(p.pid)
            rss = p.memory_info().rss
        except (psutil.Error, OSError):
            continue
        if name in before:
            rows[name] = {"cpu_pct": 100.0 * (t.user + t.system - before[name][0]) / wall,
                          "run_pct": 100.0 * (ns - before[name][1]) / 1e9 / wall,
                          "rss_mib": rss / 2**20}
    for name in c.processes():
        if name not in procs:
            rows.setdefault(name, {"cpu_pct": float("nan"), "run_pct": float("nan"),
                                   "rss_mib": float("nan"), "note": "started during the window"})
    measured = [r for r in rows.values() if "note" not in r]
    return {"seconds": wall, "processes": rows,
            "total_cpu_pct": sum(r["cpu_pct"] for r in measured),
            "total_run_pct": sum(r["run_pct"] for r in measured),
            "total_rss_mib": sum(r["rss_mib"] for r in measured)}


def _run_json(c: Cluster, code: str, args: list, env: dict, timeout: float = 120) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=c.workdir(),
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # (reaped between the two looks)
        return False


def measure_reactions(c: Cluster, pings: int) -> dict:
    r: dict = {}
    env = c.env(DPOOL_ADDRESS=c.address, DPOOL_TOKEN=c.token)
    r["work"] = _run_json(c, WORK, [str(pings)], env)
    r["spilled_work"] = _run_json(c, WORK, [str(pings), FAR], env)

    # a dead driver: its workers (busy with its tasks) must go
    marks = tempfile.mkdtemp(dir=c.tmp, prefix="hold-")
    drv = subprocess.Popen([sys.executable, "-c", HOLD, marks], cwd=c.workdir(),
                           env=c.env(DPOOL_ADDRESS="auto", DPOOL_STATE_DIR=c.states[NODE_B],
                                     DPOOL_TOKEN=c.token))
    deadline = time.monotonic() + 60
    while len(os.listdir(marks)) < 2:
        if time.monotonic() > deadline or drv.poll() is not None:
            drv.kill()
            raise RuntimeError("the holding tasks did not start")
        time.sleep(0.01)
    workers = [psutil.Process(int(n)) for n in os.listdir(marks)]
    t0 = time.monotonic()
    drv.send_signal(signal.SIGKILL)
    drv.wait()
    while any(_running(w) for w in workers):
        if time.monotonic() - t0 > 60:
            break
        time.sleep(0.005)
    r["dead_driver_workers_gone_ms"] = (time.monotonic() - t0) * 1e3

    # a frozen node (NODE_B's daemon SIGSTOPped: its links stay open, only its
    # heartbeats stop): when does the node table say it is dead? And once thawed, when is
    # it alive there again (it registers again)?
    frozen = c.records[NODE_B]["node"]
    t0 = time.monotonic()
    os.kill(frozen["pid"], signal.SIGSTOP)
    try:
        r["frozen_node_declared_dead_ms"] = _until_marked(c, frozen, True, t0)
    finally:
        t0 = time.monotonic()
        os.kill(frozen["pid"], signal.SIGCONT)
    r["thawed_node_alive_again_ms"] = _until_marked(c, frozen, False, t0)

    r["replaced_scheduler_linked_ms"] = _replace_scheduler(c)

    # node death: NODE_C's daemon SIGKILLed; when does the node table say so?
    victim = c.records[NODE_C]["node"]
    t0 = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL)
    r["node_declared_dead_ms"] = _until_marked(c, victim, True, t0)
    return r


def _replace_scheduler(c: Cluster) -> float | None:
    """SIGKILL the global scheduler, wait until every node has seen its links close, start
    another with the same command line: milliseconds from its listening socket to all
    three nodes linked to it (None: not in 30 s)."""
    gs = psutil.Process(c.records[HEAD]["global_schedulers"][0]["pid"])
    cmd, env, cwd = gs.cmdline(), gs.environ(), gs.cwd()
    gs.kill()
    gs.wait(10)
    time.sleep(4)
    i = cmd.index("--ready-fd")
    del cmd[i:i + 2]  # (`dpool start` reads that pipe; nobody does here)
    with open(os.path.join(c.tmp, "replaced-global-scheduler.log"), "ab") as log:
        new = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=log)
    c.records[HEAD]["global_schedulers"].append({"pid": new.pid})  # (stop() kills it)
    p = psutil.Process(new.pid)
    t0 = time.monotonic()
    listening = None
    while time.monotonic() - t0 < 30:
        try:
            conns = p.net_connections("tcp")
        except psutil.Error:
            conns = []
        ports = {x.laddr.port for x in conns if x.status == psutil.CONN_LISTEN}
        if ports and listening is None:
            listening = time.monotonic()
        if len([x for x in conns if x.status == psutil.CONN_ESTABLISHED
                and x.laddr.port in ports]) >= 3:
            return (time.monotonic() - listening) * 1e3
        time.sleep(0.005)
    return None


def _until_marked(c: Cluster, node: dict, dead: bool, t0: float) -> float | None:
    """Milliseconds from ``t0`` until the node table's row of ``node`` is marked dead
    (``dead``) or no longer is (read from the Redis shards every 10 ms; None: not in 60 s)."""
    import redis

    shards = [x["address"] for x in c.records[HEAD]["redis"]
              if x.get("role", "primary") == "primary"]
    clients = [redis.Redis(host=a.rsplit(":", 1)[0], port=int(a.rsplit(":", 1)[1]),
                           password=c.token) for a in shards]
    keys = [(cl, k) for cl in clients for k in cl.keys("*")
            if node["address"].encode() in k and cl.type(k) == b"hash"]
    try:
        while time.monotonic() - t0 < 60:
            for cl, k in keys:
                try:
                    if bool(cl.hexists(k, "dead")) == dead:
                        return (time.monotonic() - t0) * 1e3
                except redis.RedisError:
                    pass
            time.sleep(0.01)
        return None
    finally:
        for cl in clients:
            cl.close()


def report(idle: dict, react: dict | None, which: str) -> str:
    lines = ["| process | CPU, psutil (% of a core) | CPU, schedstat (% of a core) | RSS (MiB) |",
             "|---|---|---|---|"]
    for name, row in sorted(idle["processes"].items()):
        lines.append(f"| {name} | {row['cpu_pct']:.2f} | {row['run_pct']:.3f} "
                     f"| {row['rss_mib']:.1f} |")
    lines.append(f"| **total** | **{idle['total_cpu_pct']:.2f}** | "
                 f"**{idle['total_run_pct']:.3f}** | **{idle['total_rss_mib']:.1f}** |")
    lines.append("")
    lines.append(f"Idle for {idle['seconds']:.1f} s; replicas {idle.get('replicas', 0)}; "
                 f"dpool from `{which}`; load average (1, 5, 15 min) at the start of the "
                 f"window {_load(idle.get('loadavg_before'))}, at its end "
                 f"{_load(idle.get('loadavg_after'))}, now {_load(os.getloadavg())}.")
    if react:
        lines += ["", "| reaction | figure |", "|---|---|",
                  f"| work: executor to first result | {react['work']['first_ms']:.1f} ms |",
                  f"| work: no-op round trip (median) | {react['work']['rtt_ms']:.2f} ms |",
                  f"| spilled work: executor to first result "
                  f"| {react['spilled_work']['first_ms']:.1f} ms |",
                  f"| spilled work: round trip (median) "
                  f"| {react['spilled_work']['rtt_ms']:.2f} ms |",
                  f"| dead driver: SIGKILL to its busy workers gone "
                  f"| {react['dead_driver_workers_gone_ms']:.0f} ms |",
                  f"| frozen node: SIGSTOP to marked dead in the node table "
                  f"| {_ms(react.get('frozen_node_declared_dead_ms'))} |",
                  f"| thawed node: SIGCONT to alive again in the node table "
                  f"| {_ms(react.get('thawed_node_alive_again_ms'))} |",
                  f"| global scheduler SIGKILLed and another started: its socket "
                  f"listening to 3 nodes linked "
                  f"| {_ms(react.get('replaced_scheduler_linked_ms'))} |",
                  f"| node death: SIGKILL to marked dead in the node table "
                  f"| {_ms(react['node_declared_dead_ms'])} |"]
    return "\n".join(lines)


def _load(v: list | tuple | None) -> str:
    return "?" if v is None else " ".join(f"{x:.2f}" for x in v)


def _ms(v: float | None) -> str:
    return "not in 60 s" if v is None else f"{v:.0f} ms"


def _dpool_path(given: str | None) -> str:
    if given:
        return os.path.abspath(given)
    if Path("dpool", "__init__.py").is_file():
        return os.getcwd()
    return str(_HERE.parent)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds between the cluster coming up and the measurement")
    ap.add_argument("--pings", type=int, default=50)
    ap.add_argument("--no-react", action="store_true")
    ap.add_argument("--replicas", type=int, default=0,
                    help="`dpool start --head --replicas N`: a replica of each shard and "
                    "three Sentinels (0: none, the default)")
    ap.add_argument("--dpool-path", default=None)
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    dpool_path = _dpool_path(args.dpool_path)
    tmp = tempfile.mkdtemp(prefix="dpool-idle-")
    c = Cluster(tmp, dpool_path, args.replicas)
    try:
        which = subprocess.run([sys.executable, "-c", "import dpool; print(dpool.__file__)"],
                               env=c.env(), cwd=tmp, capture_output=True, text=True,
                               check=True).stdout.strip()
        c.start()
        time.sleep(args.settle)
        load_before = list(os.getloadavg())
        idle = measure_idle(c, args.seconds)
        idle.update(replicas=args.replicas, loadavg_before=load_before,
                    loadavg_after=list(os.getloadavg()))
        react = None if args.no_react else measure_reactions(c, args.pings)
    finally:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(report(idle, react, which))
    if args.json:
        Path(args.json).write_text(json.dumps({"idle": idle, "react": react, "dpool": which},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
