"""Export and runner: random plans become folders of parts that reproduce the original model
(checked against onnxruntime on the original), share one weights file, carry a consistent
manifest, keep subgraph nodes whole, and fail cleanly."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

import networkx as nx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import AttributeProto, TensorProto
from onnx import helper, numpy_helper
from onnx.external_data_helper import set_external_data

from onnx_models import (TINY_BERT, TINY_BERT_SHAPES, control_flow, make, mlp, save,
                         shared_weight, vi, weight)
from onnxsplit.providers import openvino
from onnxsplit.profile.devices import available_providers
from onnxsplit.errors import OnnxsplitError, SplitError
from onnxsplit.export import ANNOTATED, INLINE_BYTES, MANIFEST, WEIGHTS, export, make_parts
from onnxsplit.graph import OpGraph
from onnxsplit.running.compare import ROUNDS, run_parts
from onnxsplit.running.runner import (Parts, RunError, compare_outputs, random_feeds, read_manifest,
                                      single_device_ep)
from onnxsplit.running.verify import tolerance as verify_tolerance

CPU = "CPUExecutionProvider"
ATOL = 1e-5
MAX_IR = 13  # the newest IR version onnxruntime loads


# ------------------------------------------------------------------------------ helpers


def providers(n: int = 8) -> dict[str, str]:
    return {f"cpu{i}": CPU for i in range(n)}


def make_feeds(g: OpGraph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs for the bound shapes: normal floats, token ids below the vocabulary, 0/1 masks."""
    feeds = {}
    for name in g.inputs:
        t = g.tensors[name]
        if t.dtype.startswith("float"):
            feeds[name] = rng.standard_normal(t.shape).astype(t.dtype)
        elif name == "attention_mask":
            m = rng.integers(0, 2, t.shape).astype(t.dtype)
            m[..., 0] = 1
            feeds[name] = m
        else:
            feeds[name] = rng.integers(0, 100, t.shape).astype(t.dtype)
    return feeds


def reference(model: Path, feeds) -> dict[str, np.ndarray]:
    """The original model in one onnxruntime session, outputs by name."""
    sess = ort.InferenceSession(str(model), providers=[CPU])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, dict(feeds))))


def assert_outputs(got, want) -> None:
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape, k
        np.testing.assert_allclose(got[k], want[k], atol=ATOL, rtol=0, err_msg=k)


def all_tensors(graph: onnx.GraphProto):
    """Every tensor proto in a graph: initializers and attribute tensors, subgraphs included."""
    yield from graph.initializer
    for s in graph.sparse_initializer:
        yield s.values
    for n in graph.node:
        for a in n.attribute:
            if a.type == AttributeProto.TENSOR:
                yield a.t
            elif a.type == AttributeProto.TENSORS:
                yield from a.tensors
            elif a.type == AttributeProto.GRAPH:
                yield from all_tensors(a.g)
            elif a.type == AttributeProto.GRAPHS:
                for sg in a.graphs:
                    yield from all_tensors(sg)


def ext_info(t: TensorProto) -> tuple[str, int, int]:
    info = {e.key: e.value for e in t.external_data}
    return info["location"], int(info.get("offset", 0)), int(info["length"])


def within(seconds: float, fn):
    """Run ``fn`` in a thread; fail (instead of hanging) if it does not finish in time.
    Returns (result, exception, seconds)."""
    box: dict = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    start = time.monotonic()
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"did not finish within {seconds} s (hung?)"
    return box.get("result"), box.get("error"), time.monotonic() - start


def leftovers(parent: Path, out_name: str) -> list[str]:
    """Hidden staging or backup folders an export may have left beside ``out``."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{out_name}."))


# ------------------------------------------------------------------------------ models


def late_input(path: Path) -> Path:
    """x -> Relu -> a; Add(a, z) -> y: the model input z is read only by the second node."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Add", ["a", "z"], ["y"], name="add")]
    return save(make(nodes, [vi("x", [8, 16]), vi("z", [8, 16])], [vi("y", [8, 16])]), path)


def captured_weights(path: Path, external: bool = False) -> Path:
    """An If whose then-branch owns a big initializer and whose else-branch captures a big
    outer weight and holds a Constant; a big top-level Constant after it."""
    wt = weight("Wt", (64, 64), 1)
    wo = weight("Wo", (64, 64), 2)
    kc = numpy_helper.from_array(np.linspace(-1, 1, 64).astype(np.float32), "kc_value")
    k = numpy_helper.from_array(
        np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32) * 0.05, "K_value")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["h", "Wt"], ["t_out"], name="then_mm")],
        "then", [], [vi("t_out", [4, 64])], [wt])
    else_g = helper.make_graph(
        [helper.make_node("MatMul", ["h", "Wo"], ["e_mm"], name="else_mm"),
         helper.make_node("Constant", [], ["kc"], name="else_const", value=kc),
         helper.make_node("Add", ["e_mm", "kc"], ["e_out"], name="else_add")],
        "else", [], [vi("e_out", [4, 64])])
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("ReduceSum", ["h"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="greater"),
        helper.make_node("If", ["c"], ["branch"], name="if", then_branch=then_g, else_branch=else_g),
        helper.make_node("Add", ["branch", "h"], ["a"], name="add"),
        helper.make_node("Constant", [], ["K"], name="const_k", value=k),
        helper.make_node("MatMul", ["a", "K"], ["y"], name="out"),
    ]
    model = make(nodes, [vi("x", [4, 64])], [vi("y", [4, 64])], [wo, zero])
    if not external:
        return save(model, path)
    model.ir_version = 10
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="w.data", size_threshold=0)
    # onnx moves initializers (subgraphs' too) out, not Constant values: move those by hand
    model = onnx.load(str(path), load_external_data=False)
    with open(path.parent / "w.data", "ab") as f:
        for t in all_tensors(model.graph):
            if t.data_location != TensorProto.EXTERNAL:
                offset = f.tell()
                f.write(t.raw_data)
                set_external_data(t, "w.data", offset, len(t.raw_data))
                t.ClearField("raw_data")
                t.data_location = TensorProto.EXTERNAL
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    paths = {
        "tiny_bert": (TINY_BERT, TINY_BERT_SHAPES),
        "mlp": (mlp(d / "mlp.onnx", layers=4, batch=8, width=64), None),
        "control_flow": (control_flow(d / "cf.onnx"), None),
        "shared_weight": (shared_weight(d / "shared.onnx"), None),
        "late_input": (late_input(d / "late.onnx"), None),
        "captured": (captured_weights(d / "captured.onnx"), None),
    }
    return {k: (Path(p), OpGraph.from_onnx(p, s)) for k, (p, s) in paths.items()}


# ------------------------------------------------------------------------------ checks


