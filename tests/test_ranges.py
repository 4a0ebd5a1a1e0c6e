"""Shape ranges: --input-shape with a range per dimension, parts made for every shape in it,
checked at the corners, run at any shape inside it and refusing one outside in one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

from onnx_models import make, save, weight
from onnxsplit import api, ranges
from onnxsplit.cli import main
from onnxsplit.errors import OnnxsplitError, RunError
from onnxsplit.running import kserve
from onnxsplit.running.manifest import inputs_at, read_manifest
from onnxsplit.running.runner import Parts


# ---- the syntax ----------------------------------------------------------------------------------

def test_a_range_per_dimension_is_planned_at_its_middle_or_where_asked():
    shapes, r = api.parse_input_ranges(["input_ids=1..8x16..512", "mask=1..8x16..512"])
    assert r == {"input_ids": [(1, 8), (16, 512)], "mask": [(1, 8), (16, 512)]}
    assert shapes == {"input_ids": (3, 91), "mask": (3, 91)}  # geometric middles: sqrt(8), sqrt(8192)
    shapes, r = api.parse_input_ranges(["input_ids=1..8x16..512@1x128"])
    assert shapes == {"input_ids": (1, 128)}
    assert api.parse_input_ranges(["x=1x128"]) == ({"x": (1, 128)}, None)  # no range: one shape, as before
    assert ranges.corners(r) == ({"input_ids": (1, 16)}, {"input_ids": (8, 512)})
    assert ranges.check_shapes(r, shapes) == [{"input_ids": (1, 16)}, {"input_ids": (1, 128)},
                                              {"input_ids": (8, 512)}]


@pytest.mark.parametrize("spec, words", [
    ("x=8..1x16", "runs backwards"),
    ("x=1..x16", "integers or ranges"),
    ("x=1..8x16@9x16", "dimension 0 is 9, outside 1..8x16"),
    ("x=1..8x16@1", "has 1 dimensions"),
    ("x=1..8x16@ax16", "must be sizes"),
    ("=1..8", "expected NAME=DIMS"),
])
def test_a_bad_range_is_one_line(spec, words):
    with pytest.raises(OnnxsplitError, match=words) as e:
        api.parse_input_ranges([spec])
    assert "\n" not in str(e.value)


def test_a_command_that_takes_one_shape_refuses_a_range():
    with pytest.raises(OnnxsplitError, match="a range of shapes is for the main command and export"):
        api.parse_input_shapes(["x=1..8x16"])


def test_inputs_not_given_follow_by_dimension_names():
    names = {"ids": ["batch", "seq"], "mask": ["batch", "seq"], "pos": [None, "seq"]}
    planned = {"ids": (3, 91), "mask": (3, 91), "pos": (1, 91)}
    got = ranges.complete({"ids": [(1, 8), (16, 512)]}, names, planned)
    assert got == {"ids": [(1, 8), (16, 512)], "mask": [(1, 8), (16, 512)], "pos": [(1, 1), (16, 512)]}
    with pytest.raises(OnnxsplitError, match="dimension 'batch' the range 1..8 for 'ids' but 1 for 'mask'"):
        ranges.complete({"ids": [(1, 8), (16, 512)], "mask": [(1, 1), (16, 512)]}, names, planned)
    with pytest.raises(OnnxsplitError, match="plans dimension 'seq' at 91 for 'ids' but at 90"):
        ranges.complete({"ids": [(1, 8), (16, 512)]}, names, {"ids": (3, 91), "mask": (3, 90)})
    specs = [{"name": k, "shape": list(v), "dims": names[k]} for k, v in planned.items()]
    assert ranges.follow_names({"ids": (5, 20)}, specs) == {"ids": (5, 20), "mask": (5, 20), "pos": (1, 20)}


# ---- the server's side ---------------------------------------------------------------------------

def infer_body(shape) -> bytes:
    x = np.ones(shape, np.float32)
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(shape),
                                   "data": x.reshape(-1).tolist()}]}).encode()


def test_a_request_takes_any_shape_of_the_range_and_no_other():
    inputs = [{"name": "x", "dtype": "float32", "shape": [3, 16], "dims": ["batch", None]}]
    r = {"x": [(1, 8), (16, 16)]}
    feeds, _ = kserve.decode_request(infer_body((5, 16)), None, inputs, r)
    assert feeds["x"].shape == (5, 16)
    with pytest.raises(kserve.ProtocolError, match=r"input 'x': shape \[9, 16\], dimension 0 is 9, outside 1..8x16"):
        kserve.decode_request(infer_body((9, 16)), None, inputs, r)
    with pytest.raises(kserve.ProtocolError, match="the model takes"):  # no range: its one shape
        kserve.decode_request(infer_body((5, 16)), None, inputs)
    meta = kserve.model_metadata("m", inputs, [{"name": "y", "dtype": "float32", "shape": [3, 8],
                                                "dims": ["batch", None]}], r)
    assert meta["inputs"][0]["shape"] == [-1, 16] and meta["outputs"][0]["shape"] == [-1, 8]
    assert meta["inputs"][0]["parameters"]["shape_range"] == "1..8x16"


# ---- end to end ----------------------------------------------------------------------------------

def batched_mlp(path):
    """x [batch, 16] -> MatMul, Relu, MatMul, Relu, MatMul -> y [batch, 8], batch left free."""
    nodes, inits, prev = [], [], "x"
    for i, (a, b) in enumerate([(16, 32), (32, 32), (32, 8)]):
        inits.append(weight(f"w{i}", (a, b), seed=i))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        prev = f"h{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"], name=f"relu{i}"))
            prev = f"r{i}"
    nodes[-1].output[0] = "y"
    model = make(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 16])],
                 [helper.make_tensor_value_info("y", TP.FLOAT, ["batch", 8])], inits)
    return save(model, path)


@pytest.fixture(scope="module")
def ranged(tmp_path_factory):
    """The main command's parts for x=1..8x16, split in two (--method dp), and its report."""
    tmp = tmp_path_factory.mktemp("ranged")
    model = batched_mlp(tmp / "m.onnx")
    out = tmp / "parts"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main([str(model), "--input-shape", "x=1..8x16", "--out", str(out), "--method", "dp", "--json"])
    assert rc == 0
    return model, out, json.loads(buf.getvalue())


