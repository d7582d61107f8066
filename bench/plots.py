"""PNG plots of the bench/ reports, drawn from the JSON results the scripts saved.

    python bench/plots.py [--only latency,workers,transfer,recovery,actor_recovery]

- ``latency.png``: round-trip latency distributions (no-op ``submit`` -> ``result`` and
  ``Pool.apply``) of every peer, from ``results.json`` (``bench/run.py``): min, p10,
  median, p90, max of each peer's samples (the percentiles the run kept).
- ``workers.png``: throughput against the number of workers, from ``workers.json``
  (``bench/workers.py``).
- ``transfer.png``: GB/s against object size, from ``transfer.json``
  (``bench/transfer.py``).
- ``recovery.png``: tasks/s over time while a node is killed and re-added, from
  ``recovery.json`` (``bench/recovery.py``).
- ``actor_recovery.png``: an actor's recovery time against the calls it had run, with
  and without checkpoints, from ``actor_recovery.json`` (``bench/actor_recovery.py``).

A plot whose JSON is missing is skipped with a message. Needs matplotlib (the ``bench``
extra); the PNGs are written beside the pages that show them, in ``bench/``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

_MPL = tuple(int(x) for x in matplotlib.__version__.split(".")[:2])
BENCH = Path(__file__).resolve().parent
COLORS = {"dpool": "#1f77b4", "ppe": "#7f7f7f", "mp": "#bcbd22", "loky": "#9467bd",
          "ray": "#ff7f0e", "dask": "#2ca02c", "mpire": "#8c564b"}
NAMES = {"dpool": "dpool", "ppe": "PPE", "mp": "mp.Pool", "loky": "loky", "ray": "Ray",
         "dask": "dask.distributed", "mpire": "mpire"}


def _save(fig, png: Path) -> Path:
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    print(f"wrote {png}")
    return png


def plot_recovery(result: dict, png: Path) -> Path:
    """Tasks/s per bin over time, one panel per system, kill and re-add marked."""
    runs = result["runs"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.9 * len(runs)), sharex=True,
                             squeeze=False)
    for ax, (name, run) in zip(axes[:, 0], runs.items()):
        rate, w = run["bins_tps"], run["bin_s"]
        last = max((k for k, r in enumerate(rate) if r > 0), default=0) + 1
        xs = [k * w for k in range(last)]
        nodes = run.get("bins_by_node_tps", {})
        if nodes:
            ax.stackplot(xs, *[v[:last] for v in nodes.values()], step="post", alpha=0.25,
                         labels=[f"ended on {n}" for n in nodes],
                         colors=plt.cm.tab10.colors[2:2 + len(nodes)])
        ax.step(xs, rate[:last], where="post", color=COLORS.get(name, "k"), lw=1.4,
                label=f"{NAMES.get(name, name)}: completed tasks/s ({w} s bins)")
        ideal = run["ideal_tps"]
        ax.axhline(ideal, color="grey", ls=":", lw=1, label=f"3 nodes' capacity ({ideal:.0f}/s)")
        ax.axhline(ideal * 2 / 3, color="grey", ls="--", lw=0.8,
                   label=f"2 nodes' capacity ({ideal * 2 / 3:.0f}/s)")
        ev = run["events"]
        ax.axvline(ev["kill"], color="red", lw=1.2)
        ax.text(ev["kill"], ideal * 1.12, " node SIGKILLed", color="red", fontsize=8)
        ax.axvline(ev["add"], color="green", lw=1.2)
        ax.text(ev["add"], ideal * 1.12, " node added", color="green", fontsize=8)
        ax.axvline(result["duration"], color="black", lw=0.6, ls="-.")
        ax.set_ylim(0, ideal * 1.25)
        ax.set_ylabel("tasks/s")
        ax.legend(loc="lower left", fontsize=6, ncol=2)
    axes[-1, 0].set_xlabel("seconds since the stream started (50 ms tasks; "
                           "dash-dot: submissions stop)")
    fig.suptitle(f"Throughput through a node failure: 3 nodes x {result['cpus_per_node']} "
                 f"CPUs on loopback, {result['machine_cpus']}-core machine "
                 f"({result['date']})", fontsize=10)
    return _save(fig, png)


def plot_actor_recovery(result: dict, png: Path) -> Path:
    """Recovery time against calls run before the kill, one line per checkpoint setting."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for every, label, color in ((0, "no checkpoints: every call replayed", "tab:red"),
                                (result["every"], f"checkpoint_every={result['every']}: "
                                 "only the calls after the last checkpoint", "tab:blue")):
        rows = [r for r in result["rows"] if r["checkpoint_every"] == every]
        ax.plot([r["calls"] for r in rows], [r["recovery_s"] * 1e3 for r in rows], "o-",
                color=color, label=label)
        for r in rows:
            ax.annotate(f"{r['replayed']} replayed", (r["calls"], r["recovery_s"] * 1e3),
                        fontsize=7, textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("calls the actor ran before its process was SIGKILLed")
    ax.set_ylabel("kill -> next call's result (ms)")
    ax.legend(fontsize=8)
    ax.set_title(f"Actor recovery, dpool ({result['date']}, {result['cpus']} cores): "
                 f"{result['command']}", fontsize=8)
    return _save(fig, png)


def plot_latency(result: dict, png: Path) -> Path:
    """Per peer, a box from p10 to p90 with the median, whiskers to min and max, log scale:
    the no-op round trip, ``Pool.apply`` and executor start-up (all of its samples)."""
    panels = [("executor", "roundtrip_s", "no-op submit -> result, one at a time", 1e6, "us"),
              ("pool", "apply_s", "Pool.apply round trip", 1e6, "us"),
              ("executor", "startup_s", "start-up: create -> first result", 1e3, "ms")]
    fig, axes = plt.subplots(1, len(panels), figsize=(14, 3.8))
    for ax, (group, key, title, scale, unit) in zip(axes, panels):
        stats, labels, colors = [], [], []
        peers = result["groups"].get(group, {}).get("peers", {})
        for peer, data in peers.items():
            m = data.get("metrics", {}).get(key)
            if not m:
                continue
            if "p10" in m:
                q = [m["min"], m["p10"], m["median"], m["p90"], m["max"]]
                n = m.get("n")
            else:  # start-up: the samples themselves (a handful)
                xs = sorted(m["samples"])
                q = [xs[0], xs[len(xs) // 4], m["value"], xs[-1 - len(xs) // 4], xs[-1]]
                n = len(xs)
            q = [x * scale for x in q]
            stats.append({"whislo": q[0], "q1": q[1], "med": q[2], "q3": q[3], "whishi": q[4],
                          "fliers": []})
            capped = " capped" if m.get("capped") else ""
            med = f"{q[2]:,.0f}" if q[2] >= 10 else f"{q[2]:.1f}"
            labels.append(f"{NAMES.get(peer, peer)}: {med} {unit}\n(median, n={n}{capped})")
            colors.append(COLORS.get(peer, "k"))
        if not stats:
            ax.set_visible(False)
            continue
        horizontal = ({"orientation": "horizontal"} if _MPL >= (3, 10) else {"vert": False})
        boxes = ax.bxp(stats, patch_artist=True, showfliers=False,
                       medianprops={"color": "black"}, **horizontal)
        for patch, c in zip(boxes["boxes"], colors):
            patch.set_facecolor(c)
            patch.set_alpha(0.6)
        ax.set_yticks(range(1, len(labels) + 1), labels, fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel(unit + (" (box p10-p90, whiskers min-max)" if unit == "us" else
                              " (box: middle half of the samples)"))
        ax.set_title(title, fontsize=9)
        ax.invert_yaxis()
    mach = result.get("machine", {})
    fig.suptitle(f"Latency, {result['settings']['params']['workers']} workers, one run "
                 f"({mach.get('date', '')[:16]}, {mach.get('cpu_count')} cores): "
                 "python bench/run.py", fontsize=10)
    return _save(fig, png)


def plot_workers(result: dict, png: Path) -> Path:
    """No-op tasks/s, and 20 ms-sleep tasks/s as a share of perfect, against workers."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    top = 1
    for peer, entry in result["peers"].items():
        rows = entry.get("rows", [])
        if not rows:
            continue
        ws = [r["workers"] for r in rows]
        style = {"color": COLORS.get(peer, "k"), "marker": "o", "ms": 4,
                 "label": NAMES.get(peer, peer)}
        axes[0].plot(ws, [r["noop_tps"] for r in rows], **style)
        axes[1].plot(ws, [100 * r["sleep_tps"] * result["sleep_s"] / r["workers"]
                          for r in rows], **style)
        top = max(top, *ws)
    ticks = [w for w in (1, 2, 4, 8, 16, 32, 64) if w <= top]
    axes[0].set_title(f"{result['noops']:,} no-op tasks at once: tasks/s", fontsize=9)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("tasks/s")
    axes[1].set_title("20 x workers tasks of a 20 ms sleep at once: tasks/s as % of "
                      "workers / 20 ms", fontsize=9)
    axes[1].set_ylim(0, 105)
    axes[1].set_ylabel("% of perfect")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(w) for w in ticks])
        ax.set_xlabel("workers (max_workers / num_cpus / n_workers)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"Throughput against workers ({result['date']}, {result['cpus']} cores, "
                 "load average "
                 f"{result['loadavg_start'][0]:.1f}): python bench/workers.py", fontsize=10)
    return _save(fig, png)


def plot_transfer(result: dict, png: Path) -> Path:
    """GB/s against object size: put + remote task less its fixed cost, for dpool and Ray;
    the holder's own send rate; memcpy in one process."""
    sizes = result["sizes_mb"]
    fig, ax = plt.subplots(figsize=(10, 4.2))

    def rate(times: dict) -> list:
        base = times.get("0") or 0.0
        return [mb / 1024 / max(times[str(mb)] - base, 1e-9) if times.get(str(mb)) else None
                for mb in sizes]

    ax.plot(sizes, rate(result["dpool_s"]), "o-", color=COLORS["dpool"],
            label="dpool: put + remote task, less its fixed cost")
    if result.get("ray_s"):
        ax.plot(sizes, rate(result["ray_s"]), "o-", color=COLORS["ray"],
                label=f"{result.get('peer', 'Ray')}: the same")
    sends = [(mb, result["holder_send_ms"].get(str(mb))) for mb in sizes]
    ax.plot([mb for mb, ms in sends if ms], [mb / 1024 / (ms / 1e3) for mb, ms in sends if ms],
            "s--", color=COLORS["dpool"], alpha=0.6, label="dpool: the holder's send time alone")
    ax.plot(sizes, [mb / 1024 / result["memcpy_s"][str(mb)] for mb in sizes], "^:",
            color="grey", label="memcpy of the same bytes (one process)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes, [f"{mb} MB" for mb in sizes])
    ax.set_xlabel("object size")
    ax.set_ylabel("GB/s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if result.get("source"):
        fig.text(0.01, 0.005, "figures transcribed from TRANSFER.md's table", fontsize=6,
                 color="grey")
    ax.set_title(f"Objects between two nodes on loopback ({result['date']}, "
                 f"{result['cpus']} cores): python bench/transfer.py", fontsize=9)
    return _save(fig, png)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="latency,workers,transfer,recovery,actor_recovery")
    args = ap.parse_args()
    plots = {"latency": ("results.json", plot_latency),
             "workers": ("workers.json", plot_workers),
             "transfer": ("transfer.json", plot_transfer),
             "recovery": ("recovery.json", plot_recovery),
             "actor_recovery": ("actor_recovery.json", plot_actor_recovery)}
    for name in args.only.split(","):
        src, fn = plots[name]
        path = BENCH / src
        if not path.exists():
            print(f"skipped {name}: {path} is missing (run its script first)")
            continue
        fn(json.loads(path.read_text()), BENCH / f"{name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