def check_export(model: Path, g: OpGraph, e, device_of, piece_of=None) -> None:
    """Everything an export promises, against independent computations on the graph."""
    out = Path(e.out)
    man = json.loads((out / MANIFEST).read_text())
    assert man == e.manifest
    names = [p["name"] for p in man["parts"]]
    assert names == [p.name for p in e.parts]
    assert sorted(f.name for f in out.iterdir()) == sorted(
        [p["file"] for p in man["parts"]] + [MANIFEST, ANNOTATED] + ([WEIGHTS] if man["weights"]["file"] else []))

    # every node in exactly one part, on its device, one (device, piece) per part
    part_of = {}
    for i, p in enumerate(e.parts):
        assert p.name == f"part{i}_{p.device}" and man["parts"][i]["file"] == f"{p.name}.onnx"
        assert man["parts"][i]["nodes"] == len(p.nodes)
        keys = {(device_of[n], (piece_of or {}).get(n, 0)) for n in p.nodes}
        assert len(keys) == 1 and next(iter(keys))[0] == p.device
        for n in p.nodes:
            assert n not in part_of
            part_of[n] = p.name
    assert set(part_of) == {n.name for n in g.nodes}
    n_keys = len({(device_of[n.name], (piece_of or {}).get(n.name, 0)) for n in g.nodes})
    assert len(e.parts) == n_keys

    # crossing tensors, part inputs and outputs, computed from the graph's edges
    crossing: dict[str, tuple[str, set]] = {}
    want_in = {p.name: set() for p in e.parts}
    want_out = {p.name: set() for p in e.parts}
    for n in g.nodes:
        for t in n.dependencies:
            tt = g.tensors[t]
            if tt.kind == "initializer":
                continue
            if tt.kind == "input":
                want_in[part_of[n.name]].add(t)
            elif part_of[tt.producer] != part_of[n.name]:
                want_in[part_of[n.name]].add(t)
                want_out[part_of[tt.producer]].add(t)
                crossing.setdefault(t, (part_of[tt.producer], set()))[1].add(part_of[n.name])
    for o in g.outputs:
        want_out[part_of[g.tensors[o].producer]].add(o)
    got_crossing = {t["name"]: (t["producer"], set(t["consumers"])) for t in man["tensors"]}
    assert got_crossing == crossing
    for t in man["tensors"]:
        tt = g.tensors[t["name"]]
        assert (t["dtype"], tuple(t["shape"]), t["bytes"]) == (tt.dtype, tuple(tt.shape), tt.bytes)
        devs = {p.name: p.device for p in e.parts}
        assert t["cross_device"] == any(devs[c] != devs[t["producer"]] for c in t["consumers"])

    earlier: set[str] = set()
    for entry in man["parts"]:
        path = out / entry["file"]
        # execution order: each input comes from the model or an earlier part
        for i in entry["inputs"]:
            if i["from"] == "input":
                assert i["name"] in g.inputs
            else:
                assert i["from"] in earlier and i["from"] == part_of[g.tensors[i["name"]].producer]
            tt = g.tensors[i["name"]]
            assert (i["dtype"], tuple(i["shape"]), i["bytes"]) == (tt.dtype, tuple(tt.shape), tt.bytes)
        earlier.add(entry["name"])
        assert {i["name"] for i in entry["inputs"]} == want_in[entry["name"]]
        outs = {o["name"] for o in entry["outputs"]}
        assert want_out[entry["name"]] <= outs
        assert outs == want_out[entry["name"]] or len(outs) == 1  # a dead-end part keeps one
        for o in entry["outputs"]:
            assert set(o["to"]) == (crossing[o["name"]][1] if o["name"] in crossing else set())
            assert o["model_output"] == (o["name"] in g.outputs)

        # the file: valid, loadable, its graph matching the manifest and its metadata
        onnx.checker.check_model(str(path))
        m = onnx.load(str(path), load_external_data=False)
        assert m.ir_version <= MAX_IR
        ort.InferenceSession(str(path), providers=[CPU])
        assert [i.name for i in m.graph.input] == [i["name"] for i in entry["inputs"]]
        assert [o.name for o in m.graph.output] == [o["name"] for o in entry["outputs"]]
        assert [n.name for n in m.graph.node] == list(e.parts[names.index(entry["name"])].nodes)
        meta = {p.key: p.value for p in m.metadata_props}
        assert meta["onnxsplit.part"] == entry["name"]
        assert meta["onnxsplit.device"] == entry["device"]
        assert meta["onnxsplit.execution_provider"] == entry["execution_provider"] == CPU
        assert meta["onnxsplit.format"] == man["format"]
        assert json.loads(meta["onnxsplit.inputs"]) == {i["name"]: i["from"] for i in entry["inputs"]}
        assert json.loads(meta["onnxsplit.outputs"]) == {
            o["name"]: o["to"] + (["output"] if o["model_output"] else []) for o in entry["outputs"]}
        # the weights its nodes read, and only those
        reads = {t for n in m.graph.node for t in g.node(n.name).dependencies
                 if g.tensors[t].kind == "initializer"}
        assert {t.name for t in m.graph.initializer} == reads

    assert [o["name"] for o in man["model"]["outputs"]] == list(g.outputs)
    for o in man["model"]["outputs"]:
        assert o["from"] == part_of[g.tensors[o["name"]].producer]
    assert [i["name"] for i in man["model"]["inputs"]] == list(g.inputs)
    assert man["model"]["nodes"] == len(g.nodes)
    assert Path(man["model"]["path"]) == Path(model).resolve()
    check_weights(model, out)


def check_weights(model: Path, out: Path) -> None:
    """Big weights live once in weights.bin, bit-identical to the original's; small ones inline."""
    orig = onnx.load(str(model))  # external data loaded
    values = {t.name: numpy_helper.to_array(t) for t in all_tensors(orig.graph) if t.name}
    placed: dict[str, tuple[int, int]] = {}
    blob = (out / WEIGHTS).read_bytes() if (out / WEIGHTS).exists() else b""
    for f in sorted(out.glob("part*.onnx")):
        m = onnx.load(str(f), load_external_data=False)
        for t in all_tensors(m.graph):
            if t.data_location == TensorProto.EXTERNAL:
                loc, off, length = ext_info(t)
                assert loc == WEIGHTS
                assert placed.setdefault(t.name, (off, length)) == (off, length)  # stored once
                want = values[t.name]
                assert length == want.nbytes and off + length <= len(blob)
                got = np.frombuffer(blob[off:off + length], dtype=want.dtype).reshape(want.shape)
                np.testing.assert_array_equal(got, want)
        for t in m.graph.initializer:  # a part's own weights: inline only when small
            if t.data_location != TensorProto.EXTERNAL and t.data_type != TensorProto.STRING:
                assert values[t.name].nbytes <= INLINE_BYTES, t.name
        full = onnx.load(str(f))  # resolves weights.bin relative to the part
        for t in all_tensors(full.graph):
            if t.name in values:
                np.testing.assert_array_equal(numpy_helper.to_array(t), values[t.name])
    # no two weights overlap in the file
    spans = sorted(placed.values())
    for (a, la), (b, _) in zip(spans, spans[1:]):
        assert a + la <= b
    man = json.loads((out / MANIFEST).read_text())
    assert man["weights"]["tensors"] == len(placed)
    assert man["weights"]["bytes"] == len(blob)
    assert (man["weights"]["file"] is None) == (not placed)


def run_and_compare(model: Path, g: OpGraph, out: Path, seed: int, samples: int = 3) -> None:
    rng = np.random.default_rng(seed)
    feeds = [make_feeds(g, rng) for _ in range(samples)]
    want = [reference(model, f) for f in feeds]
    parts = Parts(out)
    for f, w in zip(feeds, want):
        assert_outputs(parts.run(f), w)
    for depth in (1, None):
        got = list(parts.stream(feeds, depth=depth))
        assert len(got) == samples
        for gg, w in zip(got, want):  # in the order of the samples
            assert_outputs(gg, w)


