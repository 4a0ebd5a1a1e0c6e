"""``run --report``: what ``run`` measured, drawn beside the prediction in the folder's
``report.html``.

A prediction is trusted once it has been seen to hold, so the page puts each part's
measured time beside the time it was predicted to take (paired bars, the gap in
percent), the plan's throughput and latency beside their promise, and the sessions a
user would run instead as measured in the same run beside the calibration's figures
for them.  Only the section between the page's markers (:data:`parts_report.MEASURED_START`
and ``MEASURED_END``) is redrawn, the file replaced in one step; a ``report.html`` that
onnxsplit did not write is never touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .errors import OnnxsplitError
from .files import write_atomic
from .parts_report import CSS, GENERATOR, MEASURED_END, MEASURED_START, REPORT
from .report import esc

BAR_W = 260
MISSED = 0.2  # a gap this large (either way) is drawn in red


def _gap(measured: float, predicted: float) -> str:
    d = measured / predicted - 1
    cls = ' style="color:#c53030;font-weight:600"' if abs(d) > MISSED else ""
    return f"<td class=\"r\"{cls}>{d:+.0%}</td>"


def _pair(predicted: float | None, measured: float | None, top: float) -> str:
    """Two bars, predicted (grey) over measured (blue)."""
    out = [f'<svg width="{BAR_W}" height="18">']
    for y, v, fill, what in ((0, predicted, "#a0aec0", "predicted"), (9, measured, "#2b6cb0", "measured")):
        if v is not None and top > 0:
            out.append(f'<rect y="{y}" width="{max(BAR_W * v / top, 0.5):.1f}" height="8" fill="{fill}">'
                       f'<title>{what}: {v:.4g}</title></rect>')
    return "".join(out) + "</svg>"


def _row(label: str, predicted: float | None, measured: float | None, top: float,
         note: str = "") -> str:
    p = f"{predicted:.4g}" if predicted is not None else "-"
    m = f"{measured:.4g}" if measured is not None else "-"
    gap = _gap(measured, predicted) if predicted and measured else "<td></td>"
    return (f"<tr><td>{esc(label)}</td><td class=\"r\">{p}</td><td class=\"r\">{m}</td>{gap}"
            f"<td>{_pair(predicted, measured, top)}</td><td class=\"small\">{esc(note)}</td></tr>")


def _table(head: str, rows: list[str]) -> str:
    return (f"<table><tr><th>{head}</th><th>predicted</th><th>measured</th><th>gap</th>"
            f"<th>grey: predicted, blue: measured</th><th></th></tr>{''.join(rows)}</table>")


def section(manifest: Mapping[str, Any], result: Mapping[str, Any]) -> str:
    """The measured section from a parts folder's manifest and ``run_parts``' result."""
    pred = result.get("predicted") or {}
    out = [f"{MEASURED_START}<h2>Measured beside the prediction</h2>"]
    where = f" at {esc(result['shapes'])}" if result.get("shapes") else ""
    fell = result.get("fell_back") or []
    out.append(f'<p class="muted">onnxsplit run{where}, engine {esc(result.get("engine", "threads"))}'
               + (f"; {esc(', '.join(fell))} ran on the CPU (absent here): not the plan's times" if fell else "")
               + f"; a gap over {MISSED:.0%} either way in red.</p>")
    measured = result.get("measured")
    if measured and pred.get("latency_ms"):
        top_t = max(pred["throughput_per_s"], measured["throughput_per_s"])
        top_l = max(pred["latency_ms"], measured["latency_ms"])
        out.append(_table("the plan", [
            _row("samples/s, pipelined", pred["throughput_per_s"], measured["throughput_per_s"], top_t),
            _row("ms, one sample", pred["latency_ms"], measured["latency_ms"], top_l)]))
    part_ms = result.get("part_ms")
    if part_ms:
        timed = pred.get("part_ms")  # the split's own timing of its parts, if it made one
        profile = pred.get("part_profile_ms") or {}
        names = [p["name"] for p in manifest["parts"]] if result.get("run_as") != "session" else ["session"]
        rows, top = [], 0.0
        said = []
        for i, name in enumerate(names):
            if timed and i < len(timed):
                said.append((timed[i], "as timed when the parts were written"))
            elif name in profile:
                said.append((profile[name], "the profile's operators summed"))
            else:
                said.append((None, ""))
        top = max([v for v in part_ms] + [s for s, _ in said if s is not None], default=1.0)
        devices = {p["name"]: p["device"] for p in manifest["parts"]}
        for name, (p, note), m in zip(names, said, part_ms):
            rows.append(_row(f"{name} ({devices.get(name, 'one session')})", p, m, top, note))
        out.append("<h3>Each part's own time (ms, one sample, parts run one after another)</h3>"
                   + _table("part", rows))
    base = result.get("baselines") or {}
    if base:
        cal = pred.get("baselines") or {}
        ratios = result.get("ratios") or {}
        rows = []
        for name, b in base.items():
            if "error" in b:
                rows.append(f"<tr><td>{esc(name)}</td><td colspan=5 class=\"muted\">{esc(b['error'][:120])}</td></tr>")
                continue
            c = cal.get(name) or {}
            r = ratios.get(name)
            vs = (f"onnxsplit {r['throughput']:.2f}x its throughput, {r['latency']:.2f}x its speed "
                  "for one sample") if r else ""
            rows.append(_row(f"{name}, samples/s", c.get("throughput_per_s"), b["throughput_per_s"],
                             max(c.get("throughput_per_s") or 0, b["throughput_per_s"]), vs))
        out.append("<h3>What a user would run instead, measured in the same run (predicted: the "
                   "calibration's figure, where it measured one)</h3>" + _table("session", rows))
    if not measured and not part_ms:
        out.append('<p class="muted">Nothing was timed (run without --no-measure to time it).</p>')
    out.append(MEASURED_END)
    return "".join(out)


def check_writable(parts_dir: str | Path) -> Path:
    """The folder's report.html, if ``run --report`` may write it: absent, or one
    onnxsplit wrote (said before the run, not after it)."""
    path = Path(parts_dir) / REPORT
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise OnnxsplitError(f"'{path}' is not a report onnxsplit wrote: left as it is")
    if path.exists():
        try:
            ours = GENERATOR in path.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise OnnxsplitError(f"cannot read '{path}': {e.strerror or e}") from None
        if not ours:
            raise OnnxsplitError(f"'{path}' was not written by onnxsplit: left as it is "
                                 "(move it away to have run --report write one)")
    return path


def write(parts_dir: str | Path, manifest: Mapping[str, Any], result: Mapping[str, Any]) -> Path:
    """Redraw the measured section of the folder's report.html (a page of it alone where
    the folder has none), in one step."""
    path = check_writable(parts_dir)
    new = section(manifest, result)
    page = path.read_text(encoding="utf-8") if path.exists() else ""
    a, b = page.find(MEASURED_START), page.find(MEASURED_END)
    if 0 <= a < b:
        page = page[:a] + new + page[b + len(MEASURED_END):]
    else:
        title = f"onnxsplit: {Path(manifest['model']['path']).name}"
        page = (f'<!doctype html><html><head><meta charset="utf-8">{GENERATOR}<title>{esc(title)}</title>'
                f"<style>{CSS}</style></head><body><h1>{esc(title)}</h1>{new}</body></html>\n")
    return write_atomic(path, page)
