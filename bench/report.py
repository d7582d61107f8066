"""Render ``results.json`` as ``RESULTS.md``.

    python bench/report.py [bench/results.json]   # regenerate RESULTS.md

One table per workload: every peer's figure, its ratio to the reference peer
(oriented so the target reads naturally), and whether dpool meets the target.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from spec import DISPLAY, FLOORS, GROUPS, OPS, Floor, Group, Metric, Target

PRETTY_OP = {"<=": "≤", ">=": "≥", "<": "<", ">": ">"}


class _Params(dict[str, Any]):
    """Run parameters for ``str.format_map``; tolerant of older results files."""

    def __missing__(self, key: str) -> str:
        return "?"


def _fmt(metric: Metric, raw: float) -> str:
    x = raw * metric.scale
    return f"{x:,.{metric.digits}f}"


def _ref_name(metric: Metric, group: Group) -> str:
    return metric.reference or group.reference


def _ratio(metric: Metric, value: float, ref_value: float) -> float:
    return value / ref_value if metric.ratio_mode == "peer/ref" else ref_value / value


def _ratio_header(metric: Metric, group: Group) -> str:
    ref = DISPLAY[_ref_name(metric, group)]
    if metric.ratio_mode == "peer/ref":
        return f"peer / {ref}"
    return f"{ref} / peer (speed-up)"


def _target_text(metric: Metric, group: Group, t: Target) -> str:
    op = PRETTY_OP[t.op]
    if t.on == "figure":
        return f"dpool {op} {t.value:g} {metric.unit}"
    ref = DISPLAY[_ref_name(metric, group)]
    expr = f"dpool/{ref}" if metric.ratio_mode == "peer/ref" else f"{ref}/dpool"
    text = f"{expr} {op} {t.value:g}x"
    if t.label:
        text += f" ({t.label})"
    elif metric.ratio_mode == "ref/peer" and t.op in (">=", ">"):
        text += f" (dpool {t.value:g}x faster)"
    return text


def targets_text(metric: Metric, group: Group) -> str:
    return "; ".join(_target_text(metric, group, t) for t in metric.targets)


def _value(peers: dict[str, Any], peer: str, key: str) -> float | None:
    m = peers.get(peer, {}).get("metrics", {}).get(key, {})
    v = m.get("value")
    return float(v) if v is not None else None


def verdict(metric: Metric, group: Group, peers: dict[str, Any]) -> tuple[bool | None, str]:
    """(met?, explanation) for dpool; ``None`` when it cannot be judged."""
    if not metric.targets:
        return None, "no target"
    value = _value(peers, "dpool", metric.key)
    if value is None:
        return None, "❔ dpool " + _why_missing(peers, "dpool", metric.key)
    ref_value = _value(peers, _ref_name(metric, group), metric.key)
    parts: list[str] = []
    met: bool | None = True
    for t in metric.targets:
        if t.on == "figure":
            x, shown = value * metric.scale, f"{_fmt(metric, value)} {metric.unit}"
        elif ref_value is None or ref_value == 0 or value == 0:
            parts.append(f"{DISPLAY[_ref_name(metric, group)]} not measured")
            met = None
            continue
        else:
            x = _ratio(metric, value, ref_value)
            shown = f"{x:.3g}x"  # 3 significant digits: 0.504x must not read as 0.50x
        ok = OPS[t.op](x, t.value)
        if met is not None:
            met = met and ok
        goal = f"{t.value:g} {metric.unit}" if t.on == "figure" else f"{t.value:g}x"
        mark = ("✓ " if ok else "✗ ") if len(metric.targets) > 1 else ""
        parts.append(f"{mark}{shown} {PRETTY_OP[t.op] if ok else _negate(t.op)} {goal}")
    mark = {True: "✅ yes", False: "❌ no", None: "❔"}[met]
    return met, f"{mark} ({'; '.join(parts)})"


def _negate(op: str) -> str:
    return {"<=": ">", ">=": "<", "<": "≥", ">": "≤"}[op]


def _why_missing(peers: dict[str, Any], peer: str, key: str) -> str:
    rec = peers.get(peer)
    if rec is None:
        return "not run"
    m = rec.get("metrics", {}).get(key)
    if m is None:
        if rec.get("status") == "skipped":
            return "skipped: " + "; ".join(rec.get("notes", []))
        return str(rec.get("status", "missing"))
    if "skipped" in m:
        return f"n/a ({m['skipped']})"
    if "error" in m:
        return f"error: {m['error']}"
    return "missing"


def _extra(metric: Metric, m: dict[str, Any]) -> str:
    parts: list[str] = []
    if metric.key.startswith("mem_"):
        parts.append(
            f"memory +{m.get('mem_delta_mb', 0):.0f} MB; "
            f"RSS +{m.get('rss_delta_mb', 0):.0f} MB ({m.get('rss_x_array', 0):.2f}× array); "
            f"PSS +{m.get('pss_delta_mb', 0):.0f} MB ({m.get('pss_x_array', 0):.2f}× array); "
            f"{m.get('processes', '?')} procs"
        )
    if "p10" in m and "p90" in m:
        parts.append(f"p10–p90: {_fmt(metric, m['p10'])}–{_fmt(metric, m['p90'])} {metric.unit}")
    if metric.key == "efficiency":
        parts.append(f"{m.get('actual_s', 0):.3f} s vs ideal {m.get('ideal_s', 0):.3f} s")
        if len(m.get("runs_s", [])) > 1:
            parts.append(f"median run {100 * m.get('median_efficiency', 0):.1f} %")
    if m.get("capped"):
        parts.append(f"time-capped at n={m.get('n')}")
    return "; ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _floor_value(gres: dict[str, Any], floor: Floor) -> float | None:
    m = gres.get("floor", {}).get("metrics", {}).get(floor.key, {})
    v = m.get("value")
    return float(v) if v is not None else None


def floor_verdict(floor: Floor, gres: dict[str, Any]) -> tuple[bool | None, str]:
    """(met?, explanation) for dpool's figure ÷ the floor against the project goal."""
    base = _floor_value(gres, floor)
    value = _value(gres["peers"], "dpool", floor.metric)
    if base is None or value is None or base == 0:
        what = "floor" if base is None else "dpool"
        return None, f"❔ {what} not measured"
    x = value / base
    ok = x <= floor.goal
    return ok, f"{'✅ yes' if ok else '❌ no'} ({x:.3g}x {'≤' if ok else '>'} {floor.goal:g}x)"


