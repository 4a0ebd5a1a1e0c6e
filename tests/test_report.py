"""The HTML report: what it draws is the plan's, checked against the workload directly."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from onnxsplit import api, report
from onnxsplit.cli import main
from onnxsplit.solve import evaluate
from onnxsplit.workload import Workload
from workloads import diamond, edge, node, workload


def _chain_with_branch() -> Workload:
    nodes = [node(i, cpu=5.0 + i, acc=1.0 + i % 3, size=10.0) for i in range(8)]
    edges = [edge(i, i + 1, 0.25) for i in range(7)] + [edge(1, 4, 0.25), edge(2, 6, 0.25)]
    return Workload.from_paper_json(workload(nodes, edges, k=2, l=1, mem=1e9))


@pytest.mark.parametrize("objective", ["throughput", "latency"])
def test_report_draws_the_plan(objective):
    w = _chain_with_branch()
    result = api.compare(w, objective, time_limit=10)
    drawn = report.best_plan(result["rows"])
    assert drawn is not None and drawn.value == min(
        r["plan"].value for r in result["rows"] if "plan" in r and r["plan"].value is not None
        and not r["plan"].details.get("violations") and r["plan"].status != "infeasible")
    page = report.render(w, result["rows"], objective, result["best_lower_bound"], drawn)
    graph = page[page.index('class="graph"'):]
    graph = graph[:graph.index("</svg>")]
    colors = report.device_colors(w)
    # one box per operator, in its device's colour
    fills = re.findall(r'<rect x="[\d.]+" y="[\d.]+" width="16" height="10" rx="2" fill="(#[0-9a-f]+)"',
                       graph)
    assert sorted(fills) == sorted(colors[drawn.assignment[n.id]] for n in w.nodes)
    # a red line for every edge whose ends are on different devices
    crossing = sum(drawn.assignment[e.source] != drawn.assignment[e.dest] for e in w.edges)
    assert graph.count('class="cut"') == crossing
    assert graph.count('class="edge"') == len(w.edges) - crossing
    # the sample timeline has one compute bar per call of the schedule
    calls = evaluate.schedule(w, drawn.assignment, drawn.pieces or None,
                              serial_cpus=objective == "throughput")
    timeline = page[page.index("One sample through the devices"):]
    timeline = timeline[:timeline.index("</svg>")]
    bars = re.findall(r"<title>(\w+): (\d+) operators?:", timeline)
    assert [(d, int(k)) for d, k in bars] == [(c.device, len(c.nodes)) for c in calls]
    # every method is listed, with the bound drawn
    for r in result["rows"]:
        assert f">{r['method']}<" in page
    if result["best_lower_bound"]:
        assert 'class="bound"' in page


def test_schedule_matches_latency():
    w = Workload.from_paper_json(diamond(k=2, l=1))
    for assignment in ({1: "acc0", 2: "acc1", 3: "cpu0", 4: "acc0"},
                       {1: "cpu0", 2: "cpu0", 3: "acc0", 4: "acc0"}):
        calls = evaluate.schedule(w, assignment)
        assert max(c.finish for c in calls) == pytest.approx(evaluate.latency(w, assignment).value)
        for c in calls:
            assert c.start <= c.compute_start <= c.compute_end <= c.finish


def test_compare_writes_html(tmp_path, capsys):
    path = tmp_path / "w.json"
    _chain_with_branch().write(path)
    out = tmp_path / "r.html"
    assert main(["compare", str(path), "--html", str(out), "--time-limit", "5"]) == 0
    text = out.read_text()
    assert text.startswith("<!doctype html>") and "Pipeline, steady state" in text
    assert main(["compare", str(path), "--html", str(out), "--draw", "nope"]) == 2
    assert "--draw nope" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium here")
def test_report_renders_in_chromium(tmp_path):
    w = _chain_with_branch()
    result = api.compare(w, "throughput", time_limit=5)
    page = tmp_path / "r.html"
    page.write_text(report.render(w, result["rows"], "throughput", result["best_lower_bound"],
                                  report.best_plan(result["rows"])))
    png = tmp_path / "r.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                    f"--screenshot={png}", "--window-size=1200,1600", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a page, not a blank
