"""Each configuration `run` compares is held and measured in a process of its own
(onnxsplit/running/apart.py): what it measures there is what it measures here, an error
there is one line here, and no child outlives its use."""

from __future__ import annotations

import os

import numpy as np
import pytest

from onnx_models import mlp
from onnxsplit.running import apart, compare, runner
from onnxsplit.running.runner import Parts, RunError
from onnxsplit.solve import isolated

CPU = "CPUExecutionProvider"


@pytest.fixture
def children(monkeypatch):
    """Every child process started meanwhile."""
    started = []
    real = isolated.start

    def start(*a, **k):
        started.append(real(*a, **k))
        return started[-1]

    monkeypatch.setattr(isolated, "start", start)
    return started


def test_a_configuration_apart_runs_there_as_here(tmp_path, children):
    model = mlp(tmp_path / "m.onnx", layers=2, batch=2, width=16)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)}
    here = Parts.whole(model, CPU, threads=1)
    with apart.Apart(("whole", str(model), CPU, {"threads": 1}), feeds) as held:
        pid = held._child.call("os:getpid")
        assert pid != os.getpid() and [p.pid for p in children] == [pid]
        assert held.default_depth() == here.default_depth() == 1
        assert held.spins == here.spins is False
        # the child runs what was built here: the same outputs of the same inputs
        there, want = held.run(), here.run(feeds)
        assert sorted(there) == sorted(want) and all(np.array_equal(there[k], want[k]) for k in want)
        got = runner.measure_pipeline(held, feeds, 7, 1)  # (measured in the child)
    assert got["samples"] == 7 and np.isfinite(got["latency_ms"]) and got["latency_ms"] > 0
    assert np.isfinite(got["throughput_per_s"]) and got["throughput_per_s"] > 0
    assert children[0].poll() is not None  # ended with the block


def test_a_configuration_that_cannot_load_is_one_line_and_no_process(tmp_path, children):
    with pytest.raises(RunError) as e:
        apart.Apart(("whole", str(tmp_path / "gone.onnx"), CPU, {"threads": 0}), {"x": np.ones(1)})
    assert "gone.onnx" in str(e.value) and "cannot be loaded" in str(e.value)
    assert len(children) == 1 and children[0].poll() is not None


def test_a_child_that_dies_is_a_run_error_naming_the_configuration(tmp_path, children):
    model = mlp(tmp_path / "m.onnx", layers=1, batch=1, width=8)
    held = apart.Apart(("whole", str(model), CPU, {"threads": 1}), {"x": np.ones((1, 8), np.float32)})
    try:
        children[0].kill()
        children[0].wait()
        with pytest.raises(RunError, match=r"^m\.onnx: its process ended"):
            held.run()
    finally:
        held.close()


def test_baselines_apart_are_the_same_configurations_as_here(tmp_path, children):
    """Each baseline in a child of its own (none left after), the same names and facts as
    loaded in this process, every figure real."""
    model = mlp(tmp_path / "m.onnx", layers=2, batch=2, width=16)
    feeds = {"x": np.ones((2, 16), np.float32)}
    there = compare.baselines(model, feeds, samples=3, warmup=1, rounds=2)
    assert len(children) == len(compare.baseline_runs()) >= 2
    assert all(p.poll() is not None for p in children)
    here = compare.baselines(model, feeds, samples=3, warmup=1, rounds=2, apart=False)
    assert len(children) == len(compare.baseline_runs())  # (none started for these)
    assert sorted(there) == sorted(here)
    for name, got in there.items():
        facts = {k: v for k, v in got.items() if k in ("execution_provider", "threads", "replicas", "hint",
                                                         "precision")}
        assert facts == {k: v for k, v in here[name].items() if k in facts}, name
        assert got["rounds"] == 2 and np.isfinite(got["latency_ms"]) and got["latency_ms"] > 0, name
        assert np.isfinite(got["throughput_per_s"]) and got["throughput_per_s"] > 0, name


def test_run_measures_the_plan_apart_beside_its_baselines(tmp_path, children, monkeypatch):
    """`run`: the plan verified here, let go of here (not held twice), measured in a child
    of its own beside each baseline, every child ended after; the paired ratios are real."""
    from onnxsplit.export import export
    from onnxsplit.graph import OpGraph

    model = mlp(tmp_path / "m.onnx", layers=3, batch=2, width=16)
    g = OpGraph.from_onnx(model)
    out = tmp_path / "parts"
    export(g, {n.name: "cpu0" for n in g.nodes}, out, providers={"cpu0": CPU}, threads={"cpu0": 1})
    released, real = [], Parts.release
    monkeypatch.setattr(Parts, "release", lambda self: released.append(len(self.sessions)) or real(self))
    got = compare.run_parts(out, samples=4, warmup=1)
    assert released == [1]  # (its one part's sessions)
    assert got["verify"]["ok"]
    assert len(children) == 1 + len(compare.baseline_runs()) and all(p.poll() is not None for p in children)
    assert got["measured"]["latency_ms"] > 0 and set(got["ratios"]) == set(got["baselines"])
    for r in got["ratios"].values():
        assert np.isfinite(r["throughput"]) and np.isfinite(r["latency"]) and r["throughput"] > 0


def test_the_calibrations_finalists_are_measured_apart_beside_the_leader(tmp_path, children):
    """calibrate.side_by_side holds each finalist in a process of its own, as `run` does,
    measures each beside the first (the leader) and puts its figures on the leader's
    scale; one that cannot load is its error, and every process ends with it."""
    from onnxsplit import calibrate

    model = mlp(tmp_path / "m.onnx", layers=2, batch=2, width=16)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)}
    runs = {"lead": (CPU, {"threads": 1}), "copies": (CPU, {"threads": 1, "replicas": 2}),
            "none": ("NoSuchExecutionProvider", {"threads": 1})}
    got = calibrate.side_by_side(model, feeds, runs)
    assert set(got) == set(runs) and "error" in got["none"]
    assert got["copies"]["paired_with"] == "lead" and "paired_with" not in got["lead"]
    for name in ("lead", "copies"):
        v = got[name]
        assert np.isfinite(v["throughput_per_s"]) and v["throughput_per_s"] > 0
        assert np.isfinite(v["latency_ms"]) and v["latency_ms"] > 0
        assert v["rounds"] == calibrate.ROUNDS * v["tries"] and "beside" not in v
    assert len(children) == len(runs) and all(p.poll() is not None for p in children)
