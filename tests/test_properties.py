"""Properties over random inputs (hypothesis): any valid ONNX DAG cut by any valid plan
reproduces the original; any damage to a parts folder's manifest is one line, never a
traceback."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from onnx_models import make, save, vi
from test_export import switch_pieces  # a piece at every device switch: always exportable
from onnxsplit.cli import main
from onnxsplit.export import MANIFEST, export
from onnxsplit.graph import OpGraph
from onnxsplit.running.runner import Parts

CPU = "CPUExecutionProvider"
SHAPE = [2, 4]
UNARY = ["Relu", "Tanh", "Neg", "Abs", "Sigmoid"]
BINARY = ["Add", "Mul", "Sub", "Max"]
KINDS = ["unary", "binary", "matmul", "concat_split", "reshape", "if", "cast"]
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,  # the same cases in CI
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@st.composite
def dags(draw):
    """(model proto, number of nodes): 2-10 steps over [2, 4] float tensors, each reading
    earlier tensors (so the graph is a DAG with branches and joins)."""
    nodes, inits, tensors = [], [], ["x", "y"]
    counter = iter(range(10_000))

    def fresh(stem: str) -> str:
        return f"{stem}{next(counter)}"

    def pick() -> str:
        return tensors[draw(st.integers(0, len(tensors) - 1))]

    for _ in range(draw(st.integers(2, 10))):
        kind = draw(st.sampled_from(KINDS))
        a = pick()
        out = fresh("t")
        if kind == "unary":
            nodes.append(helper.make_node(draw(st.sampled_from(UNARY)), [a], [out], name=fresh("u")))
        elif kind == "binary":
            nodes.append(helper.make_node(draw(st.sampled_from(BINARY)), [a, pick()], [out],
                                          name=fresh("b")))
        elif kind == "matmul":
            w = fresh("w")
            inits.append(numpy_helper.from_array(
                np.random.default_rng(len(inits)).standard_normal((4, 4)).astype(np.float32), w))
            nodes.append(helper.make_node("MatMul", [a, w], [out], name=fresh("mm")))
        elif kind == "concat_split":
            cat, other = fresh("cat"), fresh("s")
            sizes = fresh("sizes")
            inits.append(numpy_helper.from_array(np.array([4, 4], np.int64), sizes))
            nodes.append(helper.make_node("Concat", [a, pick()], [cat], name=fresh("c"), axis=1))
            nodes.append(helper.make_node("Split", [cat, sizes], [out, other], name=fresh("sp"), axis=1))
            tensors.append(other)
        elif kind == "reshape":
            mid, s1, s2 = fresh("r"), fresh("shape"), fresh("shape")
            inits += [numpy_helper.from_array(np.array([4, 2], np.int64), s1),
                      numpy_helper.from_array(np.array(SHAPE, np.int64), s2)]
            nodes.append(helper.make_node("Reshape", [a, s1], [mid], name=fresh("rs")))
            nodes.append(helper.make_node("Reshape", [mid, s2], [out], name=fresh("rs")))
        elif kind == "if":  # branches read outer-scope tensors
            b, s, c, zero = pick(), fresh("sum"), fresh("cond"), fresh("zero")
            inits.append(numpy_helper.from_array(np.array(0.0, np.float32), zero))
            t_out, e_out = fresh("then"), fresh("else")
            then_g = helper.make_graph([helper.make_node("Add", [a, b], [t_out], name=fresh("ta"))],
                                       fresh("then_g"), [], [vi(t_out, SHAPE)])
            else_g = helper.make_graph([helper.make_node("Sub", [a, b], [e_out], name=fresh("es"))],
                                       fresh("else_g"), [], [vi(e_out, SHAPE)])
            nodes.append(helper.make_node("ReduceSum", [a], [s], name=fresh("rsum"), keepdims=0))
            nodes.append(helper.make_node("Greater", [s, zero], [c], name=fresh("gt")))
            nodes.append(helper.make_node("If", [c], [out], name=fresh("if"),
                                          then_branch=then_g, else_branch=else_g))
        else:  # through another dtype and back
            mid, mid2 = fresh("c"), fresh("c")
            to = draw(st.sampled_from([TP.DOUBLE, TP.INT64]))
            nodes.append(helper.make_node("Cast", [a], [mid], name=fresh("cast"), to=to))
            nodes.append(helper.make_node("Add", [mid, mid], [mid2], name=fresh("add")))
            nodes.append(helper.make_node("Cast", [mid2], [out], name=fresh("cast"), to=TP.FLOAT))
        tensors.append(out)
    outputs = sorted({tensors[-1], *draw(st.lists(st.sampled_from(tensors[2:]), max_size=2))})
    model = make(nodes, [vi("x", SHAPE), vi("y", SHAPE)], [vi(o, SHAPE) for o in outputs], inits)
    return model, len(nodes)


@settings(SETTINGS, max_examples=150)
@given(data=st.data())
def test_any_dag_cut_by_any_plan_reproduces_the_original(tmp_path, data):
    model, n = data.draw(dags())
    case = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
    case.mkdir()
    path = save(model, case / "m.onnx")
    g = OpGraph.from_onnx(path)
    devices = data.draw(st.lists(st.integers(0, 2), min_size=len(g.nodes), max_size=len(g.nodes)))
    device_of = {node.name: f"cpu{d}" for node, d in zip(g.nodes, devices)}
    e = export(g, device_of, case / "parts", providers={f"cpu{i}": CPU for i in range(3)},
               piece_of=switch_pieces(g, device_of))
    rng = np.random.default_rng(n)
    feeds = {name: rng.standard_normal(SHAPE).astype(np.float32) for name in ("x", "y")}
    sess = ort.InferenceSession(str(path), providers=[CPU])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    got = Parts(e.out).run(feeds)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**12) | st.floats(allow_nan=True) |
    st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6)


def _paths(obj, prefix=()):
    """Every (path to a value) in a JSON object."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    from onnx_models import mlp

    tmp = tmp_path_factory.mktemp("made")
    model = mlp(tmp / "m.onnx", layers=3, batch=2, width=8)
    g = OpGraph.from_onnx(model)
    half = len(g.nodes) // 2
    device_of = {node.name: f"cpu{int(i >= half)}" for i, node in enumerate(g.nodes)}
    export(g, device_of, tmp / "parts", providers={"cpu0": CPU, "cpu1": CPU})
    return tmp / "parts"