def original(model, feeds):
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_parts_for_a_range_are_checked_at_its_corners_and_keep_the_dimension_names(ranged):
    model, out, result = ranged
    manifest = read_manifest(out)
    assert manifest["model"]["shape_range"] == {"x": [[1, 8], [16, 16]]}
    assert manifest["model"]["inputs"][0]["shape"] == [3, 16] and manifest["model"]["inputs"][0]["dims"] == ["batch", None]
    rows = result["per_shape"]
    assert [r["shapes"] for r in rows] == [{"x": [1, 16]}, {"x": [3, 16]}, {"x": [8, 16]}]
    assert all(r["verify"]["ok"] and r["verify"]["max_abs_error"] < 1e-4 for r in rows)
    assert [r["planned"] for r in rows] == [False, True, False]
    assert all(r["latency_ms"] > 0 and r["throughput_per_s"] > 0 for r in rows)
    assert result["verify"]["ok"] and result["verify"]["shapes"] in [r["shapes"] for r in rows]
    for p in manifest["parts"]:  # each part file keeps the model's name for the batch dimension
        m = onnx.load(str(out / p["file"]), load_external_data=False)
        first = [v for v in m.graph.input if v.name in {t["name"] for t in p["inputs"]}][0]
        assert first.type.tensor_type.shape.dim[0].dim_param == "batch"
    assert len(manifest["predicted"]["per_shape"]) == 3


@pytest.mark.parametrize("batch", [1, 5, 8])
def test_parts_for_a_range_reproduce_the_model_at_any_shape_inside_it(ranged, batch):
    model, out, _ = ranged
    parts = Parts(out)
    x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
    np.testing.assert_allclose(parts.run({"x": x})["y"], original(model, {"x": x}), rtol=1e-5, atol=1e-6)


