"""Careless use of every command: one line naming the problem, a non-zero exit, nothing lost."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from onnx_models import mlp
from onnxsplit.cli import main
from onnxsplit.export import MANIFEST, export
from onnxsplit.graph import OpGraph
from onnxsplit.running.runner import compare_outputs
from onnxsplit.running.verify import tolerance as verify_tolerance

CPU = "CPUExecutionProvider"


@pytest.fixture
def parts(tmp_path):
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    g = OpGraph.from_onnx(model)
    out = tmp_path / "p"
    export(g, {n.name: "cpu0" for n in g.nodes}, out, providers={"cpu0": CPU})
    return out


def one_line_error(capsys, argv, *words) -> str:
    """Run the CLI: it must exit 2 with one stderr line ``onnxsplit: error: ...`` holding
    every one of ``words``; that line."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # (argparse's errors end the process)
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("onnxsplit: error: "), err
    assert all(w in err[0] for w in words), err[0]
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
    (lambda m: m["parts"][0].update(replicas=10**6), "parts[0].replicas must be an integer from 0 to 1024"),
    (lambda m: m["model"].update(outputs=[]), "model.outputs must name at least one output"),
    (lambda m: m["model"]["outputs"][0].update(name="zz"), "model.outputs[0] 'zz' is made by no part"),
    (lambda m: m["parts"][-1].update(inputs=[{"name": "qq"}]), "'qq' is neither an input of the model"),
    (lambda m: m.update(predicted="x"), "'predicted' must be an object"),
    (lambda m: m.update(predicted={"latency_ms": 0}), "predicted.latency_ms must be a positive number"),
    (lambda m: m.update(predicted={"baselines": {"ort": {"throughput_per_s": "x"}}}),
     "predicted.baselines.ort.throughput_per_s must be a positive number"),
    # against the parts it names
    (lambda m: m["parts"][0].update(file="gone.onnx"), "parts[0].file 'gone.onnx' is not in the folder"),
    (lambda m: m["parts"][0]["inputs"][0].update(name="y"), "parts[0].inputs[0] 'y' is neither an input of the model"),
    (lambda m: m["parts"][0]["inputs"][0].update(dtype="int64"), "parts[0].inputs[0] says dtype int64"),
    (lambda m: m["parts"][0]["outputs"][0].update(shape=[4, 17]), "parts[0].outputs[0].shape [4, 17]"),
    (lambda m: m["model"]["inputs"][0].update(shape=[4, 16, 1]), "model.inputs[0].shape [4, 16, 1] has 3"),
    (lambda m: m["model"]["inputs"][0].update(bytes=5), "model.inputs[0].bytes is 5"),
])
def test_a_damaged_manifest_is_one_line(parts, capsys, edit, needle):
    m = json.loads((parts / MANIFEST).read_text())
    edit(m)
    (parts / MANIFEST).write_text(json.dumps(m))
    assert needle in one_line_error(capsys, ["run", str(parts), "--no-measure"])


def test_parts_listed_out_of_order_are_one_line_naming_the_input(tmp_path, capsys):
    """The pipeline runs the parts in the manifest's order: a part listed before the one
    making its input is named as the manifest's problem (a bare KeyError's 'h0' before)."""
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    g = OpGraph.from_onnx(model)
    half = len(g.nodes) // 2
    out = tmp_path / "p"
    export(g, {n.name: f"cpu{int(i >= half)}" for i, n in enumerate(g.nodes)}, out,
           providers={"cpu0": CPU, "cpu1": CPU})
    m = json.loads((out / MANIFEST).read_text())
    m["parts"].reverse()
    (out / MANIFEST).write_text(json.dumps(m))
    line = one_line_error(capsys, ["run", str(out), "--no-measure"], "parts[0].inputs[0]")
    assert "is neither an input of the model nor made by an earlier part" in line


