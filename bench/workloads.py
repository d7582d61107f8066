"""Task functions shipped to the workers of every peer.

They live in their own importable module (``bench/`` is put on ``sys.path`` of
the driver and, through ``PYTHONPATH``, of every worker) so that pickle-by-
reference works for the stdlib executors as well as for loky, Ray and dask.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import numpy.typing as npt


def noop() -> None:
    """Do nothing: measures pure scheduling/IPC overhead."""
    return None


def noop_arg(_x: object) -> None:
    """One-argument no-op for ``map``/``imap_unordered``/``apply``."""
    return None


def spin(seconds: float) -> None:
    """Busy-loop on the CPU for ``seconds`` of wall time."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def array_sum(x: Any) -> float:
    """Sum an array; resolves a ``dpool.ObjectRef`` if the peer did not.

    Ray resolves top-level ``ObjectRef`` arguments itself; for dpool we accept
    either behaviour so the benchmark does not depend on that design choice.
    """
    if not isinstance(x, np.ndarray):
        import dpool  # only reached for dpool refs

        x = dpool.get(x)
    return float(np.sum(x))


def make_array(n_elems: int) -> npt.NDArray[np.float64]:
    """Return a freshly allocated float64 array of ones."""
    return np.ones(n_elems, dtype=np.float64)


def nap(seconds: float) -> None:
    """Sleep ``seconds`` (a task that holds its worker without using the CPU)."""
    time.sleep(seconds)
