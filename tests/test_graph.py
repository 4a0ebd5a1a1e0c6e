"""The importer checked against facts it does not compute: what onnxruntime produces for
each tensor when the *real* model runs, what the file lists, and what a user would type."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from onnxsplit.errors import ModelError, OnnxsplitError
from onnxsplit.graph import OpGraph
from onnxsplit.shapes import with_all_outputs

DATA = Path(__file__).parent / "data"
LIGHT = sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__),
                                      "backend", "test", "data", "light", "*.onnx")))


# ------------------------------------------------------------------ helpers


def save(model: onnx.ModelProto, path: Path, **kw) -> Path:
    model.ir_version = 10  # onnxruntime 1.31 rejects onnx 1.23's default IR 14
    onnx.save(model, str(path), **kw)
    return path


def make(nodes, inputs, outputs, inits=(), opsets=(("", 17),)):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def vi(name, shape, t=TP.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def weight(name, shape, seed=0):
    return numpy_helper.from_array(
        np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def feeds_for(path: Path, shapes: dict | None = None) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = {}
    for i in sess.get_inputs():
        shape = (shapes or {}).get(i.name) or i.shape
        if i.type == "tensor(float)":
            out[i.name] = np.random.default_rng(1).random(shape).astype(np.float32)
        else:
            out[i.name] = np.ones(shape, dtype=np.int64)
    return out


def ort_actual(path: Path, shapes: dict | None = None) -> dict[str, np.ndarray]:
    """Every node output of the real model (real weights), as onnxruntime computes it."""
    m = with_all_outputs(onnx.load(str(path), load_external_data=False))  # ORT reads the data file
    m.ir_version = min(m.ir_version, 10) if m.ir_version >= 4 else m.ir_version
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # no folding: faster
    so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                str(Path(path).parent))
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds_for(path, shapes))))


def check_against_file_and_runtime(path: Path, g: OpGraph, shapes: dict | None = None):
    m = onnx.load(str(path), load_external_data=False)
    # every node of the file appears exactly once
    assert len(g.nodes) == len(m.graph.node)
    assert len({n.name for n in g.nodes}) == len(g.nodes)
    assert sorted((n.op_type, n.outputs) for n in g.nodes) == sorted(
        (n.op_type, tuple(n.output)) for n in m.graph.node)
    # topological: every edge goes forward
    pos = {n.name: i for i, n in enumerate(g.nodes)}
    assert all(pos[e.producer] < pos[e.consumer] for e in g.edges)
    # every produced tensor's bytes, dtype and shape are what onnxruntime produces
    actual = ort_actual(path, shapes)
    produced = [t for t in g.tensors.values() if t.kind == "activation"]
    assert produced
    for t in produced:
        arr = actual[t.name]
        assert (t.bytes, t.shape, t.dtype) == (arr.nbytes, arr.shape, arr.dtype.name), t.name
    # one edge per (producer, consumer, tensor); a tensor's consumers are its edges' heads
    assert len(set(g.edges)) == len(g.edges)
    for t in produced:
        heads = [e.consumer for e in g.edges if e.tensor == t.name]
        assert sorted(heads) == sorted(t.consumers)
        assert all(e.producer == t.producer for e in g.edges if e.tensor == t.name)


# ------------------------------------------------------------------ real models


@pytest.mark.skipif(not LIGHT, reason="onnx wheel ships no light zoo models")
@pytest.mark.parametrize("path", LIGHT, ids=lambda p: Path(p).stem)
def test_light_zoo_models(path):
    g = OpGraph.from_onnx(path)
    check_against_file_and_runtime(Path(path), g)
    m = onnx.load(path, load_external_data=False)
    assert set(g.initializers) == {t.name for t in m.graph.initializer}
    assert g.to_networkx().number_of_nodes() == len(m.graph.node)


def test_tiny_bert_export_with_dynamic_axes():
    """A transformers BERT exported by torch.onnx (dynamo) with dynamic batch/sequence."""
    path = DATA / "tiny_bert.onnx"
    with pytest.raises(ModelError) as e:
        OpGraph.from_onnx(path)
    msg = str(e.value)
    assert "\n" not in msg and "input_ids" in msg and "--input-shape" in msg
    shapes = {n.name: (2, 16) for n in onnx.load(str(path)).graph.input}
    g = OpGraph.from_onnx(path, shapes)
    check_against_file_and_runtime(path, g, shapes)
    assert g.tensors["input_ids"].shape == (2, 16)
    big = max(g.weights, key=lambda t: t.bytes)
    assert big.consumers  # the embedding table is used


# ------------------------------------------------------------------ hand-built models


def test_shared_weight_and_fanout(tmp_path):
    w = weight("W", (8, 8))
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W"], ["a"], name="mm1"),
        helper.make_node("MatMul", ["r", "W"], ["b"], name="mm2"),
        helper.make_node("Mul", ["r", "r"], ["c"], name="sq"),
        helper.make_node("Sum", ["a", "b", "c"], ["y"], name="sum"),
    ]
    path = save(make(nodes, [vi("x", [4, 8])], [vi("y", [4, 8])], [w]), tmp_path / "m.onnx")
    g = OpGraph.from_onnx(path)
    check_against_file_and_runtime(path, g)
    assert [t.name for t in g.weights] == ["W"]
    assert set(g.tensors["W"].consumers) == {"mm1", "mm2"}
    assert g.weight_bytes == 8 * 8 * 4 and g.weights_of("mm2") == ("W",)
    # r feeds three nodes: three edges, one tensor, charged to its producer
    assert sorted(e.consumer for e in g.edges if e.tensor == "r") == ["mm1", "mm2", "sq"]
    assert g.tensors["r"].producer == "relu" and g.tensors["r"].bytes == 4 * 8 * 4
    assert g.inputs == ("x",) and g.outputs == ("y",)
    assert g.predecessors("sum") == ("mm1", "mm2", "sq")


def _branch(name, outer, out, nested=None):
    nodes = [helper.make_node("Add", [outer, "W"], [out + "_t"], name=name + "_add")]
    if nested is not None:
        nodes.append(helper.make_node("If", ["cond"], [out + "_n"], name=name + "_if",
                                      then_branch=nested, else_branch=nested))
        nodes.append(helper.make_node("Add", [out + "_t", out + "_n"], [out]))
    else:
        nodes.append(helper.make_node("Identity", [out + "_t"], [out]))
    return helper.make_graph(nodes, name, [], [vi(out, [2, 3])])


def test_if_is_atomic_with_captured_outer_tensors(tmp_path):
    # the else branch holds a nested If whose branches read 'deep', two scopes out
    inner = helper.make_graph([helper.make_node("Neg", ["deep"], ["z"])], "inner", [],
                              [vi("z", [2, 3])])
    nodes = [
        helper.make_node("Relu", ["x"], ["outer"], name="producer"),
        helper.make_node("Sigmoid", ["x"], ["deep"], name="deep_producer"),
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="rs"),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="gt"),
        helper.make_node("If", ["cond"], ["y"], name="branch",
                         then_branch=_branch("then", "outer", "o1"),
                         else_branch=_branch("else", "outer", "o2", nested=inner)),
    ]
    inits = [weight("W", (2, 3)), numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    path = save(make(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])], inits), tmp_path / "if.onnx")
    g = OpGraph.from_onnx(path)
    check_against_file_and_runtime(path, g)
    assert [n.name for n in g.nodes if n.op_type == "If"] == ["branch"]  # nested If not split out
    node = g.node("branch")
    assert node.has_subgraphs and node.inputs == ("cond",)
    assert set(node.captured_inputs) == {"outer", "W", "deep", "cond"}
    assert set(g.predecessors("branch")) == {"producer", "deep_producer", "gt"}
    assert "branch" in g.tensors["W"].consumers and "branch" in g.tensors["deep"].consumers
    assert set(g.tensors) == {"x", "W", "zero", "outer", "deep", "s", "cond", "y"}


def test_loop_is_atomic_and_its_scan_output_is_measured(tmp_path):
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "outer"], ["v_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Mul", ["v_out", "W"], ["scan"])],
        "body",
        [vi("i", [], TP.INT64), vi("c_in", [], TP.BOOL), vi("v_in", None)],
        [vi("c_out", [], TP.BOOL), vi("v_out", None), vi("scan", None)])
    nodes = [helper.make_node("Exp", ["x"], ["outer"], name="exp"),
             helper.make_node("Loop", ["trips", "", "x"], ["v", "stacked"], body=body,
                              name="loop"),
             helper.make_node("ReduceSum", ["stacked"], ["y"], keepdims=1, name="sum")]
    inits = [numpy_helper.from_array(np.array(5, np.int64), "trips"), weight("W", (3,))]
    path = save(make(nodes, [vi("x", [3])], [vi("y", None), vi("v", None)], inits),
                tmp_path / "loop.onnx")
    g = OpGraph.from_onnx(path)
    check_against_file_and_runtime(path, g)
    assert g.tensors["stacked"].shape == (5, 3)  # 5 trips: known only by running
    loop = g.node("loop")
    assert loop.has_subgraphs and set(loop.captured_inputs) == {"outer", "W"}
    assert g.predecessors("loop") == ("exp",) and set(g.tensors["W"].consumers) == {"loop"}


def test_external_data_is_never_read(tmp_path):
    w1, w2 = weight("W1", (256, 512), 1), weight("W2", (512, 64), 2)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "W2"], ["y"], name="mm2")]
    path = save(make(nodes, [vi("x", ["batch", 256])], [vi("y", ["batch", 64])], [w1, w2]),
                tmp_path / "ext.onnx", save_as_external_data=True, location="ext.data")
    assert (tmp_path / "ext.data").stat().st_size == (256 * 512 + 512 * 64) * 4
    with_data = OpGraph.from_onnx(path, {"x": (3, 256)})
    check_against_file_and_runtime(path, with_data, {"x": (3, 256)})
    (tmp_path / "ext.data").rename(tmp_path / "moved.data")
    g = OpGraph.from_onnx(path, {"x": (3, 256)})
    assert g.tensors["W1"].bytes == 256 * 512 * 4 and g.tensors["W2"].bytes == 512 * 64 * 4
    assert g.tensors["h"].bytes == 3 * 512 * 4 and g.tensors["y"].shape == (3, 64)
    assert [n.name for n in g.nodes] == ["mm1", "relu", "mm2"]


def test_weights_over_2gb_in_a_missing_file(tmp_path):
    # a 4 GiB external weight whose data file does not exist: only its dims are ever read
    huge = onnx.TensorProto(name="W", data_type=TP.FLOAT, dims=[1 << 15, 1 << 15],
                            data_location=onnx.TensorProto.EXTERNAL)
    for k, v in (("location", "huge.data"), ("offset", "0"), ("length", str(1 << 32))):
        huge.external_data.add(key=k, value=v)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    path = save(make(nodes, [vi("x", ["b", 1 << 15])], [vi("y", None)], [huge]),
                tmp_path / "huge.onnx")
    assert path.stat().st_size < 1000
    g = OpGraph.from_onnx(path, {"x": (2, 1 << 15)})
    assert g.weight_bytes == 1 << 32 and g.tensors["W"].consumers == ("mm",)
    assert g.tensors["h"].bytes == 2 * (1 << 15) * 4 and g.shapes_from == "shape-inference"


def test_unknown_shapes_are_measured_with_onnxruntime(tmp_path):
    # com.microsoft ops have no ONNX shape-inference schema: onnxruntime must measure them
    nodes = [helper.make_node("FusedMatMul", ["x", "W"], ["h"], domain="com.microsoft",
                              alpha=0.5, name="fmm"),
             helper.make_node("Gelu", ["h"], ["g"], domain="com.microsoft", name="gelu"),
             helper.make_node("Transpose", ["g"], ["y"], perm=[1, 0], name="tr")]
    model = make(nodes, [vi("x", ["n", 16])], [vi("y", None)], [weight("W", (16, 24))],
                 opsets=(("", 17), ("com.microsoft", 1)))
    path = save(model, tmp_path / "ms.onnx")
    g = OpGraph.from_onnx(path, {"x": (5, 16)})
    assert g.shapes_from == "onnxruntime"
    check_against_file_and_runtime(path, g, {"x": (5, 16)})
    assert g.tensors["y"].shape == (24, 5)


def test_weight_free_shape_arithmetic_is_run_alone(tmp_path):
    # Range's length comes from the input's shape: inference cannot size it, and so not the
    # embedding lookup it feeds; running only the weight-free nodes (Shape, Gather, Range)
    # is enough, the 256 KB embedding table is never needed
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0, name="seq"),
             helper.make_node("Range", ["zero", "seq", "one"], ["pos"], name="range"),
             helper.make_node("Gather", ["E", "pos"], ["emb"], axis=0, name="lookup"),
             helper.make_node("MatMul", ["x", "emb"], ["y"], name="mm")]
    inits = [weight("E", (512, 128)),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "one")]
    model = make(nodes, [vi("x", ["b", "s"])], [vi("y", None)], inits)
    path = save(model, tmp_path / "range.onnx")
    g = OpGraph.from_onnx(path, {"x": (3, 20)})
    assert g.shapes_from == "onnxruntime-partial"
    check_against_file_and_runtime(path, g, {"x": (3, 20)})
    assert g.tensors["emb"].shape == (20, 128) and g.tensors["y"].shape == (3, 128)


def test_static_model_needs_no_run_and_constants_are_node_data(tmp_path):
    c = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "cv")
    nodes = [helper.make_node("Constant", [], ["c"], value=c, name="const"),
             helper.make_node("Constant", [], ["shape"], value_ints=[4, 3], name="shape_const"),
             helper.make_node("Reshape", ["c", "shape"], ["cr"], name="reshape"),
             helper.make_node("MatMul", ["x", "cr"], ["y"], name="mm")]
    path = save(make(nodes, [vi("x", [2, 4])], [vi("y", [2, 3])]), tmp_path / "c.onnx")
    g = OpGraph.from_onnx(path)
    assert g.shapes_from == "shape-inference"
    check_against_file_and_runtime(path, g)
    assert OpGraph.from_onnx(path, check_runtime=False) == g
    assert g.node("const").data_bytes == 48 and g.node("shape_const").data_bytes == 16
    assert g.tensors["c"].producer == "const" and g.initializers == ()


def test_weight_values_that_steer_shapes_are_read_when_needed(tmp_path):
    # a large int64 weight (160 KB) whose first values are a Reshape target: the skeleton
    # feeds it without its values, the Reshape fails, the importer retries with real weights
    table = np.arange(20000, dtype=np.int64)
    table[:2] = (3, 4)
    nodes = [helper.make_node("Slice", ["table", "starts", "ends"], ["target"], name="slice"),
             helper.make_node("Reshape", ["x", "target"], ["r"], name="reshape"),
             helper.make_node("Relu", ["r"], ["y"], name="relu")]
    inits = [numpy_helper.from_array(table, "table"),
             numpy_helper.from_array(np.array([0], np.int64), "starts"),
             numpy_helper.from_array(np.array([2], np.int64), "ends")]
    path = save(make(nodes, [vi("x", [12])], [vi("y", None)], inits), tmp_path / "steer.onnx")
    g = OpGraph.from_onnx(path)
    check_against_file_and_runtime(path, g)
    assert g.tensors["y"].shape == (3, 4) and g.tensors["table"].bytes == 160000


def test_unnamed_and_duplicate_names_are_unique_and_stable(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Relu", ["a"], ["b"], name="Relu_0"),
             helper.make_node("Neg", ["b"], ["c"], name="dup"),
             helper.make_node("Neg", ["c"], ["y"], name="dup")]
    path = save(make(nodes, [vi("x", [2])], [vi("y", [2])]), tmp_path / "n.onnx")
    names = [n.name for n in OpGraph.from_onnx(path).nodes]
    assert len(set(names)) == 4 and "Relu_0" in names and "dup" in names
    assert names == [n.name for n in OpGraph.from_onnx(path).nodes]


def test_nodes_out_of_file_order_are_sorted(tmp_path):
    nodes = [helper.make_node("Neg", ["b"], ["y"], name="last"),
             helper.make_node("Relu", ["x"], ["a"], name="first"),
             helper.make_node("Exp", ["a"], ["b"], name="middle")]
    path = save(make(nodes, [vi("x", [2])], [vi("y", [2])]), tmp_path / "o.onnx")
    g = OpGraph.from_onnx(path)
    assert [n.name for n in g.nodes] == ["first", "middle", "last"]
    assert [n.index for n in g.nodes] == [1, 2, 0]


# ------------------------------------------------------------------ errors


def one_line_error(path, shapes=None) -> str:
    with pytest.raises(ModelError) as e:
        OpGraph.from_onnx(path, shapes)
    assert isinstance(e.value, OnnxsplitError)
    msg = str(e.value)
    assert msg and "\n" not in msg and len(msg) < 500
    return msg


@pytest.fixture
def good(tmp_path) -> Path:
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    return save(make(nodes, [vi("x", ["batch", 64])], [vi("y", ["batch", 64])],
                     [weight("W", (64, 64))]), tmp_path / "good.onnx")


def test_error_missing_file(tmp_path):
    assert "does not exist" in one_line_error(tmp_path / "nope.onnx")


def test_error_empty_file(tmp_path):
    (tmp_path / "e.onnx").write_bytes(b"")
    assert "empty" in one_line_error(tmp_path / "e.onnx")


def test_error_text_file(tmp_path):
    p = tmp_path / "t.onnx"
    p.write_text("This is a README, not a model.\nIt has two lines.\n")
    assert "not" in one_line_error(p) and "ONNX" in one_line_error(p)


@pytest.mark.parametrize("fraction", [0.5, 0.9, 0.1])
def test_error_truncated_file(good, tmp_path, fraction):
    data = good.read_bytes()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: int(len(data) * fraction)])
    one_line_error(p, {"x": (1, 64)})


def test_every_truncation_is_a_model_error(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    data = save(make(nodes, [vi("x", [1, 4])], [vi("y", [1, 4])], [weight("W", (4, 4))]),
                tmp_path / "small.onnx").read_bytes()
    p = tmp_path / "cut.onnx"
    for k in range(len(data)):
        p.write_bytes(data[:k])
        one_line_error(p)


def test_error_directory(tmp_path):
    assert "directory" in one_line_error(tmp_path)


def test_error_unbound_dimension(good):
    msg = one_line_error(good)
    assert "'x'" in msg and "dimension 0" in msg and "'batch'" in msg
    assert "--input-shape x=Nx64" in msg
    assert OpGraph.from_onnx(good, {"x": (7, 64)}).tensors["y"].shape == (7, 64)


def test_error_bad_input_shapes(good):
    assert "'z'" in one_line_error(good, {"z": (1, 64)})
    assert "'W'" in one_line_error(good, {"x": (1, 64), "W": (64, 64)})
    assert "2 dimensions" in one_line_error(good, {"x": (1, 64, 1)})
    assert "fixed to 64" in one_line_error(good, {"x": (1, 32)})


def test_error_no_operators(tmp_path):
    model = make([], [vi("x", [2])], [vi("x", [2])])
    assert "no operators" in one_line_error(save(model, tmp_path / "empty_graph.onnx"))


def test_error_dangling_input(tmp_path):
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")]
    msg = one_line_error(save(make(nodes, [vi("x", [2])], [vi("y", [2])]), tmp_path / "d.onnx"))
    assert "'adder'" in msg and "'ghost'" in msg


def test_error_dangling_captured_input(tmp_path):
    branch = helper.make_graph([helper.make_node("Neg", ["ghost"], ["z"])], "b", [],
                               [vi("z", [2])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="iff", then_branch=branch,
                              else_branch=branch)]
    model = make(nodes, [vi("c", [], TP.BOOL)], [vi("y", [2])])
    msg = one_line_error(save(model, tmp_path / "dc.onnx"))
    assert "'iff'" in msg and "'ghost'" in msg


def test_error_cycle(tmp_path):
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
             helper.make_node("Relu", ["a"], ["b"], name="n2"),
             helper.make_node("Neg", ["a"], ["y"], name="n3")]
    msg = one_line_error(save(make(nodes, [vi("x", [2])], [vi("y", [2])]), tmp_path / "c.onnx"))
    assert "cycle" in msg and ("'n1'" in msg or "'n2'" in msg)


def test_error_two_producers(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="p1"),
             helper.make_node("Neg", ["x"], ["y"], name="p2")]
    msg = one_line_error(save(make(nodes, [vi("x", [2])], [vi("y", [2])]), tmp_path / "p.onnx"))
    assert "'p1'" in msg and "'p2'" in msg


def test_error_op_onnxruntime_cannot_run(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("Foo", ["h"], ["y"], domain="com.example", name="custom")]
    model = make(nodes, [vi("x", [2])], [vi("y", [2])], opsets=(("", 17), ("com.example", 1)))
    msg = one_line_error(save(model, tmp_path / "foo.onnx"))
    assert "'custom'" in msg and "com.example::Foo" in msg and "onnxruntime" in msg
