"""Start a cluster on a few SSH hosts: the head on one, a node on each of the others.

    dpool up hosts.yaml        (idempotent: what already runs is left as it is)
    dpool down hosts.yaml      (the workers' nodes first, then the head)

The file (YAML, or JSON)::

    cluster_name: lab
    python: python3              # the default interpreter on the hosts (with dpool)
    ssh: {user: me, port: 22, identity_file: ~/.ssh/id_ed25519}
    head: {host: 10.0.0.1, port: 6380, num_cpus: 8}
    workers:
      - {host: 10.0.0.2}
      - {host: 10.0.0.3, python: /opt/py311/bin/python, num_cpus: 16}

Each host is reached with the user's own ``ssh`` (its config, keys and agent), never
asked for a password (``BatchMode``). ``host`` is also the address the node listens on
and the others reach it at. The head's token goes to the workers on ssh's standard
input, never on a command line. Per host, ``up`` reports what it did or what failed, and
prints the cluster's ``DPOOL_ADDRESS`` and ``DPOOL_TOKEN`` at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

_SSH_TIMEOUT = 120.0

# On the host: this host's record (``dpool start``'s), as JSON, or null.
_READ_RECORD = ("import json; from dpool.runtime import address as a; "
                "r = a.read_record(); print(json.dumps(r))")


class ConfigError(Exception):
    pass


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="the cluster's hosts file (YAML or JSON)")


def load(path: str) -> dict:
    """The hosts file, checked: a dict with ``head`` and ``workers`` (ConfigError says what
    is wrong)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if path.endswith(".json"):
        data = json.loads(text)
    else:
        try:
            import yaml
        except ImportError:
            raise ConfigError("reading a YAML hosts file needs PyYAML (pip install "
                              "'dpool[launch]'), or give the file as JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with head: and workers:")
    unknown = set(data) - {"cluster_name", "python", "ssh", "head", "workers"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)}")
    head = data.get("head")
    if not isinstance(head, dict) or not head.get("host"):
        raise ConfigError(f"{path}: head: needs a host:")
    workers = data.get("workers") or []
    if not isinstance(workers, list) or not all(isinstance(w, dict) and w.get("host")
                                                for w in workers):
        raise ConfigError(f"{path}: workers: must be a list of mappings with a host:")
    for h in [head, *workers]:
        bad = set(h) - {"host", "port", "python", "num_cpus", "num_gpus"}
        if bad:
            raise ConfigError(f"{path}: host {h.get('host')}: unknown keys {sorted(bad)}")
    ssh = data.get("ssh") or {}
    if not isinstance(ssh, dict) or set(ssh) - {"user", "port", "identity_file", "options"}:
        raise ConfigError(f"{path}: ssh: takes user, port, identity_file, options")
    return data


def ssh_command(cfg: dict, host: str) -> list:
    """``ssh ... host``, with the file's ``ssh:`` settings."""
    s = cfg.get("ssh") or {}
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    if s.get("port"):
        cmd += ["-p", str(s["port"])]
    if s.get("identity_file"):
        cmd += ["-i", os.path.expanduser(str(s["identity_file"]))]
    for opt in s.get("options") or ():
        cmd += ["-o", str(opt)]
    target = f"{s['user']}@{host}" if s.get("user") else host
    return [*cmd, target]


def _remote(cfg: dict, host: str, argv: list, stdin: str = "") -> subprocess.CompletedProcess:
    """Run ``argv`` on ``host`` (quoted for its shell); ``stdin`` goes to its input."""
    return subprocess.run([*ssh_command(cfg, host), " ".join(shlex.quote(a) for a in argv)],
                          input=stdin, capture_output=True, text=True, timeout=_SSH_TIMEOUT,
                          check=False)


def _python(cfg: dict, h: dict) -> str:
    return str(h.get("python") or cfg.get("python") or "python3")


def _record(cfg: dict, h: dict) -> Optional[dict]:
    out = _remote(cfg, h["host"], [_python(cfg, h), "-c", _READ_RECORD])
    if out.returncode != 0:
        raise ConfigError(_why(out))
    try:  # (the last line: a login banner may come first)
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else None
    except ValueError:
        raise ConfigError(f"unreadable answer from {h['host']}: {out.stdout[-200:]!r}") \
            from None


def _why(out: subprocess.CompletedProcess) -> str:
    text = (out.stderr or out.stdout).strip().splitlines()
    return text[-1] if text else f"exit status {out.returncode}"


