"""Start a cluster's head on this host (``--head``), or join this host to one (``--address``).

The head runs the control store's Redis shards (with ``--replicas 1``: a replica of each
and three Sentinels, ``control._sentinel_server``), the global schedulers and this host's
node daemon; a joining host runs its node daemon. Each prints the variables a driver
needs and records what it started (``dpool stop`` stops it; ``DPOOL_ADDRESS=auto`` reads it).
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
from typing import Any

from dpool.cli._procs import StartError, launch, same_process, started_at, stop_pid
from dpool.errors import Error
from dpool.runtime import address as _address


def _share(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"a share of the host's memory in (0, 1], got {v}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    role = p.add_mutually_exclusive_group(required=True)
    role.add_argument("--head", action="store_true", help="start a new cluster here")
    role.add_argument("--address", metavar="HOST:PORT", help="join the cluster at HOST:PORT")
    p.add_argument("--port", type=int, default=6380,
                   help="the head node's port: the cluster's address (default 6380)")
    p.add_argument("--node-port", type=int, default=0,
                   help="a joining node's port (default: any free port)")
    p.add_argument("--token", default=None,
                   help="the cluster token (default $DPOOL_TOKEN; a head without one makes "
                        "one up)")
    p.add_argument("--num-cpus", type=int, default=None,
                   help="CPUs this node offers (default: all it may use; 0: runs no tasks)")
    p.add_argument("--num-gpus", type=int, default=None,
                   help="GPUs this node offers (default: detected through NVML or "
                   "CUDA_VISIBLE_DEVICES; more than it has: fake ones, for tests)")
    p.add_argument("--resources", default=None, metavar="JSON",
                   help='custom resources this node offers, e.g. \'{"TPU": 4}\'')
    p.add_argument("--node-ip", default="127.0.0.1",
                   help="the address other hosts reach this node at (default 127.0.0.1)")
    p.add_argument("--bind", default=None,
                   help="the address to listen on (default: --node-ip)")
    p.add_argument("--object-store-memory", type=int, default=None, metavar="BYTES",
                   help="bytes of shared memory this node's object store may hold")
    p.add_argument("--memory-threshold", type=_share, default=None, metavar="SHARE",
                   help="above this share of the host's memory in use (0 < SHARE <= 1, "
                        "e.g. 0.95), the node kills the worker of its newest task, whose "
                        "future raises dpool.OutOfMemoryError, before the kernel's OOM "
                        "killer picks a victim (default: off)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics (/metrics, with the cluster token as a "
                        "Bearer token) and /health on this port of --bind (0: any free)")
    p.add_argument("--drain-grace", type=float, default=None, metavar="SECONDS",
                   help="on SIGTERM (dpool stop, a batch system's or Kubernetes' notice), "
                        "how long the node lets running tasks finish before it hands them "
                        "to other nodes, uncharged (default 8)")
    p.add_argument("--block", action="store_true",
                   help="stay in the foreground: on SIGTERM or SIGINT (or when this host's "
                        "node dies) stop everything started here, as `dpool stop`, and exit "
                        "(a container's or batch script's entrypoint)")
    p.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                   help="head: add nodes when tasks wait and remove idle ones, keeping "
                        "between MIN and MAX nodes of its own (not counting the head)")
    p.add_argument("--provider", default="local",
                   help="head, with --autoscale: where nodes come from (local: node "
                        "processes on this host, on addresses of their own)")
    p.add_argument("--provider-config", default=None, metavar="FILE",
                   help="the provider's settings (JSON or YAML), e.g. {\"num_cpus\": 2}")
    p.add_argument("--idle-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="with --autoscale: how long a node it added may be idle before it "
                        "is removed (default 60)")
    p.add_argument("--shards", type=int, default=2,
                   help="head: redis-server shards of the control store (default 2), on "
                   "the ports after --port")
    p.add_argument("--global-schedulers", type=int, default=1,
                   help="head: global scheduler replicas (default 1)")
    p.add_argument("--replicas", type=int, default=0,
                   help="head: a replica of each shard (0 or 1; default 0), on the ports "
                   "after the shards, and 3 Redis Sentinels after those that promote a "
                   "replica when its shard's primary dies")
    p.add_argument("--redis-address", default=None,
                   metavar="HOST:PORT[,HOST:PORT...] | sentinel://HOST:PORT[,...]/MASTER[,...]",
                   help="head: use these Redis servers (password: the cluster token, so "
                   "pass --token too) instead of starting shards; or a Sentinel-managed "
                   "deployment: sentinel://, its Sentinels, then one master name per shard "
                   "(e.g. sentinel://10.0.0.5:26379,10.0.0.6:26379,10.0.0.7:26379/s0,s1)")
    p.add_argument("--placement-policy", default=None, metavar="MODULE:CLASS",
                   help="where tasks go: 'default', 'spread' or MODULE:CLASS, a "
                   "dpool.PlacementPolicy (head: the global schedulers'; any node: its "
                   "keep-or-spill decision)")


def run(args: argparse.Namespace) -> int:
    if args.placement_policy:
        from dpool.placement import load as load_policy

        try:
            load_policy(args.placement_policy)
        except (ValueError, TypeError) as exc:
            sys.stderr.write(f"dpool start: --placement-policy: {exc}\n")
            return 2
    if args.num_cpus is not None and args.num_cpus < 0:
        sys.stderr.write("dpool start: --num-cpus must be >= 0\n")
        return 2
    if args.num_gpus is not None and args.num_gpus < 0:
        sys.stderr.write("dpool start: --num-gpus must be >= 0\n")
        return 2
    if args.resources is not None:
        from dpool.scheduling import detect as _detect
        from dpool.scheduling import resources as _resources

        try:
            _resources.spec(resources=_detect.parse_resources(args.resources, "--resources"))
        except (TypeError, ValueError) as exc:
            sys.stderr.write(f"dpool start: {exc}\n")
            return 2
    existing = _address.read_record()
    if existing is not None and _node_alive(existing):
        sys.stderr.write(
            f"dpool start: a dpool node already runs on this host (pid "
            f"{existing['node']['pid']}, cluster {existing['address']}); `dpool stop` first, "
            f"or set DPOOL_STATE_DIR to run another one\n")
        return 1
    if args.head:
        if args.shards < 1 or args.global_schedulers < 0:
            sys.stderr.write("dpool start: --shards must be >= 1 and --global-schedulers "
                             ">= 0\n")
            return 2
        if args.replicas not in (0, 1):
            sys.stderr.write("dpool start: --replicas must be 0 or 1\n")
            return 2
        if args.replicas and args.redis_address:
            sys.stderr.write("dpool start: --replicas replicates the shards dpool starts; "
                             "with --redis-address, give a Sentinel-managed deployment "
                             "(sentinel://...) instead\n")
            return 2
        # (a launcher's own token, from a Secret or a 0600 file: $DPOOL_TOKEN)
        token = args.token or os.environ.get("DPOOL_TOKEN") or secrets.token_hex(16)
        port = args.port
        if getattr(args, "autoscale", None):
            from dpool.autoscaler import parse_range

            try:
                parse_range(args.autoscale)
            except ValueError as exc:
                sys.stderr.write(f"dpool start: {exc}\n")
                return 2
    else:
        token = args.token or os.environ.get("DPOOL_TOKEN") or ""
        if not token:
            sys.stderr.write("dpool start: joining needs the cluster token (--token or "
                             "$DPOOL_TOKEN)\n")
            return 2
        try:
            _address.parse_hostport(args.address, "--address")
        except Error as exc:
            sys.stderr.write(f"dpool start: {exc}\n")
            return 2
        port = args.node_port
    try:
        state = _address.ensure_state_dir()
    except Error as exc:
        sys.stderr.write(f"dpool start: {exc}\n")
        return 1
    record: dict = {"head": bool(args.head), "token": token, "redis": [],
                    "global_schedulers": [], "node_ip": args.node_ip}
    try:
        if args.head:
            shards = _start_control_store(args, token, port, state, record)
            _start_global_schedulers(args, token, shards, state, record)
            node = _start_node(args, token, port, state, ["--redis", ",".join(shards)])
        else:
            node = _start_node(args, token, port, state, ["--join", args.address])
    except (StartError, Error) as exc:
        sys.stderr.write(f"dpool start: {exc}\n")
        _undo(record)
        return 1
    record["node"] = node
    record["address"] = node["address"] if args.head else args.address
    _address.write_record(record)
    if args.head and getattr(args, "autoscale", None):
        try:
            record["autoscaler"] = _start_autoscaler(args, token, node["address"], state)
        except (StartError, Error) as exc:
            sys.stderr.write(f"dpool start: the autoscaler: {exc}\n")
            from dpool.cli import _stop

            _stop.run(argparse.Namespace(timeout=10.0))
            return 1
        _address.write_record(record)
    print(f"dpool: {'head' if args.head else 'node'} started on {socket.gethostname()} "
          f"(node {node['address']}, log {node['log']})")
    print(f"DPOOL_ADDRESS={record['address']}")
    print(f"DPOOL_TOKEN={token}")
    if getattr(args, "block", False):
        sys.stdout.flush()
        return block(record)
    return 0


def block(record: dict) -> int:
    """``--block``: until SIGTERM/SIGINT, or until this host's node exits, then stop what
    was started here (``dpool stop``). 0 after a signal, 1 if the node died."""
    import signal
    import time

    from dpool.cli import _stop

    why: list = []  # (a handler only appends: a lock taken in one could deadlock)

    def on_signal(signum: int, _frame: Any) -> None:
        why.append(signal.Signals(signum).name)

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    node = record["node"]
    try:
        while not why:
            time.sleep(0.2)
            if not why and not same_process(node.get("pid"), node.get("started")):
                why.append("its node exited")
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    print(f"dpool start --block: {why[0] if why else 'stopping'}; stopping", flush=True)
    _stop.run(argparse.Namespace(timeout=10.0))
    return 0 if why and why[0] != "its node exited" else 1


def _start_control_store(args: argparse.Namespace, token: str, port: int, state: str,
                         record: dict) -> list:
    """The Redis shards (or the given Redis servers), with replicas and Sentinels if
    asked: what ``--redis`` gets (shard addresses, or one ``sentinel://`` spec)."""
    from dpool.control import parse_spec

    if args.redis_address:
        if parse_spec(args.redis_address) is not None:
            return [args.redis_address.strip()]
        shards = [a.strip() for a in args.redis_address.split(",") if a.strip()]
        for a in shards:
            _address.parse_hostport(a, "--redis-address")
        return shards
    from dpool.control import RedisServer

    bind = args.bind or args.node_ip
    primaries = []
    for i in range(args.shards):
        server = RedisServer(port + 1 + i, token, bind=bind,
                             dir=os.path.join(state, f"redis-{i}"), detached=True)
        os.makedirs(server.dir or "", exist_ok=True)
        server.start()
        primaries.append(server)
        _record_server(record, server, "primary")
    if not args.replicas:
        return [r["address"] for r in record["redis"]]
    from dpool.control import sentinel_address, start_replicated

    n = args.shards
    started: list = []
    try:
        start_replicated(
            primaries, token, ports=[port + 1 + n + i for i in range(n)],
            sentinel_ports=[port + 1 + 2 * n + j for j in range(3)],
            announce_ip=args.node_ip, bind=bind,
            dirs=[os.path.join(state, f"redis-{i}-replica") for i in range(n)],
            sentinel_dirs=[os.path.join(state, f"sentinel-{j}") for j in range(3)],
            detached=True, started=started)
    finally:  # (a failed start stops what is recorded: `_undo`)
        for server in started:
            if server.running():
                _record_server(record, server, "sentinel" if hasattr(server, "masters")
                               else "replica")
    sentinels = [r["address"] for r in record["redis"] if r["role"] == "sentinel"]
    return [sentinel_address(sentinels, n)]


def _record_server(record: dict, server: Any, role: str) -> None:
    address = f"{record.get('node_ip', '')}:{server.port}"
    record["redis"].append({"address": address, "pid": server.pid, "role": role,
                            "started": started_at(server.pid)})


def _start_global_schedulers(args: argparse.Namespace, token: str, shards: list,
                             state: str, record: dict) -> None:
    bind = args.bind or args.node_ip
    for i in range(args.global_schedulers):
        proc, line = launch("dpool.global_scheduler",
                            ["--bind", bind, "--advertise", args.node_ip, "--port", "0",
                             "--redis", ",".join(shards),
                             *(["--placement-policy", args.placement_policy]
                               if args.placement_policy else [])],
                            os.path.join(state, f"global-scheduler-{i}.log"),
                            {"DPOOL_TOKEN": token})
        record["global_schedulers"].append({"address": line.split()[1], "pid": proc.pid,
                                            "started": started_at(proc.pid)})


def _start_autoscaler(args: argparse.Namespace, token: str, head: str, state: str) -> dict:
    argv = ["--head", head, "--autoscale", args.autoscale, "--provider", args.provider,
            "--idle-timeout", str(args.idle_timeout),
            "--state", os.path.join(state, "autoscaler")]
    if args.provider_config:
        argv += ["--provider-config", os.path.abspath(args.provider_config)]
    log_path = os.path.join(state, "autoscaler.log")
    proc, _line = launch("dpool.autoscaler", argv, log_path, {"DPOOL_TOKEN": token})
    return {"pid": proc.pid, "started": started_at(proc.pid), "log": log_path}


def _undo(record: dict) -> None:
    """A start that failed half-way stops what it started (Sentinels before shards)."""
    servers = sorted(record.get("redis", []), key=lambda r: r.get("role") != "sentinel")
    for item in record.get("global_schedulers", []) + servers:
        stop_pid(item.get("pid"), timeout=5, started=item.get("started"))


def _start_node(args: argparse.Namespace, token: str, port: int, state: str,
                cluster_args: list) -> dict:
    unix_path = os.path.join(state, "node.sock")
    log_path = os.path.join(state, "node.log")
    argv = ["--node-ip", args.node_ip, "--port", str(port), "--unix-path", unix_path,
            *cluster_args]
    if args.bind:
        argv += ["--bind", args.bind]
    if args.num_cpus is not None:
        argv += ["--num-cpus", str(args.num_cpus)]
    if args.num_gpus is not None:
        argv += ["--num-gpus", str(args.num_gpus)]
    if args.resources is not None:
        argv += ["--resources", args.resources]
    if args.object_store_memory:
        argv += ["--object-store-memory", str(args.object_store_memory)]
    if getattr(args, "drain_grace", None) is not None:
        argv += ["--drain-grace", str(args.drain_grace)]
    if getattr(args, "metrics_port", None) is not None:
        argv += ["--metrics-port", str(args.metrics_port)]
    env = {"DPOOL_TOKEN": token}
    if getattr(args, "memory_threshold", None) is not None:
        env["DPOOL_MEMORY_THRESHOLD"] = repr(args.memory_threshold)
    if args.placement_policy:
        env["DPOOL_PLACEMENT_POLICY"] = args.placement_policy
    proc, line = launch("dpool.node", argv, log_path, env)
    node_id = line.split()[1]
    grace = args.drain_grace if getattr(args, "drain_grace", None) is not None else 8.0
    return {"address": node_id, "pid": proc.pid, "started": started_at(proc.pid),
            "unix_path": unix_path, "log": log_path, "drain_grace": grace}


def _node_alive(record: dict) -> bool:
    node = record.get("node", {})
    return same_process(node.get("pid"), node.get("started"))

