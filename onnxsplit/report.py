"""The comparison report (``onnxsplit compare --html``): one self-contained HTML page
(inline SVG, no script, no network) that answers at a glance:

- how far each method is from the optimum: every method's value as a bar, with the best
  proven lower bound drawn across them;
- which device does what: the operator graph in topological layers, coloured by device,
  tensors that cross devices in red with their bytes (or transfer time);
- where the time goes: per-device loads, a timeline of one sample through the devices
  (:func:`evaluate.schedule`) and, for throughput plans, the pipeline of a few samples.

Write-up: README.md (Workloads and solvers).
"""

from __future__ import annotations

import html
from typing import Any, Sequence

import numpy as np

from .plan import Plan
from .shapes import bytes_text
from .solve import evaluate
from .workload import Workload

ACC_COLORS = ("#2b6cb0", "#2f855a", "#6b46c1", "#b7791f", "#00838f", "#9c4221", "#2c5282", "#276749")
CPU_COLORS = ("#dd6b20", "#c53030", "#d53f8c", "#718096", "#975a16", "#e53e3e", "#b83280", "#4a5568")
NODE_W, NODE_H, GAP_X, GAP_Y = 16, 10, 14, 6


GENERATOR = '<meta name="generator" content="onnxsplit compare">'  # (marks a page it may replace)


def device_colors(workload: Workload) -> dict[str, str]:
    """A colour per device: the palettes' (cool for accelerators, warm for CPUs), then
    hues a golden angle apart, so that no two devices of a large plan share one."""
    out = {}
    for d in workload.devices:
        pal = ACC_COLORS if d.kind == "acc" else CPU_COLORS
        i = int(d.name[3:]) if d.name[3:].isdigit() else 0
        k = i - len(pal)
        out[d.name] = pal[i] if k < 0 else \
            f"hsl({(k * 137.5 + (200 if d.kind == 'acc' else 20)) % 360:.0f},55%,{42 + 12 * (k % 2)}%)"
    return out


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    return f"{v:.4g}{unit}"


# ------------------------------------------------------------------------------- methods


def methods_svg(rows: Sequence[dict], bound: float | None, width: int = 760) -> str:
    """One bar per method, the best proven bound as a dashed line."""
    plans = [(r["method"], r.get("plan"), r.get("error")) for r in rows]
    values = [p.value for _, p, _ in plans if p is not None and p.value is not None]
    top = max(values + ([bound] if bound else []), default=1.0) or 1.0
    if bound:  # bars past 3x the bound are cut (marked) so the close ones stay readable
        top = min(top, 3 * bound)
    label_w, bar_w, row_h = 130, width - 330, 22
    h = row_h * len(plans) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" class="methods">']
    for i, (method, plan, error) in enumerate(plans):
        y = 10 + i * row_h
        parts.append(f'<text x="0" y="{y + 14}" class="lbl">{esc(method)}</text>')
        if plan is None or plan.value is None:
            why = error or (plan.status if plan else "no plan")
            parts.append(f'<text x="{label_w}" y="{y + 14}" class="muted">{esc(why)[:90]}</text>')
            continue
        w = max(1.0, bar_w * min(plan.value, top) / top)
        cut = plan.value > top
        bad = plan.details.get("violations")
        color = "#a0aec0" if bad else ("#2f855a" if bound and plan.value <= bound * (1 + 1e-6) else "#3182ce")
        over = f"+{plan.value / bound - 1:.1%}" if bound else ""
        note = " (breaks constraints)" if bad else ""
        parts.append(f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" fill="{color}">'
                     f'<title>{esc(method)}: {plan.value:.6g} ({plan.status}){esc(note)}</title></rect>')
        if cut:
            parts.append(f'<text x="{label_w + w - 10:.1f}" y="{y + 14}" class="inbar">&#187;</text>')
        parts.append(f'<text x="{label_w + w + 6:.1f}" y="{y + 14}" class="val">{plan.value:.5g} '
                     f'{over} {esc(plan.status)}{esc(note)}</text>')
    if bound:
        x = label_w + bar_w * bound / top
        parts.append(f'<line x1="{x:.1f}" y1="4" x2="{x:.1f}" y2="{h - 14}" class="bound"/>')
        parts.append(f'<text x="{x + 3:.1f}" y="{h - 2}" class="muted">best proven bound {bound:.5g}</text>')
    parts.append("</svg>")
    return "".join(parts)


