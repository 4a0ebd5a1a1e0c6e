"""Models that use onnxruntime's own operators (contrib operators in com.microsoft, and those
it registers in the default domain, which onnx's checker does not know): they import,
profile, export and verify, and a part made invalid is still refused (issue 45, part 1).

The decoder is tests/data/llama_tiny_genai, as onnxruntime-genai's model builder writes a
Llama; the reference for its parts is onnxruntime's default session on the original."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnx_models import TINY_LLAMA, TINY_LLAMA_DECODE, TINY_LLAMA_PAST, mlp, runtime_ops
from onnxsplit import export as ex
from onnxsplit.cli import main
from onnxsplit.errors import OnnxsplitError
from onnxsplit.graph import OpGraph
from onnxsplit.profile import profile
from onnxsplit.running.runner import Parts
from onnxsplit.running.compare import run_parts

CPU = "CPUExecutionProvider"
TWO_CPUS = {"cpu0": CPU, "cpu1": CPU}
MS = "com.microsoft"


def halves(g: OpGraph) -> dict[str, str]:
    """The first half of the nodes (topological order) on cpu0, the rest on cpu1."""
    return {n.name: "cpu0" if i < len(g.nodes) // 2 else "cpu1" for i, n in enumerate(g.nodes)}


@pytest.fixture(scope="module")
def decoder_parts(tmp_path_factory):
    """The decoder imported at a decode step, split in two parts, written and checked."""
    g = OpGraph.from_onnx(TINY_LLAMA, TINY_LLAMA_DECODE)
    out = tmp_path_factory.mktemp("contrib") / "parts"
    return g, ex.export(g, halves(g), out, providers=TWO_CPUS)


def decode_step_feeds(token: int = 42) -> dict[str, np.ndarray]:
    """A decode step's real inputs: the cache of a 16-token prefill of the original model."""
    sess = ort.InferenceSession(str(TINY_LLAMA), providers=[CPU])
    empty = {n: np.zeros((1, 2, 0, 16), np.float32) for n in TINY_LLAMA_DECODE if n.startswith("past")}
    prompt = np.arange(3, 3 + TINY_LLAMA_PAST, dtype=np.int64)[None]
    got = dict(zip([o.name for o in sess.get_outputs()],
                   sess.run(None, {"input_ids": prompt, "attention_mask": np.ones_like(prompt), **empty})))
    return {"input_ids": np.array([[token]], np.int64),
            "attention_mask": np.ones((1, TINY_LLAMA_PAST + 1), np.int64),
            **{n: got[n.replace("past_key_values", "present")] for n in empty}}


def test_the_genai_decoder_imports_with_its_shapes_from_onnxruntime():
    g = OpGraph.from_onnx(TINY_LLAMA, TINY_LLAMA_DECODE)
    ops = {(n.domain, n.op_type) for n in g.nodes}
    assert {(MS, "GroupQueryAttention"), (MS, "SkipSimplifiedLayerNormalization"),
            ("", "SimplifiedLayerNormalization")} <= ops
    assert g.opsets[MS] == 1
    assert g.tensors["logits"].shape == (1, 1, 256)
    for i in range(2):  # the cache grows by the step's token
        assert g.tensors[f"present.{i}.key"].shape == (1, 2, TINY_LLAMA_PAST + 1, 16)


def test_every_operator_of_the_decoder_is_timed_alone_and_in_the_graph():
    """A single contrib node in a model of its own carries the model's opset imports."""
    for method in ("alone", "in_graph"):
        (entry,) = profile(TINY_LLAMA, TINY_LLAMA_DECODE, cache=False, repeats=2, quiet=True,
                           method=method, providers=[CPU]).entries
        assert len(entry.nodes) == 33
        bad = {n: t.error for n, t in entry.nodes.items() if t.error or not t.supported}
        assert not bad, (method, bad)


