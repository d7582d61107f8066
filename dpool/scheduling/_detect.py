"""What this host offers: CPUs, GPUs, memory, custom resources -- detected, or as told.

- CPUs: the CPUs this process may run on (affinity), capped by a cgroup CPU quota
  (``cpu.max`` of cgroup v2, ``cpu.cfs_quota_us``/``cpu.cfs_period_us`` of v1), at least 1.
- GPUs: counted through NVML (``pip install dpool[gpu]`` brings ``nvidia-ml-py``; imported
  only here, only when asked), else ``nvidia-smi -L`` when it is on ``PATH``; when
  ``CUDA_VISIBLE_DEVICES`` is set, limited to its entries and named after them. With
  neither tool, the entries of ``CUDA_VISIBLE_DEVICES``; else none. Never through CUDA: a
  driver process that initializes CUDA before its workers fork leaves them unable to use it.
- memory: the host's RAM (psutil).

Overrides, embedded runtime: ``DPOOL_NUM_CPUS`` (the default ``max_workers``),
``DPOOL_NUM_GPUS``, ``DPOOL_RESOURCES`` (JSON: ``{"TPU": 4}``; it may carry ``GPU`` and
``memory``; a ``CPU`` entry is ignored), or the executor's ``runtime_resources=``. Nodes:
the options of ``dpool start``. Declared GPUs that no device backs are *fake* ones -- the
way to run GPU code paths on a laptop or in tests: they are named after the entries of
``CUDA_VISIBLE_DEVICES`` when there are enough, else ``0..n-1``.

Functions only, no state. Detecting GPUs may run ``nvidia-smi`` (for up to 10 s):
``LocalScheduler.set_resource_offer`` detects outside the scheduler's lock,
``resources_locked`` (on the first task that asks for resources) under it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional

from dpool import _log
from dpool.scheduling._resources import Ledger

log = _log.getLogger("dpool.runtime")


def cpus() -> int:
    import psutil

    try:
        n = len(psutil.Process().cpu_affinity() or ()) or (os.cpu_count() or 1)
    except (AttributeError, psutil.Error, OSError):  # no affinity on this platform
        n = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        n = min(n, max(1, int(quota + 0.999)))
    return max(1, n)


def _cgroup_quota() -> Optional[float]:
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            q, period = f.read().split()[:2]
        if q != "max":
            return int(q) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            length = int(f.read())
        return quota / length if quota > 0 and length > 0 else None
    except (OSError, ValueError):
        return None


def _visible() -> Optional[list]:
    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    if v is None:
        return None
    return [x.strip() for x in v.split(",") if x.strip() and x.strip() != "-1"]


def gpu_names(count: Optional[int] = None) -> list:
    """Names (``CUDA_VISIBLE_DEVICES`` entries) of the GPUs offered: ``count`` of them
    when declared, else the detected ones."""
    visible = _visible()
    if count is not None:
        if visible is not None and len(visible) >= count:
            return visible[:count]
        return [str(i) for i in range(count)]
    n = _nvml_count()
    if n is None:
        n = _smi_count()
    if n is not None:
        return visible[:n] if visible is not None else [str(i) for i in range(n)]
    return visible or []


def _nvml_count() -> Optional[int]:
    try:
        import pynvml  # type: ignore[import-not-found]  # nvidia-ml-py, optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - no driver: no GPUs
        log.debug("NVML found no GPUs: %s", exc)
        return None


def _smi_count() -> Optional[int]:
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("nvidia-smi failed: %s", exc)
        return None
    if out.returncode != 0:
        return None
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def parse_resources(text: str, where: str) -> dict:
    """A ``{"name": amount}`` JSON object (``DPOOL_RESOURCES``, ``--resources``)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{where} must be a JSON object such as '{{\"TPU\": 4}}', got "
                         f"{text!r}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a JSON object such as '{{\"TPU\": 4}}', got "
                         f"{text!r}")
    return value


def ledger(num_gpus: Optional[float] = None, mem: Optional[int] = None,
           custom: Optional[Mapping[str, Any]] = None) -> Ledger:
    """A ledger of this host's GPUs (declared or detected), memory and custom resources."""
    n = None if num_gpus is None else int(num_gpus)
    return Ledger(gpu_names(n), memory() if mem is None else mem, custom)


def embedded_ledger(override: Optional[Mapping[str, Any]] = None) -> Ledger:
    """The embedded runtime's: ``override`` (the executor keyword), else the environment
    (``DPOOL_NUM_GPUS``, ``DPOOL_RESOURCES``), else detected."""
    if override is None:
        spec: dict = {}
        text = os.environ.get("DPOOL_RESOURCES")
        if text:
            spec.update(parse_resources(text, "DPOOL_RESOURCES"))
        if os.environ.get("DPOOL_NUM_GPUS"):
            spec["GPU"] = _env_number("DPOOL_NUM_GPUS")
    else:
        spec = dict(override)
    spec.pop("CPU", None)  # each executor's max_workers is its CPU budget
    gpus = spec.pop("GPU", None)
    mem = spec.pop("memory", None)
    return ledger(gpus, mem, spec)


def embedded_cpus() -> Optional[int]:
    """``DPOOL_NUM_CPUS`` if set (the default ``max_workers``), else None."""
    if os.environ.get("DPOOL_NUM_CPUS"):
        return int(_env_number("DPOOL_NUM_CPUS"))
    return None


def _env_number(name: str) -> float:
    text = os.environ[name]
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
    if v < 0 or v != int(v):
        raise ValueError(f"{name} must be a whole number >= 0, got {text!r}")
    return v