# ------------------------------------------------------------------------------ random plans


def contiguous_plan(g: OpGraph, rng, k: int):
    names = [n.name for n in g.nodes]
    k = min(k, len(names))
    cuts = sorted(rng.choice(np.arange(1, len(names)), k - 1, replace=False).tolist())
    bounds = [0, *cuts, len(names)]
    return [names[bounds[c]:bounds[c + 1]] for c in range(k)]


def random_topological_order(g: OpGraph, rng) -> list[str]:
    """A random linear extension of the graph (Kahn's algorithm, a random ready node each step)."""
    indeg = {n.name: len(g.predecessors(n.name)) for n in g.nodes}
    ready = [n for n, d in indeg.items() if d == 0]
    order = []
    while ready:
        v = ready.pop(int(rng.integers(len(ready))))
        order.append(v)
        for s in g.successors(v):
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    assert len(order) == len(g.nodes)
    return order


def switch_pieces(g: OpGraph, device_of) -> dict[str, int]:
    """A new piece at every device switch along a path: the pieces always form a DAG."""
    piece: dict[str, int] = {}
    for n in g.nodes:
        piece[n.name] = max([piece[u] + (device_of[u] != device_of[n.name])
                             for u in g.predecessors(n.name)], default=0)
    return piece


def device_cycle(g: OpGraph, device_of) -> bool:
    d = nx.DiGraph()
    d.add_nodes_from(set(device_of.values()))
    d.add_edges_from((device_of[e.producer], device_of[e.consumer]) for e in g.edges
                     if device_of[e.producer] != device_of[e.consumer])
    return not nx.is_directed_acyclic_graph(d)


PLAN_MODELS = ["tiny_bert", "mlp", "control_flow"]


