"""Providers beyond onnxruntime's built-in EPs: plugin EP libraries (onnxsplit/providers/plugins.py)
and OpenVINO's own runtime (onnxsplit/providers/openvino.py), which run parts on the CPU's cores.

Tests that need OpenVINO skip where it is not installed (``make test`` installs the
``openvino`` extra); the plugin EP's device tests skip where it offers no device (it
takes Intel hardware only)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from onnx_models import make, mlp, save, vi
from test_machine import record
from workloads import diamond
from onnxsplit import calibrate, machine
from onnxsplit.providers import openvino, plugins
from onnxsplit.cli import main
from onnxsplit.errors import OnnxsplitError
from onnxsplit.profile import devices
from onnxsplit.profile.devices import CPU_EP, available_providers, provider_lines, shares_cpu
from onnxsplit.running.runner import Parts, measure_pipeline
from onnxsplit.running.compare import baselines
from onnxsplit.workload import Workload

pytestmark = pytest.mark.every_provider  # (every provider installed: tests/conftest.py)
needs_openvino = pytest.mark.skipif(not openvino.available(), reason="OpenVINO's runtime is not installed")
OV_EP = "OpenVINOExecutionProvider"


def reference(model: Path, feeds) -> dict:
    sess = ort.InferenceSession(str(model), providers=[CPU_EP])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def det_model(path: Path) -> Path:
    """One Det node: onnxruntime runs it, OpenVINO's ONNX frontend has no rule for it."""
    return save(make([helper.make_node("Det", ["x"], ["y"], name="det")], [vi("x", [3, 3])],
                     [vi("y", None)]), path)


# ---------------------------------------------------------------------- plugin libraries


def test_ep_library_specs_are_name_path_pairs():
    assert plugins.parse_spec("A=/x/liba.so; B=/y/libb.so,") == {"A": "/x/liba.so", "B": "/y/libb.so"}
    for bad in ("A", "=/x.so", "A="):
        with pytest.raises(OnnxsplitError, match="expected NAME=PATH"):
            plugins.parse_spec(bad)


