"""The figures and the RECOVERY.md section of ``bench/recovery.py``, from its drivers'
records and task logs: throughput per 0.5 s bin (in all and per node), before, between
and after; how long it took to settle; tasks cut short, failed, or run twice."""

from __future__ import annotations

from pathlib import Path

BIN_S = 0.5


def analyse(res: dict, events: dict, slots: int, duration: float) -> dict:
    """Bins, and the figures of the report, from a driver's records and its task log."""
    nbins = int((duration + 20) / BIN_S)
    bins = [0] * nbins
    for _, seen, _ in res["records"]:
        if 0 <= seen < nbins * BIN_S:
            bins[int(seen / BIN_S)] += 1
    rate = [b / BIN_S for b in bins]
    t0 = res["t0"]
    starts: dict = {}
    ends: dict = {}
    by_node: dict = {}  # node's IP -> tasks it ended per bin (from the task log)
    first_new = None
    for line in res["log"].splitlines():
        kind, i, node, _pid, t = line.split()
        if int(i) < 0:
            continue
        (starts if kind == "start" else ends).setdefault(int(i), []).append(node)
        k = int((float(t) - t0) / BIN_S)
        if kind == "end" and 0 <= k < nbins:
            by_node.setdefault(node.split(":")[0], [0] * nbins)[k] += 1
        if kind == "end" and node.startswith(res["nodes"]["added"]):
            first_new = min(first_new or 1e9, float(t) - t0)
    killed = res["nodes"]["killed"]
    # cut short by the kill: started on the killed node, never ended there
    lost = sorted(i for i, v in starts.items() if any(n.startswith(killed) for n in v)
                  and not any(n.startswith(killed) for n in ends.get(i, ())))
    ids = [r[0] for r in res["records"]]
    kill = events["kill"]
    seen_at = {r[0]: r[1] for r in res["records"]}
    lost_done = [seen_at[i] for i in lost if i in seen_at]
    run = {
        "bins_tps": rate, "bin_s": BIN_S,
        "bins_by_node_tps": {n: [c / BIN_S for c in v] for n, v in sorted(by_node.items())},
        "ideal_tps": slots / 0.05, "events": events,
        "submitted": res["submitted"], "completed": len(res["records"]),
        "distinct_completed": len(set(ids)), "errors": res["errors"][:20],
        "n_errors": len(res["errors"]), "unfinished": res["unfinished"][:50],
        "n_unfinished": len(res["unfinished"]),
        "started_twice": sum(1 for v in starts.values() if len(v) > 1),
        "ended_twice": sum(1 for v in ends.values() if len(v) > 1),
        "ended_twice_ids": [i for i, v in ends.items() if len(v) > 1][:20],
        "ran_on_killed_node": sum(1 for v in starts.values()
                                  if any(n.startswith(killed) for n in v)),
        "cut_short_by_kill": len(lost), "cut_short_delivered": len(lost_done),
        "last_cut_short_done_after_kill": (max(lost_done) - kill) if lost_done else None,
        "first_task_on_new_node_after_add_s": (first_new - events["add"]) if first_new
        else None,
    }
    run.update(levels(run, duration))
    return run


def levels(run: dict, duration: float) -> dict:
    """Throughput before, between and after, and how long it took to settle, from the
    bins (``0.5 s`` resolution)."""
    rate, w = run["bins_tps"], run["bin_s"]
    kill, add = run["events"]["kill"], run["events"]["add"]
    new = run["first_task_on_new_node_after_add_s"]

    def mean(a: float, b: float) -> float:
        sel = rate[int(a / w):int(b / w)]
        return sum(sel) / len(sel) if sel else 0.0

    before, degraded = mean(1.0, kill), mean((kill + add) / 2, add)
    # the kill: from the end of the last bin below 80 % of the two-node rate (the mean of
    # the second half before the re-add) -- 0.5 s if none was
    low = [k for k in range(int(kill / w), int(add / w)) if rate[k] < 0.8 * degraded]
    settled = ((max(low) + 1) * w - kill) if low else (int(kill / w) + 1) * w - kill
    back = None  # the re-add: a 1.5 s rolling mean first at 90 % of "before"
    for k in range(int(add / w), int(duration / w) - 2):
        if sum(rate[k:k + 3]) / 3 >= 0.9 * before:
            back = (k + 3) * w - add
            break
    after_lo = add + (new if new is not None else 0.0) + 2.0
    return {"tps_before": before, "tps_during": mean(kill, add), "tps_degraded": degraded,
            "tps_after": mean(after_lo, duration),
            "lowest_bin_3s_after_kill": min(rate[int(kill / w):int((kill + 3) / w)]),
            "kill_to_settled_s": settled, "add_to_before_level_s": back}


