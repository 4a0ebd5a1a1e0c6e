"""``report.html`` in a parts folder: the plan drawn so that a person can judge it.

One self-contained page (inline SVG and CSS, no script, no network), readable at any
model size because it draws the model by its own structure (:mod:`onnxsplit.hierarchy`),
a screenful of groups, each with its devices' share of its time, its time, its weights
and the tensors cut at its edges with their bytes; a group opens (``<details>``, no
script) onto its operators.  Above it: what was weighed and why this plan won, each
device's share of the time and its memory against its limit; below it, the timelines of
one sample and of a few pipelined samples (:mod:`onnxsplit.report`'s).  The section
between :data:`MEASURED_START` and :data:`MEASURED_END` is what ``run --report`` redraws
with what it measured (:mod:`onnxsplit.measured_report`).

It needs a Workload and a Plan only, so a workload without an ONNX model is drawn too.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from . import hierarchy, machine
from .plan import Plan
from .report import CSS as COMPARE_CSS, esc, device_colors, graph_svg, pipeline_timeline_svg, \
    sample_timeline_svg
from .shapes import bytes_text
from .solve import evaluate
from .workload import Workload

REPORT = "report.html"
GENERATOR = '<meta name="generator" content="onnxsplit parts report">'
MEASURED_START, MEASURED_END = "<!-- measured -->", "<!-- /measured -->"
NODE_VIEW_MOST = 300  # a group of more operators opens onto its subgroups, not its operators
NODE_VIEW_BUDGET = 2500  # operators drawn one by one in the whole page, groups with cuts first
CUTS_LISTED = 2  # cut tensors named in a group's row each way (all of them when it opens)
BAR_W = 200
NO_LIMIT = 1e15  # bytes: a memory limit this large is none (workloads spell "unlimited" so)

CSS = COMPARE_CSS + """
.grid{display:grid;grid-template-columns:minmax(180px,250px) 70px 340px 70px 90px 1fr;
 column-gap:10px;align-items:center}
