"""What the transfer tests share: segments a test made, removed after it."""

from __future__ import annotations

import os

import pytest

from dpool.objects import _segment
from dpool.objects._serialization import serialize


@pytest.fixture
def segments():
    """Names of the segments a test made or copied (removed after it)."""
    made: list = []
    yield made
    for n in made:
        _segment.unlink(n)


def exists(name: str) -> bool:
    return os.path.exists(os.path.join(_segment.SHM_DIR, name.lstrip("/")))


def stored(value, segments: list, object_id: int) -> str:
    """``value`` written into a new segment of this process (removed after the test)."""
    name = _segment.segment_name(os.getpid(), object_id)
    _segment.write_object(name, serialize(value))
    segments.append(name)
    return name