def test_an_ep_library_that_is_not_there_is_one_line(tmp_path, capsys):
    model = mlp(tmp_path / "m.onnx", layers=1, batch=2, width=8)
    code = main([str(model), "--out", str(tmp_path / "p"), "--ep-library", f"X={tmp_path / 'none.so'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"onnxsplit: error: --ep-library X={tmp_path / 'none.so'}: no such file"]
    assert not (tmp_path / "p").exists()


def test_an_ep_library_that_does_not_load_leaves_everything_else_working(tmp_path, monkeypatch):
    """A file that is no EP library: its registration fails, is remembered and said, and
    the providers present stay those of onnxruntime (and OpenVINO's runtime)."""
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(b"not a shared library")
    monkeypatch.setenv(plugins.ENV, f"JunkExecutionProvider={junk}")
    plugins.libraries.cache_clear()
    try:
        found = {p.name: p for p in plugins.plugins()}
        assert found["JunkExecutionProvider"].devices == ()
        assert found["JunkExecutionProvider"].error
        assert "JunkExecutionProvider" not in available_providers()
        assert any(line.startswith("JunkExecutionProvider") and "did not load" in line
                   for line in provider_lines())
    finally:
        monkeypatch.delenv(plugins.ENV)
        plugins.libraries.cache_clear()


def test_devices_says_in_one_line_what_each_provider_offers(capsys):
    assert main(["devices"]) == 0
    cap = capsys.readouterr()
    spec = json.loads(cap.out)
    cpu = next(d for d in spec["devices"] if d["class"] == "cpu")
    notes = [line for line in cap.err.splitlines() if line.startswith("onnxsplit: note: ")]
    said = {line.split(": ", 2)[2].split(" ")[0].rstrip(":") for line in notes}
    assert {openvino.RUNTIME, OV_EP} <= said  # present or absent, each is named
    # the providers that run on the cores are the CPU's, not accelerators of their own;
    # the detected cluster plans for OpenVINO through its own runtime
    assert cpu.get("shared_by", []) == ([openvino.RUNTIME] if openvino.available() else [])
    assert all(shares_cpu(ep) for ep in cpu.get("shared_by", []))
    assert all(d["class"] == "cpu" or d.get("execution_provider") not in (OV_EP, openvino.RUNTIME)
               for d in spec["devices"])
    if OV_EP in plugins.libraries() and not plugins.ep_devices(OV_EP):
        assert any("offers no device on this machine" in line for line in notes)
    if openvino.available():  # (and what it computes in by default, where that is not float32)
        line = next(n for n in notes if n.startswith(f"onnxsplit: note: {openvino.RUNTIME}: "))
        assert ("computes in bf16 by default on this CPU" in line) == openvino.bf16_units()


def test_names_a_plugin_library_adds_beside_its_own_are_not_devices(monkeypatch):
    """OpenVINO's library also registers 'OpenVINOExecutionProvider.AUTO' (its AUTO device
    over the same hardware): not a device class of its own, so not profiled or planned."""
    monkeypatch.setattr(plugins, "register", lambda: {"P": "/lib.so"})
    monkeypatch.setattr(plugins, "providers", lambda: ["P"])
    monkeypatch.setattr(openvino, "available", lambda: False)
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["AzureExecutionProvider", "CPUExecutionProvider", "P", "P.AUTO", "Q"])
    monkeypatch.delenv("ONNXSPLIT_PROVIDERS", raising=False)
    assert available_providers() == ["Q", "P", CPU_EP]


def test_openvinos_ep_is_held_to_the_precision_of_onnxsplits_openvino_parts(monkeypatch):
    """On a CPU with bf16 units OpenVINO's EP computes in bf16 unless its load_config says
    otherwise (its 'precision' option is ignored there): the config onnxsplit gives it
    follows --precision, and keeps what the caller's own load_config says."""
    monkeypatch.delenv(openvino.PRECISION_ENV, raising=False)
    got = json.loads(plugins.precision_config(OV_EP)["load_config"])
    assert got == {"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}
    monkeypatch.setenv(openvino.PRECISION_ENV, "bf16")
    mine = json.dumps({"CPU": {"NUM_STREAMS": "2"}, "GPU": {"X": "1"}})
    got = json.loads(plugins.precision_config(OV_EP, "cpu", mine)["load_config"])
    assert got == {"CPU": {"NUM_STREAMS": "2", "INFERENCE_PRECISION_HINT": "bf16"}, "GPU": {"X": "1"}}
    assert plugins.precision_config("OtherEP") == {}
    assert plugins.precision_config("OtherEP", "cpu", mine) == {"load_config": mine}


def test_a_parts_config_holds_it_to_the_precision_in_force(monkeypatch):
    """What export writes in a part's config so that `run` computes as the plan was
    measured: nothing in float32; in bf16, OpenVINO's own property for its runtime and the
    plugin EP's load_config for the EP (read back as the EP's options); nothing for others."""
    monkeypatch.delenv(openvino.PRECISION_ENV, raising=False)
    assert [plugins.part_config(ep) for ep in (openvino.RUNTIME, OV_EP, CPU_EP)] == [{}, {}, {}]
    monkeypatch.setenv(openvino.PRECISION_ENV, "bf16")
    assert plugins.part_config(openvino.RUNTIME) == {"INFERENCE_PRECISION_HINT": "bf16"}
    options, rest = plugins.options_of(OV_EP, plugins.part_config(OV_EP))
    assert rest == {} and json.loads(options["load_config"]) == {"CPU": {"INFERENCE_PRECISION_HINT": "bf16"}}
    assert plugins.part_config(CPU_EP) == {}
    assert devices.precision_note(OV_EP) == ", computing in bf16"
    assert devices.precision_note(OV_EP, "Intel Xeon, computing in bf16") == ", computing in bf16"
    assert devices.precision_note(OV_EP, "Intel Xeon") == ""


@pytest.mark.skipif(not plugins.ep_devices(OV_EP), reason="the OpenVINO plugin EP offers no device here")
def test_a_model_runs_on_the_openvino_plugin_ep_as_on_the_cpu(tmp_path):
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=32)
    feeds = {"x": np.random.default_rng(0).random((4, 32), dtype=np.float32)}
    parts = Parts.whole(model, OV_EP)
    assert parts.execution_providers == [OV_EP]
    got, want = parts.run(feeds), reference(model, feeds)
    assert np.abs(got["h1"] - want["h1"]).max() <= 1e-4


# ------------------------------------------------------------------ OpenVINO's runtime


@needs_openvino
@pytest.mark.parametrize("how", [{"threads": 0}, {"threads": 1}, {"threads": 1, "replicas": 2}])
def test_openvino_runs_a_model_as_onnxruntime_does(tmp_path, how):
    model = mlp(tmp_path / "m.onnx", layers=3, batch=8, width=64, dynamic_batch=True)
    rng = np.random.default_rng(1)
    parts = Parts.whole(model, openvino.RUNTIME, **how)
    assert parts.execution_providers == [openvino.RUNTIME]
    for batch in (8, 3):  # a dynamic dimension: compiled for each shape it is run with
        feeds = {"x": rng.random((batch, 64), dtype=np.float32)}
        want = reference(model, feeds)["h2"]
        assert np.abs(parts.run(feeds)["h2"] - want).max() <= 1e-4
        # streams side by side: every sample's own outputs, in order
        samples = [{"x": rng.random((batch, 64), dtype=np.float32)} for _ in range(6)]
        for s, out in zip(samples, parts.stream(samples)):
            assert np.abs(out["h2"] - reference(model, s)["h2"]).max() <= 1e-4


@needs_openvino
def test_one_part_on_openvinos_streams_runs_through_its_own_queue(tmp_path, monkeypatch):
    """The whole model on OpenVINO's runtime with two streams streams through OpenVINO's
    queue of infer requests (the threaded pipeline ran the same compiled model slower):
    each sample's own outputs in order, across samples of other shapes (the queue drains,
    another compiles), a sample it refuses ends the stream in one line naming the part,
    and a sample missing an input is the runner's own error."""
    import openvino as ov

    from onnxsplit.errors import RunError

    made = []
    real = ov.AsyncInferQueue
    monkeypatch.setattr(ov, "AsyncInferQueue", lambda compiled, jobs: made.append(jobs) or real(compiled, jobs))
    model = mlp(tmp_path / "m.onnx", layers=3, batch=8, width=64, dynamic_batch=True)
    parts = Parts.whole(model, openvino.RUNTIME, threads=1, replicas=2)
    rng = np.random.default_rng(4)
    samples = [{"x": rng.random((b, 64), dtype=np.float32)} for b in (8, 8, 8, 3, 3, 8, 8)]
    outs = list(parts.stream(samples))
    assert made == [2, 2, 2] and len(outs) == len(samples)
    for s, out in zip(samples, outs):
        np.testing.assert_allclose(out["h2"], reference(model, s)["h2"], rtol=1e-4, atol=1e-5)
    with pytest.raises(RunError, match=r"^part whole on whole failed: .*") as got:
        list(parts.stream(samples[:2] + [{"x": np.ones((8, 63), np.float32)}] + samples[2:]))
    assert "\n" not in str(got.value)
    with pytest.raises(RunError, match=r"^input 'x' is not given$"):
        list(parts.stream(samples[:2] + [{"y": samples[0]["x"]}]))
    # with a deadline to keep, the threaded pipeline runs it
    made.clear()
    assert len(list(parts.stream(samples[:3], timeout_s=30))) == 3 and made == []


@needs_openvino
def test_openvinos_queue_names_the_outputs_as_the_model_does(tmp_path):
    """An output behind an Identity answers in the compiled model to its input's name
    (GPT-2's 'view_80'), not the model's: the queue names the outputs as the model does
    (the split of GPT-2 failed with KeyError 'view_80' in its calibration)."""
    nodes = [helper.make_node("Relu", ["x"], ["view_80"]), helper.make_node("Identity", ["view_80"], ["y"]),
             helper.make_node("Neg", ["view_80"], ["z"])]
    model = save(make(nodes, [vi("x", [2, 4])], [vi("y", [2, 4]), vi("z", [2, 4])]), tmp_path / "m.onnx")
    parts = Parts.whole(model, openvino.RUNTIME, threads=1, replicas=2)
    samples = [{"x": np.full((2, 4), v, np.float32)} for v in (-1.0, 2.0, 3.0)]
    for s, out in zip(samples, parts.stream(samples), strict=True):
        np.testing.assert_array_equal(out["y"], np.maximum(s["x"], 0))
        np.testing.assert_array_equal(out["z"], -np.maximum(s["x"], 0))


def test_openvinos_failure_in_a_run_is_said_without_its_source_locations():
    """A run OpenVINO refuses (a decoder's ScatterUpdate past its cache, as on an 8-layer
    genai decoder) says what failed, not the C++ files it passed through."""
    message = ("Exception from src/inference/src/cpp/infer_request.cpp:224:\n"
               "Exception from src/plugins/intel_cpu/src/graph.cpp:1628:\nNode ScatterUpdate_7 of type ScatterUpdate\n"
               "Check 'idxValue < static_cast<int64_t>(srcDimAxis)' failed at src/plugins/intel_cpu/src/nodes/scatter_update.cpp:913:\n"
               "ScatterUpdate node with name 'ScatterUpdate_7' have indices value that points to non-existing output tensor element\n")

    class Request:
        def infer(self, feeds):
            raise RuntimeError(message)

    import threading

    compiled = SimpleNamespace(request=lambda feeds, copy: (Request(), threading.Lock()), outputs=[],
                               renew=lambda feeds: None)
    with pytest.raises(openvino.OpenVINOError) as got:
        openvino.Session(compiled, 0).run(None, {"x": np.zeros(1)})
    assert str(got.value) == ("Node ScatterUpdate_7 of type ScatterUpdate ScatterUpdate node with name 'ScatterUpdate_7' "
                              "have indices value that points to non-existing output tensor element")


@needs_openvino
def test_a_failed_openvino_run_leaves_the_next_runs_their_answers():
    """A served part (its dynamic dimensions compiled once, two streams) run with inputs
    whose sequence lengths disagree: OpenVINO fails that run, and had failed every later
    run of the shape the streams ran before with the same words (a server answered half
    its good requests 500 from then on)."""
    model = Path(__file__).resolve().parent.parent / "models" / "small_bert.onnx"
    if not model.exists():
        pytest.skip("models/small_bert.onnx is not here")
    sessions = openvino.open_sessions(model, threads=1, replicas=2, served=True,
                                      shapes={"input_ids": [2, 23], "attention_mask": [2, 23]})
    ids = np.random.default_rng(0).integers(0, 1000, (2, 16))
    feeds = {"input_ids": ids, "attention_mask": np.ones((2, 16), np.int64)}
    want = [s.run(None, feeds)[1] for s in sessions]
    with pytest.raises(openvino.OpenVINOError):
        sessions[0].run(None, {"input_ids": ids, "attention_mask": np.ones((2, 17), np.int64)})
    for _ in range(3):
        for s, w in zip(sessions, want):
            np.testing.assert_array_equal(s.run(None, feeds)[1], w)


@needs_openvino
@pytest.mark.parametrize("hint", openvino.HINTS)
def test_openvino_as_its_users_run_it_answers_every_sample_in_order(tmp_path, hint):
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=32)
    peer = openvino.Hinted(model, hint)
    rng = np.random.default_rng(2)
    samples = [{"x": rng.random((4, 32), dtype=np.float32)} for _ in range(9)]
    outs = list(peer.stream(samples))
    assert len(outs) == 9
    # OpenVINO's default precision: float32, or bf16 on a CPU with bf16 units (an AMD EPYC
    # here: 2.5e-4 off outputs of about 0.1), which the peer keeps as its users get it
    assert peer.precision in ("f32", "bf16")
    tol = 1e-4 if peer.precision == "f32" else 1e-2
    wants = [reference(model, s)["h1"] for s in samples]
    for k, out in enumerate(outs):
        off = [np.abs(out["h1"] - w).max() for w in wants]
        assert off[k] <= tol * max(1.0, np.abs(wants[k]).max()) and int(np.argmin(off)) == k  # (in order)
    got = measure_pipeline(peer, samples[0], samples=8, warmup=1)
    assert got["latency_ms"] > 0 and got["throughput_per_s"] > 0


