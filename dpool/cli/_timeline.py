"""Write the cluster's task timeline as a Chrome trace-event JSON file (Perfetto,
chrome://tracing): one process per node, one thread per worker, a span per task."""

from __future__ import annotations

import argparse
import json
import sys

from dpool.errors import Error
from dpool.observe import NoClusterError, cluster_trace, parse_duration


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help="the cluster (default: $DPOOL_ADDRESS, else this host's record)")
    p.add_argument("--out", default="trace.json", help="the file to write ('-': stdout)")
    p.add_argument("--last", default=None, metavar="DURATION",
                   help="only what happened in the last DURATION (90s, 10m, 2h)")


def run(args: argparse.Namespace) -> int:
    if args.last is not None:
        try:
            parse_duration(args.last)
        except ValueError as exc:
            sys.stderr.write(f"dpool timeline: {exc}\n")
            return 2
    try:
        doc = cluster_trace(args.address, args.last)
    except NoClusterError as exc:
        sys.stderr.write(f"dpool timeline: {exc}\n")
        return 2
    except Error as exc:
        sys.stderr.write(f"dpool timeline: {exc}\n")
        return 1
    spans = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")
    if args.out == "-":
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
    else:
        with open(args.out, "w") as f:
            json.dump(doc, f)
        print(f"dpool timeline: {spans} task spans written to {args.out} "
              "(open it in https://ui.perfetto.dev or chrome://tracing)")
    return 0