def test_inputs_too_big_for_memory_are_refused_before_any_is_made(tmp_path, capsys):
    """A dynamic batch edited to 10^11 rows: one line naming the field and the limit,
    before any feed is allocated (not numpy's out-of-memory traceback)."""
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16, dynamic_batch=True)
    g = OpGraph.from_onnx(model, {"x": (4, 16)})
    out = tmp_path / "p"
    export(g, {n.name: "cpu0" for n in g.nodes}, out, providers={"cpu0": CPU})
    m = json.loads((out / MANIFEST).read_text())
    m["model"]["inputs"][0].update(shape=[100_000_000_000, 16], bytes=None)
    (out / MANIFEST).write_text(json.dumps(m))
    line = one_line_error(capsys, ["run", str(out), "--no-measure"])
    assert "model.inputs: one sample of shape [100000000000, 16] takes" in line
    assert "above the memory limit" in line


def test_a_damaged_profile_cache_is_set_aside_and_measured_again(tmp_path, capsys, monkeypatch):
    """The per-user cache is onnxsplit's own: a file that is not a profile is renamed
    (kept) and a damaged or foreign entry dropped, each with a note, and the command
    measures again and succeeds.  A profile file the user names stays an error.  (The
    profile command reads and writes the cache as the main command does, without
    calibrating the model each time.)"""
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    args = ["profile", str(model), "--quiet"]
    assert main(args) == 0
    cache = next((tmp_path / "cache").rglob("*.json"))
    good = json.loads(cache.read_text())
    capsys.readouterr()
    # one entry's time made negative, another's nodes renamed
    broken = json.loads(cache.read_text())
    first = next(iter(broken["entries"][0]["nodes"].values()))
    first["median_ms"] = -1.0
    if len(broken["entries"]) > 1:
        nodes = broken["entries"][1]["nodes"]
        broken["entries"][1]["nodes"] = {f"other_{k}": v for k, v in nodes.items()}
    cache.write_text(json.dumps(broken))
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "median_ms -1.0 is not a time" in err and "dropped, measuring again" in err
    assert len(json.loads(cache.read_text())["entries"]) == len(good["entries"])
    # a file that is not a profile at all
    cache.write_text("{not json")
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "set aside as" in err and (cache.parent / f"{cache.name}.corrupt").read_text() == "{not json"
    assert json.loads(cache.read_text())["entries"]
    # a profile the user names is theirs: an error, the file untouched
    mine = tmp_path / "mine.json"
    mine.write_text("{not json")
    line = one_line_error(capsys, [str(model), "--out", str(tmp_path / "p"), "--quiet",
                                   "--profile", str(mine)])
    assert "is not a profile file" in line and mine.read_text() == "{not json"


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


def test_tolerance_scales_with_each_output():
    """A large output is held relative to its size, a small one to the absolute floor,
    each on its own; ints exactly."""
    want = {"big": np.array([1000.0, -250.0], np.float32), "small": np.array([0.1, 0.01], np.float32)}
    sums = {"big": np.array([1000.001, -250.0], np.float32), "small": np.array([0.1000005, 0.01], np.float32)}
    got = compare_outputs(sums, want)
    v = verify_tolerance(got, accelerated=False)
    assert v["ok"] and got["max_abs_error"] > 1e-4  # (an absolute bar alone cried wolf here)
    assert v["allowed"]["big"]["why"] == "relative" and v["allowed"]["small"]["why"] == "abs"
    assert v["allowed"]["big"]["abs"] == pytest.approx(1000 * 4e-6)
    # the same absolute error on the small output, or ten times it on the big one, is real
    for wrong in ({"big": sums["big"], "small": np.array([0.1001, 0.01], np.float32)},
                  {"big": np.array([1000.02, -250.0], np.float32), "small": want["small"]}):
        assert not verify_tolerance(compare_outputs(wrong, want), accelerated=False)["ok"]


