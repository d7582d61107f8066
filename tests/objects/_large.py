"""Large segments of this process for the tests of ``_recycle`` and ``_writemaps``."""

from __future__ import annotations

import itertools
import os

import numpy as np

from dpool.objects import _segment as seg
from dpool.objects._serialization import serialize

N = (4 << 20) // 8  # 4 MiB of float64: a large segment
_ids = itertools.count(10_000)


def new_name(names: list[str]) -> str:
    """A fresh segment name of this process, recorded in ``names`` (the ``names``
    fixture unlinks whatever exists at the end)."""
    name = seg.segment_name(os.getpid(), next(_ids))
    names.append(name)
    return name


def write(names: list[str], value: float) -> str:
    """A new large segment holding ``N`` float64s of ``value``; its name."""
    name = new_name(names)
    seg.write_object(name, serialize(np.full(N, value)))
    return name