@pytest.mark.parametrize("name", PLAN_MODELS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_contiguous_plans(models, tmp_path, name, seed):
    model, g = models[name]
    rng = np.random.default_rng(seed)
    # one chunk of the topological order per device
    chunks = contiguous_plan(g, rng, int(rng.integers(2, 7)))
    device_of = {n: f"cpu{c}" for c, chunk in enumerate(chunks) for n in chunk}
    e = export(g, device_of, tmp_path / "a", providers=providers())
    assert [p.nodes for p in e.parts] == [tuple(c) for c in chunks]
    check_export(model, g, e, device_of)
    run_and_compare(model, g, e.out, seed)
    # chunks on fewer devices, a device coming back: one piece per chunk
    devices = int(rng.integers(1, len(chunks))) if len(chunks) > 1 else 1
    device_of = {n: f"cpu{c % devices}" for c, chunk in enumerate(chunks) for n in chunk}
    piece_of = {n: c for c, chunk in enumerate(chunks) for n in chunk}
    e = export(g, device_of, tmp_path / "b", providers=providers(), piece_of=piece_of)
    assert len(e.parts) == len(chunks)
    check_export(model, g, e, device_of, piece_of)
    run_and_compare(model, g, e.out, seed + 10, samples=2)


@pytest.mark.parametrize("name", PLAN_MODELS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_scattered_plans(models, tmp_path, name, seed):
    model, g = models[name]
    rng = np.random.default_rng(100 + seed)
    k = int(rng.integers(2, 4))
    device_of = {n.name: f"cpu{rng.integers(k)}" for n in g.nodes}
    # without pieces: a cycle between devices is refused, anything else runs
    if device_cycle(g, device_of):
        with pytest.raises(SplitError, match="cycle"):
            export(g, device_of, tmp_path / "a", providers=providers())
        assert not (tmp_path / "a").exists() and not leftovers(tmp_path, "a")
    else:
        e = export(g, device_of, tmp_path / "a", providers=providers())
        assert len(e.parts) == len(set(device_of.values()))
        check_export(model, g, e, device_of)
        run_and_compare(model, g, e.out, seed, samples=2)
    # with a piece at every device switch it always exports
    piece_of = switch_pieces(g, device_of)
    e = export(g, device_of, tmp_path / "b", providers=providers(), piece_of=piece_of)
    check_export(model, g, e, device_of, piece_of)
    run_and_compare(model, g, e.out, seed, samples=2)
    assert run_parts(e.out, measure=False, seed=seed)["verify"]["max_abs_error"] < ATOL
    # chunks of a random linear extension: convex parts, not runs of the file's order
    order = random_topological_order(g, rng)
    k = min(int(rng.integers(2, 7)), len(order))
    cuts = sorted(rng.choice(np.arange(1, len(order)), k - 1, replace=False).tolist())
    bounds = [0, *cuts, len(order)]
    device_of = {n: f"cpu{c}" for c in range(k) for n in order[bounds[c]:bounds[c + 1]]}
    assert not device_cycle(g, device_of)
    e = export(g, device_of, tmp_path / "c", providers=providers())
    assert [p.device for p in e.parts] == [f"cpu{c}" for c in range(k)]
    check_export(model, g, e, device_of)
    run_and_compare(model, g, e.out, seed, samples=2)


# ------------------------------------------------------------------------------ weights


def test_weights_stored_once(models, tmp_path):
    model, g = models["mlp"]
    # every layer on its own device: each weight still written once, offsets aligned
    device_of = {n.name: f"cpu{n.name[-1]}" for n in g.nodes}
    e = export(g, device_of, tmp_path / "out", providers=providers())
    assert len(e.parts) == 4
    big = [t for t in g.weights if t.bytes > INLINE_BYTES]
    assert {t.name for t in big} == {f"W{i}" for i in range(4)}  # biases (256 B) stay inline
    size = (e.out / WEIGHTS).stat().st_size
    total = sum(t.bytes for t in big)
    assert total <= size < total + 64 * len(big)
    assert e.manifest["weights"] == {"file": WEIGHTS, "bytes": size, "tensors": len(big)}
    offsets = set()
    for p in e.parts:
        m = onnx.load(str(e.out / p.file), load_external_data=False)
        for t in m.graph.initializer:
            if t.name.startswith("W"):
                loc, off, length = ext_info(t)
                assert (loc, length) == (WEIGHTS, g.tensors[t.name].bytes) and off % 64 == 0
                offsets.add(off)
            else:
                assert t.data_location != TensorProto.EXTERNAL and t.raw_data
    assert len(offsets) == 4
    check_weights(model, e.out)


def test_weight_read_by_two_parts_is_stored_once(models, tmp_path):
    model, g = models["shared_weight"]
    device_of = {"relu": "cpu0", "mm1": "cpu0", "add1": "cpu0", "mm2": "cpu1", "add2": "cpu1"}
    e = export(g, device_of, tmp_path / "out", providers=providers())
    assert [p.device for p in e.parts] == ["cpu0", "cpu1"]
    refs = []
    for p in e.parts:
        m = onnx.load(str(e.out / p.file), load_external_data=False)
        by_name = {t.name: t for t in m.graph.initializer}
        assert set(by_name) == {"W", "bias"}
        refs.append(ext_info(by_name["W"]))
        assert by_name["bias"].data_location != TensorProto.EXTERNAL  # 1 KiB: inline
    assert refs[0] == refs[1] == (WEIGHTS, 0, 256 * 256 * 4)
    # both parts together read 512 KiB of W; the file holds it once
    assert (e.out / WEIGHTS).stat().st_size == 256 * 256 * 4
    assert e.manifest["weights"]["tensors"] == 1
    check_export(model, g, e, device_of)
    run_and_compare(model, g, e.out, 0)


def test_small_weights_only_write_no_weights_file(models, tmp_path):
    model, g = models["control_flow"]
    e = export(g, {n.name: "cpu0" for n in g.nodes}, tmp_path / "out", providers=providers())
    assert not (e.out / WEIGHTS).exists()
    assert e.manifest["weights"] == {"file": None, "bytes": 0, "tensors": 0}
    assert [p.name for p in e.parts] == ["part0_cpu0"]
    run_and_compare(model, g, e.out, 0)


def test_external_data_model(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    path = mlp(tmp_path / "plain.onnx", layers=3, batch=8, width=64)
    m = onnx.load(str(path))
    m.ir_version = 10
    onnx.save(m, str(src / "mlp.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="w.data", size_threshold=0)
    model = src / "mlp.onnx"
    assert onnx.load(str(model), load_external_data=False).graph.initializer[0].data_location \
        == TensorProto.EXTERNAL
    g = OpGraph.from_onnx(model)
    device_of = {n.name: ("cpu0" if n.name[-1] in "01" else "cpu1") for n in g.nodes}
    e = export(g, device_of, tmp_path / "out", providers=providers())
    check_export(model, g, e, device_of)
    # every weight (biases too: they were external) is in weights.bin, none refers to w.data
    n_ext = 0
    for p in e.parts:
        mm = onnx.load(str(e.out / p.file), load_external_data=False)
        for t in all_tensors(mm.graph):
            assert t.data_location == TensorProto.EXTERNAL and ext_info(t)[0] == WEIGHTS
            n_ext += 1
        assert b"w.data" not in (e.out / p.file).read_bytes()
    assert n_ext == e.manifest["weights"]["tensors"] == 6
    assert (e.out / WEIGHTS).stat().st_size >= sum(t.bytes for t in g.weights)

    rng = np.random.default_rng(0)
    feeds = [make_feeds(g, rng) for _ in range(2)]
    want = [reference(model, f) for f in feeds]
    (src / "w.data").rename(src / "w.data.away")  # the parts need nothing from the original
    try:
        parts = Parts(e.out)
        for f, w in zip(feeds, want):
            assert_outputs(parts.run(f), w)
        for got, w in zip(parts.stream(feeds), want):
            assert_outputs(got, w)
    finally:
        (src / "w.data.away").rename(src / "w.data")


def test_external_data_in_subgraphs_and_constants(tmp_path):
    """External tensors inside If branches and Constant attributes move to weights.bin too."""
    (tmp_path / "src").mkdir()
    model = captured_weights(tmp_path / "src" / "cw.onnx", external=True)
    raw = onnx.load(str(model), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in all_tensors(raw.graph))
    g = OpGraph.from_onnx(model)
    device_of = {"relu": "cpu0", "sum": "cpu0", "greater": "cpu0", "if": "cpu1",
                 "add": "cpu2", "const_k": "cpu0", "out": "cpu2"}
    e = export(g, device_of, tmp_path / "out", providers=providers())
    check_export(model, g, e, device_of)
    names = set()
    for p in e.parts:
        mm = onnx.load(str(e.out / p.file), load_external_data=False)
        for t in all_tensors(mm.graph):
            assert t.data_location == TensorProto.EXTERNAL and ext_info(t)[0] == WEIGHTS, t.name
            names.add(t.name)
    assert {"Wt", "Wo", "kc_value", "K_value", "zero"} <= names
    (tmp_path / "src" / "w.data").rename(tmp_path / "w.data.away")
    try:
        for x in (np.ones((4, 64), np.float32), -np.ones((4, 64), np.float32)):  # both branches
            want = reference_from(raw, tmp_path / "w.data.away", {"x": x})
            assert_outputs(Parts(e.out).run({"x": x}), want)
    finally:
        (tmp_path / "w.data.away").rename(tmp_path / "src" / "w.data")


def reference_from(raw: onnx.ModelProto, data: Path, feeds):
    """The original (external data in ``data``) with its weights loaded into memory."""
    m = onnx.ModelProto()
    m.CopyFrom(raw)
    blob = data.read_bytes()
    for t in all_tensors(m.graph):
        _, off, length = ext_info(t)
        t.raw_data = blob[off:off + length]
        t.data_location = TensorProto.DEFAULT
        del t.external_data[:]
    sess = ort.InferenceSession(m.SerializeToString(), providers=[CPU])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, dict(feeds))))


def test_newer_ir_version_is_lowered(tmp_path):
    path = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=32)
    m = onnx.load(str(path))
    m.ir_version = 14  # newer than onnxruntime accepts
    onnx.save(m, str(tmp_path / "ir14.onnx"))
    g = OpGraph.from_onnx(tmp_path / "ir14.onnx")
    device_of = {n.name: ("cpu0" if n.name.endswith("0") else "cpu1") for n in g.nodes}
    e = export(g, device_of, tmp_path / "out", providers=providers())
    for p in e.parts:
        assert onnx.load(str(e.out / p.file), load_external_data=False).ir_version <= MAX_IR
    feeds = make_feeds(g, np.random.default_rng(0))
    assert_outputs(Parts(e.out).run(feeds), reference(path, feeds))


# ------------------------------------------------------------------------------ manifest


def test_manifest_extras_and_threads(models, tmp_path):
    model, g = models["tiny_bert"]
    names = [n.name for n in g.nodes]
    device_of = {n: ("cpu0" if i < 40 else "cpu1" if i < 80 else "cpu2") for i, n in enumerate(names)}
    e = export(g, device_of, tmp_path / "out", providers=providers(), threads={"cpu0": 1, "cpu1": 2},
               predicted={"latency_ms": 1.5, "throughput_per_s": 700.0},
               plan={"objective": "latency"}, files={"plan.txt": "hello\n"})
    man = json.loads((e.out / MANIFEST).read_text())
    assert man["predicted"] == {"latency_ms": 1.5, "throughput_per_s": 700.0}
    assert man["plan"] == {"objective": "latency"}
    assert [p["threads"] for p in man["parts"]] == [1, 2, None]
    assert (e.out / "plan.txt").read_text() == "hello\n"
    assert man["model"]["input_shapes"] == {k: list(v) for k, v in TINY_BERT_SHAPES.items()}
    # a crossing tensor's bound shape and bytes: the hidden state after part 0
    crossing = {t["name"]: t for t in man["tensors"]}
    assert crossing and all(t["devices"][0] == device_of[g.tensors[t["name"]].producer]
                            for t in crossing.values())
    # the part keeps the original's symbolic dims on its inputs
    m = onnx.load(str(e.out / e.parts[1].file), load_external_data=False)
    assert any(d.dim_param for i in m.graph.input for d in i.type.tensor_type.shape.dim)
    r = run_parts(e.out, measure=False)
    assert r["parts"] == [p.name for p in e.parts] and r["devices"] == ["cpu0", "cpu1", "cpu2"]
    assert r["verify"]["max_abs_error"] < ATOL and r["verify"]["outputs"] == 2


def test_parts_run_other_batch_sizes(models, tmp_path):
    """Parts declare the original's symbolic dims, so other bindings than the plan's run."""
    model, g = models["tiny_bert"]
    names = [n.name for n in g.nodes]
    device_of = {n: ("cpu0" if i < 60 else "cpu1") for i, n in enumerate(names)}
    e = export(g, device_of, tmp_path / "out", providers=providers())
    rng = np.random.default_rng(5)
    feeds = {"input_ids": rng.integers(0, 100, (3, 11)).astype(np.int64),
             "attention_mask": np.ones((3, 11), np.int64)}
    assert_outputs(Parts(e.out).run(feeds), reference(model, feeds))


# ------------------------------------------------------------------------------ subgraphs


def test_if_node_stays_whole_with_outer_scope_inputs(models, tmp_path):
    model, g = models["control_flow"]
    assert set(g.node("if").captured_inputs) == {"h", "scale"}
    assert set(g.node("loop").captured_inputs) == {"h"}
    device_of = {"relu": "cpu0", "sum": "cpu0", "greater": "cpu0", "if": "cpu1",
                 "loop": "cpu2", "out": "cpu2"}
    e = export(g, device_of, tmp_path / "out", providers=providers())
    check_export(model, g, e, device_of)
    assert [p.nodes for p in e.parts] == [("relu", "sum", "greater"), ("if",), ("loop", "out")]
    assert set(e.parts[0].outputs) == {"h", "c"}
    # the If reads c directly and h through its branches: both are part inputs
    assert set(e.parts[1].inputs) == {"c", "h"}
    assert set(e.parts[2].inputs) == {"branch", "h"}
    orig = onnx.load(str(model))
    orig_if = next(n for n in orig.graph.node if n.op_type == "If")
    orig_loop = next(n for n in orig.graph.node if n.op_type == "Loop")
    m1 = onnx.load(str(e.out / e.parts[1].file))
    assert [n.op_type for n in m1.graph.node] == ["If"]
    assert m1.graph.node[0].SerializeToString() == orig_if.SerializeToString()  # branches intact
    assert {t.name for t in m1.graph.initializer} == {"scale"}  # captured weight, inline
    m2 = onnx.load(str(e.out / e.parts[2].file))
    assert m2.graph.node[0].SerializeToString() == orig_loop.SerializeToString()
    assert {t.name for t in m2.graph.initializer} == {"trips", "yes"}
    parts = Parts(e.out)
    for x in (np.abs(np.random.default_rng(0).standard_normal((4, 16))),  # then-branch
              -np.ones((4, 16))):  # else-branch
        feeds = {"x": x.astype(np.float32)}
        assert_outputs(parts.run(feeds), reference(model, feeds))


def test_subgraph_with_big_captured_weight(models, tmp_path):
    model, g = models["captured"]
    assert "Wo" in g.node("if").captured_inputs and "h" in g.node("if").captured_inputs
    device_of = {n.name: ("cpu1" if n.name == "if" else "cpu0" if n.name in ("relu", "sum", "greater")
                          else "cpu2") for n in g.nodes}
    e = export(g, device_of, tmp_path / "out", providers=providers())
    check_export(model, g, e, device_of)
    m1 = onnx.load(str(e.out / e.parts[1].file), load_external_data=False)
    wo = next(t for t in m1.graph.initializer if t.name == "Wo")
    assert ext_info(wo)[0] == WEIGHTS  # the captured outer weight, by reference
    then_init = next(a.g for a in m1.graph.node[0].attribute if a.name == "then_branch").initializer  # the branch's own weight stays in it
    assert [t.name for t in then_init] == ["Wt"]
    parts = Parts(e.out)
    for x in (np.ones((4, 64), np.float32), -np.ones((4, 64), np.float32)):
        assert_outputs(parts.run({"x": x}), reference(model, {"x": x}))


# ------------------------------------------------------------------------------ errors


def test_cycle_is_refused_before_writing(models, tmp_path):
    model, g = models["mlp"]
    device_of = {n.name: "cpu0" for n in g.nodes}
    device_of["add1"] = "cpu1"  # cpu0 -> cpu1 -> cpu0
    with pytest.raises(SplitError, match=r"cycle \(cpu[01] -> cpu[01] via '(m1|a1)'"):
        make_parts(g, device_of, providers())
    with pytest.raises(SplitError, match="cycle"):
        export(g, device_of, tmp_path / "out", providers=providers())
    assert list(tmp_path.iterdir()) == []  # no output, no staging folder
    # the same placement as two calls on cpu0 is fine
    piece_of = {n.name: (1 if n.name in ("relu1", "matmul2", "add2", "relu2", "matmul3", "add3",
                                         "relu3") else 0) for n in g.nodes}
    e = export(g, device_of, tmp_path / "out", providers=providers(), piece_of=piece_of)
    assert [p.name for p in e.parts] == ["part0_cpu0", "part1_cpu1", "part2_cpu0"]
    check_export(model, g, e, device_of, piece_of)
    run_and_compare(model, g, e.out, 0, samples=2)


def test_existing_output_folder(models, tmp_path):
    model, g = models["mlp"]
    device_of = {n.name: "cpu0" for n in g.nodes}
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OnnxsplitError, match="already exists"):
        export(g, device_of, out, providers=providers())
    assert [f.name for f in out.iterdir()] == ["keep.txt"]
    assert leftovers(tmp_path, "out") == []
    # --force replaces only a folder onnxsplit made: a user's file is never deleted
    with pytest.raises(OnnxsplitError, match="has no onnxsplit manifest.json"):
        export(g, device_of, out, providers=providers(), force=True)
    assert [f.name for f in out.iterdir()] == ["keep.txt"]
    (out / "keep.txt").unlink()
    with pytest.raises(OnnxsplitError, match="has no onnxsplit manifest.json"):
        export(g, device_of, out, providers=providers(), force=True)  # empty, not ours
    out.rmdir()
    export(g, device_of, out, providers=providers())
    first = sorted(f.name for f in out.iterdir())
    e = export(g, device_of, out, providers=providers(), force=True)
    assert sorted(f.name for f in out.iterdir()) == first and (out / MANIFEST).exists()
    assert leftovers(tmp_path, "out") == []  # neither staging nor the old folder
    check_export(model, g, e, device_of)
    # one foreign file beside the parts, a link in its place: refused, untouched
    (out / "notes.md").write_text("mine")
    with pytest.raises(OnnxsplitError, match="'notes.md'"):
        export(g, device_of, out, providers=providers(), force=True)
    assert (out / "notes.md").read_text() == "mine"
    (out / "notes.md").unlink()
    link = tmp_path / "link"
    link.symlink_to(out, target_is_directory=True)
    with pytest.raises(OnnxsplitError, match="symbolic link"):
        export(g, device_of, link, providers=providers(), force=True)
    assert link.is_symlink() and sorted(f.name for f in out.iterdir()) == first
    # a plain file in the way is never replaced
    (tmp_path / "file").write_text("x")
    with pytest.raises(OnnxsplitError, match="not a folder"):
        export(g, device_of, tmp_path / "file", providers=providers(), force=True)
    assert (tmp_path / "file").read_text() == "x"


