"""The main command end to end: onnxsplit MODEL --out DIR, export --plan, run, bad input."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnx_models import TINY_BERT, control_flow, make, mlp, save, vi
from onnxsplit import calibrate as cal
from onnxsplit.cli import main
from onnxsplit.running.runner import Parts, random_feeds
from onnxsplit.workflow import (CALL_GIL_MS, COPIES_OVER_DEFAULT, MIN_CONFIG_GAIN, MIN_SPLIT_GAIN,
                                STAGE_OVERHEAD_MS)

TINY_ARGS = ["--input-shape", "input_ids=1x32", "--input-shape", "attention_mask=1x32"]


def run_json(capsys, argv):
    code = main(argv + ["--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def original_outputs(model, feeds):
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def test_split_tiny_bert_reproduces_the_model(tmp_path, capsys, own_cache):
    out = tmp_path / "parts"
    code, res = run_json(capsys, [str(TINY_BERT), "--out", str(out)] + TINY_ARGS)
    assert code == 0
    assert res["out"] == str(out) and res["parts"] == sorted(res["parts"], key=lambda f: int(f[4:f.index("_")]))
    assert {p.name for p in out.iterdir()} >= set(res["parts"]) | {"manifest.json", "plan.json"}
    assert res["verify"]["max_abs_error"] <= 1e-4
    # independent check: our own run of the parts against onnxruntime on the original
    parts = Parts(out)
    feeds = random_feeds(parts.inputs, seed=3)
    want = original_outputs(TINY_BERT, feeds)
    got = parts.run(feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, atol=1e-5)
    plan = res["plan"]
    assert plan["objective"] == "throughput" and plan["value"] > 0
    n = len(res["parts"])
    # the plan beats, or is, the best way to run the model whole that the calibration
    # measured: onnxruntime's default session, or copies of the model side by side
    cache = json.loads(next((tmp_path / "cache").rglob("*.json")).read_text())
    as_run = cache["entries"][0]["as_run"]
    # the default session and the copies as calibrated, kept for `run` to weigh the
    # machine's own drift: the copies only where calibrated as `run` runs them, with
    # every graph optimisation
    keys = ("latency_ms", "throughput_per_s")
    one_per_core = as_run["replicas"]["1"]
    want = {"ort_default_cpu": {k: pytest.approx(as_run["default"][k]) for k in keys}}
    if one_per_core["copies"] > 1 and one_per_core["optimization"] == "all":
        want[f"ort_replicas_cpu_{one_per_core['copies']}x1"] = {
            k: pytest.approx(one_per_core[k]) for k in keys}
    assert res["predicted"]["baselines"] == want
    default = as_run["default"]["throughput_per_s"]
    copies = max((r["throughput_per_s"] for r in as_run["replicas"].values() if r["copies"] > 1),
                 default=None)
    # one session configured otherwise (fewer threads, or on every core at another level)
    # only where it promises MIN_CONFIG_GAIN times the default session
    sessions = [r["throughput_per_s"] for t, r in as_run["replicas"].items() if r["copies"] == 1
                and (int(t) < as_run["cores"] or r["optimization"] != "all")
                and r["throughput_per_s"] > MIN_CONFIG_GAIN * default]
    # the best whole way, copies staying unless the default session promises
    # COPIES_OVER_DEFAULT times more
    best = max([default, copies or 0.0] + sessions)
    if best == default and copies is not None and default < COPIES_OVER_DEFAULT * copies:
        best = copies
    if plan["method"] == "whole":
        assert res["predicted"]["throughput_per_s"] == pytest.approx(best)
        assert res["predicted"]["from"] == "calibration" and n == 1
    else:
        # a split promised MIN_SPLIT_GAIN times the best whole way from the profile, and
        # still beats it once its parts were timed as written
        assert res["predicted"]["from"] == "parts"
        assert res["predicted"]["profile"]["throughput_per_s"] >= MIN_SPLIT_GAIN * best
        assert res["predicted"]["throughput_per_s"] >= best
    assert len(plan["assignment"]) == len(onnx.load(str(TINY_BERT)).graph.node)


def test_plan_json_is_editable_and_reapplied(tmp_path, capsys):
    model = mlp(tmp_path / "mlp.onnx", layers=3, batch=4, width=64)
    first = tmp_path / "a"
    code, res = run_json(capsys, [str(model), "--out", str(first)])
    assert code == 0
    plan = json.loads((first / "plan.json").read_text())
    names = [n.name for n in onnx.load(str(model)).graph.node]
    assert set(plan["assignment"]) == set(names)  # nodes by name: a user can edit it
    # move everything after the first layer to cpu1, the first layer to cpu0
    plan["assignment"] = {n: ("cpu0" if n.endswith("0") else "cpu1") for n in names}
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(plan))
    second = tmp_path / "b"
    code, res = run_json(capsys, ["export", str(model), "--plan", str(edited), "--out", str(second)])
    assert code == 0 and res["verify"]["max_abs_error"] == 0.0
    manifest = json.loads((second / "manifest.json").read_text())
    devices = {p["device"]: p["nodes"] for p in manifest["parts"]}
    assert devices == {"cpu0": 3, "cpu1": 6}
    assert res["plan"]["method"] == "given"
    # export writes the folder's report too, of the plan it was given: both cores drawn,
    # the tensor cut between them named (tests/test_parts_report.py looks at such pages)
    page = (second / "report.html").read_text()
    assert res["report"] == str(second / "report.html")
    assert "cpu0 → cpu1" in page and all(f"<td>{d}</td>" in page or f">{d}<" in page for d in devices)
    # the edited plan is predicted from its parts as written and timed (the calibration
    # is in the cache): the slower device's parts bound its rate
    pred = manifest["predicted"]
    assert pred["from"] == "parts" == res["predicted"]["from"] and len(pred["part_ms"]) == 2
    assert all(np.isfinite(v) and v > 0 for v in pred["part_ms"])
    assert pred["throughput_per_s"] <= 1e3 / max(pred["part_ms"])
    assert pred["latency_ms"] >= sum(pred["part_ms"])


def estimated_gpu_cluster(path):
    """One CPU core and one fast GPU that onnxruntime cannot drive here (estimated)."""
    path.write_text(json.dumps({
        "devices": [{"name": "cpu", "class": "cpu", "count": 1, "memory": "8GiB",
                     "execution_provider": "CPUExecutionProvider"},
                    {"name": "gpu", "class": "gpu", "count": 1, "memory": "8GiB",
                     "peak_flops": 1e14, "memory_bandwidth": "900GB/s"}],
        "links": [{"between": ["cpu", "gpu"], "bandwidth": "16GB/s", "latency": "10us"}]}))
    return path


def test_pins_keep_matching_operators_on_the_cpu(tmp_path, capsys):
    """With an (estimated) accelerator, pinned op types never go to it."""
    model = mlp(tmp_path / "mlp.onnx", layers=2, batch=64, width=256)
    cluster = estimated_gpu_cluster(tmp_path / "c.json")
    out = tmp_path / "p"
    code, res = run_json(capsys, [str(model), "--out", str(out), "--devices", str(cluster),
                                  "--pin", "Relu=cpu"])
    assert code == 0
    plan = json.loads((out / "plan.json").read_text())
    relus = [n for n in plan["assignment"] if n.startswith("relu")]
    assert relus and all(plan["assignment"][n] == "cpu0" for n in relus)
    # the fast estimated GPU takes the MatMuls: the pin changed something real
    assert any(d == "acc0" for n, d in plan["assignment"].items() if n.startswith("matmul"))
    # parts for the absent GPU are verified on the CPU
    assert res["verify"]["max_abs_error"] <= 1e-5
    manifest = json.loads((out / "manifest.json").read_text())
    assert any(p["execution_provider"] == "gpu (no execution provider)" or
               p["device"].startswith("acc") for p in manifest["parts"])
    # parts that all ran on the CPU are held to the exact tolerance
    assert res["verify"]["ok"] and res["verify"]["tolerance"] == {"max_abs_error": 1e-6}


def test_control_flow_model_splits_and_verifies(tmp_path, capsys):
    model = control_flow(tmp_path / "cf.onnx")
    code, res = run_json(capsys, [str(model), "--out", str(tmp_path / "p")])
    assert code == 0 and res["verify"]["max_abs_error"] <= 1e-6


def test_input_value_steers_the_check_run(tmp_path, capsys):
    """An input that picks an If branch: fed the given value, not the default ones."""
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["t"], name="sq")], "then", [],
                               [vi("t", [2, 3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="neg")], "else", [],
                               [vi("e", [2, 3])])
    nodes = [helper.make_node("Equal", ["mode", "two"], ["c"], name="eq"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)]
    two = onnx.numpy_helper.from_array(np.array(2, np.int64), "two")
    path = save(make(nodes, [vi("x", [2, 3]), vi("mode", [], onnx.TensorProto.INT64)],
                     [vi("y", [2, 3])], [two]), tmp_path / "m.onnx")
    out = tmp_path / "p"
    code, res = run_json(capsys, [str(path), "--out", str(out), "--input-value", "mode=2"])
    assert code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert {i["name"]: i.get("fill") for i in manifest["model"]["inputs"]} == {"x": None, "mode": 2}
    feeds = random_feeds(manifest["model"]["inputs"])
    assert feeds["mode"] == 2
    got = Parts(out).run(feeds)["y"]
    np.testing.assert_allclose(got, feeds["x"] ** 2)  # the 'then' branch ran


# ----------------------------------------------------------------------------- bad input


def _bad_models(d):
    ok = mlp(d / "ok.onnx", layers=2, batch=4, width=64)
    (d / "empty.onnx").write_bytes(b"")
    (d / "text.onnx").write_text("not a model at all")
    raw = ok.read_bytes()
    (d / "truncated.onnx").write_bytes(raw[: len(raw) // 2])
    save(make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2, 2])], [vi("y", [2, 2])],
              opset=99), d / "opset99.onnx")
    m = make([helper.make_node("FooBar", ["x"], ["y"], domain="com.acme")], [vi("x", [2, 2])],
             [vi("y", [2, 2])])
    m.opset_import.append(helper.make_opsetid("com.acme", 1))
    save(m, d / "unknown_op.onnx")
    save(make([helper.make_node("Relu", ["b"], ["a"], name="A"),
               helper.make_node("Relu", ["a"], ["b"], name="B"),
               helper.make_node("Relu", ["a"], ["y"], name="C")],
              [vi("x", [2, 2])], [vi("y", [2, 2])]), d / "cycle.onnx")
    save(make([helper.make_node("Add", ["x", "ghost"], ["y"], name="add")], [vi("x", [2, 2])],
              [vi("y", [2, 2])]), d / "dangling.onnx")
    save(make([], [vi("x", [2, 2])], [vi("x", [2, 2])]), d / "no_ops.onnx")
    mlp(d / "dynamic.onnx", layers=2, batch=4, width=64, dynamic_batch=True)
    (d / "bad_cluster.json").write_text('{"devices": [{"name": "g", "class": "gpu", "count": "two"}]}')
    (d / "small_cluster.json").write_text(json.dumps({
        "devices": [{"name": "cpu", "class": "cpu", "count": 2, "memory": "1KiB",
                     "execution_provider": "CPUExecutionProvider"}], "links": []}))
    (d / "exists").mkdir()
    return ok


BAD = [
    (["missing.onnx"], "does not exist"),
    (["empty.onnx"], "is empty"),
    (["text.onnx"], "not a readable ONNX model"),
    (["truncated.onnx"], "not a readable ONNX model"),
    (["opset99.onnx"], "unsupported opset"),
    (["unknown_op.onnx"], "com.acme::FooBar"),
    (["cycle.onnx"], "cycle"),
    (["dangling.onnx"], "'ghost' that nothing produces"),
    (["no_ops.onnx"], "no operators"),
    (["dynamic.onnx"], "unbound dimension"),
    (["ok.onnx", "--devices", "bad_cluster.json"], "count must be an integer"),
    (["ok.onnx", "--devices", "nowhere.json"], "does not exist"),
    (["ok.onnx", "--devices", "small_cluster.json"], "short"),
    (["ok.onnx", "--pin", "Nothing=cpu"], "matches no operator"),
    (["ok.onnx", "--pin", "Relu=tpu"], "unknown device"),
    (["ok.onnx", "--input-value", "nope=3"], "not an input"),
]


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_one_line_error_and_nothing_written(tmp_path, capsys, monkeypatch, args, needle):
    _bad_models(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = set(p.name for p in tmp_path.iterdir())
    code = main(args + ["--out", "parts", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert len(err) == 1 and err[0].startswith("onnxsplit: error: ") and needle in err[0], err
    after = set(p.name for p in tmp_path.iterdir()) - {"cache"}  # the profile cache may fill
    assert after == before  # no parts, no staging folder


def test_a_bad_pin_or_plan_file_is_refused_before_any_calibration(tmp_path, capsys, monkeypatch):
    """What the user wrote is checked before a minute of measuring the machine."""
    from onnxsplit import calibrations

    def calibrated(*args, **kwargs):
        raise AssertionError("calibrated before refusing")

    monkeypatch.setattr(calibrations, "calibrated", calibrated)
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=16)
    assert main([str(model), "--out", str(tmp_path / "p"), "--pin", "Nothing=cpu", "--quiet"]) == 2
    assert "matches no operator" in capsys.readouterr().err
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"objective": "throughput", "assignment": {"no_such_node": "cpu0"}}))
    assert main(["export", str(model), "--plan", str(plan), "--out", str(tmp_path / "q"), "--quiet"]) == 2
    assert "not in the model" in capsys.readouterr().err
    assert not (tmp_path / "p").exists() and not (tmp_path / "q").exists()


def test_existing_output_needs_force(tmp_path, capsys, monkeypatch):
    _bad_models(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exists" / "keep.txt").write_text("x")
    assert main(["ok.onnx", "--out", "exists", "--quiet"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (tmp_path / "exists" / "keep.txt").exists()
    # --force never deletes what onnxsplit did not write
    assert main(["ok.onnx", "--out", "exists", "--quiet", "--force"]) == 2
    assert "replaces only a parts folder onnxsplit made" in capsys.readouterr().err
    assert (tmp_path / "exists" / "keep.txt").read_text() == "x"
    assert main(["ok.onnx", "--out", "made", "--quiet"]) == 0
    assert main(["ok.onnx", "--out", "made", "--quiet", "--force"]) == 0
    assert (tmp_path / "made" / "manifest.json").exists()
    # the model's own folder, or the working folder, is never an output to replace
    assert main(["ok.onnx", "--out", ".", "--quiet", "--force"]) == 2
    assert (tmp_path / "ok.onnx").exists() and (tmp_path / "exists" / "keep.txt").exists()
    # a model kept inside an earlier parts folder is not replaced with it
    (tmp_path / "made" / "model.onnx").write_bytes((tmp_path / "ok.onnx").read_bytes())
    assert main(["made/model.onnx", "--out", "made", "--quiet", "--force"]) == 2
    assert "'model.onnx'" in capsys.readouterr().err and (tmp_path / "made" / "model.onnx").exists()


def test_help_explains_the_main_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "onnxsplit model.onnx --out parts/" in text and "onnxsplit run parts/" in text


def test_python_api_split_then_run(tmp_path):
    import onnxsplit

    model = mlp(tmp_path / "mlp.onnx", layers=4, batch=16, width=128)
    res = onnxsplit.split(model, tmp_path / "p", quiet=True)
    assert res["verify"]["max_abs_error"] == 0.0
    report = onnxsplit.run(tmp_path / "p", samples=10, warmup=2)
    for key in ("verify", "measured", "predicted"):
        assert set(report[key]) >= ({"max_abs_error", "max_rel_error"} if key == "verify"
                                    else {"latency_ms", "throughput_per_s"})
    assert report["measured"]["throughput_per_s"] > 0
    assert report["predicted"]["throughput_per_s"] == pytest.approx(res["predicted"]["throughput_per_s"])
    # the loaded pipeline streams samples in order
    pipe = onnxsplit.load(tmp_path / "p")
    xs = [{"x": np.full((16, 128), i, np.float32)} for i in range(6)]
    outs = list(pipe.stream(xs, depth=3))
    for x, y in zip(xs, outs):
        np.testing.assert_array_equal(y[pipe.output_names[0]], pipe.run(x)[pipe.output_names[0]])


@pytest.mark.parametrize("ms,split", [(0.02, False), (5.0, True)])
def test_auto_keeps_a_model_whole_when_hand_offs_cost_more_than_the_split_saves(ms, split):
    from workloads import edge, node, workload
    from onnxsplit.workflow import _whole_if_split_does_not_pay, choose_plan, predict

    from onnxsplit.workload import Workload

    w = Workload.from_paper_json(workload([node(i, cpu=ms, acc=ms, supported=False) for i in range(4)],
                                          [edge(i, i + 1, 0.0) for i in range(3)], k=0, l=2))
    best = choose_plan(w, "throughput")
    assert len(set(best.assignment.values())) == 2 and best.value == pytest.approx(2 * ms)
    chosen = _whole_if_split_does_not_pay(w, best)
    assert (len(set(chosen.assignment.values())) == 2) is split
    # the arithmetic behind it: 2 stages of 2*ms + overhead each, against 4*ms whole
    two = 1e3 / max(2 * ms + STAGE_OVERHEAD_MS, 2 * CALL_GIL_MS)
    assert predict(w, best)["throughput_per_s"] == pytest.approx(two)
    assert (two >= 1.1 * 1e3 / (4 * ms)) is split


@pytest.mark.parametrize("ms,split", [(0.02, False), (5.0, True)])
def test_auto_keeps_a_model_whole_when_a_latency_split_does_not_pay(ms, split):
    """A chain whose accelerator holds half of it: the latency plan runs two nodes there
    (at half the CPU's time) and two on the CPU, one call each.  In the runner that is
    3 ms-units plus 3 hand-offs, against 4 units plus 2 hand-offs on the CPU alone."""
    from workloads import edge, node, workload
    from onnxsplit.workflow import _whole_if_split_does_not_pay, choose_plan, predict

    from onnxsplit.workload import Workload

    w = Workload.from_paper_json(workload([node(i, cpu=ms, acc=ms / 2, size=1) for i in range(4)],
                                          [edge(i, i + 1, 0.0) for i in range(3)], k=1, l=1, mem=2))
    best = choose_plan(w, "latency")
    assert best.value == pytest.approx(3 * ms) and len(set(best.assignment.values())) == 2
    assert predict(w, best)["latency_ms"] == pytest.approx(3 * ms + 3 * STAGE_OVERHEAD_MS)
    chosen = _whole_if_split_does_not_pay(w, best)
    assert (len(set(chosen.assignment.values())) == 2) is split
    assert ((4 * ms + 2 * STAGE_OVERHEAD_MS) >= 1.1 * (3 * ms + 3 * STAGE_OVERHEAD_MS)) is split
    if not split:
        assert chosen.objective == "latency" and "does not pay" in chosen.details["why"]

def test_compare_on_a_model(tmp_path, capsys):
    model = mlp(tmp_path / "mlp.onnx", layers=3, batch=16, width=128)
    code = main(["compare", str(model), "--json", "--time-limit", "10"])
    assert code == 0
    res = json.loads(capsys.readouterr().out)
    by = {m["method"]: m for m in res["methods"]}
    # every plan is no better than the proven bound, and the IP (non-contiguous, warm
    # started from the quick methods) is the best of them
    values = [m["value"] for m in res["methods"]
              if m.get("value") is not None and m.get("status") != "infeasible"]
    assert res["best_lower_bound"] is not None and min(values) >= res["best_lower_bound"] - 1e-9
    assert by["ip"]["value"] <= min(values) + 1e-9
    assert by["all_cpu"]["value"] == pytest.approx(2 * by["dp"]["value"], rel=0.5)


def test_latency_split_with_cpu_calls_around_accelerator_calls(tmp_path, capsys):
    """A latency plan names only its accelerator calls; with the middle MatMul pinned to
    the (estimated) GPU and the outer ones to the CPU, the CPU runs a call before the
    GPU's and one after (one call for both would wait on the GPU's, and it on them)."""
    model = mlp(tmp_path / "mlp.onnx", layers=3, batch=64, width=256)
    cluster = estimated_gpu_cluster(tmp_path / "c.json")
    out = tmp_path / "p"
    code, res = run_json(capsys, [str(model), "--out", str(out), "--devices", str(cluster),
                                  "--pin", "matmul0|matmul2=cpu", "--pin", "matmul1=acc",
                                  "--objective", "latency"])
    assert code == 0, res
    assert res["verify"]["max_abs_error"] <= 1e-5
    manifest = json.loads((out / "manifest.json").read_text())
    cpu_parts = [p for p in manifest["parts"] if p["device"] == "cpu0"]
    acc_parts = [p for p in manifest["parts"] if p["device"].startswith("acc")]
    assert acc_parts and len(cpu_parts) >= 2


def test_a_calibration_whose_copies_no_longer_run_as_chosen_is_measured_again(tmp_path, capsys, own_cache):
    """Copies stored at an optimisation level the rule no longer picks (an earlier rule
    took a 1% faster unoptimised session) are not what a plan would run: the split
    measures the machine again rather than plan from them."""
    model = mlp(tmp_path / "m.onnx", layers=3, batch=4, width=64)
    code, _ = run_json(capsys, [str(model), "--out", str(tmp_path / "a")])
    assert code == 0
    path = next((tmp_path / "cache").rglob("*.json"))
    cache = json.loads(path.read_text())
    cpu = next(i for i, e in enumerate(cache["entries"])
               if e["device"]["execution_provider"] == "CPUExecutionProvider")
    record = cache["entries"][cpu]["as_run"]
    marker = {"latency_ms": 1e4, "throughput_per_s": 0.1}
    record["default"].update(marker)
    record["threads"]["1"] = {"all": 10.0, "disabled": 9.9}
    record["replicas"]["1"]["optimization"] = "disabled"
    path.write_text(json.dumps(cache))
    code, got = run_json(capsys, [str(model), "--out", str(tmp_path / "b")])
    assert code == 0
    fresh = got["predicted"]["baselines"]["ort_default_cpu"]
    assert 0 < fresh["latency_ms"] < 1e3  # measured again, not the stored marker
    stored = next(e for e in json.loads(path.read_text())["entries"]
                  if e["device"]["execution_provider"] == "CPUExecutionProvider")["as_run"]
    assert stored["default"]["latency_ms"] == pytest.approx(fresh["latency_ms"])
    assert not cal.stale(stored)


def test_recalibrate_measures_the_machine_again(tmp_path, capsys, own_cache):
    """A calibration stored with the profile is reused as it is, however the machine has
    moved since; --recalibrate measures it again and stores the new one."""
    model = mlp(tmp_path / "m.onnx", layers=3, batch=4, width=64)
    code, first = run_json(capsys, [str(model), "--out", str(tmp_path / "a")])
    assert code == 0
    path = next((tmp_path / "cache").rglob("*.json"))
    cache = json.loads(path.read_text())
    stale = {"latency_ms": 1e4, "throughput_per_s": 0.1}  # a machine 10 s a sample slow
    cache["entries"][0]["as_run"]["default"].update(stale)
    path.write_text(json.dumps(cache))
    code, again = run_json(capsys, [str(model), "--out", str(tmp_path / "b")])
    assert code == 0 and again["predicted"]["baselines"]["ort_default_cpu"] == stale
    code, fresh = run_json(capsys, [str(model), "--out", str(tmp_path / "c"), "--recalibrate"])
    assert code == 0
    measured = fresh["predicted"]["baselines"]["ort_default_cpu"]
    assert 0 < measured["latency_ms"] < 1e3 and measured["throughput_per_s"] > 1
    stored = json.loads(path.read_text())["entries"][0]["as_run"]["default"]
    assert stored["latency_ms"] == pytest.approx(measured["latency_ms"])
