"""OpGraph: an ONNX model read as the operator DAG that placement works on.

Placement needs each operator, the exact bytes of each tensor between operators, and the
weights each operator holds; nothing else of the model.  So the importer reads the graph
without its weight data (external files, > 2 GB models load in seconds), keeps If/Loop/Scan
atomic with their outer-scope reads as extra inputs, and refuses a model it cannot place
with one clear line (``ModelError``) instead of a traceback later on.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Iterator, Mapping, NamedTuple

import onnx
from onnx import AttributeProto, GraphProto, NodeProto

from . import limits, shapes
from .errors import ModelError
from .profile.store import profile_key


@dataclass(frozen=True)
class OpNode:
    name: str  # unique; unnamed nodes get "<op_type>_<index in file>"
    op_type: str
    domain: str  # "" for the default ONNX domain
    inputs: tuple[str, ...]  # as in the file; "" marks an omitted optional input
    outputs: tuple[str, ...]  # as in the file; "" marks an omitted optional output
    captured_inputs: tuple[str, ...] = ()  # outer-scope tensors its subgraphs read
    has_subgraphs: bool = False  # If / Loop / Scan: kept as one atomic node
    data_bytes: int = 0  # data the node owns: Constant values, subgraph weights
    index: int = 0  # position in the file's node list

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    @property
    def dependencies(self) -> tuple[str, ...]:
        """Every tensor the node reads, direct or captured, each once."""
        return tuple(dict.fromkeys(t for t in self.inputs + self.captured_inputs if t))


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # numpy dtype name: "float32", "int64", "bfloat16", "str", ...
    shape: tuple[int, ...]
    bytes: int  # exact, for the bound input shapes
    kind: str  # "input" | "initializer" | "activation"
    producer: str | None  # node name; None for graph inputs and initializers
    consumers: tuple[str, ...]  # nodes reading it (captured reads included), topological order


class Edge(NamedTuple):
    producer: str
    consumer: str
    tensor: str


@dataclass(frozen=True)
class OpGraph:
    path: str
    nodes: tuple[OpNode, ...]  # topological order (file order where that is one)
    tensors: Mapping[str, Tensor]
    inputs: tuple[str, ...]  # user-fed graph inputs (initializers excluded)
    outputs: tuple[str, ...]
    initializers: tuple[str, ...]  # weights, file order
    edges: tuple[Edge, ...]  # one per (producer, consumer, tensor)
    input_shapes: Mapping[str, tuple[int, ...]]  # the binding the sizes hold for
    opsets: Mapping[str, int]
    ir_version: int
    shapes_from: str  # "shape-inference", "onnxruntime-partial" or "onnxruntime"
    input_fills: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))  # inputs fed a given value
    profile_key: str = ""  # what its profile is keyed by: the graph, bound shapes and fills (profile/store.py)

    @classmethod
    def from_onnx(
        cls,
        path: str | Path,
        input_shapes: Mapping[str, Iterable[int]] | None = None,
        *,
        check_runtime: bool = True,
        input_fills: Mapping[str, float] | None = None,
    ) -> "OpGraph":
        """Import ``path``; dynamic input dimensions must be bound in ``input_shapes``.

        ``check_runtime=False`` skips building an onnxruntime session when shape inference
        already gives every size (no check that onnxruntime can run each operator).
        ``input_fills``: inputs whose value steers the graph (an If on a sample rate) and
        the value every run should feed them, instead of ones / random floats.
        """
        return _import(Path(path), input_shapes, check_runtime, dict(input_fills or {}))

    def __len__(self) -> int:
        return len(self.nodes)

    @cached_property
    def _by_name(self) -> dict[str, OpNode]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> OpNode:
        return self._by_name[name]

    @property
    def weights(self) -> tuple[Tensor, ...]:
        """Initializers, each once, with every node that uses it in ``consumers``."""
        return tuple(self.tensors[w] for w in self.initializers)

    @property
    def weight_bytes(self) -> int:
        return sum(t.bytes for t in self.weights)

    def proto(self) -> onnx.ModelProto:
        """The model file without weight data (external data stays a reference), its nodes
        renamed to this graph's unique names, IR version within onnxruntime's range."""
        model = load_model(Path(self.path))
        for node, opnode in zip(model.graph.node, sorted(self.nodes, key=lambda n: n.index)):
            node.name = opnode.name
        model.ir_version = min(max(model.ir_version, 4), shapes.ORT_MAX_IR_VERSION)
        return model

    def weights_of(self, node: str) -> tuple[str, ...]:
        return tuple(t for t in self.node(node).dependencies if self.tensors[t].kind == "initializer")

    def predecessors(self, node: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.producer for e in self._in_edges.get(node, ())))

    def successors(self, node: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.consumer for e in self._out_edges.get(node, ())))

    @cached_property
    def _in_edges(self) -> dict[str, list[Edge]]:
        d: dict[str, list[Edge]] = {}
        for e in self.edges:
            d.setdefault(e.consumer, []).append(e)
        return d

    @cached_property
    def _out_edges(self) -> dict[str, list[Edge]]:
        d: dict[str, list[Edge]] = {}
        for e in self.edges:
            d.setdefault(e.producer, []).append(e)
        return d

    def to_networkx(self):
        """A ``networkx.DiGraph``: node attrs from OpNode, edge attrs ``tensors`` and ``bytes``."""
        import networkx as nx

        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.name, op_type=n.op_type, domain=n.domain, data_bytes=n.data_bytes)
        for e in self.edges:
            if g.has_edge(e.producer, e.consumer):
                g.edges[e.producer, e.consumer]["tensors"].append(e.tensor)
                g.edges[e.producer, e.consumer]["bytes"] += self.tensors[e.tensor].bytes
            else:
                g.add_edge(e.producer, e.consumer, tensors=[e.tensor],
                           bytes=self.tensors[e.tensor].bytes)
        return g


# ---------------------------------------------------------------------------- reading


def load_model(path: Path) -> onnx.ModelProto:
    if not path.exists():
        raise ModelError(f"model file '{path}' does not exist")
    if path.is_dir():
        raise ModelError(f"'{path}' is a directory, not an ONNX model file")
    try:
        if path.stat().st_size == 0:
            raise ModelError(f"model file '{path}' is empty")
        model = onnx.load(str(path), load_external_data=False)
    except ModelError:
        raise
    except OSError as e:
        raise ModelError(f"cannot read model file '{path}': {e.strerror or e}") from None
    except Exception as e:  # protobuf DecodeError and friends
        why = " ".join(str(e).split())[:200] or type(e).__name__
        raise ModelError(
            f"'{path}' is not a readable ONNX model (truncated or another format): {why}"
        ) from None
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        missing = [w for w, ok in (("IR version", model.ir_version > 0),
                                   ("graph", model.HasField("graph")),
                                   ("opset import", bool(model.opset_import))) if not ok]
        raise ModelError(
            f"'{path}' is not an ONNX model (truncated or another format): "
            f"it has no {', no '.join(missing)}"
        )
    return model


def subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs


def _free_names(graph: GraphProto) -> list[str]:
    """Names ``graph`` (recursively) reads from enclosing scopes, in order of first use."""
    defined = {v.name for v in graph.input}
    defined.update(t.name for t in graph.initializer)
    defined.update(s.values.name for s in graph.sparse_initializer)
    defined.update(o for n in graph.node for o in n.output if o)
    free: dict[str, None] = {}
    for n in graph.node:
        reads = list(n.input)
        for sub in subgraphs(n):
            reads.extend(_free_names(sub))
        for r in reads:
            if r and r not in defined:
                free.setdefault(r)
    for o in graph.output:
        if o.name not in defined:
            free.setdefault(o.name)
    return list(free)


_SCALAR_ATTR_BYTES = {
    "value_float": 4, "value_int": 8,
}


def _owned_bytes(node: NodeProto) -> int:
    """Bytes of data held inside the node: tensor attributes and subgraph weights."""
    total = 0
    for a in node.attribute:
        if a.type == AttributeProto.TENSOR:
            total += shapes.proto_bytes(a.t)
        elif a.type == AttributeProto.TENSORS:
            total += sum(shapes.proto_bytes(t) for t in a.tensors)
        elif a.type == AttributeProto.SPARSE_TENSOR:
            total += shapes.proto_bytes(a.sparse_tensor.values) + shapes.proto_bytes(
                a.sparse_tensor.indices)
        elif node.op_type == "Constant" and not node.domain:
            if a.type == AttributeProto.FLOATS:
                total += 4 * len(a.floats)
            elif a.type == AttributeProto.INTS:
                total += 8 * len(a.ints)
            elif a.type == AttributeProto.STRING:
                total += len(a.s)
            elif a.type == AttributeProto.STRINGS:
                total += sum(len(s) for s in a.strings)
            else:
                total += _SCALAR_ATTR_BYTES.get(a.name, 0)
    for sub in subgraphs(node):
        total += sum(shapes.proto_bytes(t) for t in sub.initializer)
        total += sum(_owned_bytes(n) for n in sub.node)
    return total


def _unique_names(nodes: Iterable[NodeProto]) -> list[str]:
    """The file's node names, with unnamed and duplicate ones made unique, deterministically."""
    nodes = list(nodes)
    taken = {n.name for n in nodes if n.name}
    seen: set[str] = set()
    out = []
    for i, n in enumerate(nodes):
        base = n.name if n.name and n.name not in seen else (n.name or f"{n.op_type}_{i}")
        name, k = base, 1
        while name in seen or (name != n.name and name in taken):
            name, k = f"{base}__{k}", k + 1
        seen.add(name)
        out.append(name)
    return out