@SETTINGS
@given(data=st.data())
def test_any_damaged_manifest_is_one_line_or_runs(made, tmp_path, capsys, data):
    """A value anywhere in manifest.json replaced (or removed): ``run`` checks the outputs
    or ends with one line naming the problem, never a traceback."""
    case = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
    shutil.copytree(made, case)
    manifest = json.loads((case / MANIFEST).read_text())
    paths = [p for p in _paths(manifest) if p]
    where = data.draw(st.sampled_from(paths))
    parent = manifest
    for key in where[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()) and isinstance(parent, dict):
        del parent[where[-1]]
    else:
        parent[where[-1]] = data.draw(JSON_VALUES)
    (case / MANIFEST).write_text(json.dumps(manifest))
    code = main(["run", str(case), "--no-measure"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code in (0, 1, 2)
    if code == 2:
        assert len(err) == 1 and err[0].startswith("onnxsplit: error: "), err


@SETTINGS
@given(data=st.data())
def test_any_damaged_part_file_is_one_line(made, tmp_path, capsys, data):
    """Bytes of a part file cut off, flipped or replaced: one line, never a traceback."""
    case = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
    shutil.copytree(made, case)
    part = sorted(case.glob("part*.onnx"))[data.draw(st.integers(0, 1))]
    blob = bytearray(part.read_bytes())
    how = data.draw(st.sampled_from(["cut", "flip", "replace"]))
    at = data.draw(st.integers(0, len(blob) - 1))
    if how == "cut":
        blob = blob[:at]
    elif how == "flip":
        blob[at] ^= 0xFF
    else:
        blob = bytearray(data.draw(st.binary(max_size=64)))
    part.write_bytes(bytes(blob))
    code = main(["run", str(case), "--no-measure"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code in (0, 1, 2)
    if code != 0:
        assert err and err[-1].startswith("onnxsplit: "), err
        assert not any(line.startswith("Traceback") for line in err)
