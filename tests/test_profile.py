"""Per-node profiling checked against what it does not compute: the whole model's time in
the same run, the file's node list, onnxruntime's own sessions (counted), and the cache."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnx_models import TINY_BERT, TINY_BERT_SHAPES, control_flow, mlp, shared_weight
from onnxsplit.cli import main
from onnxsplit.errors import ModelError, ProfileError
from onnxsplit.graph import OpGraph
from onnxsplit.profile import costmodel, measure, model_hash, profile
from onnxsplit.profile.store import ProfileFile

SHAPE_OPS = costmodel.SHAPE_OPS


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny BERT profiled once for the module: (profile, cache file)."""
    cache = tmp_path_factory.mktemp("prof") / "tiny.json"
    return profile(TINY_BERT, TINY_BERT_SHAPES, cache=cache, repeats=5, quiet=True), cache


@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory):
    return mlp(tmp_path_factory.mktemp("mlp") / "mlp.onnx")


def test_every_node_timed_once_with_positive_latency(tiny):
    prof, _ = tiny
    (entry,) = prof.entries
    g = OpGraph.from_onnx(TINY_BERT, TINY_BERT_SHAPES)
    assert list(entry.nodes) == [n.name for n in g.nodes]  # topological, the importer's names
    assert entry.execution_provider == "CPUExecutionProvider"
    for name, t in entry.nodes.items():
        assert t.supported and t.error is None, name
        assert t.op_type == g.node(name).op_type
        if t.op_type in SHAPE_OPS:
            assert t.median_ms >= 0
        else:
            assert t.median_ms > 0, name
        assert t.p10_ms <= t.median_ms <= t.p90_ms
    assert entry.whole_model_ms["median"] > 0 and entry.whole_model_ms["ep_share"] == 1.0
    # grouped: members carry their representative's numbers
    for name, t in entry.nodes.items():
        if t.same_as:
            rep = entry.nodes[t.same_as]
            assert (t.median_ms, t.p10_ms, t.p90_ms, t.op_type) == (
                rep.median_ms, rep.p10_ms, rep.p90_ms, rep.op_type)
            assert rep.same_as is None
    assert entry.model["distinct_node_models"] < len(entry.nodes)


def test_node_sum_tracks_whole_model(tiny, mlp_path):
    # loose bands: the machine is noisy; tools/bench_profile.py reports the precise figure.
    # tiny BERT's nodes take about a microsecond each, near the cost of a run call that is
    # subtracted from each: only a sanity band (a unit or double-count slip is far outside)
    entry = tiny[0].entries[0]
    assert entry.settings["method"] == "alone"  # auto: its nodes are far under 20 us
    assert 0.2 < entry.node_sum_ms() / entry.whole_model_ms["median"] < 5
    for method, band in (("in_graph", (0.8, 1.25)), ("alone", (0.4, 1.4))):
        # measured again once where the first is out of band: a busy moment moved one
        # whole-model median 3x (1.93 ms of nodes against 6.21 ms) in a full suite; a slip
        # in the sums is out of band every time (three tries).  Beside a CPU-bound process the
        # nodes timed alone measured 0.42 of the whole twice, and 0.46 in all three tries of
        # a fresh-clone run: the band's low end is below that; a node counted twice still
        # lands far above its high end
        for attempt in range(3):
            e = profile(mlp_path, cache=False, repeats=10, quiet=True, method=method).entries[0]
            ratio = e.node_sum_ms() / e.whole_model_ms["median"]
            if band[0] < ratio < band[1]:
                break
        assert e.settings["method"] == method
        assert band[0] < ratio < band[1], (method, ratio)
        # the MatMuls are where the time goes, as FLOPs say
        mm = sum(t.median_ms for t in e.nodes.values() if t.op_type == "MatMul")
        assert mm > 0.6 * e.node_sum_ms(), method