def test_tolerance_grows_with_what_the_model_itself_moves():
    """Where the original's own outputs move 1e-3 between onnxruntime's configurations, a
    split may differ by up to ten times that, not more."""
    want = {"y": np.array([1.0, 2.0], np.float32)}
    off = compare_outputs({"y": np.array([1.005, 2.0], np.float32)}, want)
    assert not verify_tolerance(off, accelerated=False)["ok"]
    v = verify_tolerance(off, accelerated=False, own={"y": 1e-3})
    assert v["ok"] and v["allowed"]["y"] == {"abs": pytest.approx(1e-2), "why": "spread"}
    far = compare_outputs({"y": np.array([1.02, 2.0], np.float32)}, want)
    assert not verify_tolerance(far, accelerated=False, own={"y": 1e-3})["ok"]


def test_parts_in_bf16_may_move_as_far_as_the_whole_model_does_in_it_not_more():
    """--precision bf16: an output may move REDUCED_FACTOR times what the whole model moves
    when OpenVINO computes it in bf16; without that measure, or beyond it, it fails."""
    from onnxsplit.running.verify import REDUCED_FACTOR

    want = {"y": np.array([1.0, 2.0], np.float32)}
    moved = compare_outputs({"y": np.array([1.0, 2.03], np.float32)}, want)  # (bf16: 1.5% of 2)
    assert not verify_tolerance(moved, accelerated=True)["ok"]  # (beyond an accelerator's 1e-2 relative)
    reduced = {"precision": "bf16", "spread": {"y": 0.012}}
    v = verify_tolerance(moved, accelerated=True, reduced=reduced)
    assert v["ok"] and v["allowed"]["y"] == {"abs": pytest.approx(REDUCED_FACTOR * 0.012), "why": "reduced"}
    assert v["reduced"] == reduced
    far = compare_outputs({"y": np.array([1.0, 2.0 + 1.5 * REDUCED_FACTOR * 0.012], np.float32)}, want)
    assert not verify_tolerance(far, accelerated=True, reduced=reduced)["ok"]


def test_an_output_that_moves_as_far_as_its_values_cannot_be_checked():
    """A numerically chaotic model (x1e7, then Sin) moves by as much as its values between
    onnxruntime's configurations, or in bf16: a tolerance grounded in that move would pass
    parts computing garbage, so the check fails and says it cannot tell."""
    from onnxsplit.running.verify import UNCHECKABLE_SHARE, failed

    want = {"y": np.array([0.9, -0.4], np.float32)}
    garbage = compare_outputs({"y": np.array([-0.5, 0.3], np.float32)}, want)
    for grounds in ({"own": {"y": 0.8}}, {"reduced": {"precision": "bf16", "spread": {"y": 0.5}}}):
        v = verify_tolerance(garbage, accelerated=True, **grounds)
        assert not v["ok"] and v["allowed"]["y"]["uncheckable"]
        assert failed({**garbage, **v}).startswith("the check cannot tell whether the parts reproduce the model: "
                                                  "output 'y' may be off by")
    # below the share, the same grounds hold as before
    fine = compare_outputs({"y": np.array([0.901, -0.4], np.float32)}, want)
    v = verify_tolerance(fine, accelerated=False, own={"y": 0.9 * UNCHECKABLE_SHARE / 20})  # (allowed: half the share)
    assert v["ok"] and "uncheckable" not in v["allowed"]["y"]


def test_the_reference_spread_is_the_models_own(tmp_path):
    """The original run as the reference and in onnxruntime's default session: an MLP's
    float outputs move a little (another summation order) or not at all, never by more
    than float32 rounding of their size."""
    from onnxsplit.running.verify import reference

    model = mlp(tmp_path / "m.onnx", layers=3, batch=8, width=256)
    feeds = {"x": np.random.default_rng(0).random((8, 256), dtype=np.float32)}
    want, own = reference(model, feeds)
    assert set(own) == set(want) == {"h2"}
    assert 0.0 <= own["h2"] <= 1e-5 * float(np.abs(want["h2"]).max()) + 1e-7