def test_the_decoder_split_in_two_reproduces_logits_and_caches(decoder_parts):
    g, e = decoder_parts
    assert len(e.parts) == 2
    ops = {}
    for p in e.parts:
        m = onnx.load(str(e.out / p.file), load_external_data=False)
        assert {o.domain: o.version for o in m.opset_import} == {"": 22, MS: 1}  # the model's
        ops[p.name] = {n.op_type for n in m.graph.node}
    # both kinds of onnxruntime operator are in the parts: the default domain's in the first
    assert "SimplifiedLayerNormalization" in ops[e.parts[0].name]
    assert all("GroupQueryAttention" in o for o in ops.values())
    feeds = decode_step_feeds()
    sess = ort.InferenceSession(str(TINY_LLAMA), providers=[CPU])  # as users run it
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    got = Parts(e.out).run(feeds)
    assert set(got) == set(want) == {"logits"} | {f"present.{i}.{kv}" for i in range(2)
                                                  for kv in ("key", "value")}
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5 * np.abs(w).max(), err_msg=name)
    # the cache a part returns ends in the step's own key: the prefill's 16 and one more
    assert got["present.1.key"].shape == (1, 2, TINY_LLAMA_PAST + 1, 16)
    np.testing.assert_array_equal(got["present.1.key"][:, :, :TINY_LLAMA_PAST], feeds["past_key_values.1.key"])
    assert run_parts(e.out, model=TINY_LLAMA, feeds=feeds, measure=False)["verify"]["ok"]


def test_a_shape_the_model_declares_wrongly_crosses_parts_as_measured(tmp_path):
    """onnxruntime-genai's builder declares its Constant [1] a scalar: where it crosses parts,
    the part declares it with the rank onnxruntime measured, so the manifest and the part agree."""
    g = OpGraph.from_onnx(TINY_LLAMA, TINY_LLAMA_DECODE)
    const = "/model/constant_nodes/INT64/[1]"
    tensor = g.node(const).outputs[0]
    assert g.tensors[tensor].shape == (1,)
    place = {n.name: "cpu1" if n.name == const else "cpu0" for n in g.nodes}
    e = ex.export(g, place, tmp_path / "parts", providers=TWO_CPUS)
    m = onnx.load(str(e.out / e.parts[0].file), load_external_data=False)
    (out,) = [o for o in m.graph.output if o.name == tensor]
    assert len(out.type.tensor_type.shape.dim) == 1
    assert run_parts(e.out, model=TINY_LLAMA, feeds=decode_step_feeds(), measure=False)["verify"]["ok"]


def test_a_genuinely_wrong_part_fails_the_check(decoder_parts, tmp_path):
    """Attention scaled twice as much in the second part: valid, runs, wrong."""
    import shutil

    _, e = decoder_parts
    out = tmp_path / "wrong"
    shutil.copytree(e.out, out)
    path = out / e.parts[1].file
    m = onnx.load(str(path), load_external_data=False)
    (gqa,) = [n for n in m.graph.node if n.op_type == "GroupQueryAttention"]
    for a in gqa.attribute:
        if a.name == "scale":
            a.f *= 2
    path.write_bytes(m.SerializeToString())
    ex.check_part(path, "the damaged part")  # still a valid model
    r = run_parts(out, model=TINY_LLAMA, feeds=decode_step_feeds(), measure=False)
    assert not r["verify"]["ok"] and r["verify"]["max_rel_error"] > 1e-3


def _rename(op: str, to: str):
    def damage(m: onnx.ModelProto) -> None:
        for n in m.graph.node:
            if n.op_type == op:
                n.op_type = to
    return damage


def _drop_attribute(op: str, name: str):
    def damage(m: onnx.ModelProto) -> None:
        for n in m.graph.node:
            if n.op_type == op:
                keep = [a for a in n.attribute if a.name != name]
                del n.attribute[:]
                n.attribute.extend(keep)
    return damage


def _read_nothing(m: onnx.ModelProto) -> None:
    m.graph.node[-1].input[0] = "made_by_nothing"