# ------------------------------------------------------------------------------ the graph


def _layers(workload: Workload, inside: np.ndarray) -> np.ndarray:
    level = np.zeros(workload.n, dtype=np.int64)
    for v in workload.topological_order:
        for u in workload.predecessors[v]:
            if inside[u]:
                level[v] = max(level[v], level[u] + 1)
    return level


def graph_svg(workload: Workload, assignment: dict[int, str], colors: dict[str, str],
              max_labels: int = 40, nodes=None) -> str:
    """Operators in topological layers (left to right), coloured by device; edges that
    cross devices in red, the largest labelled with the bytes (or ms) they move.
    ``nodes`` (indices): draw those alone (one group of a large model), a node that
    exchanges a tensor with another device outside them outlined in red."""
    dev = evaluate.device_array(workload, assignment)
    names = [d.name for d in workload.devices]
    inside = np.ones(workload.n, dtype=bool)
    if nodes is not None:
        inside[:] = False
        inside[np.asarray(list(nodes), dtype=np.int64)] = True
    level = _layers(workload, inside)
    slot = np.zeros(workload.n, dtype=np.int64)
    count: dict[int, int] = {}
    for v in workload.topological_order:
        if inside[v]:
            slot[v] = count.get(int(level[v]), 0)
            count[int(level[v])] = slot[v] + 1
    x = level * (NODE_W + GAP_X) + 10
    y = slot * (NODE_H + GAP_Y) + 10
    width = int(x[inside].max(initial=0)) + NODE_W + 20
    height = int(y[inside].max(initial=0)) + NODE_H + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" class="graph">']
    cut = []
    outlined = set()
    for e, s, t in zip(workload.edges, workload.edge_src, workload.edge_dst):
        crossing = dev[s] != dev[t]
        if not (inside[s] and inside[t]):
            if crossing:
                outlined.update(v for v in (s, t) if inside[v])
            continue
        x1, y1 = x[s] + NODE_W, y[s] + NODE_H / 2
        x2, y2 = x[t], y[t] + NODE_H / 2
        cls = "cut" if crossing else "edge"
        parts.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" class="{cls}"/>')
        if crossing:
            nbytes = (e.extra or {}).get("bytes")
            cut.append((nbytes if nbytes is not None else e.cost, nbytes is not None, x1, y1, x2, y2))
    for amount, is_bytes, x1, y1, x2, y2 in sorted(cut, key=lambda c: -c[0])[:max_labels]:
        label = bytes_text(amount) if is_bytes else f"{amount:.3g} ms"
        parts.append(f'<text x="{(x1 + x2) / 2:.1f}" y="{(y1 + y2) / 2 - 2:.1f}" class="cutlbl">'
                     f'{esc(label)}</text>')
    for v in np.flatnonzero(inside):
        nd = workload.nodes[v]
        d = names[dev[v]]
        op = (nd.extra or {}).get("opType", "")
        tip = (f"{nd.name or nd.id} {op} on {d}: cpu {nd.cpu_latency:.4g} ms, acc "
               f"{nd.acc_latency:.4g} ms{'' if nd.supported else ' (CPU only)'}")
        edge = ' stroke="#e53e3e" stroke-width="2"' if v in outlined else ""
        parts.append(f'<rect x="{x[v]}" y="{y[v]}" width="{NODE_W}" height="{NODE_H}" rx="2" '
                     f'fill="{colors[d]}"{edge}><title>{esc(tip)}</title></rect>')
    parts.append("</svg>")
    return "".join(parts)


# ------------------------------------------------------------------------------ timelines


