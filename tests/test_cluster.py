"""Cluster specs (read, validated, detected) and the cost model for absent devices."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from onnx import helper

from onnx_models import TINY_BERT, TINY_BERT_SHAPES, make, mlp, save, vi, weight
from onnxsplit.cli import main
from onnxsplit.cluster import Cluster, quantity
from onnxsplit.errors import ClusterError
from onnxsplit.graph import OpGraph
from onnxsplit.profile import costmodel as cm
from onnxsplit.profile import profile

GPU = {"name": "t4", "class": "gpu", "count": 2, "execution_provider": "CUDAExecutionProvider",
       "memory": "16GiB", "peak_flops": "8.1TFLOP/s", "memory_bandwidth": "320GB/s",
       "call_overhead": "5us"}
LINK = {"between": ["cpu", "gpu"], "bandwidth": "12GB/s", "latency": "10us"}


def spec(tmp_path, data, name="c.json"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


# ------------------------------------------------------------------ detection and parsing


def test_detected_cluster_is_this_machine():
    c = Cluster.detect()
    assert c.cpu.count == os.cpu_count() and c.cpu.execution_provider == "CPUExecutionProvider"
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert c.cpu.memory == total
    import onnxruntime as ort

    if set(ort.get_available_providers()) <= {"CPUExecutionProvider", "AzureExecutionProvider"}:
        assert c.accelerators == () and c.links == ()  # Azure is not a device
    assert Cluster.from_dict(c.to_json()).to_json() == c.to_json()


def test_quantities():
    assert quantity("16GiB", "bytes", "m") == 16 * 2 ** 30
    assert quantity("16GB", "bytes", "m") == 16e9
    assert quantity("900GB/s", "bytes/s", "b") == 900e9
    assert quantity("19.5TFLOP/s", "flops", "f") == 19.5e12
    assert quantity("10us", "seconds", "l") == pytest.approx(1e-5)
    assert quantity("2ms", "seconds", "l") == pytest.approx(2e-3)
    assert quantity(1.5e9, "bytes/s", "b") == 1.5e9
    for bad, kind in (("16 parsecs", "bytes"), ("fast", "bytes/s"), (True, "bytes"), (-1, "bytes"),
                      ("10GB", "seconds")):
        with pytest.raises(ClusterError):
            quantity(bad, kind, "x")


def test_json_spec(tmp_path):
    c = Cluster.from_file(spec(tmp_path, {"devices": [{"name": "host", "class": "cpu", "count": 4,
                                                       "memory": "64GiB"}, GPU], "links": [LINK]}))
    assert c.cpu.count == 4 and c.cpu.memory == 64 * 2 ** 30
    (gpu,) = c.accelerators
    assert (gpu.name, gpu.cls, gpu.count, gpu.memory) == ("t4", "gpu", 2, 16 * 2 ** 30)
    assert gpu.peak_flops == 8.1e12 and gpu.memory_bandwidth == 320e9 and gpu.call_overhead == 5e-6
    link = c.link("gpu", "cpu")
    assert link is c.link("cpu", "gpu") and link.bandwidth == 12e9 and link.latency == 1e-5
    assert link.seconds(12e6) == pytest.approx(1e-5 + 1e-3)
    assert c.link("gpu", "gpu") is None


def test_spec_without_cpu_takes_this_machine(tmp_path):
    c = Cluster.from_file(spec(tmp_path, {"devices": [GPU], "links": [LINK]}))
    assert c.cpu.count == os.cpu_count() and c.notes


def test_yaml_spec(tmp_path):
    pytest.importorskip("yaml")
    text = """
devices:
  - {name: host, class: cpu, count: 2}
  - name: t4
    class: gpu
    count: 1
    execution_provider: CUDAExecutionProvider
    memory: 16GiB
    peak_flops: 8.1TFLOP/s
    memory_bandwidth: 320GB/s
links:
  - {between: [cpu, gpu], bandwidth: 12GB/s, latency: 10us}
