"""Exact dtype, shape and byte size of every top-level tensor of an ONNX graph.

Placement charges every edge by the bytes of its tensor, so sizes must be exact, not
guessed.  ONNX shape inference answers most tensors for free; whatever it leaves unknown
or symbolic is measured by running the model once in onnxruntime with every intermediate
as an output.  Both work on a *skeleton* of the model whose large weights are replaced by
graph inputs, so neither ever reads the weight data (external files, > 2 GB models).
The same skeleton gives onnxruntime the chance to refuse an operator it cannot run.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import onnx
from onnx import TensorProto

from .errors import ModelError

# Weights up to this many bytes keep their values in the skeleton: they are what
# Reshape/Slice/Expand read as shapes.  Larger ones become inputs fed with random data.
KEEP_WEIGHT_BYTES = 64 * 1024
# onnxruntime 1.31 rejects IR version 14 (onnx 1.23's default); see DESIGN.md.
ORT_MAX_IR_VERSION = 13


def _dtype_table() -> dict[int, tuple[str, int]]:
    """ONNX element type -> (numpy dtype name, bits per element; 0 = variable length)."""
    names = {
        "FLOAT": ("float32", 32), "UINT8": ("uint8", 8), "INT8": ("int8", 8),
        "UINT16": ("uint16", 16), "INT16": ("int16", 16), "INT32": ("int32", 32),
        "INT64": ("int64", 64), "STRING": ("str", 0), "BOOL": ("bool", 8),
        "FLOAT16": ("float16", 16), "DOUBLE": ("float64", 64), "UINT32": ("uint32", 32),
        "UINT64": ("uint64", 64), "COMPLEX64": ("complex64", 64),
        "COMPLEX128": ("complex128", 128), "BFLOAT16": ("bfloat16", 16),
        "FLOAT8E4M3FN": ("float8_e4m3fn", 8), "FLOAT8E4M3FNUZ": ("float8_e4m3fnuz", 8),
        "FLOAT8E5M2": ("float8_e5m2", 8), "FLOAT8E5M2FNUZ": ("float8_e5m2fnuz", 8),
        "UINT4": ("uint4", 4), "INT4": ("int4", 4), "FLOAT4E2M1": ("float4_e2m1fn", 4),
        "FLOAT8E8M0": ("float8_e8m0fnu", 8), "UINT2": ("uint2", 2), "INT2": ("int2", 2),
    }
    return {getattr(TensorProto, k): v for k, v in names.items() if hasattr(TensorProto, k)}


DTYPES = _dtype_table()
_ELEM_TYPES = {name: et for et, (name, _bits) in DTYPES.items()}


def dtype_name(elem_type: int) -> str:
    return DTYPES.get(elem_type, (f"onnx_type_{elem_type}", 0))[0]


def elem_type(dtype: str) -> int | None:
    """The ONNX element type of a :func:`dtype_name`; None for one it does not know."""
    return _ELEM_TYPES.get(dtype)


def nbytes(elem_type: int, shape: Iterable[int]) -> int:
    """Bytes of a dense tensor; sub-byte types are packed (ceil)."""
    bits = DTYPES.get(elem_type, ("", 0))[1]
    return math.ceil(math.prod(shape) * bits / 8)


def proto_bytes(t: TensorProto) -> int:
    """Bytes of a TensorProto's data, from its dims alone (external data is never read)."""
    if t.data_type == TensorProto.STRING:
        return sum(len(s) for s in t.string_data)
    return nbytes(t.data_type, t.dims)


@dataclass(frozen=True)
class TensorType:
    dtype: str  # numpy dtype name ("float32", "int64", "bfloat16", "str", "seq(float32)")
    shape: tuple[int, ...]
    bytes: int


