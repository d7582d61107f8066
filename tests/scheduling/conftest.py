"""The scheduling tests' fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.scheduling._sim import SimScheduler


@pytest.fixture
def sim() -> Iterator[SimScheduler]:
    """The real local scheduler, driven event by event (``_sim``)."""
    s = SimScheduler()
    yield s
    for w in s.started:
        w.chan.sock.close()
