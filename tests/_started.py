"""Processes a test run started that are not its children (node daemons that `dpool start`
ran): tests/cluster adds their pids, the leak check counts their segments as the run's."""

STARTED_PIDS: set[int] = set()