@pytest.mark.parametrize("damage", ["zeroed", "garbage", "subtle"])
def test_parts_with_damaged_weights_fail_the_check(tmp_path, capsys, damage):
    """weights.bin zeroed, overwritten with garbage, or one weight of 256 x 256 moved by
    0.2% (its outputs move by 1.3e-5, under a bar of 1e-4 absolute alone): the check
    fails (exit 1) and says by how much, above which tolerance."""
    model = mlp(tmp_path / "m.onnx", layers=2, batch=8, width=256)
    g = OpGraph.from_onnx(model)
    out = tmp_path / "p"
    export(g, {n.name: "cpu0" if i < 3 else "cpu1" for i, n in enumerate(g.nodes)}, out,
           providers={"cpu0": CPU, "cpu1": CPU})
    assert main(["run", str(out), "--no-measure"]) == 0
    blob = bytearray((out / "weights.bin").read_bytes())
    values = np.frombuffer(blob, dtype=np.float32).copy()
    if damage == "zeroed":
        values[:] = 0
    elif damage == "garbage":
        values[:] = np.random.default_rng(1).standard_normal(len(values)).astype(np.float32)
    else:
        values[1000] *= 1.002
    (out / "weights.bin").write_bytes(values.tobytes())
    capsys.readouterr()
    assert main(["run", str(out), "--no-measure"]) == 1
    err = capsys.readouterr().err
    assert "check failed" in err and "above" in err


