"""Small ONNX models built in tests (no files committed beyond tests/data/tiny_bert.onnx and
tests/data/llama_tiny_genai/, made by tools/build_test_models.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

DATA = Path(__file__).parent / "data"
TINY_BERT = DATA / "tiny_bert.onnx"
TINY_BERT_SHAPES = {"input_ids": (1, 32), "attention_mask": (1, 32)}
# a Llama (2 layers, 4 heads, 2 of keys and values of 16) as onnxruntime-genai's builder
# writes it: GroupQueryAttention, SkipSimplifiedLayerNormalization (com.microsoft) and
# SimplifiedLayerNormalization (the default domain), bound at one decode step after 16 tokens
TINY_LLAMA = DATA / "llama_tiny_genai" / "model.onnx"
TINY_LLAMA_PAST = 16
TINY_LLAMA_DECODE = {"input_ids": (1, 1), "attention_mask": (1, TINY_LLAMA_PAST + 1),
                     **{f"past_key_values.{i}.{kv}": (1, 2, TINY_LLAMA_PAST, 16)
                        for i in range(2) for kv in ("key", "value")}}


def save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 10  # onnxruntime 1.31 rejects onnx 1.23's default IR 14
    onnx.save(model, str(path))
    return path


def make(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def vi(name, shape, t=TP.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def weight(name, shape, seed=0):
    return numpy_helper.from_array(
        np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.05, name)


def mlp(path: Path, layers: int = 4, batch: int = 64, width: int = 512, seed: int = 0,
        dynamic_batch: bool = False) -> Path:
    """x -> (MatMul, Add, Relu) x layers -> y: compute-bound, one weight per MatMul."""
    nodes, inits = [], []
    cur = "x"
    for i in range(layers):
        inits += [weight(f"W{i}", (width, width), seed + i), weight(f"b{i}", (width,), seed + 100 + i)]
        nodes += [helper.make_node("MatMul", [cur, f"W{i}"], [f"m{i}"], name=f"matmul{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                  helper.make_node("Relu", [f"a{i}"], [f"h{i}"], name=f"relu{i}")]
        cur = f"h{i}"
    b = "batch" if dynamic_batch else batch
    return save(make(nodes, [vi("x", [b, width])], [vi(cur, [b, width])], inits), path)


def shared_weight(path: Path) -> Path:
    """Two MatMuls read the same 256 KiB weight; a small bias is shared too."""
    w = weight("W", (256, 256))
    bias = weight("bias", (256,), 1)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W"], ["a"], name="mm1"),
        helper.make_node("Add", ["a", "bias"], ["a2"], name="add1"),
        helper.make_node("MatMul", ["a2", "W"], ["b"], name="mm2"),
        helper.make_node("Add", ["b", "bias"], ["y"], name="add2"),
    ]
    return save(make(nodes, [vi("x", [8, 256])], [vi("y", [8, 256])], [w, bias]), path)


def control_flow(path: Path) -> Path:
    """An If whose branches read outer-scope tensors, and a Loop that captures one."""
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["h", "scale"], ["t_out"], name="then_mul")],
        "then", [], [vi("t_out", [4, 16])])
    else_g = helper.make_graph(
        [helper.make_node("Add", ["h", "scale"], ["e_out"], name="else_add")],
        "else", [], [vi("e_out", [4, 16])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
         helper.make_node("Add", ["acc_in", "h"], ["acc_out"], name="body_add")],
        "body", [vi("iter", [], TP.INT64), vi("cond_in", [], TP.BOOL), vi("acc_in", [4, 16])],
        [vi("cond_out", [], TP.BOOL), vi("acc_out", [4, 16])])
    scale = numpy_helper.from_array(np.full((16,), 2.0, np.float32), "scale")
    trips = numpy_helper.from_array(np.array(3, np.int64), "trips")
    yes = numpy_helper.from_array(np.array(True), "yes")
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("ReduceSum", ["h"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="greater"),
        helper.make_node("If", ["c"], ["branch"], name="if", then_branch=then_g, else_branch=else_g),
        helper.make_node("Loop", ["trips", "yes", "branch"], ["looped"], name="loop", body=body),
        helper.make_node("Add", ["looped", "h"], ["y"], name="out"),
    ]
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    return save(make(nodes, [vi("x", [4, 16])], [vi("y", [4, 16])], [scale, trips, yes, zero]), path)


def decoder(path: Path, layers: int = 32, hidden: int = 16, seq: int = 8, vocab: int = 64) -> Path:
    """A Llama-shaped decoder with the name scopes torch.onnx's TorchScript exporter writes
    (``/model/layers.3/self_attn/q_proj/MatMul``): embedding, ``layers`` blocks of
    attention (one head) and a gated MLP, each after a LayerNormalization and added back,
    a final norm and ``/lm_head``.  Tiny, so that its structure, not its work, shows."""
    n = 0
    inits = [weight("embed", (vocab, hidden), 1000)]

    def w(shape):
        nonlocal n
        n += 1
        inits.append(weight(f"w{n}", shape, n))
        return f"w{n}"

    def ln(scope: str, x: str) -> tuple:
        s, b = w((hidden,)), w((hidden,))
        return helper.make_node("LayerNormalization", [x, s, b], [f"{scope}/ln_out"],
                                name=f"{scope}/LayerNormalization", axis=-1), f"{scope}/ln_out"

    def op(kind: str, scope: str, ins: list, **attrs) -> tuple:
        out = f"{scope}/{kind}_out"
        return helper.make_node(kind, ins, [out], name=f"{scope}/{kind}", **attrs), out

    scale = numpy_helper.from_array(np.array(hidden ** -0.5, np.float32), "scale")
    inits.append(scale)
    nodes = []
    node, x = op("Gather", "/model/embed_tokens", ["embed", "input_ids"])
    nodes.append(node)
    for i in range(layers):
        p = f"/model/layers.{i}"
        a, h = ln(f"{p}/input_layernorm", x)
        nodes.append(a)
        got = {}
        for proj in ("q_proj", "k_proj", "v_proj"):
            node, got[proj] = op("MatMul", f"{p}/self_attn/{proj}", [h, w((hidden, hidden))])
            nodes.append(node)
        t, kt = op("Transpose", f"{p}/self_attn", [got["k_proj"]], perm=[0, 2, 1])
        qk, s = op("MatMul", f"{p}/self_attn", [got["q_proj"], kt])
        sc, s2 = op("Mul", f"{p}/self_attn", [s, "scale"])
        sm, pr = op("Softmax", f"{p}/self_attn", [s2], axis=-1)
        av = helper.make_node("MatMul", [pr, got["v_proj"]], [f"{p}/self_attn/av"], name=f"{p}/self_attn/MatMul_1")
        o, attn = op("MatMul", f"{p}/self_attn/o_proj", [f"{p}/self_attn/av", w((hidden, hidden))])
        r1 = helper.make_node("Add", [x, attn], [f"{p}/res1"], name=f"{p}/Add")
        b, h2 = ln(f"{p}/post_attention_layernorm", f"{p}/res1")
        g, gate = op("MatMul", f"{p}/mlp/gate_proj", [h2, w((hidden, 2 * hidden))])
        u, up = op("MatMul", f"{p}/mlp/up_proj", [h2, w((hidden, 2 * hidden))])
        sg, sig = op("Sigmoid", f"{p}/mlp/act_fn", [gate])
        sl = helper.make_node("Mul", [gate, sig], [f"{p}/mlp/silu"], name=f"{p}/mlp/act_fn/Mul")
        gu = helper.make_node("Mul", [f"{p}/mlp/silu", up], [f"{p}/mlp/gated"], name=f"{p}/mlp/Mul")
        d, down = op("MatMul", f"{p}/mlp/down_proj", [f"{p}/mlp/gated", w((2 * hidden, hidden))])
        r2 = helper.make_node("Add", [f"{p}/res1", down], [f"{p}/res2"], name=f"{p}/Add_1")
        nodes += [t, qk, sc, sm, av, o, r1, b, g, u, sg, sl, gu, d, r2]
        x = f"{p}/res2"
    c, h = ln("/model/norm", x)
    head, logits = op("MatMul", "/lm_head", [h, w((hidden, vocab))])
    nodes += [c, head]
    model = make(nodes, [vi("input_ids", [1, seq], TP.INT64)], [vi(logits, [1, seq, vocab])], inits)
    return save(model, path)


def decoder_with_past(path: Path, layers: int = 4, hidden: int = 32, heads: int = 2, vocab: int = 64,
                      seed: int = 0) -> Path:
    """A decoder with a KV cache in Optimum's layout: inputs ``input_ids`` [batch,
    sequence_length], ``attention_mask`` [batch, total_sequence_length] and each layer's
    ``past_key_values.N.key/value`` [batch, heads, past_sequence_length, head_dim]; outputs
    ``logits`` and ``present.N.key/value`` (the past with this call's keys appended).  Each
    layer: causal multi-head attention over past and new keys (the mask's zeros left out),
    then a ReLU MLP, each added back at 0.6 of a unit-variance layer's scale.  Plain ONNX
    operators only.  Greedy decoding walks the vocabulary (the head, below) and the layers
    steer it: 30 distinct tokens in 40 from prompt 3 7 11 5; with each step's cache thrown
    away it turns to repeating two tokens by the fourth."""
    dim = hidden // heads
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "embed")]
    nodes: list = []

    def w(name: str, shape, scale: float) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def const(name: str, value, dtype=np.int64) -> str:
        inits.append(numpy_helper.from_array(np.array(value, dtype), name))
        return name

    def n(kind: str, ins: list, out: str, **attrs) -> str:
        nodes.append(helper.make_node(kind, ins, [out], name=out, **attrs))
        return out

    const("heads_shape", [0, 0, heads, dim])
    const("merge_shape", [0, 0, hidden])
    const("zero", 0)
    const("one", 1)
    const("two", [2])
    const("axis0", [0])
    const("axis1", [1])
    const("neg", -1e9, np.float32)
    const("nothing", 0.0, np.float32)
    const("inv_sqrt", dim ** -0.5, np.float32)
    x = n("Gather", ["embed", "input_ids"], "embedded")
    # causal mask over [past + new] keys: key j is seen by new position i where j <= past + i
    # and attention_mask[j] is 1 (shapes read from the first layer's past)
    past_len = n("Gather", [n("Shape", ["past_key_values.0.key"], "past_shape"), "two"], "past_len1")
    new_len = n("Gather", [n("Shape", ["input_ids"], "ids_shape"), "one"], "new_len")
    past_s = n("Squeeze", [past_len], "past_len")
    total = n("Add", [past_s, new_len], "total_len")
    qpos = n("Range", [past_s, total, "one"], "qpos")
    kpos = n("Range", ["zero", total, "one"], "kpos")
    causal = n("LessOrEqual", [n("Unsqueeze", [kpos, "axis0"], "kpos_row"),
                               n("Unsqueeze", [qpos, "axis1"], "qpos_col")], "causal")
    keep = n("Cast", ["attention_mask"], "mask_bool", to=TP.BOOL)
    keep = n("Unsqueeze", [keep, const("mask_axes", [1, 2])], "mask_b11t")
    allowed = n("And", [n("Unsqueeze", [causal, "axis0"], "causal_1st"), keep], "allowed")
    bias = n("Where", [allowed, "nothing", "neg"], "mask_bias")  # [batch, 1, new, total]
    for i in range(layers):
        p = f"layer{i}"
        heads_of = {}
        for proj in ("q", "k", "v"):
            m = n("MatMul", [x, w(f"{p}.W{proj}", (hidden, hidden), hidden ** -0.5)], f"{p}/{proj}")
            r = n("Reshape", [m, "heads_shape"], f"{p}/{proj}_heads")
            heads_of[proj] = n("Transpose", [r], f"{p}/{proj}_bhsd", perm=[0, 2, 1, 3])
        k = n("Concat", [f"past_key_values.{i}.key", heads_of["k"]], f"present.{i}.key", axis=2)
        v = n("Concat", [f"past_key_values.{i}.value", heads_of["v"]], f"present.{i}.value", axis=2)
        kt = n("Transpose", [k], f"{p}/k_t", perm=[0, 1, 3, 2])
        s = n("Mul", [n("MatMul", [heads_of["q"], kt], f"{p}/qk"), "inv_sqrt"], f"{p}/scores")
        pr = n("Softmax", [n("Add", [s, bias], f"{p}/masked")], f"{p}/probs", axis=-1)
        a = n("Transpose", [n("MatMul", [pr, v], f"{p}/av")], f"{p}/av_bshd", perm=[0, 2, 1, 3])
        a = n("MatMul", [n("Reshape", [a, "merge_shape"], f"{p}/merged"),
                         w(f"{p}.Wo", (hidden, hidden), 0.6 * hidden ** -0.5)], f"{p}/o")
        x = n("Add", [x, a], f"{p}/res1")
        h = n("Relu", [n("MatMul", [x, w(f"{p}.W1", (hidden, 2 * hidden), hidden ** -0.5)], f"{p}/up")], f"{p}/act")
        x = n("Add", [x, n("MatMul", [h, w(f"{p}.W2", (2 * hidden, hidden), 0.6 * (2 * hidden) ** -0.5)], f"{p}/down")],
              f"{p}/res2")
    # the head scores token j by the embedding of the token before it in one long cycle, so
    # greedy decoding walks the vocabulary (what the layers add moves it) instead of
    # settling on one token as random heads do
    cycle = rng.permutation(vocab)
    before = np.empty(vocab, np.int64)
    before[cycle] = np.roll(cycle, 1)
    embed = numpy_helper.to_array(inits[0])
    inits.append(numpy_helper.from_array((embed[before].T * hidden ** -0.5).astype(np.float32), "lm_head"))
    n("MatMul", [x, "lm_head"], "logits")
    cache = ["batch", heads, "past_sequence_length", dim]
    present = ["batch", heads, "total_sequence_length", dim]
    inputs = [vi("input_ids", ["batch", "sequence_length"], TP.INT64),
              vi("attention_mask", ["batch", "total_sequence_length"], TP.INT64)]
    outputs = [vi("logits", ["batch", "sequence_length", vocab])]
    for i in range(layers):
        for kv in ("key", "value"):
            inputs.append(vi(f"past_key_values.{i}.{kv}", cache))
            outputs.append(vi(f"present.{i}.{kv}", present))
    return save(make(nodes, inputs, outputs, inits), path)


def runtime_ops(path: Path, domain: str, batch: int = 4, width: int = 64) -> Path:
    """x -> MatMul -> onnxruntime's own operators -> MatMul -> y, in ``domain``:
    ``com.microsoft`` (FastGelu with its bias, SkipLayerNormalization adding x back) or
    ``""`` (SimplifiedLayerNormalization, an onnxruntime operator in the default domain that
    onnx's checker does not know).  Plain ONNX elsewhere, opset 17."""
    ms = "com.microsoft"
    inits = [weight(f"W{i}", (width, width), i) for i in range(3)] + [weight("gamma", (width,), 11)]
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h0"], name="mm0")]
    if domain == ms:
        inits += [weight("bias", (width,), 10), weight("beta", (width,), 12)]
        nodes += [helper.make_node("FastGelu", ["h0", "bias"], ["g"], name="gelu", domain=ms),
                  helper.make_node("MatMul", ["g", "W1"], ["h1"], name="mm1"),
                  helper.make_node("SkipLayerNormalization", ["h1", "x", "gamma", "beta"], ["n"],
                                   name="skipnorm", domain=ms, epsilon=1e-5)]
    else:
        nodes += [helper.make_node("SimplifiedLayerNormalization", ["h0", "gamma"], ["s"],
                                   name="rmsnorm", axis=-1, epsilon=1e-6, stash_type=1),
                  helper.make_node("Relu", ["s"], ["r"], name="relu"),
                  helper.make_node("MatMul", ["r", "W1"], ["n"], name="mm1")]
    nodes.append(helper.make_node("MatMul", ["n", "W2"], ["y"], name="mm2"))
    g = helper.make_graph(nodes, "g", [vi("x", [batch, width])], [vi("y", [batch, width])], inits)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(ms, 1)] if domain == ms else [])
    return save(helper.make_model(g, opset_imports=opsets), path)