def bind_inputs(
    graph: onnx.GraphProto, weights: set[str], input_shapes: Mapping[str, Iterable[int]] | None
) -> dict[str, tuple[int, ...]]:
    """Concrete shape of every user-fed graph input, or a ModelError naming what is unbound.
    A dimension the model names (``past_sequence_length``) takes the size it has in an
    input given a shape: a decoder's 64 caches follow the one given."""
    given = {k: tuple(v) for k, v in (input_shapes or {}).items()}
    inputs = [i for i in graph.input if i.name not in weights]
    names = [i.name for i in inputs]
    for name, shape in given.items():
        if name not in names:
            what = "a weight (initializer)" if name in weights else "not an input of the model"
            raise ModelError(
                f"input shape given for '{name}', which is {what} (inputs: {', '.join(names)})"
            )
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0
                   for d in shape):
            raise ModelError(f"input shape for '{name}' must be non-negative integers, got {shape}")
    size_of: dict[str, int] = {}  # named dimension -> its size in the first input given it
    for vi in inputs:
        if vi.name in given and vi.type.tensor_type.HasField("shape"):
            for d, n in zip(vi.type.tensor_type.shape.dim, given[vi.name]):
                if d.dim_param:
                    size_of.setdefault(d.dim_param, int(n))
    bound: dict[str, tuple[int, ...]] = {}
    unbound: list[str] = []  # one message per unbound input
    for vi in inputs:
        t = vi.type
        if t.WhichOneof("value") != "tensor_type":
            raise ModelError(
                f"input '{vi.name}' is a {t.WhichOneof('value') or 'untyped value'}, "
                "not a tensor: only tensor inputs are supported"
            )
        if t.tensor_type.elem_type not in DTYPES or t.tensor_type.elem_type == 0:
            raise ModelError(f"input '{vi.name}' has no or an unknown element type")
        want = given.get(vi.name)
        if not t.tensor_type.HasField("shape"):
            if want is None:
                unbound.append(
                    f"input '{vi.name}' has no declared shape: bind it with "
                    f"--input-shape {vi.name}=NxN (one integer per dimension)"
                )
            else:
                bound[vi.name] = tuple(int(d) for d in want)
            continue
        dims = t.tensor_type.shape.dim
        if want is not None and len(want) != len(dims):
            raise ModelError(
                f"input '{vi.name}' has {len(dims)} dimensions but its given shape "
                f"{'x'.join(map(str, want))} has {len(want)}"
            )
        shape, free = [], []
        for k, d in enumerate(dims):
            fixed = d.dim_value if d.HasField("dim_value") else None
            if want is not None:
                if fixed is not None and fixed != want[k]:
                    raise ModelError(
                        f"input '{vi.name}' dimension {k} is fixed to {fixed} by the model "
                        f"but given as {want[k]}"
                    )
                shape.append(int(want[k]))
            elif fixed is not None:
                shape.append(fixed)
            elif d.dim_param in size_of:
                shape.append(size_of[d.dim_param])
            else:
                free.append((k, d.dim_param))
                shape.append(None)
        if free:
            which = ", ".join(f"{k} ('{p}')" if p else f"{k} (unnamed)" for k, p in free)
            what = "unbound dimensions" if len(free) > 1 else "an unbound dimension"
            hint = "x".join("N" if s is None else str(s) for s in shape)
            unbound.append(
                f"input '{vi.name}' has {what} {which}: bind it with "
                f"--input-shape {vi.name}={hint}"
            )
        else:
            bound[vi.name] = tuple(shape)
    if unbound:
        others = [m.split("'")[1] for m in unbound[1:]]
        more = f" (also unbound: {', '.join(others)})" if others else ""
        raise ModelError(unbound[0] + more)
    return bound


def dims_text(shape) -> str:
    """A shape as the --input-shape syntax writes it: 1x128; a scalar is 'scalar'."""
    return "x".join(map(str, shape)) if len(shape) else "scalar"