@needs_openvino
def test_openvino_throughput_hint_keeps_one_sample_in_flight_when_asked(tmp_path, monkeypatch):
    """A latency is measured with one sample in flight: the THROUGHPUT hint's queue must not
    run its optimal number of requests then (two finishing together read as 0.003 ms)."""
    import openvino as ov

    made = []
    real = ov.AsyncInferQueue

    def queue(compiled, jobs):
        made.append(jobs)
        return real(compiled, jobs)

    monkeypatch.setattr(ov, "AsyncInferQueue", queue)
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=32)
    peer = openvino.Hinted(model, "THROUGHPUT")
    feeds = {"x": np.ones((4, 32), dtype=np.float32)}
    assert len(list(peer.stream([feeds] * 3, depth=1))) == 3
    assert len(list(peer.stream([feeds] * 3))) == 3
    assert made == [1, peer.requests]


@needs_openvino
def test_run_measures_openvino_beside_onnxsplit(tmp_path):
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=32)
    feeds = {"x": np.ones((4, 32), dtype=np.float32)}
    got = baselines(model, feeds, samples=4, warmup=1, rounds=1)
    for hint in openvino.HINTS:
        b = got[f"openvino_{hint.lower()}"]
        assert b["hint"] == hint and b["latency_ms"] > 0 and b["throughput_per_s"] > 0
        # what it computes in, as its users get it: bf16 where the CPU has bf16 units
        assert b["precision"] == ("bf16" if openvino.bf16_units() else "f32")
    assert got["openvino_throughput"]["replicas"] >= 1


@needs_openvino
def test_a_model_openvino_refuses_is_planned_without_it(tmp_path, capsys, monkeypatch):
    """Found when profiling, said in one line, stored (not tried again), and the plan goes
    on with onnxruntime; `run` names the refusal in OpenVINO's baselines."""
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    model = det_model(tmp_path / "det.onnx")
    assert main([str(model), "--out", str(tmp_path / "p"), "--json"]) == 0
    cap = capsys.readouterr()
    refused = [line for line in cap.err.splitlines() if "OpenVINO refused the model" in line]
    assert len(refused) == 1 and "Det" in refused[0] and "Exception from" not in refused[0]
    result = json.loads(cap.out)
    # (onnxruntime with OpenVINO's EP, where it offers a device, is weighed: it hands Det to the CPU EP)
    assert result["verify"]["ok"] and result["execution"].get("provider") != openvino.RUNTIME
    assert not any(c["what"].startswith("OpenVINO") for c in result["plan"]["details"]["candidates"])
    assert main([str(model), "--out", str(tmp_path / "q"), "--json"]) == 0
    assert "OpenVINO refused" not in capsys.readouterr().err  # (the cache remembers)


