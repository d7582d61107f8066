"""Where the autoscaler's nodes come from: ``NodeProvider`` (create one, terminate one,
list them), configured by ``--provider-config FILE`` (JSON, or YAML with PyYAML).

``local``: node processes on this host, each started as ``dpool start --address HEAD
--node-ip ADDR`` with a state folder of its own (under the autoscaler's) and the token in
its environment; ``terminate`` is ``dpool stop`` for that folder (SIGTERM: the node drains
first). Its config:

- ``num_cpus`` (default 1): each new node's CPUs;
- ``addresses``: the loopback (or other local) addresses its nodes listen on, one node
  each -- the most it can start at once (default ``127.0.100.1`` .. ``127.0.100.32``);
- ``python`` (default this interpreter);
- ``object_store_memory``: each node's store, in bytes (default: the node's own default,
  a share of this host's memory -- give less when many nodes share the host).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

_START_TIMEOUT_S = 120.0


class ProviderError(Exception):
    """A provider's config is wrong, or it could not do what it was asked."""


@dataclass
class ProvidedNode:
    key: str  # the provider's name for it (the local provider: its address)
    node_id: str = ""  # the cluster's, once it runs ("" while it starts)
    created: float = 0.0  # (monotonic)
    error: str = ""  # why it failed to start
    seen_live: bool = False  # the cluster listed it alive once (the autoscaler's note)
    terminating: bool = False  # being stopped: no longer counted, never stopped twice
    started: threading.Event = field(default_factory=threading.Event)  # its start ended


class NodeProvider(Protocol):
    """Starts and stops nodes that join the cluster at ``head`` with ``token``."""

    cpus_per_node: int

    def create_node(self) -> ProvidedNode: ...
    def terminate_node(self, node: ProvidedNode) -> None: ...
    def nodes(self) -> list[ProvidedNode]: ...


def read_config(path: Optional[str]) -> dict:
    if not path:
        return {}
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise ProviderError(f"cannot read the provider config {path}: {exc}") from None
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except ImportError:
        raise ProviderError("a YAML provider config needs PyYAML (pip install "
                            "'dpool[launch]'), or give it as JSON") from None
    except Exception as exc:  # noqa: BLE001 - json's ValueError, yaml.YAMLError
        raise ProviderError(f"{path} is not valid: {exc}") from None
    if not isinstance(data, dict):
        raise ProviderError(f"{path}: expected a mapping")
    return data


def load_provider(name: str, config: dict, head: str, token: str, state: str) -> NodeProvider:
    """The provider ``name`` (``local``), configured; ``ProviderError`` says what is wrong."""
    if name == "local":
        return LocalProvider(config, head, token, state)
    raise ProviderError(f"unknown provider {name!r} (known: local)")


class LocalProvider:
    """Node processes on this host (see the module's doc)."""

    def __init__(self, config: dict, head: str, token: str, state: str) -> None:
        unknown = set(config) - {"num_cpus", "addresses", "python", "object_store_memory"}
        if unknown:
            raise ProviderError(f"local provider: unknown config keys {sorted(unknown)} "
                                "(it takes num_cpus, addresses, python, "
                                "object_store_memory)")
        store = config.get("object_store_memory")
        if store is not None and (isinstance(store, bool) or not isinstance(store, int)
                                  or store <= 0):
            raise ProviderError(f"local provider: object_store_memory must be a positive "
                                f"int (bytes), got {store!r}")
        self._store_bytes = store
        cpus = config.get("num_cpus", 1)
        if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
            raise ProviderError(f"local provider: num_cpus must be an int >= 1, got {cpus!r}")
        addresses = config.get("addresses", [f"127.0.100.{i}" for i in range(1, 33)])
        if not isinstance(addresses, list) or not addresses or \
                not all(isinstance(a, str) and a for a in addresses):
            raise ProviderError("local provider: addresses must be a non-empty list of "
                                "addresses")
        self.cpus_per_node = cpus
        self._addresses = list(addresses)
        self._python = str(config.get("python") or sys.executable)
        self._head, self._token, self._state = head, token, state
        self._nodes: dict[str, ProvidedNode] = {}
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return len(self._addresses)

    def _env(self, key: str) -> dict:
        env = {**os.environ, "DPOOL_TOKEN": self._token,
               "DPOOL_STATE_DIR": os.path.join(self._state, f"node-{key}")}
        env.pop("DPOOL_ADDRESS", None)
        return env

    def create_node(self) -> ProvidedNode:
        """Start a node on a free address, in the background; its ``node_id`` is set once
        it runs (``error`` if it failed)."""
        with self._lock:
            free = [a for a in self._addresses if a not in self._nodes]
            if not free:
                raise ProviderError(f"local provider: all {len(self._addresses)} addresses "
                                    "are in use")
            node = self._nodes[free[0]] = ProvidedNode(free[0], created=time.monotonic())
        threading.Thread(target=self._start, args=(node,), daemon=True,
                         name=f"dpool-autoscale-start-{node.key}").start()
        return node

    def _start(self, node: ProvidedNode) -> None:
        argv = [self._python, "-m", "dpool", "start", "--address", self._head,
                "--node-ip", node.key, "--num-cpus", str(self.cpus_per_node)]
        if self._store_bytes is not None:
            argv += ["--object-store-memory", str(self._store_bytes)]
        try:
            out = subprocess.run(argv, env=self._env(node.key), capture_output=True,
                                 text=True, timeout=_START_TIMEOUT_S, check=False)
            if out.returncode != 0:
                lines = (out.stderr or out.stdout).strip().splitlines()
                node.error = lines[-1] if lines else f"exit status {out.returncode}"
            for line in out.stdout.splitlines():
                if "(node " in line:  # "dpool: node started on HOST (node ADDR:PORT, ...)"
                    node.node_id = line.split("(node ", 1)[1].split(",", 1)[0]
            if not node.error and not node.node_id:
                node.error = f"no node address in: {out.stdout!r}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            node.error = str(exc)
        finally:
            if node.error:  # (whatever it left behind on that address goes first)
                self._stop(node)
            node.started.set()

    def _stop(self, node: ProvidedNode) -> bool:
        try:
            out = subprocess.run([self._python, "-m", "dpool", "stop"],
                                 env=self._env(node.key), capture_output=True, text=True,
                                 timeout=_START_TIMEOUT_S, check=False)
            return out.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def terminate_node(self, node: ProvidedNode) -> None:
        """``dpool stop`` for its state folder (the node drains first; a start still under
        way is waited for), then forget it -- unless the stop failed."""
        node.started.wait(_START_TIMEOUT_S + 10)
        if self._stop(node):
            with self._lock:
                if self._nodes.get(node.key) is node:
                    del self._nodes[node.key]

    def nodes(self) -> list[ProvidedNode]:
        with self._lock:
            return list(self._nodes.values())

    def forget_failed(self) -> list[ProvidedNode]:
        """The nodes that failed to start, their starts over (addresses free again)."""
        with self._lock:
            failed = [n for n in self._nodes.values() if n.error and n.started.is_set()]
            for n in failed:
                del self._nodes[n.key]
        return failed
