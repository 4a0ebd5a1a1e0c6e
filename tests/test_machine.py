"""The machine as users run onnxruntime: whole-model candidates, CPU divisions, one-session
plans, copies side by side -- each checked against an independent computation."""

from __future__ import annotations

import json
import os
import time
from itertools import product

import numpy as np
import onnxruntime as ort
import pytest

from onnx_models import make, mlp, save, vi
from workloads import diamond, edge, node, workload
from onnxsplit import calibrate as cal
from onnxsplit import machine
from onnxsplit.export import SESSION_FILE, export
from onnxsplit.graph import OpGraph
from onnxsplit.plan import Plan
from onnxsplit.running.runner import Parts, RunError
from onnxsplit.running.compare import run_parts
from onnxsplit.workload import Workload

CPU = "CPUExecutionProvider"


def original(model, feeds):
    sess = ort.InferenceSession(str(model), providers=[CPU])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def test_thread_counts():
    assert cal.thread_counts(1) == [1]
    assert cal.thread_counts(2) == [1, 2]
    assert cal.thread_counts(16) == [1, 2, 4, 8, 16]
    assert cal.thread_counts(12) == [1, 2, 4, 8, 12]


@pytest.mark.parametrize("seed", range(6))
def test_serial_latency_is_every_node_plus_each_tensor_once_per_reading_device(seed):
    """Brute force: a session runs nodes one after another; a tensor crossing to another
    device is paid once per (producer, reading device), however many nodes read it."""
    rng = np.random.default_rng(seed)
    n = 6
    nodes = [node(i, float(rng.uniform(1, 9)), float(rng.uniform(0.1, 2))) for i in range(n)]
    cost = rng.uniform(0, 1, n)  # a cost belongs to its source's tensor
    edges = [edge(i, j, float(cost[i])) for i, j in product(range(n), range(n))
             if i < j and rng.random() < 0.5]
    w = Workload.from_paper_json(workload(nodes, edges, k=1, l=1))
    for bits in range(2 ** n):
        a = {i: ("acc0" if bits >> i & 1 else "cpu0") for i in range(n)}
        want = sum(w.nodes[i].acc_latency if a[i] == "acc0" else w.nodes[i].cpu_latency
                   for i in range(n))
        paid = {(e.source, a[e.dest]): e.cost for e in w.edges if a[e.source] != a[e.dest]}
        want += sum(paid.values()) + machine.SESSION_CALL_MS
        assert machine.serial_latency(w, a) == pytest.approx(want)


def cached_cpu_entry(model) -> dict:
    """``model``'s CPU EP entry in the profile cache the test runs with (the worker's shared
    one, tests/conftest.py)."""
    from onnxsplit.graph import OpGraph
    from onnxsplit.profile import default_cache

    entries = json.loads(default_cache(OpGraph.from_onnx(model).profile_key).read_text())["entries"]
    return next(e for e in entries if e["device"]["execution_provider"] == "CPUExecutionProvider")


def record(default_ms, threads_ms, replicas):
    """A CPU calibration record: thread count -> latency; t -> (copies, throughput)."""
    return {"cores": max(threads_ms), "default": {"latency_ms": default_ms,
                                                  "throughput_per_s": 1e3 / default_ms},
            "threads": {str(t): {"all": ms} for t, ms in threads_ms.items()},
            "replicas": {str(t): {"copies": c, "throughput_per_s": x, "latency_ms": threads_ms[t],
                                  "optimization": "all"} for t, (c, x) in replicas.items()}}


def test_whole_candidates_take_the_measured_figures():
    w = Workload.from_paper_json(diamond(k=0, l=2))
    rec = record(6.0, {1: 10.0, 2: 6.0}, {1: (2, 180.0)})
    got = {c.plan.details["why"]: c for c in machine.whole_candidates(w, "throughput", rec, None)}
    assert len(got) == 2
    best = max(got.values(), key=lambda c: c.predicted["throughput_per_s"])
    assert best.execution == {"cpu_threads": 1, "optimization": "all", "replicas": 2,
                              "run_as": "pipeline"}
    assert [c.execution.get("baseline") for c in got.values()].count(True) == 1
    assert best.predicted["throughput_per_s"] == 180.0
    assert set(best.plan.assignment.values()) == {"cpu0"}
    lat = machine.whole_candidates(w, "latency", rec, None)
    assert [c.predicted["latency_ms"] for c in lat] == [6.0]  # copies do not cut latency
    # the accelerator's session only where the model fits it
    acc = {"default": {"latency_ms": 1.0, "throughput_per_s": 1e3}}
    assert len(machine.whole_candidates(Workload.from_paper_json(diamond(k=1, l=2)),
                                        "latency", rec, acc)) == 2
    small = Workload.from_paper_json(diamond(k=1, l=2, mem=1.0))
    for n in small.nodes:
        object.__setattr__(n, "size", 1.0)
    small = Workload(small.nodes, small.edges, 1, 2, 1.0)
    assert len(machine.whole_candidates(small, "latency", rec, acc)) == 1


@pytest.mark.parametrize("measured, level", [
    ({"all": 119.5, "disabled": 118.6}, "all"),  # GPT-2's near tie: what users run
    ({"all": 10.0, "disabled": 9.2}, "all"),
    ({"all": 1.93, "disabled": 1.52}, "disabled"),  # small_bert: clearly faster unoptimised
    ({"all": None, "disabled": 5.0}, "disabled"),  # all failed
    ({"all": 5.0, "disabled": None}, "all"),
    ({}, "all"),
    # leaving the slow fusion out needs less: BERT-base, 239.4 against 228.4 ms
    ({"all": 239.4, "disabled": 229.9, "all_unfused": 228.4}, "all_unfused"),
    ({"all": 10.0, "all_unfused": 9.9}, "all"),
    ({"all": 10.0, "disabled": 8.5, "all_unfused": 9.0}, "disabled"),  # the fastest that counts
])
def test_another_optimisation_level_must_be_clearly_faster(measured, level):
    assert cal.faster_level(measured) == level
    rec = {"threads": {"1": measured}}
    assert cal.level_of(rec, 1) == level
    assert cal.latency_ms(rec, 1) == measured.get(level)
    # copies measured at the level the rule picks are current; at the other, stale
    other = "disabled" if level == "all" else "all"
    for at, stale in ((level, False), (other, True)):
        rec["replicas"] = {"1": {"copies": 2, "throughput_per_s": 1.0, "optimization": at}}
        assert cal.stale(rec) is stale


def test_cpu_divisions_scale_by_measured_threads_and_contention():
    w = Workload.from_paper_json(diamond(k=0, l=4))
    unopt = float(w.cpu_latency.sum())  # 100
    rec = record(30.0, {1: 50.0, 2: 30.0, 4: 20.0}, {1: (4, 40.0), 2: (2, 50.0)})
    got = machine.split_workloads(w, "throughput", rec, None, {"cpu": unopt})
    # 4 single-thread devices and 2 of two threads; one device of 4 is the whole model
    assert [(x.num_cpus, ex["cpu_threads"]) for x, ex in got] == [(4, 1), (2, 2)]
    w1, w2 = got[0][0], got[1][0]
    # 1 thread: 50 ms alone, 4 copies at 40/s = 100 ms each: contention 2
    assert w1.cpu_latency.sum() == pytest.approx(unopt * 0.5 * 2.0)
    # 2 threads: 30 ms alone, 2 copies at 50/s = 40 ms each: contention 4/3
    assert w2.cpu_latency.sum() == pytest.approx(unopt * 0.3 * 40 / 30)
    lat = machine.split_workloads(Workload.from_paper_json(diamond(k=1, l=4)), "latency", rec,
                                  None, {"cpu": unopt})
    assert [(x.num_cpus, ex["cpu_threads"]) for x, ex in lat] == [(1, 4)]
    assert lat[0][0].cpu_latency.sum() == pytest.approx(unopt * 0.2)