def _floor_rows(metric: Metric, group: Group, gres: dict[str, Any], params: _Params) -> list[str]:
    floor = FLOORS.get(group.name)
    if floor is None or floor.metric != metric.key or "floor" not in gres:
        return []
    base = _floor_value(gres, floor)
    if base is None:
        notes = "; ".join(n.splitlines()[0] for n in gres["floor"].get("notes", []))
        return [f"| _{floor.title}_ | — | — | | {_cell(notes or 'not measured')} |"]
    ref_value = _value(gres["peers"], _ref_name(metric, group), metric.key)
    ratio = f"{_ratio(metric, base, ref_value):.2f}x" if ref_value else "—"
    data = gres["floor"]["metrics"][floor.key]
    note = f"{floor.detail.format_map(params)}; {_extra(metric, data)}"
    if "spin_median" in data:
        note += (f"; both sides polling without sleeping instead: {_fmt(metric, data['spin_median'])} "
                 f"{metric.unit} (p10–p90 {_fmt(metric, data['spin_p10'])}–{_fmt(metric, data['spin_p90'])})")
    met = f"dpool ÷ floor, project goal: {floor_verdict(floor, gres)[1]}"
    return [f"| _{floor.title}_ | {_fmt(metric, base)} | {ratio} | {_cell(met)} | {_cell(note)} |"]


def _metric_table(metric: Metric, group: Group, gres: dict[str, Any], params: _Params) -> list[str]:
    peers = gres["peers"]
    ref = _ref_name(metric, group)
    ref_value = _value(peers, ref, metric.key)
    out = [f"### {metric.title.format_map(params)}", "", f"_{metric.detail.format_map(params)}._  "]
    out.append(f"Reference: {DISPLAY[ref]}. Target: {targets_text(metric, group) or '—'}.")
    out += ["", f"| peer | {metric.unit} | {_ratio_header(metric, group)} | dpool meets target? | notes |"]
    out.append("|---|---:|---:|---|---|")
    for peer in group.peers:
        if peer not in peers:
            continue
        value = _value(peers, peer, metric.key)
        data = peers[peer].get("metrics", {}).get(metric.key, {})
        if value is None:
            fig, ratio, note = "—", "—", _why_missing(peers, peer, metric.key)
        else:
            fig = _fmt(metric, value)
            ratio = f"{_ratio(metric, value, ref_value):.2f}x" if ref_value and value else "—"
            note = _extra(metric, data)
        met = ""
        if peer == "dpool" and metric.targets:
            met = verdict(metric, group, peers)[1] if value is not None else "—"
        name = f"**{DISPLAY[peer]}**" if peer == "dpool" else DISPLAY[peer]
        out.append(f"| {name} | {fig} | {ratio} | {_cell(met)} | {_cell(note)} |")
    out += _floor_rows(metric, group, gres, params)
    return out + [""]


