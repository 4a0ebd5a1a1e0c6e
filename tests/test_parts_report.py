"""report.html in the parts folder, looked at in headless Chromium as a user would: small_bert
split by the main command, a 32-layer decoder with name scopes re-applied by ``export``,
and a 10,000-operator workload without a model; each must fit two screens at its top
level, name every device with its share and every cut tensor with its bytes.  Also the
grouping alone (onnxsplit.hierarchy) and ``run --report`` (measured beside predicted)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from browser import SCREEN_H, content_height, dump_dom, screenshot, unusable
from onnx_models import decoder

from onnxsplit import api, hierarchy, measured_report, parts_report
from onnxsplit.cli import main
from onnxsplit.errors import OnnxsplitError
from onnxsplit.export import check_out
from onnxsplit.plan import Plan
from onnxsplit.solve import evaluate
from onnxsplit.workload import Workload

ROOT = Path(__file__).resolve().parent.parent
SMALL_BERT = ROOT / "models" / "small_bert.onnx"


@pytest.fixture
def chromium():
    """Skips the test, saying why, where no Chromium runs headless."""
    why = unusable()
    if why:
        pytest.skip(why)


class _Page(HTMLParser):
    """The structure a test reads off a page: the top-level group rows (their names and
    texts), the device table's rows and every text."""

    def __init__(self):
        super().__init__()
        self.depth_rows = 0  # nesting of div.rows
        self.stack: list[str] = []
        self.groups: list[str] = []  # top-level summaries' texts
        self.devices: list[str] = []  # rows of the Devices table
        self.in_summary = self.in_devices = False
        self.text, self.buf = [], []
        self.section = ""

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class", "") or ""
        self.stack.append((tag, cls))
        if tag == "div" and "rows" in cls.split():
            self.depth_rows += 1
        if tag == "summary" and self.depth_rows == 1:
            self.in_summary, self.buf = True, []
        if tag == "tr" and self.section == "Devices":
            self.in_devices, self.buf = True, []

    def handle_endtag(self, tag):
        while self.stack:
            t, cls = self.stack.pop()
            if t == "div" and "rows" in cls.split():
                self.depth_rows -= 1
            if t == tag:
                break
        if tag == "summary" and self.in_summary:
            self.in_summary = False
            self.groups.append(" ".join(" ".join(self.buf).split()))
        if tag == "tr" and self.in_devices:
            self.in_devices = False
            self.devices.append(" ".join(" ".join(self.buf).split()))

    def handle_data(self, data):
        self.text.append(data)
        if self.stack and self.stack[-1][0] == "h2":
            self.section = data.strip()
        if self.in_summary or self.in_devices:
            self.buf.append(data)


def _read(page: Path) -> _Page:
    p = _Page()
    p.feed(dump_dom(page))
    return p


def _looked_at(page: Path, tmp_path: Path, name: str) -> tuple[int, _Page]:
    """The height the page takes in Chromium at its top level (groups closed), and its DOM."""
    png = screenshot(page, tmp_path / f"{name}.png")
    return content_height(png), _read(page)


def _check_devices(read: _Page, workload: Workload, plan: Plan) -> None:
    """Every device of the plan has its row with its share of the work, as the plan's own
    node times give it."""
    from onnxsplit import machine

    ms = machine.node_times(workload, plan.assignment)
    dev = evaluate.device_array(workload, plan.assignment)
    used = sorted({plan.assignment[i] for i in plan.assignment})
    assert len([r for r in read.devices if r and not r.startswith("device")]) == len(used)
    for d in used:
        row = next(r for r in read.devices if r.split()[0] == d)
        share = ms[dev == workload.device_index[d]].sum() / ms.sum()
        assert f"{share:.0%}" in row, (d, row)


# ------------------------------------------------------------------------- the grouping


def _decoder_names(layers: int) -> list[str]:
    names = ["/model/embed_tokens/Gather"]
    for i in range(layers):
        names += [f"/model/layers.{i}/{s}" for s in (
            "input_layernorm/Mul", "self_attn/q_proj/MatMul", "self_attn/k_proj/MatMul",
            "self_attn/Softmax", "self_attn/o_proj/MatMul", "Add", "mlp/up_proj/MatMul",
            "mlp/down_proj/MatMul", "Add_1")]
    return names + ["/model/norm/Mul", "/lm_head/MatMul"]


def _chain(names):
    n = len(names)
    return [(i, i + 1) for i in range(n - 1)], list(range(n))


def test_a_decoder_reads_one_row_per_layer():
    names = _decoder_names(32)
    edges, order = _chain(names)
    how, rows = hierarchy.group_nodes(names, [n.rsplit("/", 1)[-1] for n in names], edges, order)
    assert how.startswith("name scopes")
    assert [r.name for r in rows] == ["embed_tokens"] + [f"layers.{i}" for i in range(32)] + ["norm", "lm_head"]
    assert all(len(r.nodes) == 9 for r in rows[1:33])
    assert sorted(v for r in rows for v in r.nodes) == order  # every node once


