"""Careless use of every command: one line naming the problem, a non-zero exit, nothing lost."""

from __future__ import annotations

import json

import numpy as np
import pytest

from onnx_models import mlp
from onnxsplit.cli import main
from onnxsplit.export import MANIFEST, export
from onnxsplit.graph import OpGraph
from onnxsplit.runner import compare_outputs, verify_tolerance

CPU = "CPUExecutionProvider"


@pytest.fixture
def parts(tmp_path):
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    g = OpGraph.from_onnx(model)
    out = tmp_path / "p"
    export(g, {n.name: "cpu0" for n in g.nodes}, out, providers={"cpu0": CPU})
    return out


def one_line_error(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("onnxsplit: error: "), err
    return err[0]


@pytest.mark.parametrize("edit,needle", [
    (lambda m: m["parts"][0].pop("file"), "parts[0].file"),
    (lambda m: m["parts"][0].update(threads="two"), "parts[0].threads"),
    (lambda m: m["parts"][0].update(file="../../etc/passwd"), "a file in the folder"),
    (lambda m: m["parts"][0].update(inputs=7), "parts[0].inputs must be a list"),
    (lambda m: m.update(parts=[]), "'parts' must be a non-empty list"),
    (lambda m: m["model"].update(inputs=[{"name": "x"}]), "model.inputs[0] needs"),
    (lambda m: m.update(run_as="cluster"), "'run_as'"),
    (lambda m: m["parts"][0].update(optimization="max"), "optimization"),
])
def test_a_damaged_manifest_is_one_line(parts, capsys, edit, needle):
    m = json.loads((parts / MANIFEST).read_text())
    edit(m)
    (parts / MANIFEST).write_text(json.dumps(m))
    assert needle in one_line_error(capsys, ["run", str(parts), "--no-measure"])


def test_unwritable_outputs_are_one_line(tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "plan.json"
    line = one_line_error(capsys, ["solve", "models/demo_workload.json", "--method", "greedy",
                                   "-o", str(missing)])
    assert str(missing) in line and not missing.exists()


def test_samples_must_be_positive(parts, capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", str(parts), "--samples", "0"])
    assert e.value.code == 2 and "must be at least 1" in capsys.readouterr().err


def test_tolerance_by_dtype():
    # float32 on the CPU: 1e-4 absolute
    want = {"y": np.array([1000.0, 2.0], np.float32)}
    near = compare_outputs({"y": np.array([1000.01, 2.0], np.float32)}, want)
    assert not verify_tolerance(near, accelerated=False)["ok"]
    # float16 outputs round at 1e-3 relative: held to 1e-2 relative
    half = {"y": np.array([1000.0, 2.0], np.float16)}
    got = compare_outputs({"y": np.array([1001.0, 2.0], np.float16)}, half)
    assert got["half_precision"] and verify_tolerance(got, accelerated=False)["ok"]
    wrong = compare_outputs({"y": np.array([1100.0, 2.0], np.float16)}, half)
    assert not verify_tolerance(wrong, accelerated=False)["ok"]
    # integers exactly, on any device
    ints = {"i": np.array([3, 4], np.int64)}
    off = compare_outputs({"i": np.array([3, 5], np.int64)}, ints)
    assert not verify_tolerance(off, accelerated=True)["ok"]


@pytest.mark.parametrize("edit,needle", [
    (lambda p: p.update(assignment=[1, 2]), "'assignment' object"),
    (lambda p: p.update(pieces={"x": "one"}), "'pieces'"),
    (lambda p: p.update(pieces=[0]), "'pieces'"),
    (lambda p: p["details"].update(execution={"cpu_threads": "two"}), "cpu_threads"),
    (lambda p: p["details"].update(execution={"replicas": 0}), "replicas"),
    (lambda p: p["details"].update(execution={"run_as": "cluster"}), "run_as"),
    (lambda p: p["details"].update(execution={"optimization": "max"}), "optimization"),
    (lambda p: p.update(objective="speed"), "objective"),
    (lambda p: p["assignment"].update({"no_such_node": "cpu0"}), "not in the model"),
])
def test_a_damaged_plan_file_is_one_line(tmp_path, capsys, monkeypatch, edit, needle):
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    g = OpGraph.from_onnx(model)
    plan = {"objective": "throughput", "assignment": {n.name: "cpu0" for n in g.nodes},
            "details": {}}
    edit(plan)
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan))
    line = one_line_error(capsys, ["export", str(model), "--plan", str(f), "--out",
                                   str(tmp_path / "p"), "--no-verify", "--quiet"])
    assert needle in line and str(f) in line
    assert not (tmp_path / "p").exists()


def _one_op_model(path, dtype, shape):
    from onnx import helper
    import onnx

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["h"], name="id"),
                           helper.make_node("Identity", ["h"], ["y"], name="id2")], "g",
                          [helper.make_tensor_value_info("x", dtype, shape)],
                          [helper.make_tensor_value_info("y", dtype, shape)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("dtype,shape,needle", [
    ("BFLOAT16", [2, 4], "input 'x' is bfloat16"),
    ("FLOAT", [100000, 100000, 1000], "over the memory limit"),
])
def test_a_model_that_cannot_be_fed_is_one_line_before_profiling(tmp_path, capsys, monkeypatch,
                                                                 dtype, shape, needle):
    from onnx import TensorProto

    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    model = _one_op_model(tmp_path / "m.onnx", getattr(TensorProto, dtype), shape)
    assert main([str(model), "--out", str(tmp_path / "p"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("onnxsplit: error: ") and needle in err[-1], err
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "p").exists() and not (tmp_path / "cache").exists()


def test_an_output_naming_an_input_is_refused_and_the_input_kept(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    w = tmp_path / "w.json"
    w.write_text(open("models/demo_workload.json").read())
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    before = w.read_bytes(), model.read_bytes()
    for argv, needle in ((["solve", str(w), "-o", str(w)], "w.json"),
                         (["compare", str(w), "--html", str(w), "--time-limit", "2"], "w.json"),
                         (["workload", str(model), "-o", str(model), "--quiet"], "m.onnx")):
        line = one_line_error(capsys, argv)
        assert "is the input" in line and needle in line
    assert (w.read_bytes(), model.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == ["m.onnx", "w.json"]