def _topological(names: list[str], deps: list[list[int]]) -> list[int]:
    """Kahn's order, earliest file position first; ModelError naming a node on a cycle."""
    succ: list[list[int]] = [[] for _ in names]
    indeg = [0] * len(names)
    for i, ds in enumerate(deps):
        for d in set(ds):
            succ[d].append(i)
            indeg[i] += 1
    ready = [i for i, k in enumerate(indeg) if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < len(names):
        import networkx as nx

        left = {i for i, k in enumerate(indeg) if k > 0}
        g = nx.DiGraph((d, i) for i in left for d in deps[i] if d in left)
        cycle = [names[u] for u, _ in nx.find_cycle(g)]
        path = " -> ".join(cycle + [cycle[0]])
        raise ModelError(f"the graph has a cycle through node '{cycle[0]}' ({path})")
    return order


# element types numpy (and so onnxruntime's Python API) has no array for: such an input
# cannot be fed, to profile or to check the parts
_UNFEEDABLE = ("bfloat16", "float8", "float4", "int4", "uint4", "int2", "uint2")


def _check_feedable(g: GraphProto, inputs, bound) -> None:
    """Each graph input can be made as a numpy array, within the memory limit (said before
    onnxruntime or numpy is asked to)."""
    total = 0
    for v in g.input:
        if v.name not in inputs:
            continue
        et = v.type.tensor_type.elem_type
        name = shapes.dtype_name(et)
        if name.startswith(_UNFEEDABLE):
            raise ModelError(f"input '{v.name}' is {name}, which onnxruntime's Python API cannot "
                             "be fed: make it float32 and Cast inside the model")
        total += shapes.nbytes(et, bound[v.name])
    if not limits.fits(total):
        raise ModelError(f"the inputs at the bound shapes would take {total / 1e9:.1f} GB, over "
                         f"the memory limit of {limits.limit_bytes() / 1e9:.1f} GB: bind smaller "
                         "shapes (--input-shape) or raise --memory-limit")


def _import(path: Path, input_shapes, check_runtime: bool, fills: dict[str, float]) -> OpGraph:
    model = load_model(path)
    g = model.graph
    if not g.node:
        raise ModelError(f"model '{path}' has no operators (its graph has no nodes)")
    names = _unique_names(g.node)

    weights = [t.name for t in g.initializer] + [s.values.name for s in g.sparse_initializer]
    weight_set = set(weights)
    inputs = [v.name for v in g.input if v.name not in weight_set]
    sources = set(inputs) | weight_set

    producer: dict[str, int] = {}
    for i, n in enumerate(g.node):
        for o in n.output:
            if not o:
                continue
            if o in producer:
                raise ModelError(
                    f"tensor '{o}' is produced by two nodes, '{names[producer[o]]}' and '{names[i]}'"
                )
            if o in sources:
                raise ModelError(f"node '{names[i]}' overwrites graph input or weight '{o}'")
            producer[o] = i

    captured = [_free_names_of_node(n) for n in g.node]
    deps: list[list[int]] = []
    for i, n in enumerate(g.node):
        mine = []
        for t in dict.fromkeys(list(n.input) + captured[i]):
            if not t:
                continue
            if t in producer:
                mine.append(producer[t])
            elif t not in sources:
                how = "captures" if t not in n.input else "reads"
                raise ModelError(
                    f"node '{names[i]}' ({n.op_type}) {how} tensor '{t}' that nothing produces "
                    "(not a graph input, weight or node output)"
                )
        deps.append(mine)
    for o in g.output:
        if o.name not in producer and o.name not in sources:
            raise ModelError(f"graph output '{o.name}' is produced by nothing")
    order = _topological(names, deps)

    bound = shapes.bind_inputs(g, weight_set, input_shapes)
    key = profile_key(model, bound, fills)
    _check_feedable(g, inputs, bound)
    unknown = [k for k in fills if k not in inputs]
    if unknown:
        raise ModelError(f"--input-value names '{unknown[0]}', which is not an input of the model "
                         f"(inputs: {', '.join(inputs) or 'none'})")
    reads = [list(n.input) + captured[i] for i, n in enumerate(g.node)]
    types, source = shapes.resolve(model, path.parent, bound, names, reads,
                                   check_runtime=check_runtime, fills=fills)

    nodes = tuple(
        OpNode(
            name=names[i], op_type=g.node[i].op_type, domain=g.node[i].domain,
            inputs=tuple(g.node[i].input), outputs=tuple(g.node[i].output),
            captured_inputs=tuple(captured[i]),
            has_subgraphs=any(True for _ in subgraphs(g.node[i])),
            data_bytes=_owned_bytes(g.node[i]), index=i,
        )
        for i in order
    )
    consumers: dict[str, list[str]] = {}
    edges = []
    for n in nodes:
        for t in n.dependencies:
            consumers.setdefault(t, []).append(n.name)
            if t in producer:
                edges.append(Edge(names[producer[t]], n.name, t))

    tensors: dict[str, Tensor] = {}
    by_type = {v.name: v.type.tensor_type.elem_type for v in g.input}
    for name in inputs:
        shape = bound[name]
        et = by_type[name]
        tensors[name] = Tensor(name, shapes.dtype_name(et), shape, shapes.nbytes(et, shape),
                               "input", None, tuple(consumers.get(name, ())))
    for t in g.initializer:
        tensors[t.name] = Tensor(t.name, shapes.dtype_name(t.data_type), tuple(t.dims),
                                 shapes.proto_bytes(t), "initializer", None,
                                 tuple(consumers.get(t.name, ())))
    for s in g.sparse_initializer:
        v = s.values
        tensors[v.name] = Tensor(v.name, shapes.dtype_name(v.data_type), tuple(s.dims),
                                 shapes.nbytes(v.data_type, s.dims), "initializer", None,
                                 tuple(consumers.get(v.name, ())))
    for n in nodes:
        for o in n.outputs:
            if o:
                tt = types[o]
                tensors[o] = Tensor(o, tt.dtype, tt.shape, tt.bytes, "activation", n.name,
                                    tuple(consumers.get(o, ())))

    largest = max((t for t in tensors.values() if t.kind == "activation"), key=lambda t: t.bytes,
                  default=None)
    if largest is not None and not limits.fits(largest.bytes):
        raise ModelError(f"tensor '{largest.name}' ({'x'.join(map(str, largest.shape))} "
                         f"{largest.dtype}) would take {largest.bytes / 1e9:.1f} GB, over the "
                         f"memory limit of {limits.limit_bytes() / 1e9:.1f} GB: bind smaller "
                         f"input shapes (--input-shape) or raise --memory-limit")
    return OpGraph(
        path=str(path),
        nodes=nodes,
        tensors=MappingProxyType(tensors),
        inputs=tuple(inputs),
        outputs=tuple(o.name for o in g.output),
        initializers=tuple(weights),
        edges=tuple(edges),
        input_shapes=MappingProxyType(dict(bound)),
        opsets=MappingProxyType({o.domain or "": o.version for o in model.opset_import}),
        ir_version=model.ir_version,
        shapes_from=source,
        input_fills=MappingProxyType(dict(fills)),
        profile_key=key,
    )


def _free_names_of_node(node: NodeProto) -> list[str]:
    free: dict[str, None] = {}
    for sub in subgraphs(node):
        for name in _free_names(sub):
            free.setdefault(name)
    return list(free)
