"""The command line as a user meets it: output shape, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from onnxsplit.cli import main
from onnxsplit.solve import evaluate
from onnxsplit.workload import Workload
from workloads import diamond, node, workload

SOLVE_FIELDS = {"objective", "method", "status", "value", "lower_bound", "gap", "seconds", "assignment"}


@pytest.fixture
def diamond_file(tmp_path):
    p = tmp_path / "diamond.json"
    p.write_text(json.dumps(diamond()))
    return p


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_solve_json(capsys, diamond_file):
    rc, out, err = run(capsys, "solve", diamond_file, "--json")
    assert rc == 0 and err == ""
    obj = json.loads(out)
    assert SOLVE_FIELDS <= obj.keys()
    assert obj["status"] == "optimal" and obj["gap"] == 0.0
    assignment = {int(k): v for k, v in obj["assignment"].items()}
    w = Workload.from_paper_json(diamond_file)
    assert evaluate.max_load(w, assignment).value == pytest.approx(obj["value"])
    assert set(assignment.values()) <= {"acc0", "acc1", "cpu0"}


def test_solve_for_latency_without_a_method_takes_the_latency_program(capsys, diamond_file):
    rc, out, _ = run(capsys, "solve", diamond_file, "--objective", "latency", "--json")
    assert rc == 0
    obj = json.loads(out)
    assert obj["method"] == "ip" and obj["objective"] == "latency"
    assignment = {int(k): v for k, v in obj["assignment"].items()}
    pieces = {int(k): v for k, v in obj["pieces"].items()} if obj.get("pieces") else None
    w = Workload.from_paper_json(diamond_file)
    assert evaluate.latency(w, assignment, pieces).value == pytest.approx(obj["value"])


def test_solve_writes_plan_that_evaluate_reads(capsys, diamond_file, tmp_path):
    plan = tmp_path / "plan.json"
    rc, out, _ = run(capsys, "solve", diamond_file, "-o", plan)
    assert rc == 0 and "optimal" in out and "acc0" in out
    rc, out, _ = run(capsys, "evaluate", diamond_file, plan, "--json")
    assert rc == 0
    assert json.loads(out)["value"] == pytest.approx(json.loads(plan.read_text())["value"])


def test_evaluate_paper_split_with_violation(capsys, tmp_path):
    w = tmp_path / "w.json"
    w.write_text(json.dumps(diamond(k=1, mem=1.0)))
    s = tmp_path / "s.json"
    s.write_text(json.dumps({"fpgas": [{"nodes": [1, 2]}, {"nodes": [3]}], "cpus": [{"nodes": [4]}]}))
    rc, out, _ = run(capsys, "evaluate", w, s, "--json")
    obj = json.loads(out)
    assert rc == 0 and not obj["valid"]
    assert any("uses 2 accelerators, the workload has 1" in v for v in obj["violations"])


def test_infeasible_workload_exits_1(capsys, tmp_path):
    p = tmp_path / "w.json"  # an accelerator-only device set and a node it cannot run
    p.write_text(json.dumps(workload([node(1, supported=False)], [], k=2, l=0)))
    rc, out, _ = run(capsys, "solve", p, "--json")
    assert rc == 1 and json.loads(out)["status"] == "infeasible"


@pytest.mark.parametrize("argv,fragment", [
    (["solve", "/nonexistent/w.json"], "cannot read"),
    (["solve", "{diamond}", "--objective", "latency", "--method", "dp"], "does not optimise latency"),
    (["evaluate", "{diamond}", "/nonexistent/s.json"], "cannot read"),
])
def test_errors_are_one_line(capsys, diamond_file, argv, fragment):
    rc, out, err = run(capsys, *[a.format(diamond=diamond_file) for a in argv])
    assert rc == 2 and out == ""
    assert fragment in err and err.count("\n") == 1 and err.startswith("onnxsplit: error:")


def test_help_is_fast_and_imports_no_solver():
    code = "import sys; from onnxsplit.cli import main\ntry: main(['--help'])\nexcept SystemExit: pass\n" \
           "print('numba' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False False"


def test_compare_lists_every_method_against_one_bound(capsys, diamond_file):
    rc, out, _ = run(capsys, "compare", diamond_file, "--json", "--time-limit", "10")
    assert rc == 0
    obj = json.loads(out)
    methods = {m["method"]: m for m in obj["methods"]}
    assert {"dp", "ip", "greedy", "local_search", "one_accelerator"} <= methods.keys()
    bound = obj["best_lower_bound"]
    w = Workload.from_paper_json(diamond_file)
    for m in methods.values():
        if m.get("value") is not None and m["status"] != "infeasible":
            # the bound holds for every valid plan, and each value is the evaluator's
            assert m["value"] >= bound * (1 - 1e-9)
            assignment = {int(k): v for k, v in m["assignment"].items()}
            assert evaluate.max_load(w, assignment).value == pytest.approx(m["value"])
    assert methods["ip"]["value"] == pytest.approx(bound, rel=0.01)
