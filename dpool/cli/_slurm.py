"""Start a whole cluster inside a Slurm step and run a program on it, then stop it all.

    srun dpool slurm [--node-ip ADDR] [--num-cpus N] -- python prog.py [args...]

Every rank of the step runs this. Slurm rank 0 (``SLURM_PROCID``) starts the head (Redis,
a global scheduler, a node that runs tasks too) on a free port block of its address, and
every other rank a node that joins it. They meet in a rendezvous folder every rank sees
(``--shared-dir``, default ``$SLURM_SUBMIT_DIR``: ``.dpool-slurm/JOB.STEP/``, mode 0700):
rank 0 writes the cluster token there (0600: never on a command line) and then the head's
address; the other ranks wait for the address by polling the file, not by sleeping a
guess. Once every rank's node is up, rank 0 runs the program with ``DPOOL_ADDRESS`` and
``DPOOL_TOKEN`` in its environment; when it exits, rank 0 writes ``done``, the other
ranks stop their nodes, rank 0 stops the head, and the step's exit status is the
program's (every other rank exits 0). SIGTERM (``scancel``, the walltime's notice) is
passed to the program; each rank then stops what it started.

``--node-ip`` may contain ``{rank}``, replaced by the Slurm rank: on one host, two ranks
get two loopback addresses (``--node-ip 127.0.{rank}.1``). By default a rank's address is
its host's (``SLURMD_NODENAME`` resolved), refused if that is a loopback address while
the job spans several hosts. Each rank's state (its node's socket, logs) is in a folder
of its own under the temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

_POLL_S = 0.1


class _Failed(Exception):
    pass


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-ip", default=None, metavar="ADDR",
                   help="this rank's node address; '{rank}' is replaced by the Slurm rank "
                        "(default: the address of this rank's host)")
    p.add_argument("--num-cpus", type=int, default=None,
                   help="CPUs each rank's node offers (default: $SLURM_CPUS_PER_TASK, else "
                        "the CPUs Slurm gave this host shared by its ranks)")
    p.add_argument("--num-gpus", type=int, default=None,
                   help="GPUs each rank's node offers (default: detected)")
    p.add_argument("--shared-dir", default=None,
                   help="a folder every rank sees, for the rendezvous (default "
                        "$SLURM_SUBMIT_DIR, else the current folder)")
    p.add_argument("--shards", type=int, default=1, help="Redis shards of the head (1)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for the head's address and for every rank's node "
                        "(default 120)")
    p.add_argument("program", nargs=argparse.REMAINDER,
                   help="-- then the program to run on the cluster (rank 0 runs it)")


def run(args: argparse.Namespace) -> int:
    program = list(args.program)
    if program[:1] == ["--"]:
        program = program[1:]
    try:
        step = _Step.from_env(os.environ)
        if not program:
            raise _Failed("no program: `srun dpool slurm -- python prog.py`")
        ip = _node_ip(args.node_ip, step)
        shared = Path(args.shared_dir or os.environ.get("SLURM_SUBMIT_DIR") or os.getcwd())
        rdv = shared / ".dpool-slurm" / f"{step.job}.{step.step}"
        state = os.path.join(tempfile.gettempdir(),
                             f"dpool-slurm-{step.job}.{step.step}-{step.rank}")
        os.environ["DPOOL_STATE_DIR"] = state
        cpus = args.num_cpus if args.num_cpus is not None else step.cpus()
    except _Failed as exc:
        sys.stderr.write(f"dpool slurm: {exc}\n")
        return 2
    signals: list = []
    old = {s: signal.signal(s, lambda n, _f: signals.append(n))
           for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if step.rank == 0:
            return _head(args, step, program, ip, cpus, rdv, signals)
        return _member(args, step, ip, cpus, rdv, signals)
    except _Failed as exc:
        sys.stderr.write(f"dpool slurm: rank {step.rank}: {exc}\n")
        return 1
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _stop_here()
        shutil.rmtree(state, ignore_errors=True)


class _Step:
    """What Slurm says about this process's step."""

    def __init__(self, rank: int, size: int, job: str, step: str, env: Any) -> None:
        self.rank, self.size, self.job, self.step, self.env = rank, size, job, step, env

    @classmethod
    def from_env(cls, env: Any) -> _Step:
        missing = [k for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID") if k not in env]
        if missing:
            raise _Failed(f"not in a Slurm step ({', '.join(missing)} not set): run it "
                          "with srun, e.g. `srun -n 2 dpool slurm -- python prog.py`")
        return cls(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), env["SLURM_JOB_ID"],
                   env.get("SLURM_STEP_ID", "0"), env)

    def cpus(self) -> Optional[int]:
        env = self.env
        if env.get("SLURM_CPUS_PER_TASK"):
            return int(env["SLURM_CPUS_PER_TASK"])
        on_node = env.get("SLURM_CPUS_ON_NODE")
        if not on_node:
            return None  # (the node detects them)
        here = _tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE")
                               or env.get("SLURM_TASKS_PER_NODE") or "1")
        node = int(env.get("SLURM_NODEID", "0"))
        ranks_here = here[node] if node < len(here) else 1
        return max(1, int(on_node) // max(1, ranks_here))


def _tasks_per_node(text: str) -> list:
    """Slurm's ``2(x3),1`` as ``[2, 2, 2, 1]``."""
    out: list = []
    for part in text.split(","):
        if "(x" in part:
            n, times = part.rstrip(")").split("(x")
            out += [int(n)] * int(times)
        elif part:
            out.append(int(part))
    return out


def _node_ip(template: Optional[str], step: _Step) -> str:
    if template:
        return template.replace("{rank}", str(step.rank))
    host = step.env.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        ip = socket.gethostbyname(host)
    except OSError as exc:
        raise _Failed(f"cannot resolve this host's name {host!r} ({exc}): give --node-ip")
    if ip.startswith("127.") and int(step.env.get("SLURM_JOB_NUM_NODES", "1")) > 1:
        raise _Failed(f"this host's name {host!r} resolves to the loopback address {ip}, "
                      "which the job's other hosts cannot reach: give --node-ip (this "
                      "host's address on the network they share)")
    return ip


def _start(argv: list, token: str) -> dict:
    """``dpool start ARGV`` in this process (the token never on a command line); its
    record. Its messages go to stderr: stdout is the program's."""
    from dpool.cli import _start
    from dpool.runtime import address as _address

    p = argparse.ArgumentParser(prog="dpool start")
    _start.add_arguments(p)
    args = p.parse_args(argv)
    args.token = token
    with contextlib.redirect_stdout(io.StringIO()):  # (it prints the token)
        rc = _start.run(args)
    record = _address.read_record()
    if rc != 0 or record is None:
        raise _Failed(f"`dpool start {' '.join(argv)}` failed (exit status {rc})")
    node = record["node"]
    sys.stderr.write(f"dpool slurm: {'head' if record.get('head') else 'node'} "
                     f"{node['address']} started (log {node['log']})\n")
    return record


def _stop_here() -> None:
    from dpool.cli import _stop
    from dpool.runtime import address as _address

    if _address.read_record() is not None:
        with contextlib.redirect_stdout(sys.stderr):
            _stop.run(argparse.Namespace(timeout=10.0))


def _free_block(ip: str, span: int) -> int:
    """A port on ``ip`` with the ``span - 1`` after it free too."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((ip, 0))
            port = s.getsockname()[1]
        if port + span < 65536 and all(_bindable(ip, port + i) for i in range(1, span)):
            return port
    raise _Failed(f"no block of {span} free ports on {ip}")


def _bindable(ip: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


def _write(path: Path, text: str, mode: int = 0o600) -> None:
    """``text`` into ``path`` at once (a reader sees all of it or nothing)."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _head(args: argparse.Namespace, step: _Step, program: list, ip: str,
          cpus: Optional[int], rdv: Path, signals: list) -> int:
    token = os.environ.get("DPOOL_TOKEN") or secrets.token_hex(16)
    rdv.mkdir(parents=True, mode=0o700, exist_ok=True)
    os.chmod(rdv, 0o700)
    _write(rdv / "token", token)
    try:
        record = None
        for attempt in range(5):  # (another job on this host may take the block first)
            port = _free_block(ip, 2 + args.shards)
            argv = ["--head", "--node-ip", ip, "--port", str(port), "--shards",
                    str(args.shards)]
            argv += ["--num-cpus", str(cpus)] if cpus is not None else []
            argv += ["--num-gpus", str(args.num_gpus)] if args.num_gpus is not None else []
            try:
                record = _start(argv, token)
                break
            except _Failed:
                if attempt == 4:
                    raise
        assert record is not None
        address = record["address"]
        _write(rdv / "address", address, 0o644)
        from dpool.cli._status import wait_nodes

        ok, seen = wait_nodes(address, step.size, args.timeout)
        if not ok:
            raise _Failed(f"{seen} of {step.size} ranks' nodes joined {address} within "
                          f"{args.timeout:g} s (see the other ranks' errors)")
        sys.stderr.write(f"dpool slurm: {step.size} node(s) up at {address}; running "
                         f"{' '.join(program)}\n")
        code = _run_program(program, address, token, signals)
        _write(rdv / "done", str(code), 0o644)
        wait_nodes_left(address, args.timeout)
        return code
    finally:
        if not (rdv / "done").exists():
            _write(rdv / "done", "1", 0o644)  # (the others stop too)
        _stop_here()
        shutil.rmtree(rdv, ignore_errors=True)
        with contextlib.suppress(OSError):
            rdv.parent.rmdir()  # (.dpool-slurm, once no other step uses it)