def test_copies_side_by_side_compute_what_the_model_does(tmp_path):
    model = mlp(tmp_path / "m.onnx", layers=3, batch=4, width=32)
    parts = Parts.whole(model, threads=1, replicas=2)
    assert parts.workers("whole") == 2 and parts.default_depth() == 4
    xs = [{"x": np.full((4, 32), i / 7, np.float32)} for i in range(8)]
    for x, y in zip(xs, parts.stream(xs)):
        want = original(model, x)
        for k, v in want.items():
            np.testing.assert_allclose(y[k], v, rtol=1e-6)


def skip_ln(path):
    """x + s, then LayerNormalization: what onnxruntime's SkipLayerNormFusion fuses."""
    from onnx import helper, numpy_helper

    h = 64
    return save(make([helper.make_node("Add", ["x", "s"], ["a"]),
                      helper.make_node("LayerNormalization", ["a", "g", "b"], ["y"], axis=-1, epsilon=1e-5)],
                     [vi(n, [1, 8, h]) for n in "xs"], [vi("y", [1, 8, h])],
                     [numpy_helper.from_array(np.linspace(0.5, 1.5, h, dtype=np.float32), "g"),
                      numpy_helper.from_array(np.linspace(-0.1, 0.1, h, dtype=np.float32), "b")]), path)


def fused_ops(model, config, tmp_path) -> int:
    """How many SkipLayerNormalization nodes onnxruntime's optimised graph holds."""
    import onnx

    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    for k, v in config.items():
        so.add_session_config_entry(k, v)
    ort.InferenceSession(str(model), so, providers=[CPU])
    return sum(n.op_type == "SkipLayerNormalization" for n in onnx.load(so.optimized_model_filepath).graph.node)


def test_the_unfused_level_runs_all_optimisations_but_the_slow_fusions(tmp_path):
    from onnxsplit.export import UNFUSED, level_fields

    model = skip_ln(tmp_path / "skip_ln.onnx")
    assert cal.may_fuse_slowly(model)
    assert not cal.may_fuse_slowly(mlp(tmp_path / "m.onnx", layers=2, batch=4, width=32))
    level = level_fields(UNFUSED)
    assert level["optimization"] == "all"
    # onnxruntime fuses it at 'all', and not with the level's config entry
    assert fused_ops(model, {}, tmp_path) == 1
    assert fused_ops(model, level["config"], tmp_path) == 0
    feeds = {"x": np.linspace(-1, 1, 512, dtype=np.float32).reshape(1, 8, 64),
             "s": np.linspace(2, -2, 512, dtype=np.float32).reshape(1, 8, 64)}
    parts = Parts.whole(model, threads=1, optimization=UNFUSED)
    assert parts.parts[0]["config"] == level["config"]
    np.testing.assert_allclose(parts.run(feeds)["y"], original(model, feeds)["y"], atol=1e-5)
    # written as a plan's parts: onnxruntime's level and the config entry, run as such
    g = OpGraph.from_onnx(model)
    export(g, {n.name: "cpu0" for n in g.nodes}, tmp_path / "p", providers={"cpu0": CPU},
           threads={"cpu0": 1}, optimization=UNFUSED)
    entry = json.loads((tmp_path / "p" / "manifest.json").read_text())["parts"][0]
    assert entry["optimization"] == "all" and entry["config"] == level["config"]
    r = run_parts(tmp_path / "p", measure=False, feeds=feeds)
    assert r["verify"]["ok"] and r["verify"]["max_abs_error"] < 1e-5
    # one session: on the CPU alone it leaves the fusion out; beside an accelerator (whose
    # own kernel is not the CPU's) the option would hold for both, and it keeps it
    half = {n.name: "cpu0" if i == 0 else "acc0" for i, n in enumerate(g.nodes)}
    for name, device_of, providers, unfused in (
            ("s1", {n.name: "cpu0" for n in g.nodes}, {"cpu0": CPU}, True),
            ("s2", half, {"cpu0": CPU, "acc0": "CUDAExecutionProvider"}, False)):
        export(g, device_of, tmp_path / name, providers=providers, threads={"cpu0": 0},
               session={"threads": 0, "optimization": UNFUSED})
        spec = json.loads((tmp_path / name / SESSION_FILE).read_text())
        assert spec["optimization"] == "all"
        assert (level["config"].items() <= spec["config"].items()) is unfused


def test_a_session_on_every_core_without_the_slow_fusions_is_weighed():
    from onnxsplit.export import UNFUSED

    w = Workload.from_paper_json(diamond(k=0, l=2))
    rec = record(6.0, {1: 10.0, 2: 6.0}, {1: (2, 180.0), 2: (1, 250.0)})
    assert len(machine.whole_candidates(w, "latency", rec, None)) == 1  # the default's twin
    rec["replicas"]["2"]["optimization"] = UNFUSED
    got = {c.execution["optimization"]: c for c in machine.whole_candidates(w, "latency", rec, None)}
    assert set(got) == {"all", UNFUSED}
    # the default session's own threading: the level alone differs from it
    assert got[UNFUSED].execution["cpu_threads"] == 0
    assert got[UNFUSED].plan.details["why"] == ("onnxruntime's default session, all optimisations "
                                                "but SkipLayerNormFusion")


def test_one_session_runs_the_annotated_plan(tmp_path):
    model = mlp(tmp_path / "m.onnx", layers=3, batch=4, width=32)
    g = OpGraph.from_onnx(model)
    out = tmp_path / "p"
    export(g, {n.name: "cpu0" for n in g.nodes}, out, providers={"cpu0": CPU},
           threads={"cpu0": 0}, session={"threads": 0})
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["run_as"] == "session"
    spec = json.loads((out / SESSION_FILE).read_text())
    assert spec["config"]["session.layer_assignment_settings"] == "cpu(=cpu_part)"
    parts = Parts(out)
    a = parts.assignment  # with all optimisations, MatMul+Add are fused under new names
    assert a["checked"] >= 1 and a["checked"] + a["fused"] == len(g.nodes)
    assert a["elsewhere"] == 0 and a["moved"] == {}
    r = run_parts(out, measure=False)
    assert r["verify"]["ok"] and r["verify"]["max_abs_error"] == 0.0
    # a plan onnxruntime did not follow is refused: say every node was meant for CUDA
    spec["node_providers"] = {n: "CUDAExecutionProvider" for n in spec["node_providers"]}
    (out / SESSION_FILE).write_text(json.dumps(spec))
    with pytest.raises(RunError, match="another device than the plan"):
        Parts(out)


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(),
                    reason="checks a plan for a GPU elsewhere")
def test_a_session_plan_for_a_gpu_elsewhere_is_checked_on_the_cpu(tmp_path):
    """Planned here for a GPU machine: verified on the CPU (the main command's check),
    where onnxruntime's assignment cannot be the plan's and is not held against it."""
    model = mlp(tmp_path / "m.onnx", layers=3, batch=4, width=32)
    g = OpGraph.from_onnx(model)
    out = tmp_path / "p"
    half = len(g.nodes) // 2
    export(g, {n.name: "cpu0" if i < half else "acc0" for i, n in enumerate(g.nodes)}, out,
           providers={"cpu0": CPU, "acc0": "CUDAExecutionProvider"}, threads={"cpu0": 0},
           session={"threads": 0})
    with pytest.raises(RunError, match="not available here"):
        Parts(out)
    parts = Parts(out, fallback_cpu=True)
    assert parts.execution_providers == [CPU] and parts.assignment is None
    r = run_parts(out, measure=False, fallback_cpu=True)
    assert r["verify"]["ok"] and r["fell_back"] == ["session"]