def test_run_at_a_shape_of_the_range_and_not_outside_it(ranged, capsys):
    model, out, _ = ranged
    assert main(["run", str(out), "--shape", "x=5x16", "--no-measure", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["shapes"] == {"x": [5, 16]} and got["verify"]["ok"]
    assert got["predicted"] is None  # no promise made at 5x16: none compared
    assert main(["run", str(out), "--shape", "x=9x16", "--no-measure"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("onnxsplit: error: shape outside what the parts are made for: input 'x': shape [9, 16], "
                   "dimension 0 is 9, outside 1..8x16")
    with pytest.raises(RunError, match="not an input of the model"):
        inputs_at(read_manifest(out), {"z": (1, 16)})


def test_a_manifest_whose_range_does_not_hold_is_one_line(ranged, tmp_path):
    import shutil

    _, out, _ = ranged
    for edit, words in [
        (lambda m: m["model"].update(shape_range={"x": [[4, 8], [16, 16]]}), r"do not lie in model.shape_range: input 'x'"),
        (lambda m: m["model"].update(shape_range={"z": [[1, 8]]}), "names 'z', which is not an input"),
        (lambda m: m["model"].update(shape_range={"x": [[8, 1], [16, 16]]}), "model.shape_range: 'x' must be"),
        (lambda m: m["model"]["inputs"][0].update(dims=["batch", 3]), r"model.inputs\[0\].dims must be a list"),
    ]:
        copy = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
        shutil.copytree(out, copy)
        m = json.loads((copy / "manifest.json").read_text())
        edit(m)
        (copy / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(RunError, match=words) as e:
            read_manifest(copy)
        assert "\n" not in str(e.value)


def test_one_sample_of_the_largest_shape_is_held_to_the_memory_limit(ranged, tmp_path):
    import shutil

    from onnxsplit import limits

    _, out, _ = ranged
    copy = tmp_path / "big"
    shutil.copytree(out, copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["model"]["shape_range"] = {"x": [[1, 10**11], [16, 16]]}
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(RunError, match=r"one sample of shape \[100000000000, 16\] takes .* above the memory limit"):
        read_manifest(copy)
    assert limits.limit_bytes() < 10**11 * 16 * 4


def test_the_api_plans_at_the_middle_and_refuses_a_planning_shape_outside():
    r = {"x": [(1, 8), (16, 16)]}
    assert ranges.planning(r, None) == {"x": (3, 16)}
    assert ranges.planning(r, {"x": (8, 16)}) == {"x": (8, 16)}
    with pytest.raises(OnnxsplitError, match="planning shape lies outside the range: input 'x'"):
        ranges.planning(r, {"x": (9, 16)})
    with pytest.raises(OnnxsplitError, match="runs backwards"):
        ranges.planning({"x": [(8, 1)]}, None)


def test_a_model_kept_whole_promises_at_every_check_shape(tmp_path, capsys):
    """Without a split to time part by part, each shape's promise is the written parts
    measured there as the calibration measured them (the planning shape's is the
    calibration): bigger batches, fewer samples a second."""
    model = batched_mlp(tmp_path / "m.onnx")
    # (a batch of 1,024 takes about a millisecond more than one: more than the noise of a
    # busy machine, which a batch of 64 was not)
    assert main([str(model), "--input-shape", "x=1..1024x16", "--out", str(tmp_path / "p"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = result["per_shape"]
    assert [r["shapes"]["x"][0] for r in rows] == [1, 32, 1024]
    assert all(r["verify"]["ok"] and r["latency_ms"] > 0 for r in rows)
    planned = rows[1]
    assert planned["throughput_per_s"] == pytest.approx(result["predicted"]["throughput_per_s"])
    assert rows[0]["latency_ms"] < rows[2]["latency_ms"]
    assert rows[0]["throughput_per_s"] > rows[2]["throughput_per_s"]
    promised = json.loads((tmp_path / "p" / "manifest.json").read_text())["predicted"]["per_shape"]
    assert [p.get("measured", False) for p in promised] == [True, False, True]
    assert [p["throughput_per_s"] for p in promised] == [r["throughput_per_s"] for r in rows]


def test_a_split_for_a_range_is_weighed_against_the_whole_model_at_every_check_shape():
    from types import SimpleNamespace

    from onnxsplit.workflow import _over_the_range

    # the model kept whole: 12 ms a sample at the planning shape, 2 ms of it beyond the
    # model's own 10 (what a call costs: it stays at every shape)
    rival = SimpleNamespace(predicted={"throughput_per_s": 1000 / 12, "latency_ms": 12.0}, execution={})
    rows = [  # the split: faster at the planning shape, its calls' cost weighs at the small one
        {"planned": False, "part_ms": [0.5, 0.5], "throughput_per_s": 400.0, "latency_ms": 4.0},
        {"planned": True, "part_ms": [5.0, 5.0], "throughput_per_s": 150.0, "latency_ms": 9.0},
        {"planned": False, "part_ms": [20.0, 20.0], "throughput_per_s": 40.0, "latency_ms": 36.0},
    ]
    # whole, its promise plus what the parts take more (as each shape's promise is made):
    # 3, 12 and 42 ms; not in proportion (1.2, 12 and 48 ms)
    assert _over_the_range(rows, rival, "throughput") == pytest.approx(
        (400 / (1000 / 3) * 150 / (1000 / 12) * 40 / (1000 / 42)) ** (1 / 3))
    assert _over_the_range(rows, rival, "latency") == pytest.approx((3 / 4 * 12 / 9 * 42 / 36) ** (1 / 3))
    # two copies side by side share what a sample takes more: periods 0.5, 5 and 20 ms
    copies = SimpleNamespace(predicted={"throughput_per_s": 200.0, "latency_ms": 10.0}, execution={"replicas": 2})
    assert _over_the_range(rows, copies, "throughput") == pytest.approx((400 / 2000 * 150 / 200 * 40 / 50) ** (1 / 3))
    assert _over_the_range(rows[1:2], rival, "throughput") is None  # one shape: no range to weigh


def test_a_shape_without_a_promise_prints_a_dash(capsys):
    """Parts on a device this machine lacks are checked on the CPU and promise nothing
    per shape: the table says so with a dash, not 'nan'."""
    from onnxsplit import cli

    check = {"ok": True, "max_rel_error": 0.0}
    rows = [{"shapes": {"x": [1, 16]}, "planned": False, "verify": check},
            {"shapes": {"x": [4, 16]}, "planned": True, "verify": check, "latency_ms": 2.5,
             "throughput_per_s": 400.0}]
    cli._print_per_shape({"per_shape": rows, "model": {"shape_range": {"x": [[1, 4], [16, 16]]}}})
    out = capsys.readouterr().out.splitlines()
    assert "nan" not in "\n".join(out)
    assert out[-2].split()[1:4] == ["-", "-", "ok,"] and out[-1].split()[1:3] == ["2.50", "400.0"]


def test_memory_counts_each_nodes_outputs_at_the_largest_shape_of_the_range(tmp_path):
    """Parts made for a range take its largest shape too: each node's outputs count
    against a device's memory there (a batch of 1,024 here, 32 times the planning
    shape's), the weights once; at the planning shape alone, as before."""
    from onnxsplit.workflow import prepare

    model = batched_mlp(tmp_path / "m.onnx")
    widths = {"mm0": 32, "relu0": 32, "mm1": 32, "relu1": 32, "mm2": 8}  # each node's output columns
    weights = {"mm0": 16 * 32 * 4, "mm1": 32 * 32 * 4, "mm2": 32 * 8 * 4}
    for largest, rows in ((None, 32), ({"x": (32, 16)}, 32), ({"x": (1024, 16)}, 1024)):
        w = prepare(model, input_shapes={"x": (32, 16)}, largest=largest, as_run=False, narrate=False).workload
        for node in w.nodes:
            want = rows * widths[node.name] * 4  # float32
            assert node.extra["activationBytes"] == want, (largest, node.name)
            assert node.size == weights.get(node.name, 0) + want