def test_a_short_model_opens_its_layers():
    names = _decoder_names(2)
    edges, order = _chain(names)
    _, rows = hierarchy.group_nodes(names, ["x"] * len(names), edges, order)
    # two layers fit opened: their attention and MLP show as rows of their own, named in
    # their layer
    shown = [r.name for r in rows]
    assert "layers.0/self_attn/q_proj" in shown and "layers.1/mlp/up_proj" in shown
    assert "layers.1 (own ops)" in shown and len(shown) <= hierarchy.MOST_GROUPS
    assert sorted(v for r in rows for v in r.nodes) == order


def test_too_many_layers_are_binned_and_kept_as_children():
    names = [f"layer{i}.{op}" for i in range(175) for op in ("q", "k", "softmax", "out")]
    edges, order = _chain(names)
    _, rows = hierarchy.group_nodes(names, [n.split(".")[1] for n in names], edges, order)
    assert len(rows) <= hierarchy.MOST_GROUPS
    k = -(-175 // hierarchy.MOST_GROUPS)  # the fewest layers a bin that fit
    assert len(rows) == -(-175 // k)
    assert rows[0].name == f"layer0 … layer{k - 1}"
    assert [c.name for c in rows[0].children] == [f"layer{i}" for i in range(k)]
    assert sorted(v for r in rows for v in r.nodes) == order


def test_names_without_scopes_fall_back_to_the_blocks_the_graph_repeats():
    block = ["LayerNormalization", "MatMul", "MatMul", "Softmax", "MatMul", "Add", "MatMul", "Gelu", "MatMul", "Add"]
    kinds = ["Gather", "Add", "Shape", "Unsqueeze"] + block * 12 + ["MatMul"]
    names = [f"node_{k}_{i}" for i, k in enumerate(kinds)]
    edges, order = _chain(names)
    how, rows = hierarchy.group_nodes(names, kinds, edges, order)
    assert how.startswith("repeated blocks")
    blocks = [r for r in rows if r.name.startswith("block")]
    assert len(blocks) == 12 and {len(b.nodes) for b in blocks} == {len(block)}
    assert hierarchy.repeated_blocks(kinds)[1:] == (len(block), 12)
    # the blocks' boundaries fall where the fewest tensors cross (two: the residual stream
    # and the next operator's input; three inside the attention), and a first layer that
    # differs a little is taken in
    layer = ["LayerNorm", "MatMul", "MatMul", "Mul", "Softmax", "MatMul", "Add", "Gelu", "MatMul", "Add"]
    kinds = ["Gather"] + [k for i in range(8) for k in (layer[:1] + ["Where"] + layer[2:] if i == 0 else layer)]
    edges = []
    for s in range(1, len(kinds), len(layer)):
        edges += [(s - 1, s), (s, s + 1), (s, s + 2), (s + 1, s + 3), (s + 2, s + 3)]
        edges += [(v, v + 1) for v in range(s + 3, s + len(layer) - 1)] + [(s - 1, s + 6), (s + 6, s + 9)]
    how, rows = hierarchy.group_nodes([f"n{i}" for i in range(len(kinds))], kinds, edges, list(range(len(kinds))))
    blocks = [r for r in rows if r.name.startswith("block")]
    assert len(blocks) == 8 and all(len(b.nodes) == len(layer) for b in blocks)
    live = [sum(1 for a, b in edges if a < p <= b) for p in range(len(kinds))]  # tensors crossing before p
    assert all(live[b.nodes[0]] == 2 for b in blocks[1:]) and min(live[1:]) == 2 and max(live) == 3
    # alike but not equal (a ResNet's bottlenecks, some downsampling): cut after each residual
    plain = ["Conv", "BatchNormalization", "Relu"] * 3 + ["Sum"]
    down = ["Conv", "BatchNormalization", "Relu"] * 3 + ["Conv", "BatchNormalization", "Sum"]
    kinds = ["Conv", "Relu", "MaxPool"] + [k for i in range(16) for k in (down if i in (0, 3, 7, 13) else plain)] \
        + ["GlobalAveragePool", "Gemm"]
    how, rows = hierarchy.group_nodes([f"n{i}" for i in range(len(kinds))], kinds, *_chain(kinds))
    assert how.startswith("blocks ending at") and [r.name for r in rows][-2:] == ["to Sum 16", "after Sum 16"]
    assert [len(r.nodes) for r in rows[1:-1]] == [len(down if i in (3, 7, 13) else plain) for i in range(1, 16)]
    # nothing repeats: stretches of the order
    rng = np.random.default_rng(0)
    kinds = [f"Op{rng.integers(1000)}" for _ in range(500)]
    how, rows = hierarchy.group_nodes([f"n{i}" for i in range(500)], kinds, *_chain(kinds))
    assert how.startswith("stretches") and 1 < len(rows) <= hierarchy.MOST_GROUPS
    assert sorted(v for r in rows for v in r.nodes) == list(range(500))


# ------------------------------------------------------------------ many devices


def test_many_devices_keep_their_own_colours_and_their_pipeline_order(tmp_path):
    from onnxsplit.report import device_colors, pipeline_timeline_svg

    path = tmp_path / "w.json"
    subprocess.run([sys.executable, str(ROOT / "tools" / "make_large_workload.py"), str(path), "--nodes", "600",
                    "--k", "12", "--l", "16"], check=True, capture_output=True)
    w = Workload.from_paper_json(path)
    colors = device_colors(w)
    assert len(colors) == 28 and len(set(colors.values())) == 28
    # a plan without stages (a user's): its devices drawn in the order the graph reaches them
    order = list(w.topological_order)
    assignment = {int(w.ids[v]): f"cpu{15 - 16 * k // len(order)}" for k, v in enumerate(order)}
    plan = Plan("throughput", "given", "feasible", 1.0, assignment)
    svg = pipeline_timeline_svg(w, plan, colors)
    rows = re.findall(r'class="lbl">(cpu\d+)<', svg)
    assert rows == [f"cpu{i}" for i in range(15, -1, -1)]


# ----------------------------------------------------------------------- failures


def test_a_report_that_fails_to_render_warns_and_fails_nothing(tmp_path, capsys, monkeypatch):
    w = Workload.from_paper_json(ROOT / "models" / "demo_workload.json")
    plan = Plan("throughput", "given", "feasible", None, {int(i): "cpu0" for i in w.ids})

    def broken(*a, **k):
        raise ValueError("drawing failed")

    monkeypatch.setattr(parts_report, "render", broken)
    assert parts_report.write(tmp_path, w, plan, title="t") is False
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["onnxsplit: warning: report.html not written (ValueError: drawing failed)"]
    assert not (tmp_path / parts_report.REPORT).exists()


def test_run_report_never_writes_over_a_page_onnxsplit_did_not_make(tmp_path, capsys):
    (tmp_path / "report.html").write_text("<html>my notes</html>")
    assert main(["run", str(tmp_path), "--report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("onnxsplit: error: ") and "not written by onnxsplit" in err[0]
    assert (tmp_path / "report.html").read_text() == "<html>my notes</html>"
    with pytest.raises(OnnxsplitError):
        measured_report.check_writable(tmp_path)


# --------------------------------------------------------------------- in the browser


def test_small_bert_report_from_the_main_command_and_run_report(tmp_path, capsys, monkeypatch, chromium):
    out = tmp_path / "parts"
    shapes = ["--input-shape", "input_ids=1x64", "--input-shape", "attention_mask=1x64"]
    assert main([str(SMALL_BERT), *shapes, "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    page = out / "report.html"
    assert result["report"] == str(page)
    check_out(out, force=True)  # a folder with its report is still one --force may replace
    height, read = _looked_at(page, tmp_path, "small_bert")
    assert 400 < height <= 2 * SCREEN_H
    text = " ".join(read.text)
    # what was weighed: every candidate with its prediction, the written one marked
    for c in result["plan"]["details"]["candidates"]:
        assert c["what"] in text and f"{c['throughput_per_s']:.4g}" in text
    assert "✓" in text
    used = {d["device"] for d in result["devices"]}
    for d in used:
        assert any(r.split()[0] == d and "%" in r for r in read.devices)
    assert 1 < len(read.groups) <= hierarchy.MOST_GROUPS
    assert "Not measured yet" in text

    # measured beside predicted: each part's time as run measured it
    assert main(["run", str(out), "--report", "--no-measure", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["report"] == str(page) and len(run["part_ms"]) == len(result["parts"])
    html = page.read_text()
    assert "Not measured yet" not in html and html.count(parts_report.MEASURED_START) == 1
    predicted = result["predicted"]["part_profile_ms"]
    for name, ms in zip(result["parts"], run["part_ms"]):
        stem = name.removesuffix(".onnx")
        row = re.search(rf"<tr><td>{stem} \(cpu\d\)</td><td class=\"r\">([\d.e+-]+)</td><td class=\"r\">([\d.e+-]+)</td>"
                        rf"<td class=\"r\"[^>]*>([+-]\d+)%</td>", html)
        assert row, stem
        said, got = float(row.group(1)), float(row.group(2))
        assert said == pytest.approx(predicted[stem], rel=1e-3) and got == pytest.approx(ms, rel=1e-3)
        assert int(row.group(3)) == round(100 * (ms / predicted[stem] - 1))
    assert "The plan on the model's structure" in html  # the rest of the page is kept

    # a page that cannot be written: said in one line, what was measured printed all the same
    def full(*a, **k):
        raise OSError(28, "No space left on device", str(page))

    monkeypatch.setattr(measured_report, "write_atomic", full)
    assert main(["run", str(out), "--report", "--no-measure"]) == 0
    said = capsys.readouterr()
    assert said.err.strip().splitlines() == [f"onnxsplit: warning: {out}/report.html not written "
                                             "(No space left on device)"]
    assert "verify: max abs error" in said.out and page.read_text() == html


def test_a_decoder_split_by_its_layers_reads_one_row_a_layer(tmp_path, chromium):
    """The page the parts folder gets, drawn from the decoder's workload and its plan (its
    operators timed once each: the page's structure is read here, not its figures; the
    main command writing its page is small_bert's test, whose calibration this one would
    pay again)."""
    model = decoder(tmp_path / "decoder.onnx", layers=32)
    w = api.build_workload(model, repeats=1, quiet=True)
    names = [w.nodes[v].name for v in range(w.n)]
    second = {n for n in names if (m := re.search(r"layers\.(\d+)/", n)) and int(m.group(1)) >= 16
              or n.startswith(("/model/norm/", "/lm_head/"))}
    assignment = {int(w.ids[v]): "cpu1" if names[v] in second else "cpu0" for v in range(w.n)}
    plan = Plan("throughput", "given", "feasible", evaluate.max_load(w, assignment).value, assignment)
    page = tmp_path / "report.html"
    page.write_text(parts_report.render(w, plan, title="decoder.onnx"))
    height, read = _looked_at(page, tmp_path, "decoder")
    assert height <= 2 * SCREEN_H
    rows = [g.split()[0] for g in read.groups]
    assert rows == ["embed_tokens"] + [f"layers.{i}" for i in range(32)] + ["norm", "lm_head"]
    # the one tensor cut (layer 15's output, 1x8x16 float32) named with its bytes, both ways
    cut = "/model/layers.15/res2 512 B cpu0→cpu1"
    assert f"out: {cut}" in read.groups[16] and f"in: {cut}" in read.groups[17]
    assert sum(cut in g for g in read.groups) == 2
    # and at the top, by pair of devices: one tensor, its bytes, named
    assert "cpu0 → cpu1 1 512 B /model/layers.15/res2 512 B" in " ".join(" ".join(read.text).split())
    assert "cpu0 100%" in read.groups[1] and "cpu1 100%" in read.groups[20]
    assert len(read.devices) == 3 and all("50%" in r for r in read.devices[1:])
    assert page.stat().st_size < 1_000_000


def _contiguous_plan(w: Workload) -> Plan:
    """The unsupported operators on cpu0, the rest cut into four stretches of the order of
    equal accelerator time, one per accelerator."""
    order = list(w.topological_order)
    acc = w.acc_latency
    run = np.cumsum([acc[v] if w.supported[v] else 0.0 for v in order])
    assignment = {}
    for k, v in enumerate(order):
        dev = "cpu0" if not w.supported[v] else f"acc{min(int(4 * run[k] / run[-1]), 3)}"
        assignment[int(w.ids[v])] = dev
    return Plan("throughput", "given", "feasible", evaluate.max_load(w, assignment).value, assignment)


def test_a_10000_operator_workload_fits_two_screens(tmp_path, chromium):
    path = tmp_path / "w.json"
    subprocess.run([sys.executable, str(ROOT / "tools" / "make_large_workload.py"), str(path),
                    "--nodes", "10000"], check=True, capture_output=True)
    w = Workload.from_paper_json(path)
    plan = _contiguous_plan(w)
    assert evaluate.check(w, plan.assignment) == []
    page = tmp_path / "report.html"
    page.write_text(parts_report.render(w, plan, title="10,000 operators"))
    assert page.stat().st_size < 2_000_000
    height, read = _looked_at(page, tmp_path, "large")
    assert height <= 2 * SCREEN_H
    assert 10 <= len(read.groups) <= hierarchy.MOST_GROUPS
    _check_devices(read, w, plan)
    # every cut is named in the rows where it leaves, with its transfer (no bytes in a
    # paper workload: its time)
    dev = evaluate.device_array(w, plan.assignment)
    crossing = {w.nodes[s].name for s, t in zip(w.edge_src, w.edge_dst) if dev[s] != dev[t]}
    shown = " ".join(read.text)
    assert crossing and all(name in shown for name in crossing)
    assert re.search(r"out: \S+ [\d.]+ ms (cpu0|acc\d)→(cpu0|acc\d)", " ".join(read.groups))