def _peer_table(group: Group, peers: dict[str, Any]) -> list[str]:
    out = ["| peer | version | status | wall (s) | load avg before | notes |", "|---|---|---|---:|---:|---|"]
    for peer in group.peers:
        if peer not in peers:
            continue
        rec = peers[peer]
        notes = "; ".join(n.splitlines()[0] for n in rec.get("notes", []))
        out.append(
            f"| {DISPLAY[peer]} | {_cell(str(rec.get('version', '—')))} | {rec.get('status')} | "
            f"{rec.get('wall_s', 0):.1f} | {rec.get('loadavg_1m_before', 0):.2f} | {_cell(notes)} |"
        )
    return out + [""]


def render(results: dict[str, Any]) -> str:
    mach = results["machine"]
    settings = results["settings"]
    params = _Params(settings["params"])
    pk = ", ".join(f"{k} {v}" for k, v in mach["packages"].items() if v)
    out = [
        "# dpool benchmark results",
        "",
        f"- date: {mach['date']}; mode: {'quick' if settings['quick'] else 'default'}; "
        f"{params['workers']} worker processes per peer",
        f"- machine: {mach['platform']}, {mach['cpu_count']} CPUs "
        f"(affinity {mach.get('cpu_affinity')}), {mach['memory_gb']} GB RAM",
        f"- Python {mach['python']}; {pk}",
        f"- load average (1/5/15 min) at start: {', '.join(f'{x:.2f}' for x in mach['loadavg_start'])}"
        + (f"; at end: {', '.join(f'{x:.2f}' for x in mach['loadavg_end'])}" if "loadavg_end" in mach else ""),
        "",
        "Generated by `python bench/run.py` — see bench/README.md. Figures are from one run on a "
        "possibly shared machine: compare peers within this run, not across runs.",
        "",
        "![latency distributions of every peer](latency.png)",
        "",
        "![throughput against the number of workers](workers.png)",
        "",
        ("`python bench/plots.py` draws them: the first from results.json, the second from "
         "workers.json (`python bench/workers.py`, a separate run)."),
        "",
        "## Summary: dpool against its targets",
        "",
        "| group | workload | target | dpool | met? |",
        "|---|---|---|---:|---|",
    ]
    for gname, gres in results["groups"].items():
        group = GROUPS[gname]
        for metric in group.metrics:
            if not metric.targets:
                continue
            value = _value(gres["peers"], "dpool", metric.key)
            fig = f"{_fmt(metric, value)} {metric.unit}" if value is not None else "—"
            _, text = verdict(metric, group, gres["peers"])
            out.append(
                f"| {gname} | {_cell(metric.title.format_map(params))} | {_cell(targets_text(metric, group))} "
                f"| {fig} | {_cell(text)} |"
            )
        floor = FLOORS.get(gname)
        if floor is not None and "floor" in gres:
            metric = next(x for x in group.metrics if x.key == floor.metric)
            base = _floor_value(gres, floor)
            value = _value(gres["peers"], "dpool", floor.metric)
            fig = (f"{_fmt(metric, value)} / {_fmt(metric, base)} {metric.unit}"
                   if base is not None and value is not None else "—")
            out.append(
                f"| {gname} | {_cell(metric.title.format_map(params))} ÷ {floor.title} | "
                f"dpool ≤ {floor.goal:g}x floor (project goal) | {fig} | "
                f"{_cell(floor_verdict(floor, gres)[1])} |"
            )
    out.append("")
    for gname, gres in results["groups"].items():
        group = GROUPS[gname]
        out += [f"## {group.title} — reference: {DISPLAY[group.reference]}", ""]
        out += _peer_table(group, gres["peers"])
        for metric in group.metrics:
            out += _metric_table(metric, group, gres, params)
    return "\n".join(out)


def main(argv: list[str]) -> int:
    src = Path(argv[0]) if argv else Path(__file__).resolve().parent / "results.json"
    results = json.loads(src.read_text())
    dest = src.with_name("RESULTS.md")
    dest.write_text(render(results))
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
