"""Processes a test run started that are not its children (node daemons that `dpool start`
ran): tests/cluster adds their pids (``add``), the leak check counts their segments as the
run's."""

from tests import _parallel

STARTED_PIDS: set[int] = set()


def add(pid: int) -> None:
    """``pid`` was started by this test process (written down for the other xdist workers'
    leak checks too)."""
    STARTED_PIDS.add(pid)
    _parallel.note(pid)