def test_failed_write_leaves_nothing_and_keeps_old_output(tmp_path):
    (tmp_path / "src").mkdir()
    path = mlp(tmp_path / "plain.onnx", layers=2, batch=4, width=64)
    onnx.save(onnx.load(str(path)), str(tmp_path / "src" / "m.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="w.data", size_threshold=0)
    g = OpGraph.from_onnx(tmp_path / "src" / "m.onnx")
    (tmp_path / "src" / "w.data").unlink()  # the weights vanish before the export
    work = tmp_path / "work"
    work.mkdir()
    device_of = {n.name: "cpu0" for n in g.nodes}
    with pytest.raises(OnnxsplitError, match="external data"):
        export(g, device_of, work / "out", providers=providers())
    assert list(work.iterdir()) == []
    # an earlier output onnxsplit made survives a failed --force
    good = OpGraph.from_onnx(path)
    export(good, {n.name: "cpu0" for n in good.nodes}, work / "out", providers=providers())
    before = {f.name: f.read_bytes() for f in (work / "out").iterdir()}
    with pytest.raises(OnnxsplitError, match="external data"):
        export(g, device_of, work / "out", providers=providers(), force=True)
    assert sorted(p.name for p in work.iterdir()) == ["out"]
    assert {f.name: f.read_bytes() for f in (work / "out").iterdir()} == before
    # and so it does when the check before the swap fails, or the run is interrupted there

    def fail(folder):
        assert (folder / MANIFEST).exists()  # the finished folder, not yet in place
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export(good, {n.name: "cpu0" for n in good.nodes}, work / "out", providers=providers(),
               force=True, before_swap=fail)
    assert sorted(p.name for p in work.iterdir()) == ["out"]
    assert {f.name: f.read_bytes() for f in (work / "out").iterdir()} == before


def test_unplaced_node_and_unknown_device(models, tmp_path):
    _, g = models["mlp"]
    device_of = {n.name: "cpu0" for n in g.nodes}
    del device_of["relu2"]
    with pytest.raises(SplitError, match="'relu2' is not placed"):
        export(g, device_of, tmp_path / "out", providers=providers())
    device_of["relu2"] = "gpu9"
    with pytest.raises(SplitError, match="'gpu9' has no execution provider"):
        export(g, device_of, tmp_path / "out", providers=providers())
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ runner


@pytest.fixture
def late_parts(models, tmp_path):
    model, g = models["late_input"]
    e = export(g, {"relu": "cpu0", "add": "cpu1"}, tmp_path / "out", providers=providers())
    assert [p.name for p in e.parts] == ["part0_cpu0", "part1_cpu1"]
    return model, g, e


def test_stream_failure_in_a_later_part_raises(late_parts):
    model, g, e = late_parts
    parts = Parts(e.out)
    rng = np.random.default_rng(0)
    good = [make_feeds(g, rng) for _ in range(6)]
    bad = dict(good[3], z=np.zeros((3, 5), np.float32))  # only part1 reads z
    samples = good[:3] + [bad] + good[4:]
    _, err, took = within(20, lambda: list(parts.stream(samples, depth=2)))
    assert isinstance(err, RunError), err
    assert "part part1_cpu1 on cpu1 failed" in str(err) and "(sample 3)" in str(err)
    assert took < 10
    # Parts.run names the part as well
    with pytest.raises(RunError, match="part part1_cpu1 on cpu1 failed"):
        parts.run(bad)
    # the wrong dtype for the first part
    _, err, _ = within(20, lambda: list(parts.stream([dict(good[0], x=good[0]["x"].astype(np.float64))])))
    assert isinstance(err, RunError) and "part0_cpu0" in str(err) and "(sample 0)" in str(err)
    # and the same Parts still streams good samples afterwards
    got, err, _ = within(20, lambda: list(parts.stream(good)))
    assert err is None and len(got) == len(good)
    for gg, f in zip(got, good):
        assert_outputs(gg, reference(model, f))


def test_stream_bad_samples_raise(late_parts):
    _, g, e = late_parts
    parts = Parts(e.out)
    good = make_feeds(g, np.random.default_rng(0))
    _, err, _ = within(20, lambda: list(parts.stream([good, {"x": good["x"]}])))
    assert isinstance(err, RunError) and "input 'z' is not given" in str(err)

    def samples():
        yield good
        raise ValueError("broken source")

    _, err, _ = within(20, lambda: list(parts.stream(samples())))
    assert isinstance(err, RunError) and "broken source" in str(err)
    got, err, _ = within(20, lambda: list(parts.stream([])))
    assert err is None and got == []
    with pytest.raises(RunError, match="input 'z' is not given"):
        parts.run({"x": good["x"]})


def test_stream_stops_when_consumer_stops(late_parts):
    _, g, e = late_parts
    parts = Parts(e.out)
    feeds = make_feeds(g, np.random.default_rng(0))

    def take_two():
        it = parts.stream((feeds for _ in range(10 ** 6)), depth=3)
        first = [next(it), next(it)]
        it.close()  # stops the workers and the feeder
        return first

    got, err, took = within(30, take_two)
    assert err is None and len(got) == 2 and took < 20
    time.sleep(0.3)
    assert not [t for t in threading.enumerate() if t.name.startswith("onnxsplit-")]


def test_corrupt_part_file(late_parts):
    _, _, e = late_parts
    (e.out / "part1_cpu1.onnx").write_bytes(b"not an onnx model")
    # (found when the manifest is checked against its parts, before any session is made)
    with pytest.raises(RunError, match=r"parts\[1\].file 'part1_cpu1.onnx' is not an ONNX model"):
        Parts(e.out)
    (e.out / "part1_cpu1.onnx").unlink()
    with pytest.raises(RunError, match=r"parts\[1\].file 'part1_cpu1.onnx' is not in the folder"):
        Parts(e.out)


def test_read_manifest_errors(late_parts, tmp_path):
    _, _, e = late_parts
    assert read_manifest(e.out)["format"] == e.manifest["format"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RunError, match="has no manifest.json"):
        read_manifest(empty)
    with pytest.raises(RunError, match="has no manifest.json"):
        Parts(empty)
    with pytest.raises(RunError, match="not a folder"):
        read_manifest(tmp_path / "missing")
    (empty / MANIFEST).write_text("{broken")
    with pytest.raises(RunError, match="not valid JSON"):
        read_manifest(empty)
    (empty / MANIFEST).write_text(json.dumps({"format": "other"}))
    with pytest.raises(RunError, match="not an onnxsplit manifest"):
        read_manifest(empty)


def test_run_parts_measures_and_checks(late_parts, capsys):
    model, g, e = late_parts
    r = run_parts(e.out, samples=3, warmup=1)
    assert r["verify"]["max_abs_error"] < ATOL and r["verify"]["worst_output"] in (None, "y")
    assert r["verify"]["ok"] and set(r["execution_providers"].values()) == {CPU}
    assert r["measured"]["latency_ms"] > 0 and r["measured"]["throughput_per_s"] > 0
    # what users run instead, measured in the same run: the default session and copies, and
    # where installed OpenVINO's runtime with its two hints
    base = r["baselines"]
    peers = {"openvino_latency", "openvino_throughput"} if openvino.RUNTIME in available_providers() else set()
    assert set(base) == {"ort_default_cpu", f"ort_replicas_cpu_{os.cpu_count()}x1"} | peers
    # the plan measured beside each baseline in every round: its figure is the median of all
    assert r["measured"]["rounds"] == len(base) * ROUNDS == len(r["measured"]["by_round"]["latency_ms"])
    assert r["measured"]["latency_ms"] == pytest.approx(np.median(r["measured"]["by_round"]["latency_ms"]))
    assert sorted(x for b in r["measured"]["beside"].values() for x in b["latency_ms"]) \
        == sorted(r["measured"]["by_round"]["latency_ms"])
    for name, b in base.items():
        assert b["latency_ms"] > 0 and b["throughput_per_s"] > 0
        # each ratio: the median of the ratios of the pairs measured side by side
        ratio, mine, theirs = r["ratios"][name], r["measured"]["beside"][name], b["by_round"]
        assert len(mine["latency_ms"]) == len(theirs["latency_ms"]) == b["rounds"] == ROUNDS
        assert ratio["throughput"] == pytest.approx(np.median(
            np.array(mine["throughput_per_s"]) / np.array(theirs["throughput_per_s"])))
        assert ratio["latency"] == pytest.approx(np.median(
            np.array(theirs["latency_ms"]) / np.array(mine["latency_ms"])))
        assert b["latency_ms"] == pytest.approx(np.median(theirs["latency_ms"]))
    assert base["ort_default_cpu"]["threads"] == 0
    assert base[f"ort_replicas_cpu_{os.cpu_count()}x1"]["replicas"] == os.cpu_count()
    assert "drift" not in r  # (no calibration's figures in this manifest)
    assert not any("time_limited" in b for b in (r["measured"], *base.values()))  # (300 s: ample)
    # a limit it cannot keep: the fewest rounds and samples, every ratio still paired, said so
    from onnxsplit.cli import main
    from onnxsplit.running.compare import MIN_ROUNDS, MIN_SAMPLES

    assert main(["run", str(e.out), "--time-limit", "0.001", "--json"]) == 0
    cut = json.loads(capsys.readouterr().out)
    assert {b["rounds"] for b in cut["baselines"].values()} == {MIN_ROUNDS} and set(cut["ratios"]) == set(base)
    assert cut["measured"]["time_limited"] == {"time_limit_s": 0.001, "rounds": MIN_ROUNDS,
                                               "per_round": MIN_SAMPLES, "warmup": 1}
    # an explicit model path that is not there
    with pytest.raises(RunError, match="is not there"):
        run_parts(e.out, model=Path(e.out) / "nope.onnx", measure=False)
    # explicit feeds: the same as onnxruntime on the original
    feeds = make_feeds(g, np.random.default_rng(7))
    assert run_parts(e.out, feeds=feeds, measure=False)["verify"]["max_abs_error"] < ATOL


def test_run_weighs_the_default_session_against_its_calibrated_figures(late_parts, monkeypatch, capsys):
    """A manifest holding the calibration's figures for the default session: `run`
    reports the measured session over them (the machine's drift since the prediction),
    only for the sessions it measured, and the predicted ratio to it against the
    measured one (the prediction with the drift cancelled)."""
    from onnxsplit.running import compare
    from onnxsplit.cli import DRIFT_NOTED, main

    _, _, e = late_parts
    path = Path(e.out) / MANIFEST
    manifest = json.loads(path.read_text())
    calibrated = {"ort_default_cpu": {"latency_ms": 0.5, "throughput_per_s": 3000.0},
                  "ort_default_cuda": {"latency_ms": 0.1, "throughput_per_s": 9000.0}}
    manifest["predicted"] = dict(manifest.get("predicted") or {}, baselines=calibrated,
                                 throughput_per_s=2000.0, latency_ms=0.8)
    path.write_text(json.dumps(manifest))
    r = run_parts(e.out, samples=3, warmup=1)
    got = r["baselines"]["ort_default_cpu"]
    assert set(r["drift"]) == {"ort_default_cpu"}
    assert r["drift"]["ort_default_cpu"] == {
        "throughput": pytest.approx(got["throughput_per_s"] / 3000.0 - 1),
        "latency": pytest.approx(got["latency_ms"] / 0.5 - 1)}
    # the predicted ratio to that session (2000 / 3000 throughput, 0.5 / 0.8 latency)
    # against the ratio measured in pairs
    ratio = r["ratios"]["ort_default_cpu"]
    assert set(r["relative_error"]) == {"ort_default_cpu"}
    assert r["relative_error"]["ort_default_cpu"] == {
        "throughput": pytest.approx(ratio["throughput"] / (2000 / 3000) - 1),
        "latency": pytest.approx(ratio["latency"] / (0.5 / 0.8) - 1)}
    monkeypatch.setattr(compare, "run_parts", lambda *a, **k: r)
    assert main(["run", str(e.out)]) == 0
    rel = r["relative_error"]["ort_default_cpu"]
    printed = capsys.readouterr().out
    assert (f"beside ort_default_cpu, as predicted: measured ratio over predicted ratio "
            f"{rel['throughput']:+.0%} throughput, {rel['latency']:+.0%} latency") in printed
    # a session that moved more than DRIFT_NOTED: the way to measure the machine again
    moved = any(abs(v) > DRIFT_NOTED for v in r["drift"]["ort_default_cpu"].values())
    assert ("split again with --recalibrate" in printed) == moved


def test_random_feeds_and_compare_outputs():
    f = random_feeds([{"name": "a", "dtype": "float32", "shape": [3, 4]},
                      {"name": "b", "dtype": "int64", "shape": [2]},
                      {"name": "c", "dtype": "bool", "shape": [1]}], seed=1)
    assert f["a"].dtype == np.float32 and f["a"].shape == (3, 4)
    assert ((f["a"] >= 0) & (f["a"] < 1)).all() and f["a"].std() > 0
    np.testing.assert_array_equal(f["b"], np.ones(2, np.int64))
    assert f["c"].dtype == np.bool_ and f["c"].all()
    np.testing.assert_array_equal(random_feeds([{"name": "a", "dtype": "float32", "shape": [5]}], 3)["a"],
                                  random_feeds([{"name": "a", "dtype": "float32", "shape": [5]}], 3)["a"])
    with pytest.raises(RunError, match="pass its value explicitly"):
        random_feeds([{"name": "s", "dtype": "nonsense", "shape": [1]}])

    r = compare_outputs({"p": np.array([1.0, 2.0]), "q": np.array([10.0, -4.0])},
                        {"p": np.array([1.0, 2.5]), "q": np.array([10.0, -5.0])})
    assert r["max_abs_error"] == pytest.approx(1.0) and r["worst_output"] == "q"
    assert r["max_rel_error"] == pytest.approx(0.2)  # 0.5 / 2.5 and 1 / 10 -> 0.2
    assert compare_outputs({"i": np.array([1, 2])}, {"i": np.array([1, 3])})["max_abs_error"] == float("inf")
    assert compare_outputs({"i": np.array([1, 2])}, {"i": np.array([1, 2])})["max_abs_error"] == 0.0
    with pytest.raises(RunError, match="has shape"):
        compare_outputs({"p": np.zeros(2)}, {"p": np.zeros(3)})


def test_verify_tolerance_on_accelerators():
    """Parts on an accelerator are held to 1e-2 relative: on an H100 the CUDA EP's TF32
    matrix products put BERT-base 1x128 at max abs 2.8e-3, rel 1.1e-3 from the CPU (the
    main command called every GPU plan a failure); CPU parts are held much closer."""
    tf32 = {"max_abs_error": 2.8e-3, "max_rel_error": 1.1e-3}
    assert verify_tolerance(tf32, accelerated=False) == {"tolerance": {"max_abs_error": 1e-6}, "ok": False}
    got = verify_tolerance(tf32, accelerated=True)
    assert got["ok"] and got["tolerance"] == {"max_abs_error": 1e-6, "max_rel_error": 1e-2}
    assert not verify_tolerance({"max_abs_error": 0.7, "max_rel_error": 0.3}, accelerated=True)["ok"]
    assert verify_tolerance({"max_abs_error": 0.0, "max_rel_error": 0.0}, accelerated=False)["ok"]


def test_part_that_onnxruntime_moves_to_the_cpu_is_refused(tmp_path, monkeypatch):
    """A part for an accelerator EP that onnxruntime sets up on the CPU instead (its silent
    fallback where the EP cannot start) is an error, not a CPU run measured as the GPU's."""
    from onnxsplit.profile import devices

    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("Sigmoid", ["h"], ["y"], name="sigmoid")]
    model = save(make(nodes, [vi("x", [4, 8])], [vi("y", [4, 8])]), tmp_path / "m.onnx")
    e = export(OpGraph.from_onnx(model), {"relu": "cpu0", "sigmoid": "acc0"}, tmp_path / "out",
               providers={"cpu0": CPU, "acc0": "CUDAExecutionProvider"})
    monkeypatch.setattr(devices, "available_providers", lambda: ["CUDAExecutionProvider", CPU])
    with pytest.warns(UserWarning), pytest.raises(
            RunError, match="part1_acc0.*was to run on CUDAExecutionProvider but onnxruntime set it up on "
                            "CPUExecutionProvider"):
        Parts(e.out)


def test_single_device_is_the_plans_best_where_a_part_runs_on_it():
    """run_parts compares with the whole model on the plan's best single device: the
    accelerator where a part runs on it here, else a CPU core."""
    from types import SimpleNamespace

    def parts(best, placed, eps):
        return SimpleNamespace(manifest={"predicted": {"single_device": {"device": best}}},
                               parts=[{"device": d} for d in placed], execution_providers=eps)

    cuda = "CUDAExecutionProvider"
    assert single_device_ep(parts("acc0", ["cpu0", "acc0"], [CPU, cuda])) == ("acc0", cuda)
    assert single_device_ep(parts("acc0", ["cpu0", "acc0"], [CPU, CPU])) == ("cpu0", CPU)  # fell back
    assert single_device_ep(parts("acc0", ["cpu0"], [CPU])) == ("cpu0", CPU)
    assert single_device_ep(parts("cpu0", ["cpu0", "acc0"], [CPU, cuda])) == ("cpu0", CPU)
    assert single_device_ep(SimpleNamespace(manifest={}, parts=[], execution_providers=[])) == ("cpu0", CPU)


def test_dead_end_part_and_absent_execution_provider(tmp_path):
    """A part whose results nothing reads still has an output and runs; a part made for an
    execution provider absent here is refused, or run on the CPU with fallback_cpu."""
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu"),
             helper.make_node("Sigmoid", ["x"], ["dead"], name="sigmoid")]
    model = save(make(nodes, [vi("x", [4, 8])], [vi("y", [4, 8])]), tmp_path / "dead.onnx")
    g = OpGraph.from_onnx(model)
    device_of = {"relu": "cpu0", "sigmoid": "acc0"}
    e = export(g, device_of, tmp_path / "out",
               providers={"cpu0": CPU, "acc0": "NoSuchExecutionProvider"})
    assert [(p.device, p.inputs, p.outputs) for p in e.parts] == [
        ("cpu0", ("x",), ("y",)), ("acc0", ("x",), ("dead",))]
    assert e.manifest["parts"][1]["outputs"][0]["to"] == []
    with pytest.raises(RunError, match="'NoSuchExecutionProvider' is not available"):
        Parts(e.out)
    parts = Parts(e.out, fallback_cpu=True)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    assert_outputs(parts.run({"x": x}), reference(model, {"x": x}))
    assert_outputs(next(iter(parts.stream([{"x": x}]))), reference(model, {"x": x}))


