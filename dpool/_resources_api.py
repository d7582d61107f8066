"""``@dpool.resources`` and ``dpool.get_gpu_ids``: per-function requests and, inside a
task, the GPUs it was given. (The bookkeeping is ``scheduling._resources``.)"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, TypeVar

from dpool.runtime import current as _current
from dpool.scheduling import resources as _resources

__all__ = ["resources", "get_gpu_ids"]

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
