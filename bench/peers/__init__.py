"""Peer registry: ``load(peer, group)`` returns the adapter class to run.

Each peer lives in its own module that imports its library at the top, so a
missing library surfaces as ``PeerUnavailable`` at load time.
"""

from __future__ import annotations

import importlib

from .base import Adapter, ExecutorPeer, PeerUnavailable, PoolPeer, Unsupported

__all__ = ["Adapter", "ExecutorPeer", "PeerUnavailable", "PoolPeer", "Unsupported", "load"]

_MODULES: dict[str, str] = {
    "dpool": "dpool_peer",
    "ppe": "ppe_peer",
    "mp": "mp_peer",
    "loky": "loky_peer",
    "ray": "ray_peer",
    "dask": "dask_peer",
    "mpire": "mpire_peer",
}


def load(peer: str, group: str) -> tuple[type[Adapter], str]:
    """Return ``(adapter class, library version)`` or raise ``PeerUnavailable``."""
    try:
        module = importlib.import_module(f"{__name__}.{_MODULES[peer]}")
    except ModuleNotFoundError as exc:
        raise PeerUnavailable(f"not installed ({exc})") from exc
    adapters: dict[str, type[Adapter]] = module.ADAPTERS
    if group not in adapters:
        raise PeerUnavailable(f"{peer} has no adapter for group {group!r}")
    cls = adapters[group]
    cls.check()
    return cls, module.version()
