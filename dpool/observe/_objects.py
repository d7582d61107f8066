"""``dpool objects``: the cluster's objects, largest first: size, the nodes holding a copy,
what made them, and whether something still references them.

A row of the object table lives exactly as long as some handle to the object does (its
driver's future or ref, or a pending task that takes it as an argument): the node that
owns it deletes the row when the last one is released. So every listed object is still
referenced; ``referenced by`` names what the table knows of the holder: ``driver`` for a
value a driver ``put`` or a task result its driver has not released, on ``home`` node.
"""

from __future__ import annotations

from typing import Any


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def object_rows(store: Any, limit: int | None = None) -> list[dict]:
    """The cluster's objects, largest first (unknown sizes last), with function names."""
    rows = store.object_rows()
    fns = [r["task"]["fn"] for r in rows if r["task"] and r["task"]["fn"] is not None]
    names = store.function_names(fns) if fns else {}
    for r in rows:
        task = r["task"]
        if task is None:
            r["kind"] = "put"
            r["referenced_by"] = "driver"
        else:
            fn = task["fn"]
            r["kind"] = f"result of {names.get(fn, f'function {fn}')} ({task['state']})"
            r["referenced_by"] = f"driver (home {task['node']})" if task["node"] else "driver"
        r["referenced"] = True
    rows.sort(key=lambda r: (r["size"] is None, -(r["size"] or 0), r["object_id"]))
    return rows[:limit] if limit else rows


def format_rows(rows: list[dict]) -> list[str]:
    lines = [f"{'object':<20}{'size':>11}  {'holders':<32}{'referenced':<12}what"]
    for r in rows:
        holders = ", ".join(r["holders"]) or "-"
        lines.append(f"{r['object_id']:#018x}  {_size(r['size']):>11}  {holders:<32}"
                     f"{'yes' if r['referenced'] else 'no':<12}{r['kind']}")
    return lines