@pytest.mark.parametrize("damage, needle", [
    (_rename("SimplifiedLayerNormalization", "NoSuchNormalization"), "onnxruntime refuses it"),
    (_drop_attribute("GroupQueryAttention", "kv_num_heads"), "onnxruntime refuses it"),
    (_read_nothing, "made_by_nothing"),  # onnx's checker still judges all it knows
], ids=["unknown-default-domain-op", "contrib-op-missing-attribute", "dangling-input"])
def test_an_invalid_part_is_refused(decoder_parts, tmp_path, monkeypatch, damage, needle):
    g, _ = decoder_parts
    made = ex._part_model

    def damaged(*args, **kwargs):
        m = made(*args, **kwargs)
        if m.metadata_props and any(p.value == "part0_cpu0" for p in m.metadata_props):
            damage(m)
        return m

    monkeypatch.setattr(ex, "_part_model", damaged)
    out = tmp_path / "parts"
    with pytest.raises(OnnxsplitError, match="part part0_cpu0 is not a valid ONNX model") as info:
        ex.export(g, halves(g), out, providers=TWO_CPUS)
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no folder, no checked copy


def test_plain_onnx_parts_are_judged_by_onnx_checker_alone(tmp_path, monkeypatch):
    """No onnxruntime session for a part onnx's checker knows all of, and its refusals stay
    its own; an operator neither knows is refused by onnxruntime."""
    from onnxsplit.providers import sessions

    def no_session(*a, **k):
        raise AssertionError("a session was built to check a plain ONNX part")

    monkeypatch.setattr(sessions, "open_sessions", no_session)
    g = OpGraph.from_onnx(mlp(tmp_path / "mlp.onnx", layers=2, batch=2, width=16))
    e = ex.export(g, halves(g), tmp_path / "parts", providers=TWO_CPUS)
    path = e.out / e.parts[0].file
    good = path.read_bytes()
    m = onnx.load(str(path))
    _read_nothing(m)
    path.write_bytes(m.SerializeToString())
    with pytest.raises(OnnxsplitError, match="made_by_nothing"):
        ex.check_part(path, "the damaged part")
    monkeypatch.undo()
    m = onnx.load_from_string(good)
    m.graph.node[0].op_type = "NoSuchOp"
    path.write_bytes(m.SerializeToString())
    with pytest.raises(OnnxsplitError, match="onnxruntime refuses it: .*NoSuchOp"):
        ex.check_part(path, "the damaged part")


@pytest.mark.parametrize("domain", [MS, ""], ids=["com.microsoft", "default-domain"])
def test_a_model_of_onnxruntime_operators_imports_splits_and_verifies(tmp_path, domain):
    path = runtime_ops(tmp_path / "m.onnx", domain)
    g = OpGraph.from_onnx(path)
    own = {n.name for n in g.nodes if n.op_type in ("FastGelu", "SkipLayerNormalization",
                                                    "SimplifiedLayerNormalization")}
    assert own and all(g.tensors[n.outputs[0]].shape == (4, 64) for n in g.nodes)
    (entry,) = profile(path, cache=False, repeats=2, quiet=True, method="alone", providers=[CPU]).entries
    assert all(t.error is None and t.median_ms > 0 for t in entry.nodes.values())
    e = ex.export(g, halves(g), tmp_path / "parts", providers=TWO_CPUS)
    assert len(e.parts) == 2
    feeds = {"x": np.random.default_rng(0).random((4, 64), dtype=np.float32)}
    want = ort.InferenceSession(str(path), providers=[CPU]).run(None, feeds)[0]
    np.testing.assert_allclose(Parts(e.out).run(feeds)["y"], want, rtol=1e-5, atol=1e-7)
    assert run_parts(e.out, model=path, feeds=feeds, measure=False)["verify"]["ok"]


def test_the_main_command_splits_the_genai_decoder(tmp_path, capsys):
    """onnxsplit export with a plan in two parts: profiled, exported, verified."""
    g = OpGraph.from_onnx(TINY_LLAMA, TINY_LLAMA_DECODE)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"objective": "throughput", "assignment": halves(g)}))
    shapes = [a for k, v in TINY_LLAMA_DECODE.items() for a in ("--input-shape", f"{k}={'x'.join(map(str, v))}")]
    out = tmp_path / "parts"
    code = main(["export", str(TINY_LLAMA), *shapes, "--plan", str(plan), "--out", str(out), "--json"])
    res = json.loads(capsys.readouterr().out)
    assert code == 0 and res["verify"]["ok"]
    assert len(json.loads((out / "manifest.json").read_text())["parts"]) == 2
