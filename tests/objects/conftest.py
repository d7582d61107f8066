from __future__ import annotations

from collections.abc import Iterator

import pytest

from dpool.objects import _mapping, _writemaps
from dpool.objects import _segment as seg


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Fresh segment names of this process (``_large.new_name``); whatever exists at the
    end is unlinked, after this process's cached read and kept write mappings go."""
    made: list[str] = []
    _writemaps.clear()
    yield made
    _writemaps.clear()
    _mapping.clear()
    for name in made:
        seg.unlink(name)