def test_a_replaced_folder_loses_only_what_onnxsplit_wrote(tmp_path):
    """What --force removes after the swap: onnxsplit's own files, never one that appeared
    in the folder after it was checked."""
    from onnxsplit.export import _remove_made

    old = tmp_path / "old"
    old.mkdir()
    for name in ("part0_cpu0.onnx", "weights.bin", MANIFEST, "plan.json", "session.json"):
        (old / name).write_text("x")
    (old / "late.txt").write_text("mine")
    _remove_made(old)
    assert [p.name for p in old.iterdir()] == ["late.txt"]
    (old / "late.txt").unlink()
    (old / MANIFEST).write_text("{}")
    _remove_made(old)
    assert not old.exists()


def test_a_failure_removing_the_replaced_folder_never_deletes_what_is_left_in_it(models, tmp_path,
                                                                                monkeypatch):
    """After the swap the staging path names the old folder: an error while removing
    onnxsplit's files from it must not end in the staging folder's clean-up, which would
    take a file that appeared there after the check."""
    import onnxsplit.export as ex

    _, g = models["mlp"]
    device_of = {n.name: "cpu0" for n in g.nodes}
    out = tmp_path / "out"
    export(g, device_of, out, providers=providers())
    swap = ex._exchange

    def swapped_then_a_late_file(staging, target):
        done = swap(staging, target)
        (staging if done else target).joinpath("late.txt").write_text("mine")
        return done

    def cannot_remove(folder):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(ex, "_exchange", swapped_then_a_late_file)
    monkeypatch.setattr(ex, "_remove_made", cannot_remove)
    with pytest.raises(PermissionError):
        export(g, device_of, out, providers=providers(), force=True)
    assert [p.read_text() for p in tmp_path.rglob("late.txt")] == ["mine"]
    assert (out / MANIFEST).exists()


@pytest.mark.parametrize("n", range(6, 14))
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_steady_rate_counts_whole_turns_of_the_workers(n, workers):
    """Copies started together finish in bursts: ``workers`` finishes 1 ms apart every
    50 ms.  Whatever the number of finishes timed, the rate is ``workers`` per 50 ms;
    a window from the first to the last finish would count a burst's head without its
    tail (off by up to a turn)."""
    from onnxsplit.running.runner import steady_rate

    period = 0.05
    times = np.array([i // workers * period + (i % workers) * 0.001 for i in range(n)]) + 7.0
    assert steady_rate(times, workers) == pytest.approx(workers / period)
    assert steady_rate(times[:1], workers) == float("inf")
