"""What a collective operation takes and gives: its arrays and reduction operations.

Members pass numpy arrays of any dtype and shape, torch CPU tensors, or anything numpy
can view through the buffer protocol; results are numpy arrays (torch tensors for torch
inputs). ``describe`` is what members compare before an operation: an operation whose
members disagree on it fails in every member.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

_NUMBERS = "biufc"  # dtype kinds a collective takes: booleans, integers, floats, complex
OPS: dict[str, Any] = {"sum": np.add, "prod": np.multiply, "min": np.minimum,
                       "max": np.maximum}


def op_of(op: str) -> Any:
    """The ufunc of reduction ``op``; ``ValueError`` for another."""
    try:
        return OPS[op]
    except (KeyError, TypeError):
        raise ValueError(f"op must be one of {sorted(OPS)}, not {op!r}") from None


def as_array(x: Any) -> tuple[np.ndarray, Callable[[np.ndarray], Any]]:
    """``x`` as a C-contiguous numpy array (a view where it can be), and what turns a
    result back into ``x``'s kind."""
    if type(x) is np.ndarray and x.flags.c_contiguous and x.dtype.kind in _NUMBERS:
        return x, _same  # (the common case, first)
    if type(x).__module__.split(".")[0] == "torch":  # (torch is not imported for it)
        import torch

        arr = x.detach().cpu().numpy()
        return np.asarray(arr, order="C"), torch.from_numpy
    try:
        arr = np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - say what the member passed
        raise TypeError(f"a collective takes a numpy array, a torch CPU tensor or a "
                        f"buffer, not {type(x).__name__}: {exc}") from exc
    if arr.dtype.kind not in _NUMBERS:
        raise TypeError(f"a collective takes arrays of numbers (or booleans), not "
                        f"{type(x).__name__} of dtype {arr.dtype}")
    return np.asarray(arr, order="C"), _same  # (0-d stays 0-d)


def _same(a: np.ndarray) -> np.ndarray:
    return a


def describe(arr: np.ndarray) -> tuple[str, tuple]:
    return arr.dtype.str, tuple(arr.shape)


def chunks(n_items: int, parts: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each of ``parts`` pieces of ``n_items`` (``numpy.array_split``'s
    sizes: the first ``n_items % parts`` one larger)."""
    base, extra = divmod(n_items, parts)
    out = []
    lo = 0
    for i in range(parts):
        hi = lo + base + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def row_chunks(shape: tuple, parts: int) -> list[tuple[int, int]]:
    """Flat ``[lo, hi)`` element ranges of ``numpy.array_split(a, parts, axis=0)``."""
    if not shape:
        raise ValueError("reducescatter splits along axis 0: it takes an array of at "
                         "least one dimension")
    row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    return [(lo * row, hi * row) for lo, hi in chunks(shape[0], parts)]


def row_shape(shape: tuple, lo: int, hi: int) -> tuple:
    """The shape of rows ``[lo, hi)`` (flat element range) of an array of ``shape``."""
    row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    return ((hi - lo) // row if row else 0, *shape[1:])