def _gantt(rows: list[str], bars: list[tuple[str, float, float, str, str]], total: float,
           colors: dict[str, str], width: int = 900) -> str:
    """bars: (row, start, end, kind "compute"|"transfer", label).  Rows are narrower where
    there are many (a plan on many cores stays within the page's screens)."""
    label_w, row_h = 70, (26 if len(rows) <= 8 else 16)
    pad = row_h // 6
    scale = (width - label_w - 20) / total if total > 0 else 1.0
    h = row_h * len(rows) + 34
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" class="gantt">']
    index = {r: i for i, r in enumerate(rows)}
    for r, i in index.items():
        out.append(f'<text x="0" y="{i * row_h + 0.7 * row_h:.0f}" class="lbl">{esc(r)}</text>')
        out.append(f'<line x1="{label_w}" y1="{i * row_h + row_h - 2}" x2="{width - 10}" '
                   f'y2="{i * row_h + row_h - 2}" class="edge"/>')
    for row, a, b, kind, label in bars:
        i = index[row]
        w = max(1.0, (b - a) * scale)
        fill = colors.get(row, "#718096") if kind == "compute" else "#e2e8f0"
        out.append(f'<rect x="{label_w + a * scale:.1f}" y="{i * row_h + pad}" width="{w:.1f}" '
                   f'height="{row_h - 2 * pad}" fill="{fill}" stroke="#2d3748" stroke-width="0.3">'
                   f'<title>{esc(label)}: {a:.4g}-{b:.4g} ms</title></rect>')
        if w > 40:
            out.append(f'<text x="{label_w + a * scale + 3:.1f}" y="{i * row_h + 0.65 * row_h:.0f}" '
                       f'class="inbar">{esc(label)[:int(w / 6)]}</text>')
    for t in np.linspace(0, total, 6):
        xx = label_w + t * scale
        out.append(f'<text x="{xx:.1f}" y="{h - 4}" class="muted">{t:.3g} ms</text>')
    out.append("</svg>")
    return "".join(out)


def sample_timeline_svg(workload: Workload, plan: Plan, colors: dict[str, str], width: int = 900) -> str:
    """One sample through the devices: each call, with its transfers in and out."""
    serial = plan.objective == "throughput"
    calls = evaluate.schedule(workload, plan.assignment, plan.pieces or None, serial_cpus=serial)
    used = list(dict.fromkeys(c.device for c in calls))
    bars = []
    for c in calls:
        what = f"{c.device}: {len(c.nodes)} operator{'s' if len(c.nodes) > 1 else ''}"
        if c.compute_start > c.start:
            bars.append((c.device, c.start, c.compute_start, "transfer", "inputs in"))
        bars.append((c.device, c.compute_start, c.compute_end, "compute", what))
        if c.finish > c.compute_end:
            bars.append((c.device, c.compute_end, c.finish, "transfer", "outputs out"))
    total = max((c.finish for c in calls), default=0.0)
    return _gantt(used, bars, total, colors, width)


def pipeline_timeline_svg(workload: Workload, plan: Plan, colors: dict[str, str],
                          samples: int = 4, width: int = 900) -> str:
    """Steady state of a throughput plan: stage s works on sample j in slot j + s of length
    max load (the period), for its own load."""
    loads = evaluate.max_load(workload, plan.assignment).loads
    used = set(plan.assignment.values())
    # (a plan without stages, a user's say: its devices in the order the graph reaches them)
    first = [workload.ids[v] for v in workload.topological_order]
    stages = [d for d in (plan.stages or dict.fromkeys(plan.assignment[int(i)] for i in first)) if d in used]
    period = max((loads[d] for d in stages), default=0.0)
    bars = []
    for j in range(samples):
        for s, d in enumerate(stages):
            start = (j + s) * period
            bars.append((d, start, start + loads[d], "compute", f"sample {j + 1}"))
    total = (samples + len(stages) - 1) * period
    return _gantt(stages, bars, total, colors, width)


def loads_table(workload: Workload, plan: Plan, colors: dict[str, str]) -> str:
    loads = evaluate.max_load(workload, plan.assignment).loads
    counts: dict[str, int] = {}
    for d in plan.assignment.values():
        counts[d] = counts.get(d, 0) + 1
    top = max(loads.values(), default=1.0) or 1.0
    rows = []
    for d in workload.devices:
        if d.name not in counts:
            continue
        w = 300 * loads[d.name] / top
        rows.append(f'<tr><td><span class="sw" style="background:{colors[d.name]}"></span>{esc(d.name)}</td>'
                    f'<td class="r">{counts[d.name]}</td><td class="r">{loads[d.name]:.4g}</td>'
                    f'<td><svg width="310" height="12"><rect width="{w:.1f}" height="12" '
                    f'fill="{colors[d.name]}"/></svg></td></tr>')
    idle = [d.name for d in workload.devices if d.name not in counts]
    foot = f'<p class="muted">idle: {esc(", ".join(idle))}</p>' if idle else ""
    return ('<table><tr><th>device</th><th>operators</th><th>load ms</th><th></th></tr>'
            + "".join(rows) + "</table>" + foot)


