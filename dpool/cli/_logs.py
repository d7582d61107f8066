"""Print what the cluster's tasks wrote (kept by each node) and this host's daemon logs,
each line prefixed with its node and process id; --follow keeps printing."""

from __future__ import annotations

import argparse
import sys
import time

from dpool.errors import Error
from dpool.observe import NoClusterError, open_store, parse_duration
from dpool.observe import logs as _logs
from dpool.runtime import address as _address


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help="the cluster (default: $DPOOL_ADDRESS, else this host's record)")
    p.add_argument("--node", default=None, help="only this node's (its id)")
    p.add_argument("--task", default=None, help="only what this task printed (its id)")
    p.add_argument("--last", default=None, metavar="DURATION",
                   help="only task output of the last DURATION (90s, 10m, 2h)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    p.add_argument("--no-daemons", action="store_true", help="task output only")


def _task_id(text: str) -> int:
    return int(text, 0)


def run(args: argparse.Namespace) -> int:
    try:
        task = None if args.task is None else _task_id(args.task)
        since = None if args.last is None else time.time() - parse_duration(args.last)
    except ValueError as exc:
        sys.stderr.write(f"dpool logs: {exc}\n")
        return 2
    try:
        store, _status = open_store(args.address)
    except NoClusterError as exc:
        sys.stderr.write(f"dpool logs: {exc}\n")
        return 2
    except Error as exc:
        sys.stderr.write(f"dpool logs: {exc}\n")
        return 1
    daemons = [] if args.no_daemons or task is not None else \
        _logs.daemon_logs(_address.read_record(), args.node)
    offsets = {path: 0 for _prefix, path in daemons}
    after: dict = {}
    try:
        while True:
            for prefix, path in daemons:
                lines, offsets[path] = _logs.read_log(path, offsets[path])
                for line in lines:
                    print(f"{prefix} {line}")
            rows = _logs.task_output(store, args.node, task, since, after)
            for line in _logs.format_output(rows):
                print(line)
            sys.stdout.flush()
            if not args.follow:
                return 0
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    except Error as exc:
        sys.stderr.write(f"dpool logs: {exc}\n")
        return 1
    finally:
        store.close()