@needs_openvino
def test_a_provider_failing_on_the_whole_model_is_planned_without(tmp_path, capsys, monkeypatch):
    """Profiled at the planned shape, OpenVINO compiles onnxruntime-genai's decoder with its
    dynamic dims and fails when calibrated (ScatterUpdate past its axis, OpenVINO 2026.4):
    a note in one line, the plan without it, the refusal stored.  (Where it calibrates,
    its calibration is kept and it is weighed.)"""
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    model = Path(__file__).parent / "data" / "llama_tiny_genai" / "model.onnx"
    assert main([str(model), "--context", "16", "--out", str(tmp_path / "p"), "--json"]) == 0
    cap = capsys.readouterr()
    result = json.loads(cap.out)
    assert result["verify"]["ok"]
    notes = [line for line in cap.err.splitlines() if "failed on the whole model" in line]
    entries = json.loads(next((tmp_path / "cache").rglob("*.json")).read_text())["entries"]
    ov = [e for e in entries if e["device"]["execution_provider"] == openvino.RUNTIME]
    assert len(ov) == 1
    if notes:
        assert len(notes) == 1 and notes[0].startswith("onnxsplit: note: OpenVINORuntime failed") \
            and notes[0].endswith("planning without it")
        assert "failed on the whole model" in ov[0]["settings"]["refused"]
        assert result["execution"].get("provider") != openvino.RUNTIME
        assert not any(c["what"].startswith("OpenVINO") for c in result["plan"]["details"]["candidates"])
        assert main([str(model), "--context", "16", "--out", str(tmp_path / "q"), "--json"]) == 0
        assert "OpenVINORuntime" not in capsys.readouterr().err  # (the cache remembers)
    else:
        assert ov[0]["as_run"]["default"]["latency_ms"] > 0


