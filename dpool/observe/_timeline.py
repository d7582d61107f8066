"""``dpool.timeline``: the tasks that ran, as a Chrome trace-event file.

On the embedded runtime the events come from this process's control store; with
``DPOOL_ADDRESS`` set (or ``address=``), from the cluster's event streams in Redis.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from dpool.observe._trace import build_trace


def parse_duration(text: str) -> float:
    """``"90"``/``"90s"``, ``"10m"``, ``"2h"``, ``"1d"`` -> seconds; ``ValueError`` else."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    raw = text.strip().lower()
    scale = units.get(raw[-1:], None)
    number = raw[:-1] if scale is not None else raw
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 10m, 2h)") from None
    if value < 0:
        raise ValueError(f"a duration cannot be negative: {text!r}")
    return value * (scale or 1.0)


def _since(last: None | float | str) -> float | None:
    if last is None:
        return None
    if isinstance(last, str):
        seconds = parse_duration(last)
    elif isinstance(last, (int, float)) and not isinstance(last, bool):
        if last < 0:
            raise ValueError(f"last must be >= 0 seconds, not {last!r}")
        seconds = float(last)
    else:
        raise TypeError(f"last must be seconds or a string such as '10m', not {last!r}")
    return time.time() - seconds


def cluster_trace(address: str | None = None,
                  last: None | float | str = None) -> dict[str, Any]:
    """The trace of the cluster at ``address`` (default: ``$DPOOL_ADDRESS`` / this host's
    record); raises ``NoClusterError`` without a cluster."""
    from dpool.observe._cluster import open_store

    since = _since(last)
    store, _status = open_store(address)
    try:
        events, fns = store.event_log(since)
        names = store.function_names(fns.values())
    finally:
        store.close()
    return build_trace(events, fns, names)


def local_trace(last: None | float | str = None) -> dict[str, Any]:
    """The trace of the tasks this process's embedded runtime ran."""
    from dpool.runtime import current as _current

    since = _since(last)
    control = _current.driver().control  # type: ignore[attr-defined]
    events, fns = control.event_log(since)
    return build_trace(events, fns, control.function_names(fns.values()))


def timeline(path: None | str | os.PathLike = None, *,
             last: None | float | str = None) -> dict[str, Any]:
    """Write the tasks that ran as a Chrome trace-event JSON file (open it in Perfetto or
    chrome://tracing) and return the document; ``path=None`` only returns it.

    One process per node, one thread per worker, a span per task attempt named by its
    function (``args``: task id, attempt, submit-to-start wait in ms, outcome); failures,
    retries, lost workers and spills as instant events. ``last`` keeps what happened in
    the last seconds (a number, or ``"90s"``, ``"10m"``, ``"2h"``). Reads the cluster's
    event log when ``DPOOL_ADDRESS`` is set, else this process's embedded runtime's.
    """
    if os.environ.get("DPOOL_ADDRESS"):
        doc = cluster_trace(None, last)
    else:
        doc = local_trace(last)
    if path is not None:
        with open(os.fspath(path), "w") as f:
            json.dump(doc, f)
    return doc