def wait_nodes_left(address: str, timeout: float) -> None:
    """Until the other ranks' nodes have left (they stop once ``done`` is written)."""
    from dpool.cli._status import query
    from dpool.errors import Error

    deadline = time.monotonic() + min(timeout, 30.0)
    while time.monotonic() < deadline:
        try:
            if sum(1 for x in query(address)["nodes"] if x["alive"]) <= 1:
                return
        except Error:
            return
        time.sleep(_POLL_S)


def _run_program(program: list, address: str, token: str, signals: list) -> int:
    env = {**os.environ, "DPOOL_ADDRESS": address, "DPOOL_TOKEN": token}
    env.pop("DPOOL_STATE_DIR", None)  # (the program's runtime is the cluster's)
    try:
        proc = subprocess.Popen(program, env=env)
    except OSError as exc:
        raise _Failed(f"cannot run {program[0]!r}: {exc}") from exc
    passed = 0
    while True:
        try:
            code = proc.wait(_POLL_S)
            break
        except subprocess.TimeoutExpired:
            while passed < len(signals):  # SIGTERM/SIGINT: the program's to handle
                proc.send_signal(signals[passed])
                passed += 1
    return code if code >= 0 else 128 - code


def _member(args: argparse.Namespace, step: _Step, ip: str, cpus: Optional[int],
            rdv: Path, signals: list) -> int:
    deadline = time.monotonic() + args.timeout
    address_file = rdv / "address"
    while not address_file.exists():  # (rank 0 writes it once the head is up)
        if signals or (rdv / "done").exists():
            return 0
        if time.monotonic() > deadline:
            raise _Failed(f"no head address in {address_file} after {args.timeout:g} s "
                          "(is --shared-dir a folder every rank sees? see rank 0's errors)")
        time.sleep(_POLL_S)
    address = address_file.read_text().strip()
    token = (rdv / "token").read_text().strip()
    argv = ["--address", address, "--node-ip", ip]
    argv += ["--num-cpus", str(cpus)] if cpus is not None else []
    argv += ["--num-gpus", str(args.num_gpus)] if args.num_gpus is not None else []
    _start(argv, token)
    host, port = address.rsplit(":", 1)
    last_seen = checked = time.monotonic()
    while not signals and not (rdv / "done").exists() and rdv.exists():
        time.sleep(_POLL_S)
        now = time.monotonic()
        if now - checked >= 1.0:
            checked = now
            if _reachable(host, int(port)):
                last_seen = now
            elif now - last_seen > 5.0:  # the head is gone without a word
                break
    return 0


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False
