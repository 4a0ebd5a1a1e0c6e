"""Latency estimates for devices that cannot be measured here: a roofline per node.

A node's work is its floating-point operations (FLOPs) and the bytes it moves, both
counted from the OpGraph's exact shapes (:func:`work`).  On a device with effective
compute rate ``P`` (FLOP/s), effective memory bandwidth ``W`` (bytes/s) and per-call
overhead ``O`` (s) the node takes ``max(flops / P, bytes / W) + O`` (:class:`Roofline`).

The rates are calibrated on the measured CPU (:func:`calibrate`): ``O`` from the
cheapest nodes, ``P`` and ``W`` by a least-squares fit of log time (weighted by time)
over the measured nodes, then both scaled by one factor so that the estimates for the
CPU add up exactly to its measured total.  A device that is absent gets its spec's peak
rates times an efficiency: the spec's, else the CPU's calibrated fraction of its own
spec'd peak, else :data:`DEFAULT_EFFICIENCY`.

FLOP counts are the usual ones (a multiply-add is 2 FLOPs): MatMul/Gemm ``2·M·N·K``,
Conv ``2·|Y|·|W|/C_out``, attention ``4·B·H·S·S_kv·D`` plus its projections, recurrent
layers ``2·T·B·(|W|+|R|)``, elementwise ops 1–8 FLOPs per output element (transcendental
functions 8), reductions one per input element, Softmax 5 and normalisations 8 per
element.  Bytes are the inputs read plus the outputs written, except where an op reads
only part of an input (Gather reads the rows it returns, Slice what it keeps) and for
shape-only ops, which move nothing (Reshape, Squeeze, Unsqueeze, Flatten, Identity alias
their input in onnxruntime).  Einsum's contraction size is approximated from shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..graph import OpGraph, OpNode

# Of a device's peak FLOP/s and memory bandwidth, the fraction a typical DNN operator
# reaches when nothing better is known (neither the device's spec nor the CPU's peak).
DEFAULT_EFFICIENCY = {"compute": 0.5, "memory": 0.7}
# Per-call overhead of an accelerator kernel when its spec does not say (a GPU launch).
DEFAULT_ACCELERATOR_OVERHEAD_S = 5e-6

SHAPE_OPS = frozenset({
    "Shape", "Size", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Constant",
    "OptionalHasElement", "OptionalGetElement",
})
_ELEMENTWISE_1 = frozenset({
    "Add", "Sub", "Mul", "Neg", "Abs", "Relu", "Max", "Min", "Sum", "Mean", "Equal", "Less",
    "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "Where", "Clip",
    "Sign", "Floor", "Ceil", "Round", "IsNaN", "IsInf", "BitShift", "Mod", "PRelu",
    "LeakyRelu", "ThresholdedRelu", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot",
    "Shrink", "CumSum", "BiasAdd",
})
_ELEMENTWISE_4 = frozenset({"Div", "Reciprocal", "Sqrt", "HardSigmoid", "HardSwish", "Affine",
                            "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
_ELEMENTWISE_8 = frozenset({
    "Exp", "Log", "Tanh", "Sigmoid", "Erf", "Pow", "Sin", "Cos", "Tan", "Asin", "Acos",
    "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Softplus", "Softsign", "Elu", "Selu",
    "Celu", "Mish", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Swish", "Silu", "BiasSoftmax",
})
_MOVE = frozenset({
    "Transpose", "Concat", "Split", "Pad", "Tile", "Expand", "Cast", "CastLike", "Dropout",
    "DepthToSpace", "SpaceToDepth", "ReverseSequence", "Range", "ConstantOfShape", "EyeLike",
    "OneHot", "Trilu", "NonZero", "Compress", "Unique", "ScatterND", "ScatterElements",
    "Scatter", "SequenceConstruct", "SequenceAt", "SplitToSequence", "ConcatFromSequence",
    "SequenceEmpty", "SequenceInsert", "SequenceLength", "Col2Im", "CenterCropPad",
})
_PARTIAL_READ = frozenset({"Gather", "GatherElements", "GatherND", "Slice"})
_REDUCE = frozenset({
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin",
    "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "TopK",
})
_NORM = frozenset({
    "LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization", "BatchNormalization", "InstanceNormalization",
    "GroupNormalization", "LpNormalization", "MeanVarianceNormalization", "RMSNormalization",
    "EmbedLayerNormalization",
})
_SOFTMAX = frozenset({"Softmax", "LogSoftmax", "Hardmax"})
_POOL = frozenset({"MaxPool", "AveragePool", "LpPool", "MaxRoiPool", "RoiAlign", "MaxUnpool"})
_RESIZE = frozenset({"Resize", "Upsample", "GridSample", "AffineGrid"})
_MATMUL = frozenset({"MatMul", "MatMulInteger", "QLinearMatMul", "FusedMatMul", "MatMulNBits",
                     "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})
_GEMM = frozenset({"Gemm", "QGemm"})
_CONV = frozenset({"Conv", "ConvInteger", "QLinearConv", "FusedConv", "NhwcConv"})
_ATTENTION = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention",
                        "PackedAttention", "PackedMultiHeadAttention", "SparseAttention"})
_RNN = frozenset({"LSTM", "GRU", "RNN"})

# Ops outside the default domain that the tables above describe (onnxruntime contrib ops).
_CONTRIB_DOMAINS = frozenset({"com.microsoft"})
KNOWN_OPS = (SHAPE_OPS | _ELEMENTWISE_1 | _ELEMENTWISE_4 | _ELEMENTWISE_8 | _MOVE | _PARTIAL_READ
             | _REDUCE | _NORM | _SOFTMAX | _POOL | _RESIZE | _MATMUL | _GEMM | _CONV
             | _ATTENTION | _RNN | {"ConvTranspose", "Einsum"})


@dataclass(frozen=True)
class Work:
    flops: float
    bytes: float
    category: str  # "shape", "elementwise", "move", "reduce", "norm", "softmax", "pool",
    #                "matmul", "conv", "attention", "rnn", "unknown"
    covered: bool  # whether the tables above describe this op


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def work(graph: OpGraph, node: OpNode) -> Work:
    """FLOPs and bytes moved by ``node`` at the OpGraph's shapes."""
    ins = [graph.tensors[t] if t else None for t in node.inputs]
    outs = [graph.tensors[o] for o in node.outputs if o]
    in_bytes = sum(t.bytes for t in ins if t is not None)
    cap_bytes = sum(graph.tensors[t].bytes for t in node.captured_inputs)
    out_bytes = sum(t.bytes for t in outs)
    out_n = sum(_numel(t.shape) for t in outs)
    y = outs[0].shape if outs else ()
    x = ins[0].shape if ins and ins[0] is not None else ()
    op = node.op_type
    known = (node.domain in ("", "ai.onnx") or node.domain in _CONTRIB_DOMAINS) and op in KNOWN_OPS
    strings = any(t is not None and (t.dtype == "str" or t.dtype.startswith("seq(str"))
                  for t in ins + outs)
    covered = known and not node.has_subgraphs and not strings
    moved = float(in_bytes + out_bytes)

    def shape_of(i: int) -> tuple[int, ...]:
        return ins[i].shape if len(ins) > i and ins[i] is not None else ()

    if not known or node.has_subgraphs:
        return Work(0.0, float(in_bytes + cap_bytes + out_bytes), "unknown", False)
    if op in SHAPE_OPS:
        return Work(0.0, float(out_bytes) if op == "Constant" else 0.0, "shape", covered)
    if op in _ELEMENTWISE_1 or op in _ELEMENTWISE_4 or op in _ELEMENTWISE_8:
        per = 1 if op in _ELEMENTWISE_1 else 4 if op in _ELEMENTWISE_4 else 8
        arity = max(len([t for t in ins if t is not None]) - 1, 1) if op in ("Sum", "Mean", "Max", "Min") else 1
        return Work(float(per * arity * out_n), moved, "elementwise", covered)
    if op in _PARTIAL_READ:
        index_bytes = sum(t.bytes for t in ins[1:] if t is not None)
        return Work(0.0, float(index_bytes + 2 * out_bytes), "move", covered)
    if op in _MOVE:
        if op in ("Expand", "Tile", "ConstantOfShape", "Range", "EyeLike", "OneHot"):
            moved = float(ins[0].bytes if ins and ins[0] is not None and op != "ConstantOfShape" else 0) + out_bytes
        return Work(0.0, moved, "move", covered)
    if op in _REDUCE:
        factor = 2 if op in ("ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "GlobalLpPool") else 1
        if op == "TopK":
            factor = max(math.log2(max(_numel(x), 2)), 1)
        return Work(float(factor * _numel(x)), moved, "reduce", covered)
    if op in _NORM:
        return Work(float(8 * _numel(x)), moved, "norm", covered)
    if op in _SOFTMAX:
        return Work(float(5 * _numel(x)), moved, "softmax", covered)
    if op in _POOL:
        return Work(float(2 * max(_numel(x), out_n)), moved, "pool", covered)
    if op in _RESIZE:
        return Work(float(4 * out_n), moved, "move", covered)
    if op in _MATMUL:
        a = shape_of(0)
        k = a[-1] if a else 1  # MatMulNBits too: its B is packed, A is not
        return Work(float(2 * _numel(y) * k), moved, "matmul", covered)
    if op in _GEMM:
        m = y[0] if y else 1
        k = _numel(shape_of(0)) / max(m, 1)
        bias = _numel(y) if len(ins) > 2 and ins[2] is not None else 0
        return Work(float(2 * _numel(y) * k + bias), moved, "matmul", covered)
    if op in _CONV:
        w_index = 3 if op == "QLinearConv" else 1
        w = shape_of(w_index)
        per_out = _numel(w[1:]) if len(w) > 1 else 1
        return Work(float(2 * _numel(y) * per_out), moved, "conv", covered)
    if op == "ConvTranspose":
        w = shape_of(1)
        return Work(float(2 * _numel(x) * (_numel(w[1:]) if len(w) > 1 else 1)), moved, "conv", covered)
    if op == "Einsum":
        operands = [_numel(t.shape) for t in ins if t is not None]
        if len(operands) >= 2:
            k = math.sqrt(max(operands[0] * operands[1] / max(_numel(y), 1), 1.0))
        else:
            k = max(operands[0] / max(_numel(y), 1), 1.0) if operands else 1.0
        return Work(float(2 * _numel(y) * k), moved, "matmul", covered)
    if op in _ATTENTION:
        return Work(_attention_flops(op, ins, y), moved, "attention", covered)
    if op in _RNN:
        seq = x[0] if x else 1
        batch = x[1] if len(x) > 1 else 1
        w = _numel(shape_of(1)) + _numel(shape_of(2))
        return Work(float(2 * seq * batch * w + 8 * out_n), moved, "rnn", covered)
    return Work(0.0, moved, "unknown", False)


def _attention_flops(op: str, ins, y) -> float:
    """Scores (Q·Kᵀ) and context (P·V) for a (batch, sequence, hidden) query, plus the
    input projection where the op holds its weights (contrib ``Attention``)."""
    q = ins[0].shape if ins and ins[0] is not None else ()
    if len(q) == 4:  # (B, H, S, D) — ONNX Attention with 4-D inputs
        b, h, s, d = q
        hidden = h * d
    elif len(q) >= 3:
        b, s, hidden = q[0], q[1], q[-1]
    else:
        return float(2 * _numel(y))
    flops = 0.0
    kv_len = s
    if op == "Attention" and len(ins) > 1 and ins[1] is not None and len(ins[1].shape) == 2:
        w = ins[1].shape  # contrib Attention: (hidden, 3·hidden) projection weights
        flops += 2 * b * s * w[0] * w[1]
        hidden = w[1] // 3 if w[1] % 3 == 0 else hidden
    elif len(ins) > 1 and ins[1] is not None and len(ins[1].shape) >= 3:
        kv_len = ins[1].shape[-2] if len(ins[1].shape) == 4 else ins[1].shape[1]
    flops += 4 * b * s * kv_len * hidden + 5 * b * s * kv_len
    return float(flops)


# --------------------------------------------------------------------- the roofline


@dataclass(frozen=True)
class Roofline:
    flops_per_s: float
    bytes_per_s: float
    overhead_s: float

    def seconds(self, w: Work) -> float:
        return max(w.flops / self.flops_per_s, w.bytes / self.bytes_per_s) + self.overhead_s

    def to_json(self) -> dict:
        return {"flops_per_s": self.flops_per_s, "bytes_per_s": self.bytes_per_s,
                "overhead_s": self.overhead_s}


def _estimates(flops, nbytes, p, w, o):
    return np.maximum(flops / p, nbytes / w) + o


def calibrate(works: Sequence[Work], seconds: Sequence[float]) -> Roofline:
    """Effective rates of the device the ``seconds`` were measured on (see module doc).

    The estimates of the measured nodes add up to their measured total exactly."""
    t = np.asarray(seconds, dtype=np.float64)
    flops = np.array([w.flops for w in works], dtype=np.float64)
    nbytes = np.array([w.bytes for w in works], dtype=np.float64)
    keep = np.isfinite(t) & (t > 0)
    t, flops, nbytes = t[keep], flops[keep], nbytes[keep]
    if len(t) == 0:
        raise ValueError("no measured node to calibrate on")
    tiny = t[(flops == 0) & (nbytes <= 1024)]
    o = float(np.median(tiny)) if len(tiny) >= 3 else float(np.percentile(t, 5))
    o = min(o, float(t.min()))
    if t.sum() - o * len(t) <= 0:
        o = 0.0
    rest = np.maximum(t - o, 1e-12)
    heavy = flops > 0
    p0 = flops[heavy].sum() / rest[heavy].sum() if heavy.any() else 1e10
    light = (nbytes > 0) & ~heavy
    w0 = nbytes[light].sum() / rest[light].sum() if light.any() and rest[light].sum() > 0 else (
        nbytes.sum() / rest.sum() if nbytes.sum() > 0 else 1e10)
    p0, w0 = max(p0, 1.0), max(w0, 1.0)
    weight = t / t.sum()
    log_t = np.log(t)
    factors = np.logspace(-1.5, 1.5, 31)
    best = (np.inf, p0, w0)
    for fp in factors:
        for fw in factors:
            est = _estimates(flops, nbytes, p0 * fp, w0 * fw, o)
            # a node with no flops, no bytes and no overhead is estimated at 0: the same
            # error for every candidate, finite so that the others still compare
            err = float(np.sum(weight * (np.log(np.maximum(est, 1e-12)) - log_t) ** 2))
            if err < best[0]:
                best = (err, p0 * fp, w0 * fw)
    _, p, w = best
    # one factor on both rates so that the total is exact
    body = np.maximum(flops / p, nbytes / w).sum()
    target = t.sum() - o * len(t)
    if body > 0 and target > 0:
        s = body / target
        p, w = p * s, w * s
    return Roofline(float(p), float(w), float(o))


def device_roofline(peak_flops: float | None, memory_bandwidth: float | None,
                    overhead_s: float | None, efficiency: Mapping[str, float] | None,
                    cpu: Roofline | None = None,
                    cpu_peaks: tuple[float | None, float | None] = (None, None)) -> Roofline:
    """Effective rates of an absent device from its spec (see module doc)."""
    eff = dict(DEFAULT_EFFICIENCY)
    if cpu is not None and cpu_peaks[0]:
        eff["compute"] = min(cpu.flops_per_s / cpu_peaks[0], 1.0)
    if cpu is not None and cpu_peaks[1]:
        eff["memory"] = min(cpu.bytes_per_s / cpu_peaks[1], 1.0)
    eff.update(efficiency or {})
    if not peak_flops or not memory_bandwidth:
        raise ValueError("peak_flops and memory_bandwidth are needed")
    o = DEFAULT_ACCELERATOR_OVERHEAD_S if overhead_s is None else overhead_s
    return Roofline(peak_flops * eff["compute"], memory_bandwidth * eff["memory"], o)


def works(graph: OpGraph) -> dict[str, Work]:
    return {n.name: work(graph, n) for n in graph.nodes}


def estimate(graph: OpGraph, roof: Roofline, names: Iterable[str] | None = None) -> dict[str, float]:
    """Estimated seconds per node."""
    names = list(names) if names is not None else [n.name for n in graph.nodes]
    return {name: roof.seconds(work(graph, graph.node(name))) for name in names}
