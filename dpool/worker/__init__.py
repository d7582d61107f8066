"""The worker process: runs one task at a time for its scheduler (an entry point).

- ``_main``: the process's start and main loop (take a task, run it, send its result).
- ``_client``: ``WorkerClient``, the runtime client of task code that submits, waits and
  gets (a ``dpool.runtime._client.Client``); waiting gives the worker's slot back.
- ``_lease``: a worker lent to a driver on its node's host (a second channel).
- ``_output``: a node's worker sends its stdout/stderr to the driver.
- ``_watchdog``: the worker exits, and cleans up, when its driver dies.
"""

# Nothing here is for other packages: the worker is a process of its own, started by
# its module's name (``protocol.WORKER_ENTRY``).
__all__: list[str] = []