def halves_plan(tmp_path, monkeypatch, capsys, second: str, **execution):
    """An MLP split by the main command, and its plan.json edited into tmp_path/plan.json:
    the first half of the nodes on cpu0, the rest on ``second``, one thread each.  (The
    worker's shared profile cache: where both tests that take it run on one worker, the
    MLP is calibrated once.)"""
    model = mlp(tmp_path / "m.onnx", layers=4, batch=8, width=64)
    assert main([str(model), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    plan = json.loads((tmp_path / "a" / "plan.json").read_text())
    names = list(plan["assignment"])
    plan["assignment"] = {n: ("cpu0" if i < len(names) // 2 else second) for i, n in enumerate(names)}
    plan["details"]["execution"] = {"cpu_threads": 1, "replicas": 1, "run_as": "pipeline", **execution}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    capsys.readouterr()
    return model, plan


@needs_openvino
def test_a_plan_run_by_openvino_is_written_and_verifies(tmp_path, capsys, monkeypatch):
    """A plan file whose execution names OpenVINO's runtime: its parts run on it, as the
    manifest says, and reproduce the model (held to float32)."""
    model, plan = halves_plan(tmp_path, monkeypatch, capsys, "cpu1", provider=openvino.RUNTIME)
    assert main(["export", str(model), "--plan", str(tmp_path / "plan.json"),
                 "--out", str(tmp_path / "b"), "--json", "--precision", "f32"]) == 0
    result = json.loads(capsys.readouterr().out)
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert [p["execution_provider"] for p in manifest["parts"]] == [openvino.RUNTIME] * 2
    assert result["verify"]["ok"] and result["verify"]["max_abs_error"] <= 1e-4
    plan["details"]["execution"]["provider"] = "NoSuchProvider"
    (tmp_path / "bad.json").write_text(json.dumps(plan))
    assert main(["export", str(model), "--plan", str(tmp_path / "bad.json"),
                 "--out", str(tmp_path / "c")]) == 2
    assert "details.execution.provider" in capsys.readouterr().err


@needs_openvino
def test_parts_on_openvino_compute_in_bf16_where_the_user_allows_it(tmp_path, capsys, monkeypatch):
    """--precision bf16: OpenVINO's parts compute in bf16 where the CPU has bf16 units (the
    manifest says so in each part's config), their outputs move as the whole model's do
    in OpenVINO's bf16, and the check holds them to that; --precision f32 holds them to
    float32, and the default (auto) is what OpenVINO computes in by default here.  Without
    bf16 units, a note and float32."""
    model, plan = halves_plan(tmp_path, monkeypatch, capsys, "cpu1", provider=openvino.RUNTIME)
    export = ["export", str(model), "--plan", str(tmp_path / "plan.json"), "--json"]
    assert main(export + ["--out", str(tmp_path / "f32"), "--precision", "f32"]) == 0
    exact = json.loads(capsys.readouterr().out)
    assert main(export + ["--out", str(tmp_path / "bf16"), "--precision", "bf16"]) == 0
    got = json.loads(capsys.readouterr().out)
    manifest = json.loads((tmp_path / "bf16" / "manifest.json").read_text())
    assert main(export + ["--out", str(tmp_path / "auto")]) == 0
    auto = json.loads(capsys.readouterr().out)
    assert auto.get("precision", "f32") == ("bf16" if openvino.bf16_units() else "f32")
    assert "precision" not in exact and openvino.PRECISION_ENV not in __import__("os").environ
    if not openvino.bf16_units():
        assert "precision" not in manifest and "precision" not in got
        return
    assert manifest["precision"] == got["precision"] == "bf16" and got["verify"]["ok"]
    assert all(p["config"]["INFERENCE_PRECISION_HINT"] == "bf16" for p in manifest["parts"])
    v = got["verify"]
    moved = max(v["reduced"]["spread"].values())
    assert moved > 0 and v["max_abs_error"] > 100 * exact["verify"]["max_abs_error"] + 1e-6  # (bf16 it was)
    assert v["max_abs_error"] <= 3 * moved
    # the same parts run in float32 (their config edited) reproduce the model as float32 does
    for p in manifest["parts"]:
        p["config"]["INFERENCE_PRECISION_HINT"] = "f32"
    (tmp_path / "bf16" / "manifest.json").write_text(json.dumps(manifest))
    again = Parts(tmp_path / "bf16").run({"x": np.ones((8, 64), np.float32)})
    want = reference(model, {"x": np.ones((8, 64), np.float32)})
    assert max(np.abs(again[k] - want[k]).max() for k in again) <= 1e-4


def test_openvinos_float32_and_bf16_figures_never_stand_in_for_each_other(monkeypatch):
    """A bf16 split on a machine whose cache holds only OpenVINO's float32 profile measures
    OpenVINO again in bf16: it was planned and predicted from the float32 calibration
    (ViT-S predicted at 27.1/s, its bf16 parts measured 80.3/s).  Where entries of both are
    kept, each precision finds its own, and other providers' entries are untouched."""
    from onnxsplit.profile.store import Entry, ModelProfile

    def entry(ep, hardware, when):
        return Entry("h", {}, f"{ep}|{hardware}|threads=1", ep, {}, device={"hardware": hardware},
                     measured_at=when)

    f32 = entry(openvino.RUNTIME, "Xeon", "2026-01-01")
    cpu = entry(CPU_EP, "Xeon", "2026-01-01")
    prof = ModelProfile("h", {}, (f32, cpu))
    monkeypatch.delenv(openvino.PRECISION_ENV, raising=False)
    assert prof.entry(openvino.RUNTIME) is f32 and prof.entry(openvino.RUNTIME, hardware="Xeon") is f32
    monkeypatch.setenv(openvino.PRECISION_ENV, "bf16")
    assert prof.entry(openvino.RUNTIME) is None and prof.entry(openvino.RUNTIME, hardware="Xeon") is None
    assert prof.entry(CPU_EP) is cpu
    bf16 = entry(openvino.RUNTIME, "Xeon, computing in bf16", "2025-01-01")  # (older than f32's)
    prof = ModelProfile("h", {}, (f32, bf16, cpu))
    assert prof.entry(openvino.RUNTIME) is bf16
    monkeypatch.delenv(openvino.PRECISION_ENV)
    assert prof.entry(openvino.RUNTIME) is f32


@pytest.mark.parametrize("units,weighed,said", [(True, True, True), (False, True, False), (True, False, False)])
def test_a_float32_split_says_how_to_split_for_openvinos_bf16(monkeypatch, capsys, units, weighed, said):
    """Where OpenVINO was weighed on a CPU with bf16 units (where OpenVINO computes in bf16
    by default: several times the speed of float32 parts where the CPU has AMX, as
    tools/bench_vs_ort.py shows beside --precision bf16), the summary says
    how to split for bf16; elsewhere nothing."""
    from onnxsplit import cli

    monkeypatch.setattr(openvino, "bf16_units", lambda: units)
    cli._bf16_hint({"providers": {openvino.RUNTIME: {}} if weighed else {}})
    out = capsys.readouterr().out
    assert ("--precision bf16" in out) == said


def test_a_plugins_options_travel_in_a_parts_config():
    """A part's config carries a plugin EP's provider options as onnxruntime's own
    ``ep.<name>.<option>`` session entries; a session takes them back as options."""
    config = {**plugins.as_config(OV_EP, {"load_config": '{"CPU": {}}'}), "session.x": 1}
    assert config == {"ep.openvinoexecutionprovider.load_config": '{"CPU": {}}', "session.x": 1}
    assert plugins.options_of(OV_EP, config) == ({"load_config": '{"CPU": {}}'}, {"session.x": "1"})
    assert plugins.options_of("OtherEP", config)[0] == {}


@pytest.mark.skipif(not plugins.ep_devices(OV_EP), reason="the OpenVINO plugin EP offers no device here")
def test_openvinos_ep_is_weighed_for_the_whole_model_in_each_precision(tmp_path, capsys, monkeypatch):
    """OpenVINO's EP (whose whole-model calls measured faster than OpenVINO's own runtime on
    an Intel Xeon with AMX) is calibrated for the whole model, kept with the CPU's
    calibration by precision, weighed beside the rest, and not measured twice; its bf16
    part carries the precision in its config and reproduces the model as bf16 does."""
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    model = mlp(tmp_path / "m.onnx", layers=4, batch=8, width=64)
    split = [str(model), "--objective", "latency"]
    f32 = ["--precision", "f32"]  # (the default, auto, is bf16 on a CPU with bf16 units)
    assert main(split + f32 + ["--out", str(tmp_path / "a")]) == 0
    assert f"calibrating the whole model on {OV_EP}" in capsys.readouterr().err
    plan = json.loads((tmp_path / "a" / "plan.json").read_text())
    assert "onnxruntime's session on OpenVINO's EP" in [c["what"] for c in plan["details"]["candidates"]]
    entries = json.loads(next((tmp_path / "cache").rglob("*.json")).read_text())["entries"]
    cpu = next(e for e in entries if e["device"]["execution_provider"] == CPU_EP)
    assert cpu["as_run"]["whole_only"][OV_EP]["default"]["latency_ms"] > 0
    assert main(split + f32 + ["--out", str(tmp_path / "b")]) == 0
    assert OV_EP not in capsys.readouterr().err  # (kept)
    if not openvino.bf16_units():
        return
    assert main(split + ["--out", str(tmp_path / "c"), "--precision", "bf16"]) == 0
    assert f"calibrating the whole model on {OV_EP}" in capsys.readouterr().err  # (float32's is not bf16's)
    (tmp_path / "h").mkdir()
    model, plan = halves_plan(tmp_path / "h", monkeypatch, capsys, "cpu0", provider=OV_EP)
    assert main(["export", str(model), "--plan", str(tmp_path / "h" / "plan.json"), "--precision", "bf16",
                 "--out", str(tmp_path / "d"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    (part,) = manifest["parts"]
    config = json.loads(part["config"]["ep.openvinoexecutionprovider.load_config"])
    assert part["execution_provider"] == OV_EP and config["CPU"]["INFERENCE_PRECISION_HINT"] == "bf16"
    assert manifest["precision"] == "bf16" and got["verify"]["ok"] and got["verify"]["max_abs_error"] > 1e-6


def test_precision_needs_a_known_value(monkeypatch):
    with pytest.raises(OnnxsplitError, match="unknown precision 'fp8'"):
        with openvino.computing_in("fp8"):
            pass
    monkeypatch.setattr(openvino, "available", lambda: True)
    monkeypatch.setattr(openvino, "bf16_units", lambda: False)
    with openvino.computing_in("bf16", quiet=True) as value:
        assert value == "f32" and openvino.precision() == "f32"


# ---------------------------------------------------------------------- weighed like the rest


def prepared(w, cpu_rec, ov_rec):
    from onnxsplit.workflow import Prepared

    cluster = SimpleNamespace(cpu=SimpleNamespace(shared_by=(openvino.RUNTIME,)))
    return Prepared(None, cluster, None, w, {}, {"cpu": cpu_rec, openvino.RUNTIME: ov_rec},
                    {"cpu": float(w.cpu_latency.sum())})


@pytest.mark.parametrize("ov_ms,wins", [(8.0, True), (9.9, True), (10.5, False)])
def test_openvino_whole_is_weighed_beside_onnxruntime_for_latency(ov_ms, wins):
    """Each default (onnxruntime's session, OpenVINO's LATENCY hint) is what a user runs:
    the faster one is taken."""
    from onnxsplit.workflow import choose

    w = Workload.from_paper_json(diamond(k=0, l=2))
    cpu = record(10.0, {1: 18.0, 2: 10.0}, {1: (2, 150.0)})
    ov = record(ov_ms, {1: 16.0, 2: ov_ms}, {1: (2, 140.0)})
    cand = choose(prepared(w, cpu, ov), w, "latency")
    assert (cand.execution.get("provider") == openvino.RUNTIME) is wins
    assert cand.predicted["latency_ms"] == (ov_ms if wins else 10.0)
    what = [c["what"] for c in cand.plan.details["candidates"]]
    assert "OpenVINO's LATENCY hint on every core" in what


@pytest.mark.parametrize("ov_rate,wins", [(180.0, True), (150.0, False)])
def test_openvino_streams_are_weighed_beside_copies_for_throughput(ov_rate, wins):
    from onnxsplit.workflow import choose

    w = Workload.from_paper_json(diamond(k=0, l=2))
    cpu = record(10.0, {1: 18.0, 2: 10.0}, {1: (2, 160.0)})
    ov = record(12.0, {1: 17.0, 2: 12.0}, {1: (2, ov_rate)})
    cand = choose(prepared(w, cpu, ov), w, "throughput")
    assert cand.execution["replicas"] == 2
    assert (cand.execution.get("provider") == openvino.RUNTIME) is wins
    assert cand.predicted["throughput_per_s"] == (ov_rate if wins else 160.0)
    names = {c.plan.details["why"] for c in machine.whole_candidates(w, "throughput", cpu, None,
                                                                      {openvino.RUNTIME: ov})}
    assert "OpenVINO, 2 streams side by side, 1 thread(s) each" in names


# ------------------------------------------------------------------ split across providers


def with_ov_latency(w, factor=0.5):
    """``w`` as if profiled on OpenVINO too: each node ``factor`` times its CPU time."""
    meta = dict(w.extra.get("onnxsplit") or {})
    meta["onCores"] = {openvino.RUNTIME: {"latencyScale": 1.0,
                                          "latency": [n.cpu_latency * factor for n in w.nodes]}}
    return w.replace(extra={**w.extra, "onnxsplit": meta})


def test_a_division_of_the_cores_gives_devices_to_a_provider_that_shares_them():
    w = with_ov_latency(Workload.from_paper_json(diamond(k=0, l=2)))
    cpu = record(10.0, {1: 18.0, 2: 10.0}, {1: (2, 150.0)})
    ov = record(9.0, {1: 16.0, 2: 9.0}, {1: (2, 100.0)})
    unopt = {"cpu": float(w.cpu_latency.sum()), openvino.RUNTIME: float(w.cpu_latency.sum()) * 0.5}
    got = machine.split_workloads(w, "throughput", cpu, None, unopt, {openvino.RUNTIME: ov})
    shared = [ex.get("shared") for _, ex in got]
    assert shared == [None, {openvino.RUNTIME: 1}, {openvino.RUNTIME: 2}]
    for sub, ex in got[1:]:
        n = ex["shared"][openvino.RUNTIME]
        assert sub.num_cpus == 2 - n and sub.class_counts[-1] == n
        assert [d.name for d in sub.devices if d.kind == "acc"] == [f"openvino{i}" for i in range(n)]
        # OpenVINO's node times at its calibrated speed on one thread, slowed by its busy
        # neighbour as its own streams were
        squeeze = 1e3 * 2 / 100.0 / 16.0
        ov_ms = sub.class_latency[-1]
        assert np.allclose(ov_ms, w.cpu_latency * 0.5 * (16.0 / unopt[openvino.RUNTIME]) * squeeze)
    # latency: the devices would take turns on the same cores; no division gives it any
    lat = machine.split_workloads(w, "latency", cpu, None, unopt, {openvino.RUNTIME: ov})
    assert all(not ex.get("shared") for _, ex in lat)


def test_a_provider_class_exports_to_that_provider_with_the_division_threads():
    from onnxsplit.workflow import device_ids, device_providers

    w = machine.with_provider(with_ov_latency(Workload.from_paper_json(diamond(k=0, l=2))),
                              openvino.RUNTIME, 1, 1.0)
    cluster = SimpleNamespace(cpu=SimpleNamespace(execution_provider=CPU_EP, shared_by=(openvino.RUNTIME,)))
    providers, threads = device_providers(w, cluster, None, 1)
    assert providers == {"openvino0": openvino.RUNTIME, "cpu0": CPU_EP}
    assert threads == {"openvino0": 1, "cpu0": 1}
    assert device_ids(w, cluster, None) == {}  # (nothing to address: the host's cores)


def test_provider_wins_add_up():
    w = with_ov_latency(Workload.from_paper_json(diamond(k=0, l=2)), 0.5)
    lat = list(w.extra["onnxsplit"]["onCores"][openvino.RUNTIME]["latency"])
    lat[0] = w.nodes[0].cpu_latency * 3  # one operator faster on the CPU EP
    w.extra["onnxsplit"]["onCores"][openvino.RUNTIME]["latency"] = lat
    got = machine.provider_wins(w)[openvino.RUNTIME]
    cpu, ov = np.asarray(w.cpu_latency), np.asarray(lat)
    assert got["faster_on"] == int((ov < cpu).sum()) == w.n - 1 and got["cpu_faster_on"] == 1
    assert got["best_of_both_ms"] == pytest.approx(np.minimum(cpu, ov).sum(), rel=1e-5)
    assert got["best_of_both_ms"] <= min(got["cpu_ms"], got["own_ms"]) + 1e-9
    assert got["time_share"] == pytest.approx(ov[1:].sum() / np.minimum(cpu, ov).sum(), abs=1e-4)


@needs_openvino
def test_a_split_across_onnxruntime_and_openvino_runs_and_verifies(tmp_path, capsys, monkeypatch):
    """A plan file that gives one of the two cores to OpenVINO: the first half of the model
    on the CPU EP, the rest on OpenVINO's runtime, one thread each; its parts reproduce
    the model (held to float32), and re-applying the plan.json it wrote gives the same parts."""
    model, plan = halves_plan(tmp_path, monkeypatch, capsys, "openvino0", shared={openvino.RUNTIME: 1})
    assert main(["export", str(model), "--plan", str(tmp_path / "plan.json"),
                 "--out", str(tmp_path / "b"), "--json", "--precision", "f32"]) == 0
    result = json.loads(capsys.readouterr().out)
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert [(p["device"], p["execution_provider"], p["threads"]) for p in manifest["parts"]] == \
        [("cpu0", CPU_EP, 1), ("openvino0", openvino.RUNTIME, 1)]
    assert result["verify"]["ok"] and result["verify"]["max_abs_error"] <= 1e-4
    assert main(["export", str(model), "--plan", str(tmp_path / "b" / "plan.json"),
                 "--out", str(tmp_path / "c"), "--json"]) == 0
    again = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert [p["execution_provider"] for p in again["parts"]] == [CPU_EP, openvino.RUNTIME]
    plan["details"]["execution"]["shared"] = {openvino.RUNTIME: 3}
    (tmp_path / "bad.json").write_text(json.dumps(plan))
    capsys.readouterr()
    assert main(["export", str(model), "--plan", str(tmp_path / "bad.json"), "--out", str(tmp_path / "d")]) == 2
    assert "gives 3 devices to OpenVINORuntime, but the CPU has 2" in capsys.readouterr().err


@needs_openvino
def test_openvino_node_times_cover_its_counted_time(tmp_path):
    """Every layer OpenVINO ran is charged to ONNX nodes, its own made-up layers too."""
    # (a model of about 1 ms: beside a CPU-bound process the first layer's counter of a
    # 0.04-0.07 ms model read 0.77-0.92 ms in its median over 15 runs, a cost the plain
    # runs did not show; this one's counters summed 0.56 ms against 0.86 ms plain)
    batch, width = 64, 512
    model = mlp(tmp_path / "m.onnx", layers=3, batch=batch, width=width)
    names = [f"{op}{i}" for i in range(3) for op in ("matmul", "add", "relu")]
    feeds = {"x": np.random.default_rng(0).random((batch, width), dtype=np.float32)}
    reads = {f"{op}{i}": [f"{nxt}{j}"] for i in range(3) for op, nxt, j in
             (("matmul", "add", i), ("add", "relu", i), ("relu", "matmul", i + 1))}
    flops = {n: (2 * batch * width * width if n.startswith("matmul") else batch * width) + 1.0 for n in names}
    ms, whole = openvino.profile_nodes(model, feeds, names, flops, runs=15, consumers=reads)
    assert set(ms) == set(names) and all(v >= 0 for v in ms.values())
    assert sum(ms[f"matmul{i}"] for i in range(3)) > 0.5 * sum(ms.values()) > 0
    # (the whole model's plain runs interleave with the counted ones: on a busy machine
    # the two move apart, never by 10x)
    assert 0.1 * whole["median"] < sum(ms.values()) < 10 * whole["median"]


def test_the_finalists_of_each_provider_are_named_and_replaced():
    cpu = record(10.0, {1: 18.0, 2: 10.0}, {1: (2, 150.0)})
    ov = record(7.0, {1: 16.0, 2: 7.0}, {})  # (142.9/s: within CLOSE of the copies' 150/s)
    runs = calibrate.finalists({CPU_EP: cpu, openvino.RUNTIME: ov})
    assert runs == {f"{CPU_EP}:default": (CPU_EP, {"threads": 0}),
                    f"{CPU_EP}:copies": (CPU_EP, {"threads": 1, "replicas": 2, "optimization": "all"}),
                    f"{openvino.RUNTIME}:default": (openvino.RUNTIME, {"threads": 0})}
    got = {f"{CPU_EP}:default": {"latency_ms": 11.0, "throughput_per_s": 90.0},
           f"{CPU_EP}:copies": {"latency_ms": 19.0, "throughput_per_s": 140.0},
           f"{openvino.RUNTIME}:default": {"error": "refused"}}
    calibrate.take_side_by_side({CPU_EP: cpu, openvino.RUNTIME: ov}, got)
    assert cpu["default"] == {"latency_ms": 11.0, "throughput_per_s": 90.0, "side_by_side": True}
    assert cpu["replicas"]["1"]["throughput_per_s"] == 140.0 and cpu["replicas"]["1"]["copies"] == 2
    assert ov["default"]["latency_ms"] == 7.0 and "side_by_side" not in ov["default"]


def test_the_finalists_come_best_calibrated_first():
    """The leader the others are measured beside is the configuration calibrated fastest,
    whichever provider it belongs to."""
    cpu = record(10.0, {1: 18.0, 2: 10.0}, {1: (2, 150.0)})
    ov = record(7.0, {1: 16.0, 2: 7.0}, {1: (2, 160.0)})
    names = list(calibrate.finalists({CPU_EP: cpu, openvino.RUNTIME: ov}))
    rates = {f"{CPU_EP}:default": 100.0, f"{CPU_EP}:copies": 150.0,
             f"{openvino.RUNTIME}:default": 1e3 / 7.0, f"{openvino.RUNTIME}:copies": 160.0}
    assert cpu["default"]["throughput_per_s"] == 100.0 and sorted(names) == sorted(rates)
    assert names == sorted(rates, key=lambda k: -rates[k])


def test_figures_measured_beside_the_leader_are_put_on_its_scale():
    """Each configuration's figure is the leader's median times the median of the ratios
    of its rounds to the leader's measurement beside each: a slow moment that hits a pair
    cancels, where the medians of the rounds alone would rank them the other way."""
    lead = {"throughput_per_s": 10.0, "latency_ms": 100.0,
            "by_round": {"throughput_per_s": [10.0, 5.0, 10.0, 12.0, 5.0],
                         "latency_ms": [100.0, 200.0, 100.0, 80.0, 200.0]},
            "beside": {"b": {"throughput_per_s": [10.0, 5.0, 10.0], "latency_ms": [100.0, 200.0, 100.0]},
                       "c": {"throughput_per_s": [12.0, 5.0], "latency_ms": [80.0, 200.0]}}}
    b = {"throughput_per_s": 6.0, "latency_ms": 180.0,
         "by_round": {"throughput_per_s": [11.0, 5.5, 6.0], "latency_ms": [90.0, 180.0, 180.0]}}
    c = {"throughput_per_s": 9.0, "latency_ms": 120.0,
         "by_round": {"throughput_per_s": [9.0, 4.0], "latency_ms": [90.0, 250.0]}}
    got = calibrate.on_leaders_scale({"a": lead, "b": b, "c": c, "d": {"error": "refused"}}, "a")
    # b: ratios 1.1, 1.1, 0.6 -> 1.1; its own median (6.0) was below the leader's
    assert got["b"]["throughput_per_s"] == pytest.approx(11.0)
    assert got["b"]["latency_ms"] == pytest.approx(90.0)  # (ratios 0.9, 0.9, 1.8)
    assert got["c"]["throughput_per_s"] == pytest.approx(10.0 / np.median([12.0 / 9.0, 5.0 / 4.0]))
    assert got["b"]["paired_with"] == "a" and got["d"] == {"error": "refused"}
    assert got["a"]["throughput_per_s"] == 10.0 and "beside" not in got["a"]
    # without a leader that ran, the figures are left as measured
    assert calibrate.on_leaders_scale({"a": {"error": "x"}, "b": b}, "a")["b"] == b


def test_a_provider_far_behind_is_not_measured_again():
    cpu = record(10.0, {1: 18.0, 2: 10.0}, {1: (2, 150.0)})
    slow = record(40.0, {1: 80.0, 2: 40.0}, {})
    rates = {CPU_EP: calibrate.best_rate(cpu), openvino.RUNTIME: calibrate.best_rate(slow)}
    assert rates[CPU_EP] == 150.0 and rates[CPU_EP] > calibrate.CLOSE * rates[openvino.RUNTIME] > 0
    assert calibrate.finalists({CPU_EP: cpu, openvino.RUNTIME: slow}) == {}
    near = record(40.0, {1: 80.0, 2: 40.0}, {})
    near["default"]["throughput_per_s"] = 150.0 / calibrate.CLOSE  # (just within)
    assert set(calibrate.finalists({CPU_EP: cpu, openvino.RUNTIME: near})) == {
        f"{CPU_EP}:default", f"{CPU_EP}:copies", f"{openvino.RUNTIME}:default"}


@needs_openvino
def test_each_providers_best_is_measured_side_by_side(tmp_path, capsys, monkeypatch):
    """Calibrated apart, then each provider's default and copies measured again in the
    same rounds, and those figures kept."""
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(calibrate, "CLOSE", 1e9)  # (however far apart they calibrate)
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=32)
    assert main([str(model), "--out", str(tmp_path / "p")]) == 0
    assert "side by side" in capsys.readouterr().err
    entries = json.loads(next((tmp_path / "cache").rglob("*.json")).read_text())["entries"]
    records = {e["device"]["execution_provider"]: e["as_run"] for e in entries}
    for provider in (CPU_EP, openvino.RUNTIME):
        assert records[provider]["default"]["side_by_side"] is True
        rep = records[provider]["replicas"]["1"]
        assert rep.get("side_by_side") is (True if rep["copies"] > 1 else None)


@needs_openvino
def test_one_openvino_session_called_from_threads_at_once_answers_each_call(tmp_path):
    """A Serve replica calls its part's session from several threads at once: each call
    gets its own inputs' outputs (one infer request shared unguarded by two calls of one
    shape gave each other's answers: served, 3 of 4 runs of 64 padded requests went wrong)."""
    import threading

    model = mlp(tmp_path / "m.onnx", layers=3, batch=4, width=256)
    session = openvino.open_sessions(model, threads=1)[0]
    rng = np.random.default_rng(5)
    xs = [rng.random((4, 256), dtype=np.float32) for _ in range(16)]
    wants = [reference(model, {"x": x}) for x in xs]
    names = [o.name for o in session.get_outputs()]
    wrong = []

    def calls(k):
        for i in range(k, 16 * 25, 4):
            x = xs[i % 16]
            got = dict(zip(names, session.run(None, {"x": x})))
            if any(np.abs(got[n] - wants[i % 16][n]).max() > 1e-4 for n in names):
                wrong.append(i)

    threads = [threading.Thread(target=calls, args=(k,)) for k in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert wrong == []


@needs_openvino
def test_a_dynamic_openvino_session_compiles_a_few_shapes_and_runs_the_rest_dynamic(tmp_path, monkeypatch):
    """Batches of many sizes (a server's dynamic batcher) compile the first few shapes and
    run every other on the model compiled once with its dynamic batch: each answer the
    model's, and no compile after the first calls (before, every new shape evicted the
    oldest: a server cycling 6 sizes recompiled, about 80 ms, on every call)."""
    model = mlp(tmp_path / "m.onnx", layers=2, width=64, dynamic_batch=True)
    compiled = []
    real = openvino._Compiled._compile
    monkeypatch.setattr(openvino._Compiled, "_compile",
                        lambda self, key, shapes, keep=True: compiled.append(key) or real(self, key, shapes, keep))
    session = openvino.open_sessions(model, threads=1)[0]
    rng = np.random.default_rng(2)
    for rnd in range(3):
        for b in range(1, 9):
            x = rng.random((b, 64), dtype=np.float32)
            got = session.run(None, {"x": x})[0]
            np.testing.assert_allclose(got, reference(model, {"x": x})[session.get_outputs()[0].name],
                                       rtol=1e-4, atol=1e-5)
    assert len(compiled) == openvino.COMPILED_SHAPES + 1 and compiled[-1] is None  # (None: the dynamic model)
    # a server's session: the model compiled with its dynamic batch at the start, and
    # nothing compiled while it answers
    compiled.clear()
    served = openvino.open_sessions(model, threads=1, served=True)[0]
    assert compiled == [None]
    for b in (1, 5, 8, 3):
        x = rng.random((b, 64), dtype=np.float32)
        np.testing.assert_allclose(served.run(None, {"x": x})[0],
                                   reference(model, {"x": x})[session.get_outputs()[0].name], rtol=1e-4, atol=1e-5)
    assert compiled == [None]


def test_profile_and_workload_time_openvino_in_the_main_commands_precision(monkeypatch, tmp_path):
    """`onnxsplit profile` and `onnxsplit workload` time OpenVINO as the main command would
    plan with it (--precision auto: OpenVINO's default here), not always in float32; the
    precision is let go after."""
    from onnxsplit import api, profile, workflow

    seen = []
    monkeypatch.setattr(profile, "profile", lambda *a, **k: seen.append(openvino.precision()))

    class Prepared:
        workload = None

    monkeypatch.setattr(workflow, "prepare", lambda *a, **k: seen.append(openvino.precision()) or Prepared())
    api.profile_model(tmp_path / "m.onnx", quiet=True)
    api.build_workload(tmp_path / "m.onnx", quiet=True)
    api.profile_model(tmp_path / "m.onnx", quiet=True, precision="f32")
    assert seen == [openvino.default_precision()] * 2 + ["f32"]
    assert openvino.PRECISION_ENV not in __import__("os").environ