def test_a_nan_fails_the_check_even_where_the_original_has_it_too():
    """A NaN compares with nothing: where the parts give one the check fails, also where
    the original gives the same (weights that make NaNs must not pass), and says whose;
    an infinity the original has too is agreement; no value compared at all fails."""
    from onnxsplit.running.runner import compare_outputs
    from onnxsplit.running.verify import tolerance, why_not

    want = {"y": np.array([1.0, -np.inf, np.nan], np.float32)}
    both = compare_outputs({"y": np.array([1.0, -np.inf, np.nan], np.float32)}, want)
    assert both["max_abs_error"] == float("inf") and not tolerance(both, False)["ok"]
    assert why_not(both) == "; 1 NaN(s) in output 'y' (the original model's too)"
    ours = compare_outputs({"y": np.array([np.nan, 2.0], np.float32)}, {"y": np.array([1.0, 2.0], np.float32)})
    assert ours["max_abs_error"] == float("inf") and "the original model has none" in why_not(ours)
    inf = compare_outputs({"y": np.array([1.0, -np.inf], np.float32)}, {"y": np.array([1.0, -np.inf], np.float32)})
    assert inf["max_abs_error"] == 0 and tolerance(inf, False)["ok"] and why_not(inf) == ""
    empty = compare_outputs({"y": np.zeros((0, 4), np.float32)}, {"y": np.zeros((0, 4), np.float32)})
    assert empty["max_abs_error"] == 0 and not tolerance(empty, False)["ok"]
    assert "nothing was compared" in why_not(empty)
    assert not tolerance(compare_outputs({}, {}), False)["ok"]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="copies need two cores")
def test_main_command_is_never_the_slower_of_its_own_candidates(tmp_path, monkeypatch):
    """The written plan is the best of the candidates it weighed (or a split promising
    1.1x the best whole one): its prediction against the calibration in the cache."""
    from onnxsplit.workflow import COPIES_OVER_DEFAULT, MIN_CONFIG_GAIN, MIN_SPLIT_GAIN, split

    model = mlp(tmp_path / "m.onnx", layers=4, batch=16, width=128)  # (as test_python_api_split_then_run)
    res = split(model, tmp_path / "p", quiet=True)
    rec = cached_cpu_entry(model)["as_run"]
    best = max([rec["default"]["throughput_per_s"]] +  # a session on every core is the default
               [r["throughput_per_s"] for t, r in rec["replicas"].items()
                if r["copies"] > 1 or int(t) < rec["cores"]])
    got = res["predicted"]["throughput_per_s"]
    default = rec["default"]["throughput_per_s"]
    copies = max((r["throughput_per_s"] for r in rec["replicas"].values() if r["copies"] > 1),
                 default=None)
    # the best whole way, or the default session where that is one session within
    # MIN_CONFIG_GAIN of it, or copies within COPIES_OVER_DEFAULT of the default, or a
    # split whose profile promised MIN_SPLIT_GAIN times the best and whose timed parts
    # (its prediction) still promise at least the best
    pred = res["predicted"]
    split_pays = pred.get("from") == "parts" and got >= best * (1 - 1e-6) and \
        pred["profile"]["throughput_per_s"] >= MIN_SPLIT_GAIN * best
    assert got == pytest.approx(best) or split_pays or \
        (got == pytest.approx(default) and default * MIN_CONFIG_GAIN >= best) or \
        (got == pytest.approx(copies) and copies * COPIES_OVER_DEFAULT > default)
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    ex = res["execution"]
    assert all(p["threads"] == ex["cpu_threads"] and p["replicas"] == ex["replicas"]
               for p in manifest["parts"])


@pytest.mark.parametrize("t2_ms,chosen", [(9.7, 0), (9.2, 0), (8.9, 2)])
def test_the_default_session_wins_unless_another_way_beats_it_clearly(t2_ms, chosen):
    """Latency on 4 cores: an explicit 2-thread session is taken only where it promises
    MIN_CONFIG_GAIN over onnxruntime's default session (10 ms here)."""
    from onnxsplit.workflow import Prepared, choose

    w = Workload.from_paper_json(diamond(k=0, l=4))
    rec = record(10.0, {1: 18.0, 2: t2_ms, 4: 10.0}, {})
    rec["replicas"]["2"] = {"copies": 1, "throughput_per_s": 1e3 / t2_ms, "latency_ms": t2_ms,
                            "optimization": "all"}
    prep = Prepared(None, None, None, w, {}, {"cpu": rec}, {"cpu": float(w.cpu_latency.sum())})
    cand = choose(prep, w, "latency")
    assert cand.execution["cpu_threads"] == chosen
    assert cand.predicted["latency_ms"] == (10.0 if chosen == 0 else t2_ms)
    assert [c["latency_ms"] for c in cand.plan.details["candidates"]] == sorted([10.0, t2_ms])


def test_a_session_on_every_core_is_the_default_session_and_not_weighed():
    """One session with as many explicit threads as cores is the default session by
    another name: a calibration that found it 1.5x faster is noise, not a candidate."""
    w = Workload.from_paper_json(diamond(k=0, l=2))
    rec = record(10.0, {1: 18.0, 2: 6.6}, {})
    rec["replicas"]["2"] = {"copies": 1, "throughput_per_s": 1e3 / 6.6, "latency_ms": 6.6,
                            "optimization": "all"}
    for objective in ("latency", "throughput"):
        got = machine.whole_candidates(w, objective, rec, None)
        assert [c.execution["cpu_threads"] for c in got] == [0]


def test_copies_side_by_side_win_wherever_they_promise_more():
    from onnxsplit.workflow import Prepared, choose

    w = Workload.from_paper_json(diamond(k=0, l=2))
    rec = record(10.0, {1: 18.0, 2: 10.0}, {1: (2, 103.0)})  # default: 100/s
    prep = Prepared(None, None, None, w, {}, {"cpu": rec}, {"cpu": float(w.cpu_latency.sum())})
    cand = choose(prep, w, "throughput", time_limit=5)
    assert cand.execution["replicas"] == 2 and cand.predicted["throughput_per_s"] == 103.0


@pytest.mark.parametrize("copies,chosen", [(99.0, 2), (96.0, 2), (94.0, 1), (80.0, 1)])
def test_copies_stay_unless_the_default_session_promises_clearly_more(copies, chosen):
    """Throughput on 2 cores, the default session at 100/s: copies promising 99/s or
    96/s are kept (within COPIES_OVER_DEFAULT: 100 < 1.05 x 96 = 100.8), 94/s or 80/s
    are not (100 > 98.7)."""
    from onnxsplit.workflow import COPIES_OVER_DEFAULT, Prepared, choose

    assert COPIES_OVER_DEFAULT == 1.05
    w = Workload.from_paper_json(diamond(k=0, l=2))
    rec = record(10.0, {1: 18.0, 2: 10.0}, {1: (2, copies)})
    prep = Prepared(None, None, None, w, {}, {"cpu": rec}, {"cpu": float(w.cpu_latency.sum())})
    cand = choose(prep, w, "throughput", time_limit=5)
    assert cand.execution["replicas"] == chosen
    assert cand.predicted["throughput_per_s"] == (copies if chosen == 2 else 100.0)
    assert ("kept over onnxruntime's default session" in cand.plan.details["why"]) is (chosen == 2)
    # latency: copies do not cut it, the default session stays
    assert choose(prep, w, "latency", time_limit=5).execution["replicas"] == 1


