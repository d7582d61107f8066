"""The dashboard's HTML: the page, the live part of it (the *fragment* its script fetches
again every few seconds) and the tasks-per-second chart as inline SVG, all rendered
here from a snapshot (``_collect``). Nothing is fetched from anywhere but the dashboard
itself: no script, font or style from the internet, so the page works on a cluster
with no way out and its Content-Security-Policy can forbid everything else.

Every value from the cluster (node ids, function names, tracebacks) is escaped.
"""

from __future__ import annotations

import html
import math
import time
from typing import Any

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:20px;
align-items:baseline}
header h1{font-size:18px;margin:0}header .sub{opacity:.75}
main{padding:12px 20px;max-width:1200px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:10px 14px;
margin:0 0 12px}
h2{font-size:15px;margin:2px 0 8px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f3;vertical-align:top}
th{font-weight:600;color:#556;font-size:12px;text-transform:uppercase}
.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#137333;font-weight:600}.bad{color:#c5221f;font-weight:600}
.tiles{display:flex;gap:12px;flex-wrap:wrap;margin:0 0 12px}
.tile{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:8px 14px;
min-width:120px}.tile b{display:block;font-size:22px}
.errors{background:#fdecea;border-color:#f5c2c0;color:#8a1c17}
pre{margin:4px 0;white-space:pre-wrap;font-size:12px;background:#f6f7f9;padding:6px}
.muted{color:#778}.stale header{background:#7a2a2a}
svg text{font:11px system-ui,sans-serif;fill:#556}
""".strip()

SCRIPT_TEMPLATE = """(function(){var live=document.getElementById('live');
function tick(){fetch('fragment',{credentials:'same-origin',cache:'no-store'})
.then(function(r){if(r.status!==200){throw new Error('HTTP '+r.status);}return r.text();})
.then(function(h){live.innerHTML=h;document.body.classList.remove('stale');})
.catch(function(){document.body.classList.add('stale');})
.then(function(){setTimeout(tick,%d);});}
setTimeout(tick,%d);})();"""


def script(period_ms: int) -> str:
    """The page's one script: fetch the fragment every ``period_ms`` and swap it in."""
    return SCRIPT_TEMPLATE % (period_ms, period_ms)


def page(snap: dict, period_ms: int) -> str:
    """The whole page: the static frame around ``fragment(snap)``."""
    title = f"dpool · {snap.get('cluster', '')}"
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width,initial-scale=1'>"
            f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>"
            f"<header><h1>dpool dashboard</h1><span class=sub>cluster "
            f"{_e(snap.get('cluster'))}</span><span class=sub>refreshes every "
            f"{period_ms / 1000:g} s</span></header>"
            f"<main id=live>{fragment(snap)}</main>"
            f"<script>{script(period_ms)}</script></body></html>")


def fragment(snap: dict) -> str:
    """The live part of the page."""
    parts = [f"<p class=muted id=updated>updated {_clock(snap.get('updated'))}</p>"]
    if snap.get("errors"):
        items = "".join(f"<li>{_e(x)}</li>" for x in snap["errors"])
        parts.append(f"<section class=errors><h2>Could not read everything</h2>"
                     f"<ul>{items}</ul></section>")
    parts += [_tiles(snap), _chart_section(snap.get("rate") or {}), _nodes(snap),
              _running(snap.get("running") or {}, snap.get("updated") or time.time()),
              _failed(snap.get("failed") or []), _control(snap)]
    return "".join(parts)


# -- sections ------------------------------------------------------------------------------
def _tiles(snap: dict) -> str:
    nodes = snap.get("nodes") or []
    alive = [n for n in nodes if n.get("alive")]
    rate = snap.get("rate") or {}
    done = rate.get("done") or []
    recent = done[-6:]
    per_s = sum(recent) / len(recent) if recent else 0.0
    failed = sum(rate.get("failed") or []) * float(rate.get("bucket_s") or 0)
    tiles = [("nodes alive", f"{len(alive)}/{len(nodes)}"),
             ("CPUs busy", (f"{sum(n.get('cpus_used') or 0 for n in alive)}/"
                           f"{sum(n.get('cpus_total') or 0 for n in alive)}")),
             ("tasks running", str((snap.get("running") or {}).get("count", 0))),
             ("tasks queued", str(sum(n.get("queued") or 0 for n in alive))),
             ("tasks/s (30 s)", f"{per_s:.1f}"),
             ("failed (5 min)", str(round(failed)))]
    return "<div class=tiles>" + "".join(
        f"<div class=tile><span class=muted>{_e(k)}</span><b>{_e(v)}</b></div>"
        for k, v in tiles) + "</div>"


def _chart_section(rate: dict) -> str:
    minutes = len(rate.get("done") or []) * float(rate.get("bucket_s") or 0) / 60
    return (f"<section><h2>Tasks per second, last {minutes:g} minutes</h2>"
            f"{chart_svg(rate)}</section>")


def chart_svg(rate: dict, width: int = 1100, height: int = 170) -> str:
    """Tasks finished (filled) and failed (red line) per second, one point per bucket."""
    done = [float(x) for x in rate.get("done") or []]
    failed = [float(x) for x in rate.get("failed") or []]
    n = max(len(done), 1)
    left, right, top, bottom = 46, 8, 8, 20
    w, h = width - left - right, height - top - bottom
    ymax = _nice(max(done + failed + [0.0]))

    def xy(i: int, v: float) -> str:
        x = left + (w * i / (n - 1) if n > 1 else 0)
        return f"{x:.1f},{top + h - h * v / ymax:.1f}"

    grid = "".join(
        f"<line x1={left} x2={left + w} y1={top + h * k / 2:.1f} y2={top + h * k / 2:.1f} "
        f"stroke='#e3e6ea'/><text x={left - 6} y={top + h * k / 2 + 4:.1f} "
        f"text-anchor=end>{_num(ymax * (2 - k) / 2)}</text>" for k in range(3))
    area = ""
    if done:
        pts = " ".join(xy(i, v) for i, v in enumerate(done))
        area = (f"<polygon points='{xy(0, 0)} {pts} {xy(len(done) - 1, 0)}' "
                f"fill='#c6dafc' stroke='#1a73e8' stroke-width=1.5 id='done'/>")
    line = ""
    if any(failed):
        line = (f"<polyline points='{' '.join(xy(i, v) for i, v in enumerate(failed))}' "
                f"fill=none stroke='#c5221f' stroke-width=1.5 id='failed'/>")
    span = n * float(rate.get("bucket_s") or 0)
    labels = (f"<text x={left} y={height - 4}>-{_duration(span)}</text>"
              f"<text x={left + w} y={height - 4} text-anchor=end>now</text>"
              f"<text x={left + w / 2:.0f} y={height - 4} text-anchor=middle>"
              f"finished (blue) · failed (red)</text>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width={width} height={height} "
            f"viewBox='0 0 {width} {height}' role=img id=rate-chart>"
            f"<title>tasks per second</title>{grid}{area}{line}{labels}</svg>")


def _nodes(snap: dict) -> str:
    rows = []
    for n in snap.get("nodes") or []:
        alive = bool(n.get("alive"))
        if alive:
            state = "<span class=ok>alive</span>"
        else:
            why = "marked dead" if n.get("dead") else "no heartbeat"
            age = n.get("age")
            since = f"; last heartbeat {_duration(age)} ago" if isinstance(
                age, (int, float)) else ""
            state = f"<span class=bad>dead</span> <span class=muted>({why}{since})</span>"
        res = ", ".join(
            f"{_e(k)} {_used_of(v.get('used'), v.get('total'))}"
            for k, v in sorted((n.get("resources") or {}).items())
            if v.get("total") or v.get("used")) or "<span class=muted>-</span>"
        store_used, store_cap = n.get("store_used") or 0, n.get("store_capacity") or 0
        rows.append(
            f"<tr class=node data-node='{_e(n.get('node_id'))}' "
            f"data-state='{'alive' if alive else 'dead'}'>"
            f"<td>{_e(n.get('node_id'))}<br><span class=muted>{_e(n.get('hostname'))}"
            f"</span></td><td>{state}</td>"
            f"<td class=num>{n.get('cpus_used', 0)}/{n.get('cpus_total', 0)} "
            f"{_bar(n.get('cpus_used') or 0, n.get('cpus_total') or 0)}</td>"
            f"<td>{res}</td><td class=num>{n.get('queued', 0)}</td>"
            f"<td class=num>{_bytes(store_used)}/{_bytes(store_cap)} "
            f"{_bar(store_used, store_cap)}</td>"
            f"<td class=num>{_e(n.get('workers', ''))}</td>"
            f"<td class=num>{_e(n.get('drivers', ''))}</td></tr>")
    body = "".join(rows) or "<tr><td colspan=8 class=muted>no node registered</td></tr>"
    return ("<section><h2>Nodes</h2><table id=nodes><tr><th>node</th><th>state</th>"
            "<th class=num>CPUs used/total</th><th>GPUs, custom resources (used/total)"
            "</th><th class=num>queued</th><th class=num>store used/capacity</th>"
            f"<th class=num>workers</th><th class=num>drivers</th></tr>{body}</table>"
            "</section>")


def _running(running: dict, now: float) -> str:
    tasks = running.get("tasks") or []
    rows = "".join(
        f"<tr class=running><td>{t['task_id']:#x}</td><td>{_fn(t)}</td>"
        f"<td>{_e(t.get('node') or '')}</td><td class=num>{t.get('worker_id', '')}</td>"
        f"<td class=num>{_duration(now - t['started'])}</td>"
        f"<td>{'retried' if t.get('retried') else ''}</td></tr>" for t in tasks)
    count = running.get("count", 0)
    more = (f" <span class=muted>(the {len(tasks)} running longest of {count})</span>"
            if count > len(tasks) else "")
    return (f"<section><h2>Running tasks: {count}{more}</h2><table id=running>"
            "<tr><th>task</th><th>function</th><th>node</th>"
            "<th class=num>worker</th><th class=num>running for</th><th></th></tr>"
            f"{rows or '<tr><td colspan=6 class=muted>none</td></tr>'}</table></section>")


def _failed(failed: list) -> str:
    rows = []
    for t in failed:
        tb = t.get("traceback")
        detail = (f"<details><summary>traceback</summary><pre>{_e(tb)}</pre></details>"
                  if tb else "<span class=muted>no traceback recorded</span>")
        rows.append(f"<tr class=failed><td>{t['task_id']:#x}</td><td>{_fn(t)}</td>"
                    f"<td>{_e(t.get('node') or '')}</td>"
                    f"<td class=num>{_e(t.get('attempts') or '')}</td>"
                    f"<td>{_clock(t.get('at'))}</td><td>{detail}</td></tr>")
    body = "".join(rows) or "<tr><td colspan=6 class=muted>none lately</td></tr>"
    return ("<section><h2>Recently failed tasks</h2><table id=failed><tr><th>task</th>"
            "<th>function</th><th>submitted on</th><th class=num>attempts</th><th>at</th>"
            f"<th>error</th></tr>{body}</table></section>")


def _control(snap: dict) -> str:
    gss = "".join(
        f"<tr class=gs><td>{_e(g.get('address'))}</td><td>{_health(g.get('alive'))}</td>"
        f"<td class=num>{_age(g.get('age'))}</td></tr>"
        for g in snap.get("global_schedulers") or [])
    shards = "".join(
        f"<tr class=shard><td>{_e(s.get('address'))}</td><td>{_health(s.get('alive'))}</td>"
        f"<td class=num>{_bytes(s['used_memory']) if 'used_memory' in s else ''}</td>"
        f"<td class=num>{_e(s.get('keys', ''))}</td><td>{_e(s.get('error', ''))}</td></tr>"
        for s in snap.get("shards") or [])
    none = "<tr><td colspan=5 class=muted>none</td></tr>"
    return ("<section><h2>Global schedulers</h2><table id=global-schedulers><tr>"
            "<th>address</th><th>health</th><th class=num>last heartbeat</th></tr>"
            f"{gss or none}</table></section>"
            "<section><h2>Control store shards</h2><table id=shards><tr><th>address</th>"
            "<th>health</th><th class=num>memory</th><th class=num>keys</th><th></th></tr>"
            f"{shards or none}</table></section>")


# -- formatting ------------------------------------------------------------------------
def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _fn(t: dict) -> str:
    if t.get("function"):
        return _e(t["function"])
    if t.get("spilled_here"):
        return "<span class=muted>(a task spilled here by another node)</span>"
    return "<span class=muted>?</span>"


def _health(alive: bool | None) -> str:
    return "<span class=ok>up</span>" if alive else "<span class=bad>down</span>"


def _age(age: Any) -> str:
    return f"{_duration(age)} ago" if isinstance(age, (int, float)) else ""


def _used_of(used: Any, total: Any) -> str:
    return f"{_num(used) if used is not None else '?'}/{_num(total or 0)}"


def _bar(used: float, total: float, width: int = 60) -> str:
    frac = min(max(used / total, 0.0), 1.0) if total else 0.0
    color = "#c5221f" if frac > 0.9 else "#1a73e8"
    return (f"<svg width={width} height=8 class=bar><rect width={width} height=8 "
            f"fill='#e3e6ea'/><rect width={width * frac:.1f} height=8 fill='{color}'/></svg>")


def _num(x: Any) -> str:
    if isinstance(x, float) and not x.is_integer():
        return f"{x:.2g}" if x < 10 else f"{x:.0f}"
    return str(int(x)) if isinstance(x, (int, float)) else _e(x)


def _nice(x: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten that is >= x (1 for nothing)."""
    if x <= 0:
        return 1.0
    p = 10 ** math.floor(math.log10(x))
    return next(m * p for m in (1, 2, 5, 10) if m * p >= x)


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _duration(s: Any) -> str:
    if not isinstance(s, (int, float)) or s < 0:
        return "0 s"
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min" if s % 60 < 1 else f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _clock(t: Any) -> str:
    if not t:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(t))