HEADING = "## A node SIGKILLed and re-added (`bench/recovery.py`)"


def _fmt(x, unit: str = "", digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}{unit}"


def report(r: dict) -> str:
    runs = r["runs"]
    names = [n for n in ("dpool", "ray") if n in runs]
    head = " | ".join("dpool" if n == "dpool" else f"Ray {r.get('ray_version', '')}".strip()
                      for n in names)
    rows = [
        ("tasks/s before the kill (1 s to the kill)", "tps_before", " /s"),
        ("tasks/s from the kill to the re-add", "tps_during", " /s"),
        ("tasks/s in the second half of that (two nodes, settled)", "tps_degraded", " /s"),
        ("tasks/s after the re-add (first task on the new node + 2 s, to the end)",
         "tps_after", " /s"),
        ("lowest 0.5 s bin in the 3 s after the kill", "lowest_bin_3s_after_kill", " /s"),
        ("kill → settled (end of the last bin below 80 % of the settled rate)",
         "kill_to_settled_s", " s"),
        ("tasks cut short by the kill (started there, never ended there)", "cut_short_by_kill",
         ""),
        ("kill → the last of those delivered", "last_cut_short_done_after_kill", " s"),
        ("re-add (`start` run) → its command returned", "add_cmd_s", " s"),
        ("re-add → first task done on the new node", "first_task_on_new_node_after_add_s",
         " s"),
        ("re-add → 1.5 s mean back at 90 % of \"before\"", "add_to_before_level_s", " s"),
        ("tasks submitted / results delivered / distinct", "counts", ""),
        ("tasks failed / never finished", "failed", ""),
        ("tasks started twice / ended twice", "twice", ""),
    ]
    for run in runs.values():
        ev = run["events"]
        run["add_cmd_s"] = ev["add_returned"] - ev["add"]
        run["counts"] = f"{run['submitted']} / {run['completed']} / {run['distinct_completed']}"
        run["failed"] = f"{run['n_errors']} / {run['n_unfinished']}"
        run["twice"] = f"{run['started_twice']} / {run['ended_twice']}"
    lines = [HEADING, "", "```bash",
             (f"python bench/recovery.py --cpus {r['cpus_per_node']} "
              f"--duration {r['duration']:g} --kill-at {r['kill_at']:g} "
              f"--add-at {r['add_at']:g}"), "```", "",
             (f"Run {r['date']} on {r['machine_cpus']} cores (load average "
             f"{r['loadavg_start'][0]:.1f} before, {r['loadavg_end'][0]:.1f} after). Three "
             f"nodes of {r['cpus_per_node']} CPUs on loopback addresses, a driver on the "
             f"head's host keeping {6 * r['cpus_per_node']} tasks of 50 ms outstanding "
             f"({3 * r['cpus_per_node'] * 20} tasks/s if nothing else cost anything); at "
             f"{r['kill_at']:g} s the third node and all its processes are SIGKILLed, at "
             f"{r['add_at']:g} s a fresh node is started on a fourth address; submissions "
             f"stop at {r['duration']:g} s. Same script shape for both, one after the other "
             "in the same run."), "",
             "![tasks/s over time, node killed and re-added](recovery.png)", "",
             f"| figure | {head} |", "|---|" + "---|" * len(names)]
    for label, key, unit in rows:
        cells = []
        for n in names:
            v = runs[n].get(key)
            cells.append(v if isinstance(v, str) else _fmt(v, unit, 0 if key.startswith("cut")
                                                           else 1))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    for n in names:
        lines.append(f"Processes SIGKILLed ({n}): "
                     f"{', '.join(runs[n]['events']['killed_processes'])}.")
    for n in names:
        if "add_error" in runs[n]["events"]:
            err = runs[n]["events"]["add_error"].strip().splitlines()[-1]
            lines.append(f"The re-added node ({n}) failed to join: `{err}`.")
    if "ray_error" in r:
        lines.append(f"Ray: {r['ray_error']}")
    return "\n".join(lines) + "\n"


def write_section(md: Path, text: str) -> None:
    """Replace this script's section of ``md`` (up to the next ``## ``), or append it."""
    old = md.read_text() if md.exists() else "# Recovery figures\n"
    if HEADING in old:
        start = old.index(HEADING)
        nxt = old.find("\n## ", start + len(HEADING))
        new = old[:start] + text + ("\n" + old[nxt + 1:] if nxt >= 0 else "")
    else:
        new = old.rstrip("\n") + "\n\n" + text
    md.write_text(new)