def bytes_text(n: float) -> str:
    """A byte count for people: 37.50 KiB, 1.20 GiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _value_info(name: str, elem_type: int, shape: Iterable[int]) -> onnx.ValueInfoProto:
    return onnx.helper.make_tensor_value_info(name, elem_type, list(shape))


def skeleton(
    model: onnx.ModelProto,
    base_dir: Path,
    bound: Mapping[str, tuple[int, ...]],
    node_names: list[str] | None = None,
) -> tuple[onnx.ModelProto, dict[str, tuple[int, tuple[int, ...]]]]:
    """A copy of ``model`` without its large weights, and the inputs it then needs.

    Nodes take the unique ``node_names`` (onnxruntime refuses duplicates), inputs are bound
    to concrete shapes; weights over KEEP_WEIGHT_BYTES (and small external
    ones whose data file cannot be read) become graph inputs; declared value_info and
    output shapes are dropped so that every shape is derived afresh, not trusted.
    """
    g = model.graph
    sk = onnx.ModelProto()
    sk.ir_version = min(max(model.ir_version, 4), ORT_MAX_IR_VERSION)
    sk.opset_import.extend(model.opset_import)
    sk.functions.extend(model.functions)
    sg = sk.graph
    sg.name = g.name or "graph"
    sg.node.extend(g.node)
    for node, name in zip(sg.node, node_names or ()):
        node.name = name
    feeds: dict[str, tuple[int, tuple[int, ...]]] = {}
    for vi in g.input:
        if vi.name in bound:
            et = vi.type.tensor_type.elem_type
            sg.input.append(_value_info(vi.name, et, bound[vi.name]))
            feeds[vi.name] = (et, bound[vi.name])
    for t in g.initializer:
        external = t.data_location == TensorProto.EXTERNAL
        if proto_bytes(t) <= KEEP_WEIGHT_BYTES and t.data_type != 0:
            kept = sg.initializer.add()
            kept.CopyFrom(t)
            if not external:
                continue
            try:
                onnx.external_data_helper.load_external_data_for_tensor(kept, str(base_dir))
                kept.data_location = TensorProto.DEFAULT
                del kept.external_data[:]
                continue
            except Exception:  # data file absent or unreadable: feed it like a big weight
                sg.initializer.pop()
        shape = tuple(t.dims)
        sg.input.append(_value_info(t.name, t.data_type, shape))
        feeds[t.name] = (t.data_type, shape)
    sg.sparse_initializer.extend(g.sparse_initializer)
    for o in g.output:
        sg.output.add().name = o.name
    return sk, feeds


def _exact(tp: onnx.TypeProto) -> TensorType | None:
    if tp.WhichOneof("value") != "tensor_type":
        return None
    tt = tp.tensor_type
    if tt.elem_type not in DTYPES or tt.elem_type == TensorProto.STRING or not tt.HasField("shape"):
        return None
    if not all(d.HasField("dim_value") for d in tt.shape.dim):
        return None
    shape = tuple(int(d.dim_value) for d in tt.shape.dim)
    return TensorType(dtype_name(tt.elem_type), shape, nbytes(tt.elem_type, shape))


def infer(sk: onnx.ModelProto) -> dict[str, TensorType]:
    """Tensors whose dtype and shape ONNX shape inference pins down exactly."""
    try:
        inferred = onnx.shape_inference.infer_shapes(
            sk, check_type=False, strict_mode=False, data_prop=True
        )
    except Exception:  # inference is a shortcut only; onnxruntime measures what it misses
        return {}
    found: dict[str, TensorType] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = _exact(vi.type)
        if tt is not None:
            found[vi.name] = tt
    return found


_NOT_REGISTERED = re.compile(r"(?:([\w.]+):)?(\w+)\((-?\d+)\) is not a registered function/op")
NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\((\d+)\) node with name '([^']*)'")


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    return text[:400]


def _runtime_error(e: BaseException, model: onnx.ModelProto, names: list[str]) -> ModelError | None:
    """A ModelError naming the node when onnxruntime has no kernel for its op, else None."""
    text = one_line(e)
    m = _NOT_REGISTERED.search(text)
    if m:
        domain, op = m.group(1) or "", m.group(2)
        domain = "" if domain == "ai.onnx" else domain
        qual = f"{domain}::{op}" if domain else op
        for node, name in zip(model.graph.node, names):
            if node.op_type == op and (node.domain if node.domain != "ai.onnx" else "") == domain:
                return ModelError(
                    f"onnxruntime cannot run node '{name}' ({qual}): no such operator is registered"
                )
        return ModelError(f"onnxruntime cannot run operator {qual}: no such operator is registered")
    if "ValidateOpsetForDomain" in text or "is under development" in text or \
            "Unsupported model IR version" in text:
        import onnxruntime as ort

        opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
        return ModelError(f"unsupported opset: the model imports {opsets} (IR version "
                          f"{model.ir_version}), which onnxruntime {ort.__version__} does not "
                          "support")
    m = NO_KERNEL.search(text)
    if m:
        return ModelError(
            f"onnxruntime cannot run node '{m.group(3)}' ({m.group(1)}, opset {m.group(2)}): "
            "no kernel for its input types"
        )
    return None


def _session(model_bytes: bytes, base_dir: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4  # failures reach the user as ModelError, not log lines
    so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                str(base_dir))
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


_INTEGER_TYPES = frozenset({TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
                            TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32,
                            TensorProto.UINT64, TensorProto.BOOL})


def stand_in(elem_type: int, shape: tuple[int, ...], weight: bool, rng: np.random.Generator,
          fill: float | None = None, below: int | None = None):
    """A stand-in value: random floats in [0, 1) for inputs, zeros for float weights (lazily
    mapped zero pages: GBs of weights cost neither time nor memory), ones for integers and
    booleans (a safe index, a live mask), or random integers under ``below`` where every
    one is a safe index (token ids: :func:`onnxsplit.export.index_bound`); ``fill`` (the
    user's --input-value) everywhere."""
    np_type = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    if elem_type == TensorProto.STRING:
        return np.full(shape, "a", dtype=object)
    if fill is not None:
        return np.full(shape, fill).astype(np_type)
    if below and np.issubdtype(np_type, np.integer):
        return rng.integers(0, below, size=shape).astype(np_type)
    if np.issubdtype(np_type, np.integer) or np_type == np.bool_:
        return np.ones(shape, dtype=np_type)
    if weight:
        return np.zeros(shape, dtype=np_type)
    return rng.random(shape, dtype=np.float32).astype(np_type)


def _measured(value) -> TensorType:
    if value is None:  # an empty optional
        return TensorType("none", (), 0)
    if isinstance(value, list):  # a sequence output
        parts = [_measured(v) for v in value]
        inner = parts[0].dtype if parts else "unknown"
        return TensorType(f"seq({inner})", (len(parts),), sum(p.bytes for p in parts))
    arr = np.asarray(value)
    if arr.dtype == object or arr.dtype.kind in "US":
        return TensorType("str", arr.shape, sum(len(str(s).encode()) for s in arr.flat))
    return TensorType(arr.dtype.name, tuple(int(d) for d in arr.shape), int(arr.nbytes))


def resolve(
    model: onnx.ModelProto,
    base_dir: Path,
    bound: Mapping[str, tuple[int, ...]],
    node_names: list[str],
    node_reads: list[list[str]],
    *,
    check_runtime: bool = True,
    fills: Mapping[str, float] | None = None,
) -> tuple[dict[str, TensorType], str]:
    """Type of every node output of the top-level graph, and where the answer came from.

    ``node_names`` (the importer's unique names) and ``node_reads`` (every tensor each node
    reads, captured ones included) are parallel to ``model.graph.node``.  Returns ``(types,
    source)`` with source ``"shape-inference"``, ``"onnxruntime-partial"`` (the weight-free
    part of the graph was run, inference did the rest) or ``"onnxruntime"`` (one run of the
    whole model).  Raises ModelError when onnxruntime cannot build or run the model.
    """
    sk, feeds = skeleton(model, base_dir, bound, node_names)
    wanted = list(dict.fromkeys(o for n in model.graph.node for o in n.output if o))
    types = infer(sk)
    source = "shape-inference"
    if any(n not in types for n in wanted):
        partial = _infer_after_partial_run(sk, feeds, bound, base_dir, node_reads, wanted, fills or {})
        if partial is not None:
            types, source = partial, "onnxruntime-partial"
    missing = [n for n in wanted if n not in types]
    if not missing and not check_runtime:
        return {n: types[n] for n in wanted}, source

    ctx = (feeds, base_dir, wanted, missing, model, node_names, bound, fills or {})
    try:
        measured = _run(sk, *ctx)
    except ModelError as skeleton_error:
        if skeleton_error.args[0].startswith("onnxruntime cannot run node"):
            raise
        # Rare: a kernel wants a weight as a constant, or a weight's values steer shapes.
        # Try once with the real weights (this reads them) before giving up.
        full = onnx.ModelProto()
        full.CopyFrom(model)
        full.ir_version = min(full.ir_version, ORT_MAX_IR_VERSION)
        for node, name in zip(full.graph.node, node_names):
            node.name = name
        try:
            measured = _run(full, *ctx)
        except ModelError:
            raise skeleton_error from None
    if measured is None:
        return {n: types[n] for n in wanted}, source
    return {n: measured[n] for n in wanted}, "onnxruntime"


def _infer_after_partial_run(sk, feeds, bound, base_dir, node_reads, wanted, fills):
    """Types of all ``wanted`` tensors, or None if running the weight-free part is not enough.

    What inference misses is mostly shape arithmetic on the inputs (Range, Shape, masks)
    that reads no weight.  Running just those nodes and handing inference their values as
    constants usually pins every shape down, without the cost of running the whole model.
    """
    tainted = {k for k in feeds if k not in bound}  # weights stood in for by inputs
    changed = True
    while changed:  # fixpoint: the file's node order need not be topological
        changed = False
        for i, (node, reads) in enumerate(zip(sk.graph.node, node_reads)):
            outs = [o for o in node.output if o]
            if outs and outs[0] not in tainted and any(r in tainted for r in reads):
                tainted.update(outs)
                changed = True
    cheap = [i for i, n in enumerate(sk.graph.node) if not any(o in tainted for o in n.output)]
    if not cheap or len(cheap) == len(sk.graph.node):
        return None  # nothing cheap to run, or the cheap part is the whole model
    cheap_out = [o for i in cheap for o in sk.graph.node[i].output if o]

    sub = onnx.ModelProto()
    sub.CopyFrom(sk)
    del sub.graph.node[:], sub.graph.output[:], sub.graph.input[:]
    sub.graph.node.extend(sk.graph.node[i] for i in cheap)
    sub.graph.input.extend(v for v in sk.graph.input if v.name in bound)
    for o in cheap_out:
        sub.graph.output.add().name = o
    rng = np.random.default_rng(0)
    try:
        sess = _session(sub.SerializeToString(), base_dir)
        values = sess.run(cheap_out, {k: stand_in(*feeds[k], False, rng, fills.get(k)) for k in bound})
    except Exception:  # the whole-model run will tell what is wrong
        return None
    if not all(isinstance(v, np.ndarray) and v.dtype != object for v in values):
        return None

    rest = onnx.ModelProto()
    rest.CopyFrom(sk)
    keep = [n for i, n in enumerate(sk.graph.node) if i not in set(cheap)]
    del rest.graph.node[:]
    rest.graph.node.extend(keep)
    rest.graph.initializer.extend(
        onnx.numpy_helper.from_array(v, o) for o, v in zip(cheap_out, values))
    types = infer(rest)
    types.update((o, _measured(v)) for o, v in zip(cheap_out, values))
    if any(n not in types for n in wanted):
        return None
    return types


def with_all_outputs(model):
    """A copy of the model in which every node output is also a graph output, so one run
    gives every intermediate value (for exact sizes, and the profiler's node inputs)."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in have:
                m.graph.output.add().name = o
                have.add(o)
    return m


def _run(m, feeds, base_dir, wanted, missing, model, node_names, bound, fills):
    """Build a session for ``m`` (checks every operator); if sizes are missing, run it once
    with every intermediate as an output and return what it measured."""
    shapes = ", ".join(f"{k}={dims_text(v)}" for k, v in bound.items())
    given = f" with inputs {shapes}" if shapes else ""
    if missing:
        present = {o.name for o in m.graph.output}
        for n in wanted:
            if n not in present:
                m.graph.output.add().name = n
    try:
        sess = _session(m.SerializeToString(), base_dir)
    except Exception as e:
        err = _runtime_error(e, model, node_names)
        if err is not None:
            raise err from None
        raise ModelError(f"onnxruntime cannot load the model{given}: {one_line(e)}") from None
    if not missing:
        return None

    rng = np.random.default_rng(0)
    inputs = {i.name for i in sess.get_inputs()}
    feed = {k: stand_in(et, shape, k not in bound, rng, fills.get(k))
            for k, (et, shape) in feeds.items() if k in inputs}
    out_names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(out_names, feed)
    except Exception as e:
        ones = [k for k in bound if k not in fills and feeds[k][0] in _INTEGER_TYPES]
        hint = (f" (integer inputs are fed ones; give real values with --input-value, e.g. "
                f"{ones[0]}=VALUE)" if ones else "")
        raise ModelError(
            f"onnxruntime could not run the model once{given} on random values to measure the "
            f"{len(missing)} tensor(s) shape inference left unknown (e.g. '{missing[0]}'): "
            f"{one_line(e)[:300]}{hint}"
        ) from None
    return {n: _measured(v) for n, v in zip(out_names, values)}
