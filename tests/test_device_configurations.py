"""annotated.onnx carries ONNX's own multi-device metadata beside layer_ann: one
configuration of the plan's devices, and per node its device and (throughput plans) its
pipeline stage.  Checked against the manifest and the parts' own files, with the onnx
checker, onnx_ir reading it back, and onnxruntime running it against the original."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

from onnx_models import TINY_BERT, TINY_BERT_SHAPES, mlp
from onnxsplit.errors import SplitError
from onnxsplit.export import ANNOTATED, INLINE_BYTES, MANIFEST, SESSION_FILE, WEIGHTS, export
from onnxsplit.graph import OpGraph
from onnxsplit.running.runner import random_feeds
from onnxsplit.running.compare import run_parts

CPU = "CPUExecutionProvider"
MAX_IR = 13  # the newest IR version onnxruntime loads
CPUS = {f"cpu{i}": CPU for i in range(3)}


def planned(out: Path) -> tuple[list[str], dict[str, tuple[int, str]]]:
    """From the manifest and the part files alone: the plan's devices in part order, and
    node -> (its part's index, its device)."""
    man = json.loads((out / MANIFEST).read_text())
    devices = list(dict.fromkeys(p["device"] for p in man["parts"]))
    where = {}
    for i, p in enumerate(man["parts"]):
        for n in onnx.load(str(out / p["file"]), load_external_data=False).graph.node:
            where[n.name] = (i, p["device"])
    return devices, where


def ext(t: TensorProto) -> tuple[str, str, str]:
    info = {e.key: e.value for e in t.external_data}
    return info["location"], info["offset"], info["length"]


def check_annotated(out: Path, g: OpGraph, device_of, pipelined: bool, layer_ann) -> None:
    path = out / ANNOTATED
    onnx.checker.check_model(str(path))  # the path form: weights.bin beside it is checked
    proto = onnx.load(str(path), load_external_data=False)
    assert 11 <= proto.ir_version <= MAX_IR
    # the whole model, its big weights the very bytes the parts read from weights.bin
    assert [n.name for n in proto.graph.node] == [n.name for n in g.nodes]
    big = {t.name: ext(t) for t in proto.graph.initializer
           if t.data_location == TensorProto.EXTERNAL}
    assert big and {loc for loc, _, _ in big.values()} == {WEIGHTS}
    assert all(numpy_helper.to_array(t).nbytes <= INLINE_BYTES for t in proto.graph.initializer
               if t.name not in big)
    in_parts = {t.name: ext(t) for f in out.glob("part*.onnx")
                for t in onnx.load(str(f), load_external_data=False).graph.initializer
                if t.data_location == TensorProto.EXTERNAL}
    assert big == in_parts

    devices, where = planned(out)
    assert set(where) == {n.name for n in g.nodes}
    assert all(where[n][1] == device_of[n] for n in where)
    m = ir.load(str(path))
    (config,) = m.device_configurations
    assert (config.name, config.num_devices, list(config.device_names)) == (
        "onnxsplit", len(devices), devices)
    assert sorted(devices) == sorted(set(device_of.values()))
    for node in m.graph:
        assert node.metadata_props["layer_ann"] == layer_ann(device_of[node.name])
        (nc,) = node.device_configurations
        assert nc.configuration is config  # onnx_ir resolved the configuration id
        stage, device = where[node.name]
        assert nc.pipeline_stage == (stage if pipelined else None)
        assert nc.sharding_specs
        for spec in nc.sharding_specs:
            assert spec.value in node.outputs and not spec.sharded_dims
            assert [config.device_names[i] for i in spec.device] == [device]

    # onnxruntime loads it and computes what the original computes
    feeds = random_feeds(json.loads((out / MANIFEST).read_text())["model"]["inputs"], seed=3)
    for k, v in feeds.items():
        if v.dtype.kind == "f":
            feeds[k] = np.random.default_rng(7).standard_normal(v.shape).astype(v.dtype)
    want = ort.InferenceSession(str(g.path), providers=[CPU]).run(None, feeds)
    got = ort.InferenceSession(str(path), providers=[CPU]).run(None, feeds)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def cpu_tag(device: str) -> str:
    return "cpu_part"


def test_a_throughput_export_stages_each_node_by_its_part(tmp_path):
    model = mlp(tmp_path / "m.onnx", layers=3, batch=4, width=64)
    g = OpGraph.from_onnx(model)
    names = [n.name for n in g.nodes]
    device_of = {n: ("cpu2", "cpu0", "cpu1")[i * 3 // len(names)] for i, n in enumerate(names)}
    e = export(g, device_of, tmp_path / "out", providers=CPUS,
               plan={"objective": "throughput", "method": "dp"})
    assert [p.device for p in e.parts] == ["cpu2", "cpu0", "cpu1"]
    assert not (e.out / SESSION_FILE).exists()
    check_annotated(e.out, g, device_of, pipelined=True, layer_ann=cpu_tag)


def test_a_latency_export_names_devices_without_stages(tmp_path):
    """Pieces: a device comes back, listed once in the configuration."""
    g = OpGraph.from_onnx(TINY_BERT, TINY_BERT_SHAPES)
    names = [n.name for n in g.nodes]
    third = len(names) // 3
    piece_of = {n: min(i // third, 2) for i, n in enumerate(names)}
    device_of = {n: ("cpu0", "cpu1", "cpu0")[piece_of[n]] for n in names}
    e = export(g, device_of, tmp_path / "out", providers=CPUS, piece_of=piece_of,
               plan={"objective": "latency", "method": "dp"})
    assert [p.device for p in e.parts] == ["cpu0", "cpu1", "cpu0"]
    check_annotated(e.out, g, device_of, pipelined=False, layer_ann=cpu_tag)


def test_a_session_export_keeps_its_tags_and_runs_as_one_session(tmp_path):
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=64)
    g = OpGraph.from_onnx(model)
    device_of = {n.name: "cpu0" for n in g.nodes}
    e = export(g, device_of, tmp_path / "out", providers=CPUS, threads={"cpu0": 0},
               plan={"objective": "latency"}, session={"threads": 0})
    spec = json.loads((e.out / SESSION_FILE).read_text())
    assert spec["config"]["session.layer_assignment_settings"] == "cpu(=cpu_part)"
    check_annotated(e.out, g, device_of, pipelined=False, layer_ann=cpu_tag)
    r = run_parts(e.out, measure=False)
    assert r["verify"]["ok"]


def test_an_ep_layer_assignment_does_not_know(tmp_path):
    """Without a session it is tagged by its device's name; a session cannot run it, said
    before anything is written."""
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=64)
    g = OpGraph.from_onnx(model)
    device_of = {n.name: ("cpu0" if i < 3 else "npu:0") for i, n in enumerate(g.nodes)}
    providers = {"cpu0": CPU, "npu:0": "OtherExecutionProvider"}
    e = export(g, device_of, tmp_path / "out", providers=providers,
               plan={"objective": "throughput"})
    check_annotated(e.out, g, device_of, pipelined=True,
                    layer_ann=lambda d: "cpu_part" if d == "cpu0" else "npu_0_part")
    with pytest.raises(SplitError, match="one onnxruntime session"):
        export(g, device_of, tmp_path / "s", providers=providers, session={"threads": 0})
    assert not (tmp_path / "s").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".s.")]
