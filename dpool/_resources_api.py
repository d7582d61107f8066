"""``@dpool.resources`` and ``dpool.get_gpu_ids``: per-function requests and, inside a
task, the GPUs it was given. (The bookkeeping is ``scheduling._resources``.)"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, TypeVar

from dpool.runtime import current as _current
from dpool.scheduling import resources as _resources

__all__ = ["resources", "get_gpu_ids", "request_resources"]

F = TypeVar("F", bound=Callable[..., Any])


def resources(*, num_cpus: Optional[int] = None, num_gpus: Optional[float] = None,
              memory: Optional[int] = None,
              resources: Optional[Mapping[str, float]] = None) -> Callable[[F], F]:
    """Declare what every call of the decorated function needs::

        @dpool.resources(num_gpus=1)
        def train(shard): ...

    ``executor.submit(train, s)`` then runs it with one GPU to itself. The function is
    returned unchanged (called directly, it runs as before). An executor's
    ``resources=`` is the default under it; ``executor.options(...)`` overrides it.
    """
    s = _resources.spec(num_cpus, num_gpus, memory, resources)

    def mark(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"@dpool.resources decorates functions, got {fn!r}")
        return _resources.mark(fn, s)

    return mark


def get_gpu_ids() -> list:
    """The GPUs given to the running task, as ``CUDA_VISIBLE_DEVICES`` names them (ints
    for device numbers); ``[]`` in a task that asked for none, and outside tasks."""
    return _current.gpu_ids()


_REQUEST_TTL_S = 24 * 3600.0


def request_resources(num_cpus: int = 0,
                      bundles: Optional[list[Mapping[str, float]]] = None) -> None:
    """Ask the cluster's autoscaler for room ahead of the work: it keeps at least
    ``num_cpus`` CPUs, plus those of ``bundles`` (``[{"CPU": 2}, ...]``; a bundle without
    ``"CPU"`` counts one), whatever is queued now. A new call replaces the standing
    request; ``request_resources()`` withdraws it (it also lapses after a day). On the
    embedded runtime, where no autoscaler runs, it does nothing."""
    import json
    import numbers

    if isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 0:
        raise ValueError(f"num_cpus must be an int >= 0, got {num_cpus!r}")
    total = num_cpus
    for b in bundles or ():
        if not isinstance(b, Mapping):
            raise TypeError(f"bundles must be mappings like {{'CPU': 2}}, got {b!r}")
        cpu = b.get("CPU", 1)
        if isinstance(cpu, bool) or not isinstance(cpu, numbers.Real) or cpu < 0:
            raise ValueError(f"a bundle's CPU must be a number >= 0, got {cpu!r}")
        total += int(-(-cpu // 1))  # (rounded up: a node's CPUs are whole)
    import os

    if not os.environ.get("DPOOL_ADDRESS") and not _current.in_worker():
        return  # (the embedded runtime: one host, nothing to scale)
    put = getattr(_current.client(), "kv_put", None)
    if put is None:
        return
    from dpool.control import keys as _keys

    put(_keys.AUTOSCALE_REQUEST, json.dumps({"num_cpus": total}).encode(),
        _REQUEST_TTL_S if total else 1.0)