# ---------------------------------------------------------------------------------- page


CSS = """
body{font:14px system-ui,sans-serif;margin:24px;color:#1a202c;max-width:1400px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px}
.muted{fill:#718096;color:#718096;font-size:12px} .lbl{font-size:13px;fill:#1a202c}
.val{font-size:12px;fill:#2d3748} .inbar{font-size:11px;fill:#fff}
.bound{stroke:#e53e3e;stroke-width:1.5;stroke-dasharray:4 3}
.edge{stroke:#cbd5e0;stroke-width:0.6} .cut{stroke:#e53e3e;stroke-width:1.6}
.cutlbl{font-size:9px;fill:#c53030}
.scroll{overflow:auto;border:1px solid #e2e8f0;max-height:520px}
table{border-collapse:collapse} td,th{padding:2px 10px;text-align:left} .r{text-align:right}
.sw{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:middle}
.legend span{margin-right:14px} .summary{font-size:15px}
"""


def render(workload: Workload, rows: Sequence[dict], objective: str, bound: float | None,
           drawn: Plan, title: str = "onnxsplit comparison") -> str:
    """The whole page; ``rows`` as :func:`onnxsplit.api.compare` returns them, ``drawn`` the
    plan whose placement and timelines are drawn."""
    colors = device_colors(workload)
    used = sorted(set(drawn.assignment.values()), key=lambda d: [x.name for x in workload.devices].index(d))
    legend = "".join(f'<span><span class="sw" style="background:{colors[d]}"></span>{esc(d)}</span>'
                     for d in used)
    unit = "ms per sample (max load)" if objective == "throughput" else "ms (latency)"
    good = [r for r in rows if r.get("plan") is not None and r["plan"].value is not None
            and not r["plan"].details.get("violations")]
    others = ", ".join(f"{r['method']} {r['plan'].value / bound - 1:+.1%}" for r in good
                       if bound and r["plan"] is not drawn)
    gap = f"; {drawn.value / bound - 1:+.1%} above the best proven bound {bound:.5g}" if bound else ""
    summary = (f"Drawn: <b>{esc(drawn.method)}</b>, {drawn.value:.5g} {unit} ({esc(drawn.status)}){gap}."
               + (f" Others vs the bound: {esc(others)}." if others else ""))
    pipeline = ""
    if objective == "throughput":
        pipeline = ("<h2>Pipeline, steady state</h2><p class='muted'>Each stage works on one sample "
                    "per period (the max load); a stage below the max load idles.</p>"
                    + pipeline_timeline_svg(workload, drawn, colors))
    memory = f" (memory {bytes_text(workload.accelerator_memory)} each)" if workload.num_accelerators else ""
    serial = ("each core runs its part serially" if objective == "throughput"
              else "the paper's model: CPU operators run in parallel, each accelerator piece is one call")
    return f"""<!doctype html><html><head><meta charset="utf-8">{GENERATOR}<title>{esc(title)}</title>
<style>{CSS}</style></head><body>
<h1>{esc(title)}</h1>
<p class="muted">{objective}: {workload.n} operators, {esc(workload.device_summary())}{memory}</p>
<p class="summary">{summary}</p>
<h2>Methods against the best proven bound ({unit})</h2>
{methods_svg(rows, bound)}
<h2>Placement: {esc(drawn.method)}</h2>
<p class="legend">{legend} <span style="color:#c53030">red: tensors crossing devices</span></p>
<div class="scroll">{graph_svg(workload, drawn.assignment, colors)}</div>
<h2>Where the time goes</h2>
{loads_table(workload, drawn, colors)}
<h2>One sample through the devices</h2><p class="muted">{serial}; grey: transfers</p>
{sample_timeline_svg(workload, drawn, colors)}
{pipeline}
</body></html>
"""


def best_plan(rows: Sequence[dict]) -> Plan | None:
    """The lowest-valued plan that breaks nothing."""
    good = [r["plan"] for r in rows if r.get("plan") is not None and r["plan"].value is not None
            and r["plan"].status != "infeasible" and not r["plan"].details.get("violations")]
    return min(good, key=lambda p: p.value) if good else None