def test_parts_that_fail_their_check_are_not_written(tmp_path, capsys, monkeypatch):
    """A model whose weights make NaNs (the original's outputs NaN too: nothing to check
    against), split by a plan file: the check fails in one line that says so, exit 1, and
    the folder a previous split left at --out is still there, as it was (a failed check
    must not take its place); the same plan on sound weights writes and verifies."""
    import onnx
    from onnx import numpy_helper

    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    g = OpGraph.from_onnx(model)
    plan = {"objective": "throughput", "details": {},
            "assignment": {n.name: "cpu0" if i < len(g.nodes) // 2 else "cpu1" for i, n in enumerate(g.nodes)}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "p"
    assert main(["export", str(model), "--plan", str(tmp_path / "plan.json"), "--out", str(out), "--quiet"]) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    m = onnx.load(str(model))
    w = numpy_helper.to_array(m.graph.initializer[0]).copy()
    w.flat[3] = np.nan
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, m.graph.initializer[0].name))
    onnx.save(m, str(tmp_path / "nan.onnx"))
    capsys.readouterr()
    assert main(["export", str(tmp_path / "nan.onnx"), "--plan", str(tmp_path / "plan.json"), "--out", str(out),
                 "--force", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("onnxsplit: error: the parts do not reproduce the model") and err.count("\n") == 1
    assert "NaN(s) in output" in err and "the original model's too" in err and "not written" in err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # (no staging left)


@pytest.mark.parametrize("edit,needle", [
    (lambda p: p.update(assignment=[1, 2]), "'assignment' object"),
    (lambda p: p.update(pieces={"x": "one"}), "'pieces'"),
    (lambda p: p.update(pieces=[0]), "'pieces'"),
    (lambda p: p["details"].update(execution={"cpu_threads": "two"}), "cpu_threads"),
    (lambda p: p["details"].update(execution={"replicas": 0}), "replicas"),
    (lambda p: p["details"].update(execution={"replicas": 10**9}), "replicas must be an integer from 1 to 1024"),
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


def test_a_full_disk_names_the_output(tmp_path, capsys, monkeypatch):
    """A write that fails with no file named (ENOSPC from write()): the one line says
    which output, and nothing is left behind."""
    import errno
    from pathlib import Path

    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    real = Path.write_bytes

    def full(self, data):
        if self.suffix == ".onnx" and ".tmp" in str(self.parent):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "parts"
    line = one_line_error(capsys, [str(model), "--out", str(out), "--quiet"])
    assert line == f"onnxsplit: error: '{out}': No space left on device"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "m.onnx"]


@pytest.mark.parametrize("force", [False, True])
def test_two_exports_to_one_out_at_once_leave_one_whole_output(tmp_path, force):
    """Writers racing for the same --out: each either wins or fails with one line; what
    is left is one whole parts folder (every file of one export), and no staging."""
    import threading

    from onnxsplit.errors import OnnxsplitError
    from onnxsplit.running.compare import run_parts

    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    g = OpGraph.from_onnx(model)
    names = [n.name for n in g.nodes]
    plans = [{n: "cpu0" for n in names}, {n: ("cpu0" if i < 3 else "cpu1") for i, n in enumerate(names)}]
    out = tmp_path / "p"
    for round_ in range(4):
        errors, barrier = [], threading.Barrier(2)

        def write(plan):
            barrier.wait()
            try:
                export(g, plan, out, providers={"cpu0": CPU, "cpu1": CPU}, force=force or round_ > 0)
            except OnnxsplitError as e:
                errors.append(str(e))

        threads = [threading.Thread(target=write, args=(p,)) for p in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(errors) <= 1 and all("--force" in e or "already exists" in e for e in errors), errors
        manifest = json.loads((out / MANIFEST).read_text())
        files = {p.name for p in out.iterdir()}
        assert {p["file"] for p in manifest["parts"]} <= files
        assert len(manifest["parts"]) in (1, 2) and files == {p["file"] for p in manifest["parts"]} | {
            MANIFEST, "annotated.onnx"} | ({"weights.bin"} if manifest["weights"]["file"] else set())
        assert run_parts(out, measure=False)["verify"]["ok"]
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_files_a_command_writes_never_replace_one_the_user_made(tmp_path, capsys, monkeypatch):
    """`workload -o`, `solve -o` and `compare --html` replace a file they wrote before (a
    second run), but refuse in one line, before any work, a file onnxsplit did not write,
    which stays as it was."""
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    demo = str(Path(__file__).parent.parent / "models" / "demo_workload.json")
    theirs = tmp_path / "notes.txt"
    theirs.write_text("precious\n")
    runs = {"workload": ["workload", str(model), "--quiet", "-o"],
            "solve": ["solve", demo, "--quiet", "-o"],
            "compare": ["compare", demo, "--time-limit", "2", "--html"]}
    for name, argv in runs.items():
        mine = tmp_path / f"{name}.out"
        assert main(argv + [str(mine)]) == 0 and mine.stat().st_size > 0
        assert main(argv + [str(mine)]) == 0  # (its own file: replaced)
        capsys.readouterr()
        line = one_line_error(capsys, argv + [str(theirs)])
        assert "not a" in line and "onnxsplit wrote" in line and str(theirs) in line
        assert theirs.read_text() == "precious\n"


def test_input_values_the_model_refuses_are_one_line(tmp_path, capsys, monkeypatch):
    """--input-value that no input holds (NaN, 1e30) is refused as it is read; one the model
    fails on (a token id far outside its embedding) in one line from profiling's first run,
    naming the option, not onnxruntime's traceback."""
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    bert = str(Path(__file__).parent.parent / "models" / "small_bert.onnx")
    shapes = ["--input-shape", "input_ids=1x8", "--input-shape", "attention_mask=1x8", "--quiet"]
    for value in ("nan", "1e30"):
        line = one_line_error(capsys, [bert, *shapes, "--input-value", f"input_ids={value}", "--out", str(tmp_path / "o")])
        assert "the value must be a finite number below 2^63" in line
    line = one_line_error(capsys, [bert, *shapes, "--input-value", "input_ids=-99999", "--out", str(tmp_path / "o")])
    assert "the model fails on CPUExecutionProvider with the inputs profiling feeds it" in line
    assert "--input-value" in line and not (tmp_path / "o").exists()


def test_the_check_feeds_token_ids_across_the_embedding_not_one_row(tmp_path, capsys):
    """Token ids that only index an embedding are fed spread under the table's smallest
    dimension (the manifest's ``index_below``), not all ones: rows of the table other than
    row 1 damaged in the parts' weights (the original untouched) fail the check, which
    ones alone never read."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 16)).astype(np.float32)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
         helper.make_node("MatMul", ["e", "w"], ["h"], name="mm"),
         helper.make_node("Relu", ["h"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 16])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(w, "w")])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    graph = OpGraph.from_onnx(model)
    out = tmp_path / "p"
    export(graph, {"embed": "cpu0", "mm": "cpu1", "relu": "cpu1"}, out, providers={"cpu0": CPU, "cpu1": CPU})
    m = json.loads((out / MANIFEST).read_text())
    assert m["model"]["inputs"][0]["index_below"] == 16
    assert main(["run", str(out), "--no-measure"]) == 0
    # the ids serve takes: those onnxruntime's Gather takes, [-50, 50) (OpenVINO answers others with zeros)
    assert m["model"]["inputs"][0]["index_rows"] == 50
    from onnxsplit.running.kserve import ProtocolError, decode_request
    import onnxruntime as ort
    sess = ort.InferenceSession(str(model), providers=[CPU])

    def body(ids):
        return json.dumps({"inputs": [{"name": "ids", "shape": [1, 64], "datatype": "INT64",
                                       "data": [ids] + [0] * 63}]}).encode()
    for ids in (49, -50):
        sess.run(None, {"ids": np.array([[ids] + [0] * 63], np.int64)})
        assert decode_request(body(ids), None, m["model"]["inputs"])[0]["ids"][0, 0] == ids
    for ids in (50, -51):
        with pytest.raises(Exception):
            sess.run(None, {"ids": np.array([[ids] + [0] * 63], np.int64)})
        with pytest.raises(ProtocolError, match=f"index {ids} is outside the 50 rows of the table it reads"):
            decode_request(body(ids), None, m["model"]["inputs"])
    values = np.fromfile(out / "weights.bin", dtype=np.float32)
    at = next(i for i in range(len(values) - 16) if np.array_equal(values[i:i + 16], table[2]))
    values[at:at + 14 * 16] *= 1.5  # (rows 2 to 15)
    values.tofile(out / "weights.bin")
    capsys.readouterr()
    assert main(["run", str(out), "--no-measure"]) == 1
    assert "check failed" in capsys.readouterr().err


def test_a_line_break_in_a_path_cannot_forge_a_line(tmp_path, capsys):
    """A model path holding a line break and a fake error: the command's own lines stay one
    line each (the break written as \\n), the last its one error."""
    code = main([f"{tmp_path}/a\nonnxsplit: error: forged.onnx", "--out", str(tmp_path / "o")])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and [ln for ln in lines if ln.startswith("onnxsplit: error:")] == [lines[-1]]
    assert "\\nonnxsplit: error: forged.onnx' does not exist" in lines[-1]


DEEP_JSON = "[" * 100_000 + "]" * 100_000  # deeper than Python's JSON parser follows


@pytest.mark.parametrize("which", ["manifest", "force", "workload", "plan", "cluster", "cluster.yaml", "profile"])
def test_json_nested_too_deeply_is_one_line(parts, capsys, monkeypatch, which):
    """Each JSON (or YAML) file a command reads, nested deeper than the parser goes (a
    RecursionError and its traceback before): one line naming the file, left as it was."""
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(parts.parent / "cache"))
    model, out = parts.parent / "m.onnx", parts.parent / "new"
    f = parts / MANIFEST if which in ("manifest", "force") else parts.parent / which
    f = f.with_suffix(f.suffix or ".json")
    f.write_text(DEEP_JSON)
    argv, words = {
        "manifest": (["run", parts, "--no-measure"], [str(f), "nested too deeply"]),
        "force": ([model, "--out", parts, "--force", "--quiet"], [str(parts), "has no onnxsplit manifest.json"]),
        "workload": (["solve", f], [str(f), "nested too deeply"]),
        "plan": (["export", model, "--plan", f, "--out", out, "--quiet"], [str(f), "nested too deeply"]),
        "cluster": ([model, "--out", out, "--devices", f, "--quiet"], [str(f), "nested too deeply"]),
        "cluster.yaml": ([model, "--out", out, "--devices", f, "--quiet"], [str(f), "nested too deeply"]),
        "profile": ([model, "--out", out, "--profile", f, "--quiet"], [str(f), "is not a profile file"]),
    }[which]
    one_line_error(capsys, argv, *words)
    assert f.read_text() == DEEP_JSON and not out.exists()


def test_a_manifest_that_is_no_file_is_one_line_not_a_hang(parts):
    """manifest.json a named pipe: `run` and the main command's --force say the folder has
    no manifest at once (reading it waited for a writer forever)."""
    import os
    import subprocess
    import sys

    (parts / MANIFEST).unlink()
    os.mkfifo(parts / MANIFEST)
    before = sorted(x.name for x in parts.iterdir())
    env = dict(os.environ, ONNXSPLIT_CACHE_DIR=str(parts.parent / "cache"),
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    for argv, words in [(["run", parts, "--no-measure"], "has no manifest.json"),
                        ([parts.parent / "m.onnx", "--out", parts, "--force", "--quiet"],
                         "has no onnxsplit manifest.json")]:
        p = subprocess.run([sys.executable, "-m", "onnxsplit", *map(str, argv)], capture_output=True,
                           text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
        err = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(err) == 1 and words in err[0], p.stderr
    assert sorted(x.name for x in parts.iterdir()) == before


@pytest.mark.parametrize("option, value, words", [("--port", "65536", "must be from 1 to 65535"),
                                                  ("--name", "a/b", "one segment of a URL"),
                                                  ("--name", "", "one segment of a URL")])
def test_a_port_beyond_65535_or_a_name_no_url_can_hold_is_one_line(parts, capsys, option, value, words):
    with pytest.raises(SystemExit) as e:
        main(["serve", str(parts), option, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and words in err[0], err


def test_a_profile_that_is_no_file_is_set_aside_or_one_line(tmp_path, monkeypatch):
    """A named pipe where the cached profile goes is set aside and the model measured again;
    one the user names with --profile is one line (reading either waited forever)."""
    import os
    import subprocess
    import sys

    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    assert main(["profile", str(model), "--quiet"]) == 0
    cache = next((tmp_path / "cache").rglob("*.json"))
    cache.unlink()
    os.mkfifo(cache)
    os.mkfifo(tmp_path / "mine.json")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))

    def cli(*argv):
        return subprocess.run([sys.executable, "-m", "onnxsplit", *map(str, argv)], capture_output=True,
                              text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    p = cli("profile", model, "--quiet")
    assert p.returncode == 0 and "not a regular file); set aside as" in p.stderr, p.stderr
    assert cache.is_file() and (cache.parent / f"{cache.name}.corrupt").exists()
    p = cli(model, "--out", tmp_path / "p", "--quiet", "--profile", tmp_path / "mine.json")
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and "is not a profile file (not a regular file)" in err[0], err


def test_a_misspelt_execution_provider_is_named_with_what_it_may_mean(tmp_path, capsys, monkeypatch):
    """A device whose provider onnxruntime does not know reads as one to estimate: the line
    asking for its peaks says the name is unknown and what it may have meant."""
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"devices": [
        {"name": "cpu", "class": "cpu", "count": 1, "memory": "8GiB", "execution_provider": CPU},
        {"name": "gpu", "class": "gpu", "count": 1, "memory": "8GiB", "execution_provider": "CUDAExecutionProvder"}]}))
    one_line_error(capsys, [model, "--out", tmp_path / "o", "--devices", cluster, "--quiet"],
                   "device 'gpu' (CUDAExecutionProvder)", "is no execution provider onnxruntime knows",
                   "did you mean 'CUDAExecutionProvider'?")
    assert not (tmp_path / "o").exists()


def test_a_profile_cache_that_cannot_be_written_is_a_note(tmp_path, capsys, monkeypatch):
    """$ONNXSPLIT_CACHE_DIR a file of the user's: the split goes on with its measurements
    (a note says they are not kept; it ended in one line of 'Not a directory'), the file
    untouched."""
    (tmp_path / "cache").write_text("a user's file\n")
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    assert main([str(model), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "cannot be written" in err and "the measurements are used, not kept" in err, err
    assert (tmp_path / "cache").read_text() == "a user's file\n" and (tmp_path / "o" / MANIFEST).is_file()
