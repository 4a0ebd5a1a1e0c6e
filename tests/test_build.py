"""ONNX model + profile + cluster -> the paper's workload, checked against the graph's exact
tensor bytes, the profile's numbers, the paper's JSON format and the solvers."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from onnx_models import TINY_BERT, TINY_BERT_SHAPES, mlp, shared_weight
from onnxsplit import api
from onnxsplit.build import build_workload
from onnxsplit.cli import main
from onnxsplit.cluster import Cluster
from onnxsplit.errors import ClusterError, ProfileError
from onnxsplit.graph import OpGraph
from onnxsplit.profile import profile
from onnxsplit.profile.store import Entry, NodeTiming, ProfileFile
from onnxsplit.workload import Workload

GPU = {"name": "t4", "class": "gpu", "count": 2, "execution_provider": "CUDAExecutionProvider",
       "memory": "16GiB", "peak_flops": "8.1TFLOP/s", "memory_bandwidth": "320GB/s",
       "call_overhead": "5us"}
LINK = {"between": ["cpu", "gpu"], "bandwidth": "12GB/s", "latency": "10us"}
CLUSTER = {"devices": [{"name": "host", "class": "cpu", "count": 2}, GPU], "links": [LINK]}
SHAPE_ARGS = [a for k, v in TINY_BERT_SHAPES.items()
              for a in ("--input-shape", f"{k}={'x'.join(map(str, v))}")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    cache = d / "profile.json"
    prof = profile(TINY_BERT, TINY_BERT_SHAPES, cache=cache, repeats=3, quiet=True)
    return OpGraph.from_onnx(TINY_BERT, TINY_BERT_SHAPES), prof, cache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_tiny_bert_on_estimated_gpus(tiny):
    graph, prof, _ = tiny
    cluster = Cluster.from_dict(CLUSTER)
    w = build_workload(graph, prof, cluster)
    assert (w.num_accelerators, w.num_cpus, w.accelerator_memory) == (2, 2, 16 * 2 ** 30)
    entry = prof.entries[0]
    by_name = {n.name: n for n in w.nodes}
    assert list(by_name) == [n.name for n in graph.nodes]  # ONNX names, topological ids
    # node times are scaled so they add up to the whole model measured in the same run
    whole = entry.whole_model_ms["median"]
    scale = whole / sum(t.median_ms for t in entry.nodes.values())
    assert w.extra["onnxsplit"]["cpu"]["latencyScale"] == pytest.approx(scale, rel=1e-5)
    assert sum(n.cpu_latency for n in w.nodes) == pytest.approx(whole, rel=1e-5)
    raw = build_workload(graph, prof, cluster, calibrate=False)
    for i, n in enumerate(graph.nodes):
        node = by_name[n.name]
        assert node.id == i and node.extra["opType"] == n.op_type
        assert node.cpu_latency == pytest.approx(entry.nodes[n.name].median_ms * scale, rel=1e-6, abs=1e-9)
        assert raw.nodes[i].cpu_latency == entry.nodes[n.name].median_ms
        assert node.extra["latencySource"] == {"cpu": "measured", "acc": "estimated"}
        assert node.acc_latency > 0 and node.supported
    # every edge's cost: link latency + bytes / bandwidth per tensor the source's readers take
    for e in w.edges:
        src = graph.nodes[e.source]
        read = [o for o in src.outputs if o and graph.tensors[o].consumers]
        want = sum(1e-5 + graph.tensors[o].bytes / 12e9 for o in read) * 1e3
        assert e.cost == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert e.extra["bytes"] == sum(graph.tensors[t].bytes for t in e.extra["tensors"])
        assert e.extra["tensorBytes"] == [graph.tensors[t].bytes for t in e.extra["tensors"]]
    # the graph's producer -> consumer pairs, each once
    assert {(graph.nodes[e.source].name, graph.nodes[e.dest].name) for e in w.edges} == {
        (e.producer, e.consumer) for e in graph.edges}
    # sizes: every weight counted once for big weights (policy "first"), plus outputs
    big = [t for t in graph.weights if t.bytes > 64 * 1024]
    for n in graph.nodes:
        node = by_name[n.name]
        act = sum(graph.tensors[o].bytes for o in n.outputs if o)
        assert node.size == node.extra["weightBytes"] + act == node.extra["weightBytes"] + node.extra["activationBytes"]
    charged_big = sum(t.bytes for t in big)
    total = sum(n.extra["weightBytes"] for n in w.nodes)
    assert total >= charged_big + sum(n.data_bytes for n in graph.nodes)
    meta = w.extra["onnxsplit"]
    assert meta["units"]["latency"] == "ms" and meta["accelerator"]["latencies"] == "estimated"
    assert meta["cpu"]["roofline"]["flops_per_s"] > 0


def test_round_trip_and_solvers(tiny, tmp_path):
    graph, prof, _ = tiny
    w = build_workload(graph, prof, Cluster.from_dict(CLUSTER))
    again = Workload.from_paper_json(json.loads(json.dumps(w.to_paper_json())))
    assert again == w and again.to_paper_json() == w.to_paper_json()
    path = tmp_path / "w.json"
    w.write(path)
    plan = api.solve(Workload.from_paper_json(path), method="dp_linear")
    assert plan.value is not None and plan.value > 0
    assert set(plan.assignment) == {n.id for n in w.nodes}


def test_no_accelerator_here(tiny):
    graph, prof, _ = tiny
    w = build_workload(graph, prof, Cluster.detect())
    assert w.num_accelerators == 0 and w.num_cpus == os.cpu_count()
    assert all(e.cost == 0 for e in w.edges) and w.extra["onnxsplit"]["accelerator"] is None
    assert all(n.acc_latency == n.cpu_latency for n in w.nodes)


def test_shared_weight_policies(tmp_path):
    path = shared_weight(tmp_path / "s.onnx")
    graph = OpGraph.from_onnx(path)
    prof = profile(path, cache=False, repeats=2, quiet=True)
    cluster = Cluster.from_dict(CLUSTER)
    W = 256 * 256 * 4
    bias = 256 * 4

    def weights(policy):
        w = build_workload(graph, prof, cluster, shared_weights=policy, activations="none")
        return {n.name: n.size for n in w.nodes}, {n.name: n.color_class for n in w.nodes}, w

    sizes, colors, w = weights("first")
    assert sizes == {"relu": 0, "mm1": W, "add1": bias, "mm2": 0, "add2": bias}  # small: each
    assert set(colors.values()) == {None}
    assert w.extra["onnxsplit"]["sharedWeightReaders"] == {"W": [1, 3]}
    sizes, colors, _ = weights("each")
    assert sizes["mm1"] == sizes["mm2"] == W
    sizes, colors, _ = weights("color")
    assert sizes["mm2"] == 0 and colors["mm1"] == colors["mm2"] is not None
    assert colors["relu"] is None and colors["add1"] is None


def test_cluster_problems_for_a_workload(tiny, tmp_path):
    graph, prof, _ = tiny
    no_link = Cluster.from_dict({"devices": CLUSTER["devices"], "links": []})
    with pytest.raises(ClusterError, match="no link between 'cpu' and 'gpu'"):
        build_workload(graph, prof, no_link)
    two = Cluster.from_dict({"devices": CLUSTER["devices"] + [{**GPU, "name": "a100", "class": "big"}],
                             "links": [LINK, {**LINK, "between": ["cpu", "big"]}]})
    both = build_workload(graph, prof, two)  # every accelerator class at once (test_multi_class.py)
    assert both.class_names == ("acc", "t4", "a100") and [d.name for d in both.devices][:3] == ["t4_0", "t4_1", "a100_0"]
    w = build_workload(graph, prof, two, accelerator="a100")
    assert w.extra["onnxsplit"]["accelerator"]["name"] == "a100" and not w.multi_class
    no_peaks = Cluster.from_dict({"devices": [CLUSTER["devices"][0],
                                              {k: v for k, v in GPU.items() if k != "peak_flops"}],
                                  "links": [LINK]})
    with pytest.raises(ClusterError, match="peak_flops"):
        build_workload(graph, prof, no_peaks)
    picky = Cluster.from_dict({"devices": [CLUSTER["devices"][0], {**GPU, "unsupported_ops": ["Softmax"]}],
                               "links": [LINK]})
    w = build_workload(graph, prof, picky)
    assert all(n.supported == (n.extra["opType"] != "Softmax") for n in w.nodes)


def test_profile_measured_elsewhere_is_reused(tiny, tmp_path, monkeypatch):
    """A GPU machine's profile (CPU and CUDA entries) makes a laptop's workload without
    measuring anything: the accelerator's numbers are 'measured', the CPU's from that host."""
    graph, prof, _ = tiny
    cpu = prof.entries[0]
    nodes = {n: NodeTiming(t.op_type, t.op_type != "Softmax",
                           None if t.op_type == "Softmax" else t.median_ms / 10,
                           None if t.op_type == "Softmax" else t.p10_ms / 10,
                           None if t.op_type == "Softmax" else t.p90_ms / 10)
             for n, t in cpu.nodes.items()}
    server = {"hardware": "Tesla T4", "host": "gpu-server", "threads": 1}
    gpu_entry = Entry(cpu.model_hash, cpu.input_shapes, "CUDAExecutionProvider|Tesla T4|threads=1",
                      "CUDAExecutionProvider", nodes, {"median": 1.0}, device=server,
                      measured_at="2026-01-01T00:00:00Z")
    server_cpu = Entry(cpu.model_hash, cpu.input_shapes, "CPUExecutionProvider|Xeon|threads=1",
                       "CPUExecutionProvider",
                       {n: NodeTiming(t.op_type, True, 2 * t.median_ms, 2 * t.p10_ms, 2 * t.p90_ms)
                        for n, t in cpu.nodes.items()},
                       {"median": 2.0}, device={**server, "hardware": "Xeon"},
                       measured_at="2026-01-01T00:00:00Z")
    f = ProfileFile(tmp_path / "server.json", [gpu_entry, server_cpu])
    f.save()
    cfile = tmp_path / "c.json"
    cfile.write_text(json.dumps(CLUSTER))

    def no_profiling(*a, **k):
        raise AssertionError("nothing should be measured")

    import onnxsplit.profile

    monkeypatch.setattr(onnxsplit.profile, "_measure", no_profiling)
    w = api.build_workload(TINY_BERT, TINY_BERT_SHAPES, devices=cfile, profile=f.path, quiet=True)
    cpu_scale = 2.0 / sum(2 * t.median_ms for t in cpu.nodes.values())
    gpu_scale = 1.0 / sum(t.median_ms / 10 for n, t in cpu.nodes.items() if t.op_type != "Softmax")
    for n in w.nodes:
        src = cpu.nodes[n.name]
        # the server's CPU, not this machine's
        assert n.cpu_latency == pytest.approx(2 * src.median_ms * cpu_scale, rel=1e-6, abs=1e-9)
        if n.extra["opType"] == "Softmax":
            assert not n.supported and n.extra["latencySource"]["acc"] == "estimated"
        else:
            assert n.supported and n.acc_latency == pytest.approx(src.median_ms / 10 * gpu_scale, rel=1e-6, abs=1e-9)
            assert n.extra["latencySource"]["acc"] == "measured"
    assert w.extra["onnxsplit"]["accelerator"]["profile"]["host"] == "gpu-server"


def test_mismatched_profile(tiny, tmp_path):
    graph, prof, _ = tiny
    other = OpGraph.from_onnx(mlp(tmp_path / "m.onnx", layers=1, batch=2, width=8))
    with pytest.raises(ProfileError, match="does not match"):
        build_workload(other, prof, Cluster.detect())


# ------------------------------------------------------------------ command line


def test_cli_workload_then_solve(tmp_path, capsys, cache_dir):
    model = mlp(tmp_path / "m.onnx", layers=3, batch=16, width=128)
    cfile = tmp_path / "c.json"
    cfile.write_text(json.dumps(CLUSTER))
    out = tmp_path / "w.json"
    rc = main(["workload", str(model), "--devices", str(cfile), "-o", str(out), "--quiet",
               "--repeats", "3"])
    o, err = capsys.readouterr()
    assert rc == 0 and err == "", err
    assert "9 nodes" in o and "2 x t4" in o
    assert list(cache_dir.glob("profiles/*.json"))  # measured once, cached
    w = Workload.from_paper_json(out)
    assert w.n == 9 and w.num_accelerators == 2
    rc = main(["solve", str(out), "--json"])
    o, _ = capsys.readouterr()
    plan = json.loads(o)
    assert rc == 0 and plan["status"] == "optimal"
    assert {int(k) for k in plan["assignment"]} == {n.id for n in w.nodes}
    # printing instead of writing, from the cache this time
    rc = main(["workload", str(model), "--devices", str(cfile), "--quiet"])
    o, _ = capsys.readouterr()
    assert rc == 0 and Workload.from_paper_json(json.loads(o)).to_paper_json() == w.to_paper_json()


def test_cli_workload_tiny_bert(tiny, tmp_path, capsys):
    _, _, cache = tiny
    out = tmp_path / "w.json"
    rc = main(["workload", str(TINY_BERT), *SHAPE_ARGS, "--profile", str(cache), "-o", str(out)])
    _, err = capsys.readouterr()
    assert rc == 0 and err == ""
    rc = main(["solve", str(out), "--method", "dp_linear"])
    o, _ = capsys.readouterr()
    assert rc == 0 and "cpu0" in o


def test_several_inputs_bind_in_one_flag_as_in_repeated_ones(tiny, capsys, tmp_path):
    """``a=1x32,b=1x32`` in one --input-shape (as the benchmarks take models) is the repeated
    flags; a comma between dimensions stays a dimension separator."""
    assert api.each_spec(["input_ids=1x32,attention_mask=1,32", "x=2"]) == \
        ["input_ids=1x32", "attention_mask=1,32", "x=2"]
    assert api.parse_input_shapes(["input_ids=1x32,attention_mask=1,32"]) == \
        api.parse_input_shapes(["input_ids=1x32", "attention_mask=1x32"]) == \
        {"input_ids": (1, 32), "attention_mask": (1, 32)}
    assert api.parse_input_values(["sr=16000,gain=0.5"]) == {"sr": 16000, "gain": 0.5}
    with pytest.raises(api.OnnxsplitError, match="given twice for 'x'"):
        api.parse_input_shapes(["x=1x2,x=1x2"])
    _, _, cache = tiny
    joined = ",".join(f"{k}={'x'.join(map(str, v))}" for k, v in TINY_BERT_SHAPES.items())
    out = tmp_path / "w.json"
    rc = main(["workload", str(TINY_BERT), "--input-shape", joined, "--profile", str(cache),
               "-o", str(out)])
    assert rc == 0 and capsys.readouterr().err == "" and out.exists()


@pytest.mark.parametrize("extra,words", [
    (["--input-shape", "input_ids:1x32"], ["bad --input-shape", "NAME=DIMS"]),
    # (no shape given: one given would bind attention_mask too, by its dimensions' names)
    ([], ["unbound", "input_ids", "also unbound: attention_mask"]),
    ([*SHAPE_ARGS, "--devices", "MISSING"], ["cluster file", "does not exist"]),
    ([*SHAPE_ARGS, "--devices", "BAD"], ["devices[1] ('t4').memory_bandwidth"]),
    ([*SHAPE_ARGS, "--devices", "GOOD", "--accelerator", "tpu"], ["no device named 'tpu'"]),
    ([*SHAPE_ARGS, "--profile", "JUNK"], ["not a profile file"]),
])
def test_cli_workload_errors_are_one_line(tmp_path, capsys, cache_dir, extra, words):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"devices": CLUSTER["devices"][:1] + [{**GPU, "memory_bandwidth": "quick"}],
                               "links": [LINK]}))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(CLUSTER))
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2]")
    subst = {"MISSING": str(tmp_path / "nope.json"), "BAD": str(bad), "GOOD": str(good), "JUNK": str(junk)}
    argv = ["workload", str(TINY_BERT), *[subst.get(a, a) for a in extra], "--quiet",
            "-o", str(tmp_path / "w.json")]
    rc = main(argv)
    _, err = capsys.readouterr()
    assert rc == 2, err
    assert err.startswith("onnxsplit: error: ") and err.count("\n") == 1, err
    assert all(w in err for w in words), err


def test_a_server_of_three_accelerator_kinds(tiny):
    """Two GPU kinds with a peer link and an NPU that cannot run Softmax, all estimated:
    one workload with three accelerator classes, each link priced by its bandwidth."""
    graph, prof, _ = tiny
    l4 = {**GPU, "name": "l4", "class": "l4", "count": 1, "peak_flops": "30TFLOP/s", "memory_bandwidth": "640GB/s"}
    npu = {"name": "npu", "count": 1, "memory": "8GiB", "peak_flops": "10TFLOP/s", "memory_bandwidth": "100GB/s",
           "unsupported_ops": ["Softmax"]}
    cluster = Cluster.from_dict({"devices": CLUSTER["devices"] + [l4, npu],
                                 "links": [LINK, {**LINK, "between": ["cpu", "l4"]},
                                           {"between": ["cpu", "npu"], "bandwidth": "4GB/s", "latency": "20us"},
                                           {"between": ["gpu", "l4"], "bandwidth": "48GB/s", "latency": "5us"},
                                           {"between": ["gpu", "gpu"], "bandwidth": "300GB/s", "latency": "2us"}]})
    w = build_workload(graph, prof, cluster)
    # the paper's class left empty: each accelerator is a class named after it
    assert w.class_names == ("acc", "t4", "l4", "npu") and w.class_counts == (0, 2, 1, 1)
    assert [d.name for d in w.devices] == ["t4_0", "t4_1", "l4_0", "npu0", "cpu0", "cpu1"]
    softmax = [i for i, n in enumerate(w.nodes) if n.extra["opType"] == "Softmax"]
    assert softmax and not w.class_supported[3, softmax].any() and w.class_supported[1:3, softmax].all()
    assert (w.class_latency[2] <= w.class_latency[1] + 1e-12).all()  # the L4's peaks are higher here
    host = {lk.a: (lk.scale, lk.latency) for lk in w.links if lk.b == "cpu"}
    assert host == {"t4": (1.0, 0.01), "l4": (1.0, 0.01), "npu": (3.0, 0.02)}
    peers = {(lk.a, lk.b): (lk.scale, lk.latency) for lk in w.links if lk.peer}
    assert peers == {("t4", "t4"): (0.04, 0.002), ("t4", "l4"): (0.25, 0.005)}
    u = int(np.argmax(w.out_cost))
    assert w.staged_cost(3, u) == pytest.approx(0.02 + 3 * w.out_cost[u])
    again = Workload.from_paper_json(json.loads(json.dumps(w.to_paper_json())))
    assert again == w and again.links == w.links


SERVER = {"devices": [{"name": "host", "class": "cpu", "count": 2}, GPU,
                      {**GPU, "name": "l4", "class": "l4", "count": 1},
                      {"name": "npu", "count": 1, "memory": "8GiB", "execution_provider": "OpenVINOExecutionProvider",
                       "peak_flops": "10TFLOP/s", "memory_bandwidth": "100GB/s", "unsupported_ops": ["Softmax"]}],
          "links": [LINK, {**LINK, "between": ["cpu", "l4"]},
                    {"between": ["cpu", "npu"], "bandwidth": "4GB/s", "latency": "20us"},
                    {"between": ["gpu", "gpu"], "bandwidth": "300GB/s", "latency": "2us"}]}


@pytest.mark.parametrize("objective", ["throughput", "latency"])
def test_main_command_plans_for_every_class_at_once(tiny, tmp_path, capsys, objective):
    """Three accelerator kinds absent here: the plan names their devices, each part the
    device id its provider addresses; the parts are checked on the CPU (--fallback-cpu style)."""
    _, _, cache = tiny
    cfile = tmp_path / "server.json"
    cfile.write_text(json.dumps(SERVER))
    out = tmp_path / "parts"
    rc = main([str(TINY_BERT), *SHAPE_ARGS, "--profile", str(cache), "--devices", str(cfile), "--out", str(out),
               "--objective", objective, "--time-limit", "10"])
    o, err = capsys.readouterr()
    assert rc == 0, err
    assert "2 t4, 1 l4, 1 npu, 2 CPU cores" in err
    manifest = json.loads((out / "manifest.json").read_text())
    ids = {p["device"]: p.get("device_id") for p in manifest["parts"]}
    want = {"t4_0": 0, "t4_1": 1, "l4_0": 2, "npu0": 0}  # the L4 after the T4s on CUDA
    assert all(ids[d] == want[d] for d in ids if d in want) and all(d in want or d.startswith("cpu") for d in ids)
    assert "verify: max abs error" in o
    accelerated = [p["name"] for p in manifest["parts"] if not p["device"].startswith("cpu")]
    if accelerated:  # absent here: refused in one line, or (--fallback-cpu) checked on the CPU
        assert main(["run", str(out), "--samples", "2", "--warmup", "0"]) == 2
        assert capsys.readouterr().err.count("\n") == 1
        rc = main(["run", str(out), "--samples", "2", "--warmup", "0", "--fallback-cpu"])
        o, _ = capsys.readouterr()
        assert rc == 0 and f"fallback: {', '.join(accelerated)} ran on the CPU" in o
    rc = main(["workload", str(TINY_BERT), *SHAPE_ARGS, "--profile", str(cache), "--devices", str(cfile),
               "-o", str(tmp_path / "w.json")])
    o, _ = capsys.readouterr()
    assert rc == 0 and "2 x t4 (16.0 GiB each), 1 x l4 (16.0 GiB each), 1 x npu (8.0 GiB each)" in o
