"""Small ONNX models built in tests (no files committed beyond tests/data/tiny_bert.onnx)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

DATA = Path(__file__).parent / "data"
TINY_BERT = DATA / "tiny_bert.onnx"
TINY_BERT_SHAPES = {"input_ids": (1, 32), "attention_mask": (1, 32)}


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
