"""dpool's command line: ``dpool <command>`` and ``python -m dpool <command>``.

One module per command; each has ``add_arguments(parser)`` and ``run(args) -> int``.
``run`` (an unmodified program on dpool's pools) keeps its own argument handling, since
everything after the script belongs to the script.

- ``_start``: a cluster's head on this host, or this host joining one; ``_stop``:
  everything ``dpool start`` started on this host; ``_procs``: what both share --
  daemons started detached with a readiness pipe, and stopped.
- ``_slurm``: a whole cluster inside a Slurm step, running a program on it; ``_up``: a
  cluster on SSH hosts (``up``/``down``).
- ``_status``: the cluster's nodes; ``_timeline``: the task timeline as a Chrome
  trace-event file; ``_logs``: task output and daemon logs; ``_objects``: the object
  table, largest first; ``_dashboard``: a live page of the cluster.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

_USAGE = """usage: dpool <command> [args...]   (or: python -m dpool <command> ...)

commands:
  run script.py [args...]   run a program unchanged, on dpool's pools
  run -m module [args...]   run a module unchanged, on dpool's pools
  run --joblib ...          ... with dpool as joblib's default backend (or DPOOL_JOBLIB=1)
  start --head [...]        start a cluster's head on this host (Redis shards, node)
  start --address H:P       join this host to a cluster as a node
  stop                      stop everything `dpool start` started on this host
  slurm -- prog [args...]   under srun: a cluster over the step's ranks, running prog
  up hosts.yaml             start a head and nodes on SSH hosts (idempotent)
  down hosts.yaml           stop them
  status [--json]           show the cluster's nodes
  timeline [--out F]        write the cluster's task timeline (Chrome trace JSON)
  logs [--node N] [--task ID] [--follow]   the cluster's task output, daemon logs
  objects                   the cluster's largest objects: size, holders, references
  dashboard [--port P]      serve a live page of the cluster (prints a login URL)
"""

_COMMANDS = ("start", "stop", "status", "timeline", "logs", "objects", "dashboard", "slurm",
             "up", "down")
_COMMAND_MODULES = {"up": "_up", "down": "_up"}  # (a command's module, when not ``_<command>``)

__all__ = ["main"]  # (for ``python -m dpool``)


def main(argv: Optional[list] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(_USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        from dpool import _run

        return _run.main(rest)
    if command not in _COMMANDS:
        sys.stderr.write(f"dpool: unknown command {command!r}\n\n{_USAGE}")
        return 2
    import importlib

    module = importlib.import_module(f"dpool.cli.{_COMMAND_MODULES.get(command, '_' + command)}")
    parser = argparse.ArgumentParser(prog=f"dpool {command}", description=module.__doc__)
    module.add_arguments(parser)
    args = parser.parse_args(rest)  # a bad flag: usage and exit status 2
    args.command = command
    return int(module.run(args))