def test_in_graph_times_every_node_inside_the_model(mlp_path):
    e = profile(mlp_path, cache=False, repeats=3, quiet=True).entries[0]
    assert e.settings["method"] == "in_graph"  # auto: 64x512 MatMuls take far over 20 us
    assert e.settings["runs"] >= 3 and "timed_alone" not in e.settings
    assert 0 < e.settings["profiler_cost_ms"] < 0.05
    g = OpGraph.from_onnx(mlp_path)
    assert list(e.nodes) == [n.name for n in g.nodes]
    for n in g.nodes:
        t = e.nodes[n.name]
        assert t.op_type == n.op_type and t.same_as is None and t.error is None
        assert 0 <= t.p10_ms <= t.median_ms <= t.p90_ms, n.name
    # each MatMul does the same work: timed separately, they agree
    mm = [t.median_ms for t in e.nodes.values() if t.op_type == "MatMul"]
    assert len(mm) == 4 and max(mm) < 2.5 * min(mm)


def test_in_graph_if_and_loop_get_their_subgraphs_time(tmp_path):
    path = control_flow(tmp_path / "cf.onnx")
    e = profile(path, cache=False, repeats=3, quiet=True, method="in_graph").entries[0]
    g = OpGraph.from_onnx(path)
    assert list(e.nodes) == [n.name for n in g.nodes]  # no subgraph node leaks in
    for name in ("if", "loop"):
        assert e.nodes[name].median_ms > 0, name


def test_node_without_events_is_timed_alone(mlp_path, monkeypatch):
    from onnxsplit.profile import ingraph

    real = ingraph.kernel_times

    def drop_relu1(events, keep, cost_s=0.0):
        out = real(events, keep, cost_s)
        out.pop("relu1", None)  # (the profiler-cost chain has no relu1)
        return out

    monkeypatch.setattr(ingraph, "kernel_times", drop_relu1)
    e = profile(mlp_path, cache=False, repeats=2, quiet=True, method="in_graph").entries[0]
    assert e.settings["timed_alone"] == 1
    assert e.nodes["relu1"].median_ms > 0 and e.nodes["relu1"].op_type == "Relu"


def test_kernel_times_split_runs_and_sum_repeated_names():
    ev = [{"cat": "Session", "name": "model_run", "ts": 0, "dur": 50},
          {"cat": "Node", "name": "a_kernel_time", "ts": 1, "dur": 10},
          {"cat": "Node", "name": "a_fence_before", "ts": 1, "dur": 0},
          {"cat": "Session", "name": "model_run", "ts": 100, "dur": 50},
          {"cat": "Node", "name": "a_kernel_time", "ts": 101, "dur": 7},
          {"cat": "Node", "name": "b_kernel_time", "ts": 110, "dur": 3},
          {"cat": "Node", "name": "b_kernel_time", "ts": 120, "dur": 4},  # a Loop body's node, twice
          {"cat": "Session", "name": "model_run", "ts": 200, "dur": 50},
          {"cat": "Node", "name": "a_kernel_time", "ts": 201, "dur": 9}]
    from onnxsplit.profile import ingraph

    got = ingraph.kernel_times(ev, lambda run: run >= 1)
    assert got == {"a": [7e-6, 9e-6], "b": [7e-6]}
    assert ingraph.kernel_times(ev, lambda run: run == 0) == {"a": [10e-6]}
    # an If's event holds its branch's two events: the profiler's cost comes off three times
    ev += [{"cat": "Session", "name": "model_run", "ts": 300, "dur": 50},
           {"cat": "Node", "name": "if_kernel_time", "ts": 301, "dur": 20},
           {"cat": "Node", "name": "then_a_kernel_time", "ts": 303, "dur": 5},
           {"cat": "Node", "name": "then_b_kernel_time", "ts": 310, "dur": 6},
           {"cat": "Node", "name": "next_kernel_time", "ts": 321, "dur": 4}]  # starts at if's end
    got = ingraph.kernel_times(ev, lambda run: run == 3, cost_s=1e-6)
    assert got["if"] == [pytest.approx(17e-6)] and got["then_b"] == [pytest.approx(5e-6)]
    assert got["next"] == [pytest.approx(3e-6)]


