"""Subprocess entry point: run one group against one peer, stream JSON lines.

    python bench/peer_main.py --group executor --peer ppe --params '{...}'

Started by ``run.py`` in its own session; not meant to be run by hand
(though it works, which is handy for debugging a single peer).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import multiprocessing
import os
import platform
import sys
import time

from groups import RUNNERS
from params import DEFAULT, Params
from peers import PeerUnavailable, load
from recorder import Recorder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group", required=True, choices=sorted(RUNNERS))
    ap.add_argument("--peer", required=True)
    ap.add_argument("--params", default=None, help="JSON of bench.params.Params")
    args = ap.parse_args(argv)
    params = Params.from_json(json.loads(args.params)) if args.params else DEFAULT

    # If we hang, dump every thread's stack to stderr shortly before the
    # parent's deadline so the report can say where.
    faulthandler.dump_traceback_later(max(5.0, params.timeout_s - 3.0), exit=False)

    rec = Recorder()
    try:
        cls, version = load(args.peer, args.group)
    except PeerUnavailable as exc:
        rec.skip_peer(str(exc))
        return 0
    except Exception as exc:  # a broken install is a skip too, with the reason
        rec.skip_peer(f"failed to load: {type(exc).__name__}: {exc}")
        return 0

    rec.meta(
        version=version,
        adapter=cls.__name__,
        pid=os.getpid(),
        python=platform.python_version(),
        mp_start_method=multiprocessing.get_start_method(),
    )
    t0 = time.perf_counter()
    RUNNERS[args.group](cls, params, rec)
    rec.meta(group_wall_s=time.perf_counter() - t0)
    rec.done()
    faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    sys.exit(main())