def test_compare_lists_the_model_kept_whole_as_onnxruntime_runs_it(tmp_path, capsys, monkeypatch):
    from onnxsplit.cli import main

    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=32)
    assert main(["compare", str(model), "--time-limit", "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["onnxruntime"]
    rec = cached_cpu_entry(model)["as_run"]
    assert {w["what"] for w in got} >= {"onnxruntime's default session on the CPU"}
    default = next(w for w in got if w["what"] == "onnxruntime's default session on the CPU")
    assert default["ms"] == pytest.approx(1e3 / rec["default"]["throughput_per_s"])


def test_a_session_that_does_not_clearly_beat_the_default_leaves_copies_in_the_race(monkeypatch):
    """Throughput on 4 cores: 2 threads promise 1.05x the default (not enough for one
    session configured otherwise), copies 1.03x: the copies win, not the default."""
    from onnxsplit.workflow import Prepared, choose

    w = Workload.from_paper_json(diamond(k=0, l=4))
    rec = record(10.0, {1: 18.0, 2: 9.5, 4: 10.0}, {1: (4, 103.0)})  # default: 100/s
    rec["replicas"]["2"] = {"copies": 1, "throughput_per_s": 105.0, "latency_ms": 9.5,
                            "optimization": "all"}
    prep = Prepared(None, None, None, w, {}, {"cpu": rec}, {"cpu": float(w.cpu_latency.sum())})
    monkeypatch.setattr(machine, "split_workloads", lambda *a: [])  # wholes only
    cand = choose(prep, w, "throughput", time_limit=5)
    assert cand.execution["replicas"] == 4 and cand.predicted["throughput_per_s"] == 103.0
    assert [c["throughput_per_s"] for c in cand.plan.details["candidates"]][:3] == [105.0, 103.0, 100.0]


def test_ratios_pair_the_rounds_they_were_measured_in():
    """A slow round slows both sides of its ratio: the ratio is the median of the rounds'
    ratios (2, 0.5, 2 -> 2), not the ratio of the medians (20 / 15); without rounds it is
    the ratio of the figures."""
    from onnxsplit.running.compare import paired_ratios

    def rounds(thr):
        return {"throughput_per_s": float(np.median(thr)), "latency_ms": float(np.median([1e3 / t for t in thr])),
                "by_round": {"throughput_per_s": thr, "latency_ms": [1e3 / t for t in thr]}}

    got = paired_ratios(rounds([10.0, 20.0, 30.0]), {"b": rounds([5.0, 40.0, 15.0]),
                                                     "gone": {"error": "x"}})
    assert set(got) == {"b"}
    assert got["b"]["throughput"] == pytest.approx(2.0)
    assert got["b"]["latency"] == pytest.approx(2.0)
    plain = paired_ratios({"throughput_per_s": 20.0, "latency_ms": 50.0},
                          {"b": {"throughput_per_s": 15.0, "latency_ms": 75.0}})
    assert plain["b"] == pytest.approx({"throughput": 20 / 15, "latency": 1.5})


class FakeParts:
    """A loaded plan for ``compare.measure_rounds`` whose timing a test fakes: it runs
    nothing (or fails to), its threads spin or not (``Parts.spins``)."""

    def __init__(self, name: str = "", spins: bool = True, fails: bool = False):
        self.name, self.spins, self.fails = name, spins, fails

    def run(self, feeds):
        from onnxsplit.running.runner import RunError

        if self.fails:
            raise RunError("no such provider")
        if self.once:
            time.sleep(self.once)
        return {}

    once = 0.0  # (seconds a run takes)

    def default_depth(self) -> int:
        return 1


def test_each_baseline_is_measured_beside_the_plan(monkeypatch):
    """With a plan to pair with, every round measures each other session right beside a
    measurement of the plan, either side first in turn; the plan's figure is the median
    of all its measurements and each ratio pairs the two sides of one group.  The machine
    here slows down group by group (a shared machine's slow seconds): the pairs' ratios
    are then exact, where rounds in turn would pair measurements from different speeds."""
    from onnxsplit.running import compare

    rate = {"plan": 100.0, "a": 50.0, "b": 80.0, "c": 200.0}
    seq: list[str] = []
    group = [2]  # calls that run at one speed

    def fake_pipeline(parts, feeds, samples, warmup):
        seq.append(parts.name)
        speed = 1.0 / (1 + (len(seq) - 1) // group[0])  # each group: its own speed
        thr = rate[parts.name] * speed
        return {"latency_ms": 1e3 / thr, "throughput_per_s": thr}

    monkeypatch.setattr(compare, "measure_pipeline", fake_pipeline)
    loaded = {name: FakeParts(name) for name in rate}
    got = compare.measure_rounds(loaded, {}, 9, 0, rounds=4, pair_with="plan")
    groups = [tuple(seq[i:i + 2]) for i in range(0, len(seq), 2)]
    assert len(seq) == 4 * 3 * 2 and all("plan" in g and len(set(g)) == 2 for g in groups)
    for other in "abc":  # each side goes first in half of its pairs
        firsts = [g[0] for g in groups if other in g]
        assert len(firsts) == 4 and firsts.count("plan") == 2
    plan = got["plan"]
    assert plan["rounds"] == 12 and set(plan["beside"]) == {"a", "b", "c"}
    assert plan["throughput_per_s"] == pytest.approx(np.median(plan["by_round"]["throughput_per_s"]))
    ratios = compare.paired_ratios(plan, {k: got[k] for k in "abc"})
    for other in "abc":
        assert got[other]["rounds"] == 4
        assert ratios[other]["throughput"] == pytest.approx(rate["plan"] / rate[other])
        assert ratios[other]["latency"] == pytest.approx(rate["plan"] / rate[other])
    # unpaired, the same machine gives the ratio of measurements taken at other speeds
    seq.clear()
    group[0] = 1
    apart = compare.measure_rounds(loaded, {}, 9, 0, rounds=4)
    assert "beside" not in apart["plan"] and len(seq) == 16
    assert compare.paired_ratios(apart["plan"], {"a": apart["a"]})["a"]["throughput"] \
        != pytest.approx(rate["plan"] / rate["a"])


@pytest.mark.full_timing
def test_each_measurement_waits_for_the_one_before_to_settle(monkeypatch):
    """A session's spinning threads must not be timed as the next session's slowness:
    after sessions that spin (as FakeParts do unless told), every measurement starts
    SETTLE_S after the previous one ended."""
    from onnxsplit.running import compare

    events: list = []

    def fake_pipeline(parts, feeds, samples, warmup):
        events.append("measure")
        return {"latency_ms": 1.0, "throughput_per_s": 1e3}

    monkeypatch.setattr(compare, "measure_pipeline", fake_pipeline)
    monkeypatch.setattr(compare.time, "sleep", lambda s: events.append(s))
    compare.measure_rounds({"plan": FakeParts(), "a": FakeParts(), "b": FakeParts()}, {}, 9, 0, rounds=3,
                          pair_with="plan")
    assert events.count("measure") == 3 * 2 * 2
    assert events == [compare.SETTLE_S, "measure"] * 12
    assert compare.SETTLE_S >= 0.05  # the spinning measured lasts 20-50 ms


def test_the_timing_scale_shortens_every_wait_and_marks_what_it_measured(monkeypatch):
    """ONNXSPLIT_TIMING_SCALE: the pauses a fifth as long, a calibration made at a fifth
    measured again by a command at full length (not the other way round), a bad value one
    line."""
    from onnxsplit.errors import ProfileError
    from onnxsplit.running import compare, timing

    events: list = []
    monkeypatch.setattr(compare, "measure_pipeline", lambda *a: {"latency_ms": 1.0, "throughput_per_s": 1e3})
    monkeypatch.setattr(compare.time, "sleep", lambda s: events.append(s))
    monkeypatch.setenv(timing.SCALE_ENV, "0.2")
    compare.measure_rounds({"a": FakeParts(), "b": FakeParts()}, {}, 4, 0, rounds=2)
    assert events == [pytest.approx(0.2 * compare.SETTLE_S)] * 4
    rec = {"default": {}, "replicas": {}, "scale": 0.2}
    assert not cal.stale(rec)
    monkeypatch.delenv(timing.SCALE_ENV)
    assert cal.stale(rec) and not cal.stale({"default": {}, "replicas": {}})
    monkeypatch.setenv(timing.SCALE_ENV, "0.5")
    assert not cal.stale({"default": {}, "replicas": {}})  # a full one serves a shorter
    for bad in ("0", "1.5", "x", "nan", "-1"):
        monkeypatch.setenv(timing.SCALE_ENV, bad)
        with pytest.raises(ProfileError, match=f"ONNXSPLIT_TIMING_SCALE must be .* not '{bad}'"):
            timing.scale()


def test_only_a_session_whose_threads_spin_makes_the_next_one_wait(monkeypatch, tmp_path):
    """Single-thread sessions, and threads told not to spin, leave the cores free at once:
    the pause follows only a session that spins (and opens the measuring, after whatever
    ran before)."""
    from onnxsplit.running import compare

    model = mlp(tmp_path / "m.onnx", layers=2, batch=2, width=8)
    quiet = {"session.intra_op.allow_spinning": "0"}
    assert Parts.whole(model, threads=0).spins and Parts.whole(model, threads=2).spins
    assert not Parts.whole(model, threads=1, replicas=2).spins
    assert not Parts.whole(model, threads=2, config=quiet).spins

    events: list = []

    def fake_pipeline(parts, feeds, samples, warmup):
        events.append(parts.spins)
        return {"latency_ms": 1.0, "throughput_per_s": 1e3}

    monkeypatch.setattr(compare, "measure_pipeline", fake_pipeline)
    monkeypatch.setattr(compare.time, "sleep", lambda s: events.append("pause"))
    compare.measure_rounds({"plan": FakeParts(spins=False), "a": FakeParts(), "b": FakeParts(spins=False)}, {}, 9, 0,
                          rounds=3, pair_with="plan")
    assert events[0] == "pause" and events.count("pause") > 1  # (the first, and after "a")
    for before, after in zip(events, events[1:]):
        assert (after == "pause") == (before is True), events


def test_the_plan_is_measured_though_every_baseline_failed(monkeypatch):
    """A baseline that cannot run leaves the plan to be measured alone, every round."""
    from onnxsplit.running import compare

    monkeypatch.setattr(compare, "measure_pipeline",
                        lambda parts, feeds, samples, warmup: {"latency_ms": 2.0, "throughput_per_s": 500.0})
    got = compare.measure_rounds({"plan": FakeParts(), "gone": FakeParts(fails=True)}, {}, 9, 0, rounds=3,
                                pair_with="plan")
    assert got["gone"] == {"error": "no such provider"}
    assert got["plan"]["rounds"] == 3 and got["plan"]["beside"] == {}


def test_rounds_fit_a_time_limit_cutting_warmups_then_samples_then_rounds():
    """fit_rounds against the time each measurement takes counted here sample by sample:
    what fits is left alone; a tighter budget cuts the warm-up to one, then samples a
    round, then rounds, never below MIN_SAMPLES and MIN_ROUNDS."""
    from onnxsplit.running import compare

    once = {"plan": 0.1, "a": 0.2, "b": 0.05}
    depth = dict.fromkeys(once, 1)
    names = list(once)

    def seconds(rounds, warmup, n):  # every other session beside a run of the plan, each round
        pair = [(once["plan"] + once[o]) * warmup + once["plan"] * n["plan"] + once[o] * n[o] for o in "ab"]
        return rounds * sum(pair)

    asked = {"plan": 5, "a": 5, "b": 20}
    full = seconds(9, 5, asked)
    assert compare.fit_rounds(names, once, depth, asked, 5, 9, "plan", full + 0.01) == (9, 5, asked)
    r, w, n = compare.fit_rounds(names, once, depth, asked, 5, 9, "plan", seconds(9, 1, asked) + 0.01)
    assert (r, w, n) == (9, 1, asked)  # the warm-ups alone
    for budget in (seconds(9, 1, asked) * 0.6, seconds(9, 1, asked) * 0.2, 0.5, 0.0):
        r, w, n = compare.fit_rounds(names, once, depth, asked, 5, 9, "plan", budget)
        assert w == 1 and all(compare.MIN_SAMPLES <= n[k] <= asked[k] for k in n) and r >= compare.MIN_ROUNDS
        floor = seconds(compare.MIN_ROUNDS, 1, dict.fromkeys(once, compare.MIN_SAMPLES))
        assert seconds(r, w, n) <= max(budget, floor) + 1e-9, (budget, r, n)
        assert r == 9 or all(n[k] == compare.MIN_SAMPLES for k in n)  # rounds go last
    # a session slow enough for one sample a round keeps its one
    assert compare.fit_rounds(names, once, depth, dict(asked, a=1), 5, 9, "plan", 0.0)[2]["a"] == 1
    # a stream of copies: its throughput's stream is at least four samples a worker
    assert compare.measure_cost(0.1, 4, 2, 1) == pytest.approx(0.1 * (2 + 2 + 16))


@pytest.mark.full_timing
def test_run_measures_within_its_time_limit_and_says_so(monkeypatch):
    """A slow model's rounds fit --time-limit (from each session's first run), and where
    they run slower than that run foretold, no round starts once the limit is spent after
    MIN_ROUNDS; the summaries say how they were cut.  Without a limit: every round."""
    from onnxsplit.running import compare

    slow = {"t": 0.02}

    def fake_pipeline(parts, feeds, samples, warmup):
        time.sleep((samples + warmup) * slow["t"])
        return {"latency_ms": 20.0, "throughput_per_s": 50.0}

    monkeypatch.setattr(compare, "measure_pipeline", fake_pipeline)
    monkeypatch.setattr(compare, "SETTLE_S", 0.0)

    def loaded():
        parts = {"plan": FakeParts(), "a": FakeParts(), "b": FakeParts()}
        for p in parts.values():
            p.once = 0.02
        return parts

    began = time.perf_counter()
    got = compare.measure_rounds(loaded(), {}, 50, 5, pair_with="plan", time_limit=1.5)
    took = time.perf_counter() - began
    assert took < 1.5 * 1.3 and got["a"]["rounds"] >= compare.MIN_ROUNDS
    cut = got["plan"]["time_limited"]
    assert cut["time_limit_s"] == 1.5 and cut["warmup"] == 1 and cut["per_round"] < 10
    slow["t"] = 0.06  # three times what the first run said
    began = time.perf_counter()
    got = compare.measure_rounds(loaded(), {}, 50, 5, pair_with="plan", time_limit=1.5)
    assert got["a"]["rounds"] == compare.MIN_ROUNDS == got["b"]["time_limited"]["rounds"]
    assert got["plan"]["rounds"] == 2 * compare.MIN_ROUNDS  # (beside each of the others, each round)
    assert time.perf_counter() - began < compare.MIN_ROUNDS * 4 * (cut["per_round"] + 1) * 0.06 + 1
    slow["t"] = 0.0
    got = compare.measure_rounds(loaded(), {}, 50, 5, pair_with="plan")
    assert got["a"]["rounds"] == compare.ROUNDS and "time_limited" not in got["plan"]
    from onnxsplit import cli  # (its default, written out there so that --help stays quick)

    assert cli._parser().parse_args(["run", "parts"]).time_limit == compare.TIME_LIMIT_S


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_rounds_vary_who_runs_after_whom(n):
    from onnxsplit.running.compare import ROUNDS, round_order

    names = [f"s{i}" for i in range(n)]
    orders = [round_order(names, r) for r in range(max(ROUNDS, n))]
    assert all(sorted(o) == names for o in orders)
    assert sorted(o[0] for o in orders[:n]) == names  # each goes first once
    if n >= 3:  # and none always right after the same one (the copies, say)
        for x in names:
            after = {o[o.index(x) + 1] for o in orders[:ROUNDS] if o.index(x) + 1 < n}
            assert len(after) >= 2, (x, orders)


def _chain_on_two_cores(n=6, ms=2.0):
    return Workload.from_paper_json(workload([node(i, cpu=ms, acc=ms, supported=False) for i in range(n)],
                                             [edge(i, i + 1, 0.0) for i in range(n - 1)], k=0, l=2))


def test_a_plan_scattering_a_cores_nodes_pays_a_hand_off_per_call():
    """A chain of 6 on two cores, split evenly either way (max load 6 ms both): contiguous,
    each core makes one call a sample; alternating, three -- and the runner hands off
    each.  Independent arithmetic: period = load + calls x overhead, latency = all nodes
    + (calls + 1) x overhead."""
    from onnxsplit.plan import Plan
    from onnxsplit.workflow import STAGE_OVERHEAD_MS as h, predict, runner_calls, runner_pieces

    w = _chain_on_two_cores()
    halves = Plan("throughput", "x", "feasible", 6.0, {i: f"cpu{i // 3}" for i in range(6)})
    mixed = Plan("throughput", "x", "feasible", 6.0, {i: f"cpu{i % 2}" for i in range(6)})
    assert runner_calls(halves, runner_pieces(w, halves)) == {"cpu0": 1, "cpu1": 1}
    assert runner_calls(mixed, runner_pieces(w, mixed)) == {"cpu0": 3, "cpu1": 3}
    for plan, calls in ((halves, 1), (mixed, 3)):
        got = predict(w, plan)
        assert got["parts"] == 2 * calls
        assert got["throughput_per_s"] == pytest.approx(1e3 / (6.0 + calls * h))
        assert got["latency_ms"] == pytest.approx(12.0 + (2 * calls + 1) * h)


def test_the_machine_weighs_a_contiguous_plan_beside_a_scattered_one(monkeypatch):
    """Where the solver's best plan in the paper's model (free hand-offs between cores)
    scatters the cores' nodes, the contiguous plan it also found wins once each call
    is paid for."""
    from onnxsplit import workflow
    from onnxsplit.plan import Plan
    from onnxsplit.workflow import Prepared, choose

    w = _chain_on_two_cores(ms=0.2)
    mixed = Plan("throughput", "lp_round", "feasible", 0.6, {i: f"cpu{i % 2}" for i in range(6)})
    halves = Plan("throughput", "dp", "feasible", 0.6 + 1e-9, {i: f"cpu{i // 3}" for i in range(6)})
    monkeypatch.setattr(workflow, "throughput_plans", lambda *a: [mixed, halves])
    total = float(w.cpu_latency.sum())
    rec = record(total, {1: total, 2: total}, {})  # the whole model: 1.2 ms however run
    prep = Prepared(None, None, None, w, {}, {"cpu": rec}, {"cpu": total})
    cand = choose(prep, w, "throughput", time_limit=5)
    assert cand.plan.method == "dp"
    weighed = {c["what"].split(",")[0]: c["throughput_per_s"] for c in cand.plan.details["candidates"]}
    h = workflow.STAGE_OVERHEAD_MS
    assert weighed["dp"] == pytest.approx(1e3 / (0.6 + h))
    assert weighed["lp_round"] == pytest.approx(1e3 / (0.6 + 3 * h))
    # with the runner's costs calibrated, those are charged: calls this cheap make the
    # scattered plan's six calls a sample bind the shared lock (6 x 0.12 ms > 0.6 + 3 x 0.015)
    rec["runner"] = {"handoff_ms": 0.02, "call_ms": 0.01, "gil_ms": 0.12, "session_ms": 0.005,
                     "gil_tensor_ms": 0.001}
    cand = choose(prep, w, "throughput", time_limit=5)
    weighed = {c["what"].split(",")[0]: c["throughput_per_s"] for c in cand.plan.details["candidates"]}
    assert weighed["dp"] == pytest.approx(1e3 / (0.6 + 0.015))
    assert weighed["lp_round"] == pytest.approx(1e3 / (6 * 0.12))
    assert cand.predicted["call_costs"]["measured"] is True


def test_call_costs_come_from_a_whole_runner_calibration_or_not_at_all():
    """A record without the runner's costs, or with one missing or not a number, predicts
    with the defaults throughout (never a calibrated figure beside a default one)."""
    default = machine.CallCosts()
    full = {"handoff_ms": 0.2, "call_ms": 0.3, "gil_ms": 0.05, "session_ms": 0.01,
            "gil_tensor_ms": 0.004}
    assert machine.CallCosts.of(None) == default
    for broken in ({"gil_ms": None}, {"gil_ms": 0.0}, {"call_ms": float("nan")}, {"session_ms": -1.0}):
        assert machine.CallCosts.of({"runner": {**full, **broken}}) == default
    for key in ("session_ms", "gil_tensor_ms"):  # (a record from before it was measured)
        assert machine.CallCosts.of({"runner": {k: v for k, v in full.items() if k != key}}) == default
    got = machine.CallCosts.of({"runner": full})
    assert (got.handoff_ms, got.call_ms, got.gil_ms, got.session_ms, got.gil_tensor_ms,
            got.measured) == (0.2, 0.3, 0.05, 0.01, 0.004, True)


def test_a_plans_prediction_charges_each_call_what_was_calibrated():
    """Independent arithmetic on the chain of 6 over two cores: the period is a core's
    load plus its calls x (call_ms + session_ms), or all calls x gil_ms where that is
    more; the latency all nodes plus calls x (handoff_ms + session_ms) and one hand-off out."""
    from onnxsplit.plan import Plan
    from onnxsplit.workflow import predict

    w = _chain_on_two_cores()
    mixed = Plan("throughput", "x", "feasible", 6.0, {i: f"cpu{i % 2}" for i in range(6)})
    got = predict(w, mixed, machine.CallCosts(0.3, 0.5, 0.01, 0.05))
    assert got["throughput_per_s"] == pytest.approx(1e3 / (6.0 + 3 * 0.55))
    assert got["latency_ms"] == pytest.approx(12.0 + 6 * 0.35 + 0.3)
    got = predict(w, mixed, machine.CallCosts(0.3, 0.5, 1.5, 0.05))
    assert got["throughput_per_s"] == pytest.approx(1e3 / (6 * 1.5))


def test_a_calls_share_of_the_lock_grows_with_its_tensors():
    """Three nodes on cpu0 each feed the node on cpu1: each core makes one call, with
    three tensors out of cpu0's (and one in: the model's input) and three into cpu1's
    (and one out), so each call holds the lock for gil_ms + 2 x gil_tensor_ms."""
    from onnxsplit.plan import Plan
    from onnxsplit.workflow import predict

    w = Workload.from_paper_json(workload([node(i, cpu=0.01, acc=0.01, supported=False) for i in range(4)],
                                          [edge(i, 3, 0.0) for i in range(3)], k=0, l=2))
    fan_in = Plan("throughput", "x", "feasible", 0.03, {0: "cpu0", 1: "cpu0", 2: "cpu0", 3: "cpu1"})
    got = predict(w, fan_in, machine.CallCosts(0.0, 0.0, 1.5, 0.0, 0.5))
    assert got["parts"] == 2
    assert got["throughput_per_s"] == pytest.approx(1e3 / (2 * (1.5 + 2 * 0.5)))
    # a sample alone: its four nodes, and each call's two further tensors handled in turn
    assert got["latency_ms"] == pytest.approx(4 * 0.01 + 2 * 2 * 0.5)
    got = predict(w, fan_in, machine.CallCosts(0.0, 0.0, 1.5, 0.0, 0.0))
    assert got["throughput_per_s"] == pytest.approx(1e3 / 3.0)


def test_a_written_plan_is_predicted_from_its_parts_own_times():
    """Parts A (d0) -> B (d1), A -> C (d0), B and C -> D (d1), timed 1, 2, 3 and 4 ms:
    alone, A ends at 1.1, B at 3.2, C (d0 free at 1.1) at 4.2, D (its third tensor 0.05
    more) at 4.3 + 4.05 = 8.35, out at 8.45; streamed, d1 is busiest: 2 + 4 (x 1.5 for
    its busy neighbour) + 2 calls x 0.2."""
    def part(name, device, inputs, outputs):
        return {"name": name, "device": device, "inputs": [{"name": t} for t in inputs],
                "outputs": [{"name": t} for t in outputs]}

    parts = [part("A", "d0", ["x"], ["a"]), part("B", "d1", ["a"], ["b"]),
             part("C", "d0", ["a"], ["c"]), part("D", "d1", ["b", "c"], ["y"])]
    costs = machine.CallCosts(handoff_ms=0.1, call_ms=0.2, gil_ms=0.05, gil_tensor_ms=0.05)
    got = machine.parts_prediction(parts, [1.0, 2.0, 3.0, 4.0], costs)
    assert got["latency_ms"] == pytest.approx(8.45)
    assert got["throughput_per_s"] == pytest.approx(1e3 / 6.4)
    got = machine.parts_prediction(parts, [1.0, 2.0, 3.0, 4.0], costs, {"d1": 1.5})
    assert got["throughput_per_s"] == pytest.approx(1e3 / 9.4)
    # the shared lock binds where calls are many and short: 0.5 ms a call, and D's
    # third tensor 0.25 ms more
    got = machine.parts_prediction(parts, [0.01] * 4,
                                   machine.CallCosts(0.1, 0.01, 0.5, gil_tensor_ms=0.25))
    assert got["throughput_per_s"] == pytest.approx(1e3 / 2.25)
    # one part alone (a plan in one session) runs with no hand-off
    alone = machine.parts_prediction([part("S", "s", ["x"], ["y"])], [2.5], costs)
    assert (alone["latency_ms"], alone["throughput_per_s"]) == (2.5, 400.0)


def test_the_runners_schedule_is_replayed_where_calls_alternate_between_devices():
    """A (d0, 3 ms) -> B (d1, 1) -> C (d0, 1) -> D (d1, 3): each device works 4 ms a
    sample, but with two samples in flight, by hand (oldest sample first): d0 runs A0
    0-3, A1 3-6, C0 6-7, C1 7-8; d1 B0 3-4, B1 6-7, D0 7-10, D1 10-13; sample 2 enters at
    10 and all repeats 10 ms later: 5 ms a sample, not 4."""
    chain = [[], [0], [1], [2]]
    devices = ["d0", "d1", "d0", "d1"]
    assert machine.simulate_runner(devices, [3, 1, 1, 3], chain, 0.0, depth=2) == pytest.approx(5.0)
    # one sample alone: its parts one after another, a hand-off before each
    assert machine.simulate_runner(devices, [3, 1, 1, 3], chain, 0.5, depth=1, samples=1) == \
        pytest.approx(8 + 4 * 0.5)
    # equal parts interleave: each device busy all the time
    assert machine.simulate_runner(devices, [1, 1, 1, 1], chain, 0.0, depth=2) == pytest.approx(2.0)
    # the written plan's prediction takes the replayed rate (four in flight, the
    # runner's two per device), not the devices' sums (10 ms each)
    ms = [1, 5, 1, 1, 5, 3, 3, 1]
    parts = [{"device": f"d{i % 2}", "inputs": [{"name": f"t{i}"}], "outputs": [{"name": f"t{i + 1}"}]}
             for i in range(8)]
    got = machine.parts_prediction(parts, ms, machine.CallCosts(0.0, 0.0, 0.01))
    replayed = machine.simulate_runner([p["device"] for p in parts], ms, [[]] + [[i] for i in range(7)], 0.0)
    assert got["throughput_per_s"] == pytest.approx(1e3 / replayed) and replayed > 1.1 * 10.0


@pytest.mark.parametrize("rival_per_s", [1e9, 1e-3])
def test_a_split_whose_timed_parts_lose_to_the_model_kept_whole_is_not_written(
        tmp_path, monkeypatch, rival_per_s):
    """The split is written, verified and timed part by part before it takes the output's
    place; where its parts promise less than the whole rival it was chosen over, the
    whole model is written instead, else the split, predicted from its parts' times."""
    from onnxsplit.running import compare
    from onnxsplit.workflow import prepare, write_parts

    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compare, "time_calls", lambda parts, feeds: [0.25 * (i + 1) for i in range(len(parts.parts))])
    model = mlp(tmp_path / "m.onnx", layers=4, batch=4, width=32)
    prep = prepare(model, as_run=False, quiet=True)
    w = prep.workload.replace(num_cpus=2)
    prep.as_run = {"cpu": {"cores": 2}}  # no copies measured: no contention; default costs
    ids = sorted(int(i) for i in w.ids)
    split_plan = Plan("throughput", "dp", "feasible", 1.0,
                      {i: ("cpu0" if k < len(ids) // 2 else "cpu1") for k, i in enumerate(ids)})
    cand = machine.Candidate(split_plan, w, {"cpu_threads": 1, "optimization": "all", "replicas": 1,
                                             "run_as": "pipeline"},
                             {"latency_ms": 1.0, "throughput_per_s": 1e3, "from": "profile"})
    whole = machine._whole_plan(w, "cpu0", "throughput", "onnxruntime's default session", 1e3 / rival_per_s)
    cand.rival = machine.Candidate(whole, w, {"cpu_threads": 0, "optimization": "all", "replicas": 1,
                                              "run_as": "pipeline", "baseline": True},
                                   {"latency_ms": 1e3 / rival_per_s, "throughput_per_s": rival_per_s,
                                    "parts": 1, "from": "calibration"})
    res = write_parts(prep, split_plan, tmp_path / "p", quiet=True, candidate=cand)
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    if rival_per_s > 1:
        assert res["plan"]["method"] == "whole" and len(manifest["parts"]) == 1
        assert "timed part by part" in res["plan"]["details"]["why"]
        assert manifest["predicted"]["throughput_per_s"] == rival_per_s
    else:
        assert [p["device"] for p in manifest["parts"]] == ["cpu0", "cpu1"]
        h = machine.CallCosts()
        # part0 0.25 ms on cpu0, part1 0.5 ms on cpu1: the period is cpu1's part and call
        assert manifest["predicted"]["throughput_per_s"] == pytest.approx(1e3 / (0.5 + h.call_ms))
        assert manifest["predicted"]["latency_ms"] == pytest.approx(0.75 + 3 * h.handoff_ms)
        assert manifest["predicted"]["from"] == "parts" == res["predicted"]["from"]
        assert manifest["predicted"]["profile"]["throughput_per_s"] == 1e3


def test_the_runner_costs_are_what_its_chains_take_beyond_their_parts_own_times(monkeypatch):
    """The chains run (each part multiplies by the identity: the output is the input),
    part i on device i mod d; each figure is the runner's measurement less the parts' own
    times, over the calls that made it."""
    from onnxsplit.running import runner

    seen = {}
    real = runner.measure_pipeline

    def fake_pipeline(parts, feeds, samples, warmup):
        devices, tensors = len(parts.devices), len(parts.parts[0]["inputs"])
        if (devices, tensors) not in seen:
            seen[devices, tensors] = real(parts, feeds, 3, 1)
            out = parts.run(feeds)
            for name in feeds:
                assert np.array_equal(out[name.replace("x0", "x16")], feeds[name]), name
            assert len(out) == len(feeds) == tensors
            assert [p["device"] for p in parts.parts] == [f"d{i % devices}" for i in range(16)]
            assert all(len(p["outputs"]) == tensors for p in parts.parts)
        return {(2, 1): {"latency_ms": 18.7, "throughput_per_s": 1e3 / 9.6},
                (4, 1): {"latency_ms": 9.0, "throughput_per_s": 1e3 / 0.8},
                (4, 6): {"latency_ms": 9.0, "throughput_per_s": 1e3 / 1.6}}[devices, tensors]

    def fake_alone(parts, feeds, budget_s):
        return [1.0 if len(parts.devices) == 2 else 0.01] * len(parts.parts)

    monkeypatch.setattr(runner, "measure_pipeline", fake_pipeline)
    monkeypatch.setattr(runner, "time_calls", fake_alone)
    got = cal.runner_costs()
    assert sorted(seen) == [(2, 1), (cal.GIL_DEVICES, 1), (cal.GIL_DEVICES, cal.WIDE_TENSORS)] \
        == [(2, 1), (4, 1), (4, 6)]
    assert all(np.isfinite(m["latency_ms"]) and m["latency_ms"] > 0 for m in seen.values())
    assert got["handoff_ms"] == pytest.approx((18.7 - 16.0) / 17, rel=1e-5)
    assert got["call_ms"] == pytest.approx((9.6 - 8.0) / 8, rel=1e-5)
    assert got["gil_ms"] == pytest.approx(0.8 / 16, rel=1e-5)
    # the wide chain's 10 more tensors a call: (1.6 - 0.8) / 16 calls / 10
    assert got["gil_tensor_ms"] == pytest.approx(0.8 / 16 / 10, rel=1e-4)
    assert got["session_ms"] == pytest.approx(0.01, rel=1e-5)
    assert machine.CallCosts.of({"runner": got}).measured


def test_a_calibration_whose_rounds_spread_wide_is_measured_again(tmp_path, monkeypatch):
    """The first measurement's rounds 60% apart (a machine still waking up): measured
    again, and the narrower one kept, with how wide it was and how many tries it took;
    a narrow first one is kept at once."""
    from onnxsplit.running import compare
    from onnxsplit.running.timing import SCALE_ENV

    monkeypatch.setenv(SCALE_ENV, "1")  # (rounds of a user's length: the bound as it stands)
    model = mlp(tmp_path / "m.onnx", layers=1, batch=2, width=8)
    feeds = {"x": np.ones((2, 8), np.float32)}
    calls = []

    def fake(loaded, feeds, samples, warmup, rounds=5, min_round_s=0.3, pair_with=None):
        calls.append(sorted(loaded))
        wide = len(calls) == 1
        rates = [100.0, 160.0, 120.0] if wide else [100.0, 104.0, 102.0]
        return {k: {"latency_ms": 10.0, "throughput_per_s": float(np.median(rates)), "samples": 3,
                    "rounds": 3, "by_round": {"throughput_per_s": rates, "latency_ms": [10.0] * 3}}
                for k in loaded}

    monkeypatch.setattr(compare, "measure_rounds", fake)
    monkeypatch.setattr(cal, "runner_costs", dict)  # (not what is judged here)
    rec = cal.calibrate(model, feeds, "CPUExecutionProvider", cores=1)
    assert len(calls) >= 2 and calls[0] == calls[1]  # the same configurations, again
    assert rec["default"]["tries"] == 2 and rec["default"]["spread"] == pytest.approx(0.04)
    assert rec["default"]["throughput_per_s"] == pytest.approx(102.0)
    calls.clear()
    monkeypatch.setattr(cal, "SPREAD_AGAIN", 0.7)
    rec = cal.calibrate(model, feeds, "CPUExecutionProvider", cores=1)
    assert rec["default"]["tries"] == 1 and rec["default"]["spread"] == pytest.approx(0.6)
    # rounds a quarter as long (ONNXSPLIT_TIMING_SCALE=0.25) spread twice as wide by their
    # shortness alone: the bound doubles with them
    monkeypatch.setenv(SCALE_ENV, "0.25")
    for bound, tries in ((0.25, 2), (0.35, 1)):  # (0.6 against 0.5, then against 0.7)
        calls.clear()
        monkeypatch.setattr(cal, "SPREAD_AGAIN", bound)
        assert cal.calibrate(model, feeds, "CPUExecutionProvider", cores=1)["default"]["tries"] == tries


def test_a_calibration_noisy_after_its_tries_is_measured_again_then_said(tmp_path, monkeypatch):
    """Rounds of a configuration spread wider than SPREAD_AGAIN are measured again, up to
    AGAIN more times, and the steadiest try is kept; where even that one spreads wider, the
    calibration names the configuration, its spread and its tries (the split's note), and
    says nothing where a try came steady."""
    from onnxsplit.running import compare

    model = mlp(tmp_path / "m.onnx", layers=2, batch=1, width=16)
    monkeypatch.setattr(cal, "scale", lambda: 1.0)
    monkeypatch.setattr(cal, "WARM_S", 0.0)
    spreads: list[list[float]] = []

    def rounds(loaded, feeds, samples, **kw):
        rates = spreads.pop(0)
        return {k: {"latency_ms": 1.0, "by_round": {"throughput_per_s": rates}} for k in loaded}

    monkeypatch.setattr(compare, "measure_rounds", rounds)
    feeds = {"x": np.ones((1, 16), np.float32)}
    spreads[:] = [[100.0, 180.0], [100.0, 150.0], [100.0, 166.0]]  # (80%, 50%, 66%: all noisy)
    got = cal.measure_loaded({"default": Parts.whole(model, threads=1)}, feeds)
    assert not spreads and got["default"]["tries"] == 1 + cal.AGAIN == 3
    assert got["default"]["spread"] == pytest.approx(0.5)
    assert cal.noisiest(got) == {"config": "default", "spread": 0.5, "tries": 3}
    spreads[:] = [[100.0, 180.0], [100.0, 110.0], [100.0, 300.0]]  # (steady on the second try)
    got = cal.measure_loaded({"default": Parts.whole(model, threads=1)}, feeds)
    assert spreads == [[100.0, 300.0]] and got["default"]["tries"] == 2
    assert cal.noisiest(got) is None