def test_typical_resolves_below_the_profilers_microsecond():
    from onnxsplit.profile import ingraph

    # a 1.4 us node read on a 1 us clock: 60% ones, 40% twos; the median says 1
    s = np.array([1.0] * 60 + [2.0] * 40)
    assert np.median(s) == 1.0 and ingraph.typical(s) == pytest.approx(1.3, abs=0.15)
    assert ingraph.typical(np.array([5.0, 1.0, 100.0])) == 5.0  # few samples: the median
    assert ingraph.typical(np.array([3.0] * 10 + [1000.0] * 2)) == 3.0  # bursts of noise cut


def test_plan_runs_fits_fast_and_slow_models():
    from onnxsplit.profile import ingraph

    n, burst = ingraph.plan_runs(1e-4, 10)  # 0.1 ms: many runs, in bursts of 10 ms
    assert n == 200 and burst == 100
    n, burst = ingraph.plan_runs(0.05, 10)
    assert n == 10 and burst == 1
    n, burst = ingraph.plan_runs(30.0, 10)  # 30 s a run: the budget allows 3
    assert n == 3 and burst == 1


def test_cache_hit_runs_nothing(tiny, monkeypatch):
    prof, cache = tiny

    def no_session(*a, **k):
        raise AssertionError("a session was created on a cache hit")

    monkeypatch.setattr(ort, "InferenceSession", no_session)
    again = profile(TINY_BERT, TINY_BERT_SHAPES, cache=cache, repeats=5, quiet=True)
    assert again.fresh == () and prof.fresh == ("CPUExecutionProvider",)
    assert [e.to_json() for e in again.entries] == [e.to_json() for e in prof.entries]
    # the file on disk round-trips too
    assert ProfileFile.load(cache).to_json() == json.loads(cache.read_text())


def test_cache_misses_on_other_shapes_and_force(tiny, monkeypatch):
    prof, cache = tiny
    created = []
    real = ort.InferenceSession

    def counting(*a, **k):
        created.append(1)
        return real(*a, **k)

    monkeypatch.setattr(ort, "InferenceSession", counting)
    other = profile(TINY_BERT, {"input_ids": (1, 8), "attention_mask": (1, 8)}, cache=cache,
                    repeats=2, warmup=1, quiet=True)
    assert created and other.model_hash != prof.model_hash
    assert len(ProfileFile.load(cache).entries) == 2  # both models' entries kept
    created.clear()
    profile(TINY_BERT, {"input_ids": (1, 8), "attention_mask": (1, 8)}, cache=cache,
            repeats=2, warmup=1, quiet=True, force=True)
    assert created


def test_model_hash_ignores_weight_values_not_structure(tmp_path):
    a = onnx.load(str(mlp(tmp_path / "a.onnx", seed=0)))
    b = onnx.load(str(mlp(tmp_path / "b.onnx", seed=7)))
    shapes = {"x": (64, 512)}
    assert model_hash(a, shapes) == model_hash(b, shapes)  # same graph, other weights
    assert model_hash(a, shapes) != model_hash(a, {"x": (32, 512)})
    c = onnx.load(str(mlp(tmp_path / "c.onnx", layers=3)))
    assert model_hash(a, shapes) != model_hash(c, shapes)


def test_identical_nodes_timed_once_unless_asked(tmp_path):
    path = mlp(tmp_path / "m.onnx", layers=3, batch=8, width=64)
    grouped = profile(path, cache=False, repeats=3, quiet=True).entries[0]
    same = {n: t.same_as for n, t in grouped.nodes.items()}
    assert same["matmul1"] == same["matmul2"] == "matmul0"  # other weights, same work
    assert same["relu2"] == "relu0" and same["matmul0"] is None
    alone = profile(path, cache=False, repeats=3, quiet=True, group=False).entries[0]
    assert all(t.same_as is None for t in alone.nodes.values())
    assert alone.model["distinct_node_models"] == len(alone.nodes) == 9