"""
    c = Cluster.from_file(spec(tmp_path, text, "c.yaml"))
    assert c.accelerators[0].memory == 16 * 2 ** 30 and c.link("cpu", "gpu").bandwidth == 12e9


@pytest.mark.parametrize("data,words", [
    ("{not json", ["not valid JSON", "line 1"]),
    ([], ["top level"]),
    ({"devices": []}, ["'devices'", "non-empty"]),
    ({"devices": [GPU], "link": []}, ["unknown field 'link'"]),
    ({"devices": [{**GPU, "memroy": 1}]}, ["devices[0] ('t4')", "unknown field 'memroy'"]),
    ({"devices": [{**GPU, "memory": "lots"}]}, ["devices[0] ('t4').memory", "'lots'"]),
    ({"devices": [{k: v for k, v in GPU.items() if k != "memory"}]}, ["missing field 'memory'"]),
    ({"devices": [{**GPU, "count": 1.5}]}, ["devices[0] ('t4').count"]),
    ({"devices": [{**GPU, "efficiency": {"compute": 2}}]}, ["efficiency.compute"]),
    ({"devices": [GPU, {**GPU}]}, ["'t4' is used twice"]),
    ({"devices": [GPU], "links": [{**LINK, "between": ["cpu", "tpu"]}]}, ["links[0]", "'tpu'"]),
    ({"devices": [GPU], "links": [{**LINK, "bandwidth": 0}]}, ["links[0].bandwidth"]),
    ({"devices": [GPU], "links": [{"between": ["cpu", "gpu"], "latency": 0}]},
     ["links[0]", "missing field 'bandwidth'"]),
    ({"devices": [GPU], "links": [LINK, LINK]}, ["second link"]),
    ({"devices": [{"name": "a", "class": "cpu"}, {"name": "b", "class": "cpu"}]}, ["2 devices of class 'cpu'"]),
])
def test_invalid_specs_name_the_field(tmp_path, data, words):
    with pytest.raises(ClusterError) as e:
        Cluster.from_file(spec(tmp_path, data))
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path) in msg, msg
    assert all(w in msg for w in words), msg


def test_cli_devices(capsys, tmp_path):
    assert main(["devices"]) == 0
    out, _ = capsys.readouterr()
    assert json.loads(out)["devices"][0]["class"] == "cpu"
    bad = spec(tmp_path, {"devices": [{**GPU, "memory": None}]})
    assert main(["devices", "--check", str(bad)]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("onnxsplit: error: ") and "memory" in err and err.count("\n") == 1
    assert main(["devices", "--check", str(tmp_path / "none.json")]) == 2
    _, err = capsys.readouterr()
    assert "does not exist" in err


# ------------------------------------------------------------------ cost model


def test_flop_counts_from_shapes(tmp_path):
    conv_w = weight("cw", (16, 4, 3, 3))  # group 2: 8 input channels
    nodes = [
        helper.make_node("MatMul", ["a", "B"], ["mm"], name="mm"),
        helper.make_node("Gemm", ["a", "G"], ["gm"], name="gemm", transB=1),
        helper.make_node("Conv", ["img", "cw"], ["cv"], name="conv", group=2, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["mm"], ["r"], name="relu"),
        helper.make_node("Tanh", ["mm"], ["t"], name="tanh"),
        helper.make_node("Reshape", ["r", "shape"], ["rs"], name="reshape"),
        helper.make_node("Softmax", ["gm"], ["sm"], name="softmax"),
        helper.make_node("ReduceMean", ["t", "axes"], ["rm"], name="mean"),
    ]
    inits = [weight("B", (32, 48)), weight("G", (24, 32)),
             conv_w, helper.make_tensor("shape", 7, [1], [-1]), helper.make_tensor("axes", 7, [1], [1])]
    path = save(make(nodes, [vi("a", [10, 32]), vi("img", [1, 8, 6, 6])],
                     [vi(o, None) for o in ("rs", "sm", "rm", "cv")], inits, opset=18), tmp_path / "f.onnx")
    g = OpGraph.from_onnx(path)
    w = cm.works(g)
    assert w["mm"].flops == 2 * 10 * 48 * 32
    assert w["gemm"].flops == 2 * 10 * 24 * 32
    assert w["conv"].flops == 2 * (1 * 16 * 6 * 6) * (4 * 3 * 3)
    assert w["relu"].flops == 10 * 48 and w["tanh"].flops == 8 * 10 * 48
    assert w["reshape"].flops == 0 and w["reshape"].bytes == 0 and w["reshape"].category == "shape"
    assert w["softmax"].flops == 5 * 10 * 24 and w["mean"].flops == 10 * 48
    assert w["mm"].bytes == (10 * 32 + 32 * 48 + 10 * 48) * 4
    assert all(x.covered for x in w.values())


def test_uncovered_ops():
    g = OpGraph.from_onnx(TINY_BERT, TINY_BERT_SHAPES)
    w = cm.works(g)
    assert all(x.covered for x in w.values())  # every op of a BERT export is described
    assert {x.category for x in w.values()} >= {"matmul", "elementwise", "norm", "softmax", "move"}


def test_calibrated_cpu_estimates_reproduce_measured_total(tmp_path):
    path = mlp(tmp_path / "m.onnx")
    entry = profile(path, cache=False, repeats=5, quiet=True).entries[0]
    g = OpGraph.from_onnx(path)
    w = cm.works(g)
    names = list(entry.nodes)
    measured = np.array([entry.nodes[n].median_ms for n in names]) / 1e3
    roof = cm.calibrate([w[n] for n in names], measured)
    est = np.array([roof.seconds(w[n]) for n in names])
    assert est.sum() == pytest.approx(measured.sum(), rel=1e-6)
    # and per node it is a sensible model: MatMuls compute-bound, within a factor of 2
    for n, e, m in zip(names, est, measured):
        if n.startswith("matmul"):
            assert 0.5 < e / m < 2, n
    assert 1e9 < roof.flops_per_s < 1e13 and 1e8 < roof.bytes_per_s < 1e12


def test_calibration_on_tiny_bert_profile():
    entry = profile(TINY_BERT, TINY_BERT_SHAPES, cache=False, repeats=3, quiet=True).entries[0]
    g = OpGraph.from_onnx(TINY_BERT, TINY_BERT_SHAPES)
    w = cm.works(g)
    names = list(entry.nodes)
    t = [entry.nodes[n].median_ms / 1e3 for n in names]
    roof = cm.calibrate([w[n] for n in names], t)
    assert sum(roof.seconds(w[n]) for n in names) == pytest.approx(sum(t), rel=1e-6)


def test_absent_device_roofline():
    r = cm.device_roofline(10e12, 500e9, 5e-6, {"compute": 0.5, "memory": 0.8})
    work = cm.Work(flops=2e9, bytes=1e6, category="matmul", covered=True)
    assert r.seconds(work) == pytest.approx(2e9 / 5e12 + 5e-6)
    work = cm.Work(flops=1e3, bytes=4e8, category="elementwise", covered=True)
    assert r.seconds(work) == pytest.approx(4e8 / 400e9 + 5e-6)
    # without a given efficiency: the CPU's calibrated fraction of its own peak, if known
    cpu = cm.Roofline(50e9, 10e9, 1e-6)
    r = cm.device_roofline(10e12, 500e9, None, None, cpu, (100e9, 20e9))
    assert r.flops_per_s == pytest.approx(5e12) and r.bytes_per_s == pytest.approx(250e9)
    assert r.overhead_s == cm.DEFAULT_ACCELERATOR_OVERHEAD_S
    r = cm.device_roofline(10e12, 500e9, None, None)
    assert r.flops_per_s == pytest.approx(10e12 * cm.DEFAULT_EFFICIENCY["compute"])
    assert math.isfinite(r.seconds(cm.Work(0, 0, "shape", True)))
