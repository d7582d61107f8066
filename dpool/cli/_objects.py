"""List the cluster's objects, largest first: size, the nodes holding a copy, what made
them, and whether something still references them."""

from __future__ import annotations

import argparse
import json
import sys

from dpool.errors import Error
from dpool.observe import NoClusterError, format_rows, object_rows, open_store


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help="the cluster (default: $DPOOL_ADDRESS, else this host's record)")
    p.add_argument("--limit", type=int, default=50, help="show this many (0: all)")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    try:
        store, _status = open_store(args.address)
    except NoClusterError as exc:
        sys.stderr.write(f"dpool objects: {exc}\n")
        return 2
    except Error as exc:
        sys.stderr.write(f"dpool objects: {exc}\n")
        return 1
    try:
        rows = object_rows(store, args.limit or None)
    except Error as exc:
        sys.stderr.write(f"dpool objects: {exc}\n")
        return 1
    finally:
        store.close()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("\n".join(format_rows(rows)))
    return 0