def test_if_and_loop_timed_with_their_captured_inputs(tmp_path):
    path = control_flow(tmp_path / "cf.onnx")
    e = profile(path, cache=False, repeats=3, quiet=True).entries[0]
    for name in ("if", "loop"):
        t = e.nodes[name]
        assert t.error is None and t.median_ms > 0, (name, t)
    # the single-node model of If reads its branches' outer-scope tensors as inputs
    g = OpGraph.from_onnx(path)
    model = g.proto()
    values = measure.reference_values(model, g, measure.input_feeds(g))
    nm = measure.node_model(model, g, g.node("if"), values)
    assert set(nm.feeds) == {"c", "h"}
    assert {t.name for t in nm.proto.graph.initializer} == {"scale"}


def test_single_node_model_keeps_weights_and_runs(tmp_path):
    path = shared_weight(tmp_path / "s.onnx")
    g = OpGraph.from_onnx(path)
    model = g.proto()
    values = measure.reference_values(model, g, measure.input_feeds(g))
    nm = measure.node_model(model, g, g.node("mm2"), values)
    assert [t.name for t in nm.proto.graph.initializer] == ["W"]
    sess = ort.InferenceSession(nm.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = sess.run(None, {k: v for k, v in nm.feeds.items()})
    np.testing.assert_allclose(out, values["b"], rtol=1e-5)  # the node alone gives the model's value


def test_external_data_weights_read_in_place(tmp_path):
    m = onnx.load(str(mlp(tmp_path / "src.onnx", layers=2, batch=4, width=128)))
    path = tmp_path / "ext.onnx"
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.onnx.data", size_threshold=0)
    e = profile(path, cache=False, repeats=2, quiet=True).entries[0]
    assert all(t.error is None and t.median_ms > 0 for t in e.nodes.values())


def test_unknown_provider_is_one_line_error(tmp_path):
    path = mlp(tmp_path / "m.onnx", layers=1, batch=2, width=8)
    with pytest.raises(ProfileError) as e:
        profile(path, cache=False, providers=["NoSuchExecutionProvider"], quiet=True)
    assert "\n" not in str(e.value) and "CPUExecutionProvider" in str(e.value)
    with pytest.raises(ModelError):
        profile(TINY_BERT, cache=False, quiet=True)  # dynamic dims unbound


def test_fallback_to_cpu_means_unsupported():
    """On an accelerator EP, a node onnxruntime gives back to the CPU EP is unsupported."""

    class Node:
        def __init__(self, name):
            self.name = name

    class Sub:
        def __init__(self, ep, names):
            self.ep_name, self._names = ep, names

        def get_nodes(self):
            return [Node(n) for n in self._names]

    class Sess:
        def get_provider_graph_assignment_info(self):
            return [Sub("CUDAExecutionProvider", ["a", "b"]), Sub("CPUExecutionProvider", ["c"])]

    r = measure.Runner.__new__(measure.Runner)
    r.ep = "CUDAExecutionProvider"
    r.options = {}
    assert r.assigned_elsewhere(Sess(), ["a", "c"]) == ["c"]
    assert r.providers() == ["CUDAExecutionProvider", "CPUExecutionProvider"]


def test_preferred_providers_one_per_device(monkeypatch):
    """onnxruntime-gpu lists TensorRT beside CUDA whether or not TensorRT's libraries are
    there (seen on an H100 with onnxruntime-gpu 1.31.1): profiling and a detected cluster
    take CUDA alone for the GPU; EPs of no known device class stay."""
    from onnxsplit.profile import devices

    monkeypatch.delenv(devices.PROVIDERS_ENV)  # (every provider listed: tests/conftest.py)

    def listed(eps):
        monkeypatch.setattr(ort, "get_available_providers", lambda: list(eps))
        return devices.preferred_providers()

    assert listed(["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]) == \
        ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert listed(["TensorrtExecutionProvider", "CPUExecutionProvider"]) == \
        ["TensorrtExecutionProvider", "CPUExecutionProvider"]
    assert listed(["XnnpackExecutionProvider", "CPUExecutionProvider", "AzureExecutionProvider"]) == \
        ["XnnpackExecutionProvider", "CPUExecutionProvider"]
    assert listed(["CPUExecutionProvider"]) == ["CPUExecutionProvider"]


def test_session_that_fell_back_to_the_cpu_is_refused(tmp_path):
    """A session onnxruntime did not set up on the EP asked for (it falls back to the CPU
    where the EP cannot start; this CPU-only build drops an EP it lacks with a warning) is
    no measurement of that EP: the node is unsupported there, the whole model an error."""
    r = measure.Runner("CUDAExecutionProvider", tmp_path)
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="set the session up on CPUExecutionProvider"):
        r.session(measure.relu_chain(2))


def test_cli_profile(tmp_path, capsys, mlp_path):
    out = tmp_path / "p.json"
    rc = main(["profile", str(mlp_path), "-o", str(out), "--repeats", "3", "--quiet"])
    o, err = capsys.readouterr()
    assert rc == 0 and err == ""
    assert "measured now" in o and "CPUExecutionProvider" in o and "ratio" in o
    rc = main(["profile", str(mlp_path), "-o", str(out), "--quiet", "--json"])
    o, err = capsys.readouterr()
    obj = json.loads(o)
    assert rc == 0 and obj["measured"] == [] and len(obj["entries"]) == 1
    assert math.isclose(sum(t["median_ms"] for t in obj["entries"][0]["nodes"].values()),
                        ProfileFile.load(out).entries[0].node_sum_ms())


def test_cli_profile_errors_are_one_line(tmp_path, capsys):
    path = str(TINY_BERT)
    for argv, words in [
        (["profile", path, "--input-shape", "input_ids"], ["NAME=DIMS"]),
        (["profile", path, "--input-shape", "input_ids=1xb"], ["non-negative integers"]),
        (["profile", path, "--input-shape", "input_ids=1x8", "--input-shape", "input_ids=1x8"],
         ["twice"]),
        (["profile", path], ["attention_mask", "--input-shape"]),  # (input_ids=1x8 binds it by name)
        (["profile", path, "--input-shape", "nope=1x8"], ["nope", "not an input"]),
        (["profile", str(tmp_path / "missing.onnx")], ["does not exist"]),
    ]:
        rc = main(argv + ["--quiet", "-o", str(tmp_path / "p.json")])
        _, err = capsys.readouterr()
        assert rc == 2, argv
        assert err.startswith("onnxsplit: error: ") and err.count("\n") == 1, err
        assert all(w in err for w in words), err


def test_progress_bar_on_stderr_unless_quiet(tmp_path, capsys, monkeypatch):
    """A bar where stderr is a terminal (here one that says it is), none when quiet or in
    a pipe."""
    import io
    import sys

    import onnxsplit.profile as prof

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())

    calls = []

    class Bar:
        def __init__(self, **kw):
            calls.append(kw)

        def update(self, n=1):
            calls.append(n)

        def close(self):
            pass

    import tqdm

    monkeypatch.setattr(tqdm, "tqdm", lambda **kw: Bar(**kw))
    path = mlp(tmp_path / "m.onnx", layers=2, batch=2, width=8)
    prof.profile(path, cache=False, repeats=1, quiet=False, method="alone")
    assert calls and calls[0]["total"] == 6 and sum(c for c in calls[1:]) == 6
    calls.clear()
    e = prof.profile(path, cache=False, repeats=1, quiet=False, method="in_graph").entries[0]
    assert calls[0]["unit"] == "run" and sum(c for c in calls[1:]) == e.settings["runs"]
    calls.clear()
    prof.profile(path, cache=False, repeats=1, quiet=True)
    assert calls == []
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a pipe
    prof.profile(path, cache=False, repeats=1, quiet=False)
    assert calls == []