def _start_args(h: dict) -> list:
    argv = ["--node-ip", str(h["host"])]
    if h.get("num_cpus") is not None:
        argv += ["--num-cpus", str(h["num_cpus"])]
    if h.get("num_gpus") is not None:
        argv += ["--num-gpus", str(h["num_gpus"])]
    return argv


def _up_head(cfg: dict) -> tuple[str, str, str]:
    """(address, token, what was done) for the head: started, or found running."""
    h = cfg["head"]
    rec = _record(cfg, h)
    if rec is not None and rec.get("head") and _alive(cfg, h, rec):
        return rec["address"], rec["token"], "already running"
    argv = [_python(cfg, h), "-m", "dpool", "start", "--head",
            "--port", str(h.get("port", 6380)), *_start_args(h)]
    out = _remote(cfg, h["host"], argv)
    if out.returncode != 0:
        raise ConfigError(_why(out))
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return values["DPOOL_ADDRESS"], values["DPOOL_TOKEN"], f"head started ({values['DPOOL_ADDRESS']})"


def _alive(cfg: dict, h: dict, rec: dict) -> bool:
    """Whether the node that the host's record names is alive in its cluster."""
    out = _remote(cfg, h["host"], [_python(cfg, h), "-m", "dpool", "status", "--json"])
    if out.returncode != 0:
        return False
    try:
        status = json.loads(out.stdout)
    except ValueError:
        return False
    mine = (rec.get("node") or {}).get("address")
    return any(n.get("node_id") == mine and n.get("alive") for n in status.get("nodes", ()))


def _up_worker(cfg: dict, h: dict, address: str, token: str) -> str:
    rec = _record(cfg, h)
    if rec is not None and rec.get("address") == address and _alive(cfg, h, rec):
        return "already running"
    if rec is not None:  # a stale record, or a node of another cluster: stopped first
        _remote(cfg, h["host"], [_python(cfg, h), "-m", "dpool", "stop"])
    # the token on standard input: ``read`` it into the environment, never argv
    script = ('read -r DPOOL_TOKEN && export DPOOL_TOKEN && exec '
              + " ".join(shlex.quote(a) for a in [_python(cfg, h), "-m", "dpool", "start",
                                                  "--address", address, *_start_args(h)]))
    out = subprocess.run([*ssh_command(cfg, h["host"]), script], input=token + "\n",
                         capture_output=True, text=True, timeout=_SSH_TIMEOUT, check=False)
    if out.returncode != 0:
        raise ConfigError(_why(out))
    node = [line for line in out.stdout.splitlines() if line.startswith("dpool: node started")]
    return node[0][len("dpool: "):] if node else "node started"


def up(cfg: dict, out: Any = sys.stdout) -> int:
    """Start what is not running; report each host. 0 if every host is up."""
    head = cfg["head"]["host"]
    try:
        address, token, did = _up_head(cfg)
    except (ConfigError, subprocess.TimeoutExpired, KeyError) as exc:
        out.write(f"{head}: FAILED: {exc}\n")
        return 1
    out.write(f"{head}: {did}\n")
    failed = 0
    workers = cfg.get("workers") or []
    with ThreadPoolExecutor(max(1, min(16, len(workers)))) as pool:
        results = [(w["host"], pool.submit(_up_worker, cfg, w, address, token))
                   for w in workers]
        for host, fut in results:
            try:
                out.write(f"{host}: {fut.result()}\n")
            except (ConfigError, subprocess.TimeoutExpired) as exc:
                failed += 1
                out.write(f"{host}: FAILED: {exc}\n")
    out.write(f"DPOOL_ADDRESS={address}\nDPOOL_TOKEN={token}\n")
    return 1 if failed else 0


def down(cfg: dict, out: Any = sys.stdout) -> int:
    """Stop every host's node (workers first, then the head); report each host."""
    failed = 0
    hosts = [*(cfg.get("workers") or []), cfg["head"]]
    for h in hosts:
        try:
            res = _remote(cfg, h["host"], [_python(cfg, h), "-m", "dpool", "stop"])
        except subprocess.TimeoutExpired as exc:
            res = subprocess.CompletedProcess([], 1, "", str(exc))
        if res.returncode != 0:
            failed += 1
            out.write(f"{h['host']}: FAILED: {_why(res)}\n")
        else:
            last = res.stdout.strip().splitlines()
            out.write(f"{h['host']}: {last[-1] if last else 'stopped'}\n")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load(args.config)
    except (ConfigError, ValueError) as exc:
        sys.stderr.write(f"dpool {args.command}: {exc}\n")
        return 2
    return up(cfg) if args.command == "up" else down(cfg)