.rows summary{list-style:none;cursor:pointer;padding:1px 0;border-bottom:1px solid #edf2f7}
.rows summary::-webkit-details-marker{display:none}
.rows summary:hover{background:#f7fafc}
.rows .head{font-weight:600;border-bottom:1px solid #a0aec0}
.rows .name{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.rows summary .name::before{content:"\\25B8 ";color:#a0aec0} details[open]>summary .name::before{content:"\\25BE "}
.rows .cuts{font-size:12px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;color:#c53030}
.rows .share{font-size:12px;white-space:nowrap;overflow:hidden}
.rows .bar{white-space:nowrap;overflow:hidden}
.rows .body{margin:4px 0 10px 18px;padding-left:8px;border-left:2px solid #e2e8f0}
.flex{display:flex;gap:24px;flex-wrap:wrap} .flex>div{flex:1 1 560px}
.small{font-size:12px} td.name{max-width:420px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.chosen{font-weight:600;background:#f0fff4} h3{font-size:14px;margin:16px 0 6px}
"""


@dataclass
class _Cut:
    tensor: str
    src: int  # node index
    dst_device: str
    src_device: str
    bytes: float | None
    ms: float

    def sized(self) -> str:
        """Its name and bytes (its transfer time where the workload has no bytes)."""
        return f"{self.tensor} {bytes_text(self.bytes) if self.bytes is not None else f'{self.ms:.3g} ms'}"

    def text(self) -> str:
        return f"{self.sized()} {self.src_device}→{self.dst_device}"


class _Facts:
    """What the page says of any set of nodes: times, weights, devices, cuts."""

    def __init__(self, workload: Workload, plan: Plan):
        self.w = workload
        self.assignment = plan.assignment
        self.dev = evaluate.device_array(workload, plan.assignment)
        self.names = [d.name for d in workload.devices]
        self.ms = machine.node_times(workload, plan.assignment)
        self.weights = np.array([float((n.extra or {}).get("weightBytes", n.size)) for n in workload.nodes])
        cuts: dict[tuple, _Cut] = {}
        self.cut_in: dict[int, list[_Cut]] = {}
        for e, s, t in zip(workload.edges, workload.edge_src, workload.edge_dst):
            if self.dev[s] == self.dev[t]:
                continue
            extra = e.extra or {}
            tensors = extra.get("tensors") or [workload.nodes[s].name or str(workload.nodes[s].id)]
            sizes = extra.get("tensorBytes") or (  # (an edge's bytes, where it does not say each's)
                [extra["bytes"] / len(tensors)] * len(tensors) if extra.get("bytes") is not None else None)
            for k, name in enumerate(tensors):
                key = (int(s), name, int(self.dev[t]))
                if key not in cuts:  # a tensor moves once to each device that reads it
                    cuts[key] = _Cut(name, int(s), self.names[self.dev[t]], self.names[self.dev[s]],
                                     None if sizes is None else float(sizes[k]), e.cost / len(tensors))
                self.cut_in.setdefault(int(t), []).append(cuts[key])
        self.cut_out: dict[int, list[_Cut]] = {}
        for c in cuts.values():
            self.cut_out.setdefault(c.src, []).append(c)

    def cuts(self, nodes: Sequence[int]) -> tuple[list[_Cut], list[_Cut]]:
        """Tensors cut that ``nodes`` make (out), and that they read from outside (in)."""
        inside = set(nodes)
        out = [c for v in nodes for c in self.cut_out.get(v, [])]
        seen, into = set(), []
        for v in nodes:
            for c in self.cut_in.get(v, []):
                if c.src not in inside and id(c) not in seen:
                    seen.add(id(c))
                    into.append(c)
        return out, into

    def per_device(self, nodes: Sequence[int]) -> dict[str, tuple[int, float]]:
        idx = np.asarray(nodes, dtype=np.int64)
        out = {}
        for d in np.unique(self.dev[idx]):
            mine = idx[self.dev[idx] == d]
            out[self.names[d]] = (len(mine), float(self.ms[mine].sum()))
        return out


def _share_bar(per: Mapping[str, tuple[int, float]], colors: Mapping[str, str], width: int = 150) -> str:
    """A stacked bar of each device's share of a group's time (of its operators where
    they take no time)."""
    total = sum(ms for _, ms in per.values())
    count = sum(n for n, _ in per.values())
    shares = {d: (ms / total if total > 0 else n / max(count, 1)) for d, (n, ms) in per.items()}
    x, rects = 0.0, []
    for d, s in sorted(shares.items(), key=lambda kv: -kv[1]):
        w = width * s
        rects.append(f'<rect x="{x:.1f}" width="{max(w, 0.5):.1f}" height="12" fill="{colors[d]}">'
                     f'<title>{esc(d)}: {s:.0%} of the time, {per[d][0]} operators</title></rect>')
        x += w
    text = " · ".join(f"{d} {s:.0%}" for d, s in sorted(shares.items(), key=lambda kv: -kv[1])[:3])
    more = f" +{len(shares) - 3}" if len(shares) > 3 else ""
    return (f'<svg width="{width}" height="12">{"".join(rects)}</svg> '
            f'<span class="share">{esc(text)}{more}</span>')


def _cuts_text(out: list[_Cut], into: list[_Cut], most: int = CUTS_LISTED) -> str:
    parts = []
    for arrow, cuts in (("out", out), ("in", into)):
        if not cuts:
            continue
        named = ", ".join(c.text() for c in cuts[:most])
        more = f" +{len(cuts) - most} more" if len(cuts) > most else ""
        parts.append(f"{arrow}: {named}{more}")
    return "; ".join(parts)


# ------------------------------------------------------------------------------ the groups


def _node_views(groups: Sequence[hierarchy.Group], facts: _Facts) -> set[int]:
    """The groups (by id) drawn operator by operator: those of at most NODE_VIEW_MOST
    operators (a larger one opens onto its subgroups), cut ones first, within
    NODE_VIEW_BUDGET operators in all."""
    found: list[hierarchy.Group] = []

    def walk(gs):
        for g in gs:
            if len(g.nodes) <= NODE_VIEW_MOST:
                found.append(g)
            else:
                walk(g.children)

    walk(groups)
    cut = {id(g): any(facts.cut_out.get(v) or facts.cut_in.get(v) for v in g.nodes) for g in found}
    chosen, used = set(), 0
    for g in sorted(found, key=lambda g: (not cut[id(g)], g.first)):
        if used + len(g.nodes) <= NODE_VIEW_BUDGET:
            chosen.add(id(g))
            used += len(g.nodes)
    return chosen


def _node_table(nodes: Sequence[int], facts: _Facts, colors: Mapping[str, str]) -> str:
    w = facts.w
    rows = []
    for v in nodes:
        nd, d = w.nodes[v], facts.names[facts.dev[v]]
        op = (nd.extra or {}).get("opType", "")
        rows.append(f'<tr><td class="name" title="{esc(nd.name)}">{esc(nd.name or nd.id)}</td>'
                    f'<td>{esc(op)}</td><td><span class="sw" style="background:{colors[d]}"></span>{d}</td>'
                    f'<td class="r">{facts.ms[v]:.3g}</td><td class="r">{bytes_text(facts.weights[v])}</td></tr>')
    return ('<table class="small"><tr><th>operator</th><th>type</th><th>device</th><th>ms</th>'
            '<th>weights</th></tr>' + "".join(rows) + "</table>")


def _row(g: hierarchy.Group, facts: _Facts, colors, views: set[int], depth: int) -> str:
    per = facts.per_device(g.nodes)
    out, into = facts.cuts(g.nodes)
    ms = sum(t for _, t in per.values())
    summary = (f'<summary class="grid"><span class="name" title="{esc(g.path)}">{esc(g.name)}</span>'
               f'<span class="r">{len(g.nodes)}</span><span class="bar">{_share_bar(per, colors)}</span>'
               f'<span class="r">{ms:.3g}</span><span class="r">{bytes_text(facts.weights[g.nodes].sum())}</span>'
               f'<span class="cuts" title="{esc(_cuts_text(out, into, 8))}">{esc(_cuts_text(out, into))}</span>'
               "</summary>")
    body = []
    if out or into:
        listed = [("leaving", c) for c in out[:50]] + [("entering", c) for c in into[:50]]
        more = len(out) + len(into) - len(listed)
        body.append('<p class="small">Cut tensors: ' + "; ".join(f"{k} {esc(c.text())}" for k, c in listed)
                    + (f"; and {more} more" if more > 0 else "") + "</p>")
    if id(g) in views:
        body.append(f'<div class="scroll">{graph_svg(facts.w, facts.assignment, colors, 12, g.nodes)}</div>')
        body.append(_node_table(g.nodes, facts, colors))
    elif g.children and len(g.nodes) > NODE_VIEW_MOST and depth < 4:
        body.append(_rows(g.children, facts, colors, views, depth + 1, head=False))
    else:
        why = (f"more than {NODE_VIEW_MOST} operators" if len(g.nodes) > NODE_VIEW_MOST else
               f"the page draws at most {NODE_VIEW_BUDGET} operators one by one, groups with cut "
               "tensors first")
        body.append(f'<p class="muted">Operators not drawn one by one here ({why}); plan.json lists '
                    "every operator's device.</p>")
    return f'<details>{summary}<div class="body">{"".join(body)}</div></details>'


def _rows(groups, facts: _Facts, colors, views: set[int], depth: int = 0, head: bool = True) -> str:
    top = ('<div class="grid head"><span>group</span><span class="r">operators</span>'
           '<span>device share of its time</span><span class="r">ms</span><span class="r">weights</span>'
           '<span>cut tensors (out / in, with bytes)</span></div>') if head else ""
    return f'<div class="rows">{top}{"".join(_row(g, facts, colors, views, depth) for g in groups)}</div>'


def structure_section(facts: _Facts, colors: Mapping[str, str]) -> str:
    """The plan on the model's own structure: a screenful of groups that open."""
    workload = facts.w
    names = [n.name or str(n.id) for n in workload.nodes]
    kinds = [str((n.extra or {}).get("opType") or _kind_from_name(n.name)) for n in workload.nodes]
    edges = list(zip(workload.edge_src.tolist(), workload.edge_dst.tolist()))
    used = len(set(facts.assignment.values()))  # (each device past 8 takes rows above: fewer groups)
    most = max(hierarchy.MOST_GROUPS - 2 * max(used - 8, 0), hierarchy.MOST_GROUPS // 2)
    how, groups = hierarchy.group_nodes(names, kinds, edges, workload.topological_order, most)
    views = _node_views(groups, facts)
    return (f'<h2>The plan on the model\'s structure</h2><p class="muted">{workload.n} operators in '
            f'{len(groups)} groups, by {esc(how)}; ms: the operators\' own time on their devices '
            "(transfers apart). Open a group for its cut tensors and its operators, drawn one by one "
            f"where it has at most {NODE_VIEW_MOST} (at most {NODE_VIEW_BUDGET} in the page, groups "
            "with cut tensors first).</p>" + _rows(groups, facts, colors, views))


def _kind_from_name(name: str | None) -> str:
    """An operator's kind from a name without an op type (paper workloads): its last part,
    numbers removed."""
    return re.sub(r"\d+", "", (name or "").replace("/", ".").rsplit(".", 1)[-1])


# ----------------------------------------------------------------------------- the devices


def devices_section(facts: _Facts, plan: Plan, colors: Mapping[str, str]) -> str:
    """Each device's share of the work and of the memory, and its memory against its limit."""
    workload, dev, ms = facts.w, facts.dev, facts.ms
    loads = evaluate.max_load(workload, plan.assignment).loads
    total = float(ms.sum()) or 1.0
    total_memory = float(workload.size.sum()) or 1.0
    used = [d for d in workload.devices if (dev == d.index).any()]
    rows = []
    for d in used:
        mine = dev == d.index
        share = float(ms[mine].sum()) / total
        memory = float(workload.size[mine].sum())
        cls = int(workload.device_class[d.index])
        limit = float(workload.class_memory[cls]) if cls >= 0 else 0.0
        mem = f"{bytes_text(memory)}, {memory / total_memory:.0%} of all"
        if 0 < limit < NO_LIMIT:
            frac = memory / limit
            fill = "#e53e3e" if frac > 1 else colors[d.name]
            mem = (f'<svg width="{BAR_W}" height="12"><rect width="{BAR_W}" height="12" fill="#edf2f7"/>'
                   f'<rect width="{BAR_W * min(frac, 1):.1f}" height="12" fill="{fill}"/></svg> '
                   f'{mem}; {frac:.0%} of its {bytes_text(limit)}')
        else:
            mem += ' <span class="muted">(no limit in the plan: host memory)</span>'
        rows.append(f'<tr><td><span class="sw" style="background:{colors[d.name]}"></span>{esc(d.name)}</td>'
                    f'<td>{"accelerator" if d.kind == "acc" else "CPU"}</td><td class="r">{int(mine.sum())}</td>'
                    f'<td><svg width="{BAR_W}" height="12"><rect width="{BAR_W}" height="12" fill="#edf2f7"/>'
                    f'<rect width="{BAR_W * share:.1f}" height="12" fill="{colors[d.name]}"/></svg> {share:.0%}</td>'
                    f'<td class="r">{loads[d.name]:.4g}</td><td>{mem}</td></tr>')
    idle = [d.name for d in workload.devices if d not in used]
    copies = int((plan.details.get("execution") or {}).get("replicas") or 1)
    foot = (f'<p class="muted">run as {copies} copies side by side, each as drawn</p>' if copies > 1 else
            f'<p class="muted">idle: {esc(", ".join(idle))}</p>' if idle else "")
    return ('<h2>Devices</h2><table><tr><th>device</th><th>kind</th><th>operators</th>'
            '<th>share of the work</th><th>load ms</th><th>memory (weights and activations): its share, '
            'against its limit</th></tr>' + "".join(rows) + "</table>" + foot)


CUT_PAIRS = 8  # device pairs listed at the top; the groups name every cut tensor


def cuts_section(facts: _Facts) -> str:
    """The tensors that cross devices, by pair of devices: how many, how much, the largest."""
    pairs: dict[tuple[str, str], list[_Cut]] = {}
    for cuts in facts.cut_out.values():
        for c in cuts:
            pairs.setdefault((c.src_device, c.dst_device), []).append(c)
    if not pairs:
        return ""

    def size(c: _Cut) -> float:
        return c.bytes if c.bytes is not None else c.ms

    def amount(cuts: list[_Cut]) -> str:
        if all(c.bytes is not None for c in cuts):
            return bytes_text(sum(c.bytes for c in cuts))
        return f"{sum(c.ms for c in cuts):.3g} ms"

    ranked = sorted(pairs.items(), key=lambda kv: -sum(size(c) for c in kv[1]))
    rows = []
    for (a, b), cuts in ranked[:CUT_PAIRS]:
        largest = sorted(cuts, key=lambda c: -size(c))[:3]
        named = ", ".join(c.sized() for c in largest)
        rows.append(f"<tr><td>{esc(a)} → {esc(b)}</td><td class=\"r\">{len(cuts)}</td><td class=\"r\">"
                    f"{amount(cuts)}</td><td class=\"small\">{esc(named)}"
                    f"{f' and {len(cuts) - 3} more' if len(cuts) > 3 else ''}</td></tr>")
    more = f'<p class="muted">and {len(ranked) - CUT_PAIRS} more pairs of devices</p>' if len(ranked) > CUT_PAIRS else ""
    return ('<h2>Tensors crossing devices</h2><table><tr><th>from → to</th><th>tensors</th><th>in all</th>'
            '<th>the largest (every one is named in its group below)</th></tr>' + "".join(rows) + "</table>" + more)


# ------------------------------------------------------------------- what was weighed


def _said(predicted: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    p = predicted or {}
    return p.get("throughput_per_s"), p.get("latency_ms")


def weighed_section(workload: Workload, plan: Plan, predicted: Mapping[str, Any] | None) -> str:
    """The candidates the main command weighed, best first, the written one marked, and
    why it won."""
    why = plan.details.get("why") or ""
    tput, lat = _said(predicted)
    if tput is None:  # a plan drawn from a workload alone: the evaluator's figures
        value = evaluate.max_load(workload, plan.assignment).value
        tput, lat = (1e3 / value if value > 0 else None,
                     evaluate.latency(workload, plan.assignment, plan.pieces or None).value)
    head = (f'<p class="summary">Plan: <b>{esc(plan.method)}</b> for {esc(plan.objective)} '
            f'({esc(plan.status)}), predicted <b>{tput:.4g} samples/s</b> pipelined, '
            f'<b>{lat:.4g} ms</b> for one sample'
            + (f", {plan.gap:.1%} from the best bound" if plan.gap is not None else "") + ".</p>"
            if tput is not None and lat is not None else "")
    if why:
        head += f'<p class="small">Why: {esc(why)}</p>'
    cands = plan.details.get("candidates") or []
    if not cands:
        return '<h2>The plan</h2>' + head
    said = (predicted or {}).get("profile") or predicted or {}
    top = max((c.get("throughput_per_s") or 0 for c in cands), default=1.0) or 1.0
    chosen = next((i for i, c in enumerate(cands) if why.startswith(c["what"])), None)
    if chosen is None:
        chosen = next((i for i, c in enumerate(cands)
                       if _close(c.get("throughput_per_s"), said.get("throughput_per_s"))
                       and _close(c.get("latency_ms"), said.get("latency_ms"))), None)
    rows = []
    for i, c in enumerate(cands):
        t = c.get("throughput_per_s") or 0.0
        rows.append(f'<tr class="{"chosen" if i == chosen else ""}"><td>{"&#10003;" if i == chosen else ""}</td>'
                    f'<td class="r">{t:.4g}</td><td class="r">{c.get("latency_ms") or 0:.4g}</td>'
                    f'<td><svg width="{BAR_W}" height="12"><rect width="{BAR_W * t / top:.1f}" height="12" '
                    f'fill="{"#2f855a" if i == chosen else "#a0aec0"}"/></svg></td>'
                    f'<td class="small">{esc(c["what"])}</td></tr>')
    return ('<h2>What was weighed</h2>' + head +
            '<table><tr><th></th><th>samples/s</th><th>ms</th><th></th><th>candidate (predicted before '
            'any was written; &#10003;: written)</th></tr>' + "".join(rows) + "</table>")


def _close(a, b) -> bool:
    return a is not None and b is not None and abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-12)


# ---------------------------------------------------------------------------------- page


def measured_placeholder() -> str:
    return (f'{MEASURED_START}<h2>Measured</h2><p class="muted">Not measured yet: '
            f'<code>onnxsplit run PARTS --report</code> adds the measured times of each part and of '
            f'what a user would run instead beside the prediction.</p>{MEASURED_END}')


def render(workload: Workload, plan: Plan, *, title: str, predicted: Mapping[str, Any] | None = None,
           measured: str | None = None) -> str:
    """The whole page (``measured``: the section ``run --report`` draws, else a note)."""
    colors = device_colors(workload)
    facts = _Facts(workload, plan)
    pipeline = ""
    if plan.objective == "throughput" and len(set(plan.assignment.values())) > 1:
        pipeline = ('<div><h2>A few samples, pipelined</h2><p class="muted">each device works on one '
                    'sample per period (the max load)</p>'
                    + pipeline_timeline_svg(workload, plan, colors, width=600) + "</div>")
    return f"""<!doctype html><html><head><meta charset="utf-8">{GENERATOR}<title>{esc(title)}</title>
<style>{CSS}</style></head><body>
<h1>{esc(title)}</h1>
<p class="muted">{esc(plan.objective)}: {workload.n} operators, {esc(workload.device_summary())}</p>
{weighed_section(workload, plan, predicted)}
{measured or measured_placeholder()}
{devices_section(facts, plan, colors)}
{cuts_section(facts)}
{structure_section(facts, colors)}
<div class="flex"><div><h2>One sample through the devices</h2><p class="muted">predicted; grey: transfers</p>
{sample_timeline_svg(workload, plan, colors, width=600)}</div>{pipeline}</div>
</body></html>
"""


def write(folder: str | Path, workload: Workload, plan: Plan, *, title: str,
          predicted: Mapping[str, Any] | None = None, quiet: bool = False) -> bool:
    """Write ``report.html`` into ``folder`` (a staged parts folder); a report that fails
    to render never fails the split, and says so in one line on stderr."""
    try:
        page = render(workload, plan, title=title, predicted=predicted)
        (Path(folder) / REPORT).write_text(page, encoding="utf-8")
        return True
    except Exception as e:  # (the parts are good without their picture)
        print(f"onnxsplit: warning: report.html not written ({type(e).__name__}: {e})", file=sys.stderr)
        return False
