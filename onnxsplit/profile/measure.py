"""Time every node of a model alone, on one execution provider.

Used on accelerators, for small models, and for nodes the in-graph profiler (``ingraph``)
reports nothing for.  A node alone keeps its weights in cache, so per-node times add up
to a little under the whole model (``python tools/bench_profile.py`` prints by how much).  The method:

1. Run the whole model once on the CPU with every intermediate tensor as an output, so
   that every node has real input values (:func:`reference_values`).
2. For each node, build a model holding that node alone: its activation inputs become
   graph inputs fed with those values, the weights it reads stay initializers (external
   data is read from the original file, never copied), If/Loop/Scan keep their subgraphs
   and get their captured tensors as inputs (:func:`node_model`).
3. Run it in a session with one intra-op thread (one CPU core) and graph optimisations
   off: warm-up runs, then timed runs; keep the median and the 10th/90th percentiles.
   Nodes whose single-node models are identical (same op, attributes, input and output
   types and shapes, same small integer inputs) are timed once (:func:`group_key`).
4. Subtract the cost of an empty ``run`` call and add what one more node costs inside a
   graph (both measured on the EP), so that tiny operators are not charged the Python
   call overhead the whole model pays once.

On an EP other than the CPU's, a node is supported when a session can be built for it
and onnxruntime assigns it to that EP (not back to the CPU); inputs and outputs are bound
in the EP's memory where onnxruntime can put them there, so times exclude host copies.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper

from .. import shapes
from ..errors import ModelError, ProfileError
from ..graph import OpGraph, OpNode
from . import devices
from .store import NodeTiming

_SMALL_VALUE_ELEMS = 64  # integer inputs this small are part of a node's identity (shapes)
_FAST_S = 1e-3  # nodes faster than this get extra timed runs: they are cheap and noisy
CHAIN = 32  # nodes in the chain that measures the per-node overhead inside a graph
NODE_BUDGET_S = 5.0  # a node slower than this over all its runs gets fewer (at least 3)


# --------------------------------------------------------------------- reference values


def input_feeds(graph: OpGraph, seed: int = 0) -> dict[str, np.ndarray]:
    """Stand-in values for the user inputs: random floats in [0, 1), ones for integers,
    the graph's ``input_fills`` where given."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.inputs:
        t = graph.tensors[name]
        out[name] = shapes.stand_in(shapes.elem_type(t.dtype) or TensorProto.FLOAT, t.shape, False, rng,
                                 graph.input_fills.get(name))
    return out


def session_options(threads: int | None = 1, base_dir: str | Path | None = None,
                    record: bool = False, optimize: bool = False):
    """Sessions as nodes are timed, and as the runner runs the parts so the plan holds:
    graph optimisations off (``optimize`` turns them on; on one thread they made BERT
    models slower here, 1.80 vs 1.49 ms for models/small_bert), ``threads`` intra-op
    threads (0 or None: onnxruntime's default)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    so.log_severity_level = 4  # failures are reported per node, not as log lines
    if base_dir is not None:
        so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                    str(base_dir))
    if record:
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    return so


def reference_values(model: onnx.ModelProto, graph: OpGraph,
                     feeds: Mapping[str, np.ndarray]) -> dict[str, object]:
    """Every top-level tensor's value in one CPU run of the real model (inputs included)."""
    import onnxruntime as ort

    m = shapes.with_all_outputs(model)
    so = session_options(threads=0, base_dir=Path(graph.path).parent)
    given = ", ".join(f"{k}={shapes.dims_text(v.shape)}" for k, v in feeds.items())
    try:
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=[devices.CPU_EP])
        names = [o.name for o in sess.get_outputs()]
        values = sess.run(names, dict(feeds))
    except Exception as e:
        raise ModelError(f"onnxruntime could not run the model with inputs {given} to get every "
                         f"node's input values: {shapes.one_line(e)}") from None
    out: dict[str, object] = dict(feeds)
    out.update(zip(names, values))
    return out


# --------------------------------------------------------------------- single-node models


def _value_info(name: str, value, dtype: str) -> onnx.ValueInfoProto:
    if isinstance(value, list):
        inner = dtype[4:-1] if dtype.startswith("seq(") else ""
        et = shapes.elem_type(inner) or (helper.np_dtype_to_tensor_dtype(value[0].dtype) if value
                                       else TensorProto.FLOAT)
        return helper.make_tensor_sequence_value_info(name, et, None)
    arr = np.asarray(value)
    if arr.dtype == object or arr.dtype.kind in "US":
        et = TensorProto.STRING
    else:
        et = shapes.elem_type(dtype) or helper.np_dtype_to_tensor_dtype(arr.dtype)
    return helper.make_tensor_value_info(name, et, list(arr.shape))


@dataclass
class NodeModel:
    node: str
    proto: onnx.ModelProto
    feeds: dict[str, object]


def weights_by_name(model: onnx.ModelProto) -> dict[str, object]:
    """Initializers (dense TensorProto, sparse SparseTensorProto) by name."""
    out: dict[str, object] = {t.name: t for t in model.graph.initializer}
    out.update((s.values.name, s) for s in model.graph.sparse_initializer)
    return out


def node_model(model: onnx.ModelProto, graph: OpGraph, opnode: OpNode,
               values: Mapping[str, object], weights: Mapping[str, object] | None = None
               ) -> NodeModel:
    """A model holding ``opnode`` alone, and the values to feed it."""
    src = model.graph
    weights = weights if weights is not None else weights_by_name(model)
    g = onnx.GraphProto()
    g.name = f"node_{opnode.index}"
    g.node.add().CopyFrom(src.node[opnode.index])
    feeds: dict[str, object] = {}
    for t in opnode.dependencies:
        w = weights.get(t)
        if isinstance(w, TensorProto):
            g.initializer.add().CopyFrom(w)
        elif w is not None:
            g.sparse_initializer.add().CopyFrom(w)
        else:
            v = values.get(t)
            if v is None:
                raise ProfileError(f"input '{t}' has no value (an empty optional)")
            g.input.append(_value_info(t, v, graph.tensors[t].dtype))
            feeds[t] = v
    for o in opnode.outputs:
        if o:
            g.output.add().name = o
    m = onnx.ModelProto()
    m.ir_version = model.ir_version
    m.opset_import.extend(model.opset_import)
    m.functions.extend(model.functions)
    m.graph.CopyFrom(g)
    return NodeModel(opnode.name, m, feeds)


def group_key(model: onnx.ModelProto, graph: OpGraph, opnode: OpNode,
              values: Mapping[str, object], weights: Mapping[str, object]) -> bytes | None:
    """Equal keys mean identical single-node models up to input values that do not change
    the work (float data, large tensors).  None: never grouped (subgraphs, sequences)."""
    if opnode.has_subgraphs:
        return None
    node = model.graph.node[opnode.index]
    parts: list[object] = [opnode.domain, opnode.op_type]
    parts += [a.SerializeToString(deterministic=True)
              for a in sorted(node.attribute, key=lambda a: a.name)]
    for t in opnode.inputs:
        if not t:
            parts.append("-")
            continue
        info = graph.tensors[t]
        parts += [info.kind == "initializer", info.dtype, info.shape]
        v = values.get(t)
        if info.kind == "initializer":
            init = weights.get(t)
            if isinstance(init, TensorProto) and math.prod(init.dims) <= _SMALL_VALUE_ELEMS:
                parts.append(init.SerializeToString(deterministic=True))
        elif isinstance(v, np.ndarray):
            if v.dtype.kind in "iub" and v.size <= _SMALL_VALUE_ELEMS:
                parts.append(v.tobytes())
        else:
            return None
    for o in opnode.outputs:
        if o:
            info = graph.tensors[o]
            parts += [info.dtype, info.shape]
    return repr(parts).encode()


# --------------------------------------------------------------------- timing on one EP


@dataclass
class Timing:
    median: float  # seconds
    p10: float
    p90: float
    runs: int
    samples: np.ndarray

    @classmethod
    def of(cls, samples: np.ndarray) -> "Timing":
        p10, med, p90 = np.percentile(samples, [10, 50, 90])
        return cls(float(med), float(p10), float(p90), len(samples), samples)


class Runner:
    """Sessions and timed runs on one EP, one intra-op thread per session."""

    def __init__(self, ep: str, base_dir: str | Path, threads: int = 1,
                 provider_options: Mapping | None = None):
        import onnxruntime as ort

        self.ort = ort
        self.ep = ep
        self.base_dir = base_dir
        self.threads = threads
        self.options = dict(provider_options or {})
        self.device = devices.ORTVALUE_DEVICE.get(ep, "cpu")
        self._device_ok: bool | None = None

    def providers(self) -> list:
        first = (self.ep, self.options) if self.options else self.ep
        return [first] if self.ep == devices.CPU_EP else [first, devices.CPU_EP]

    def session(self, proto: onnx.ModelProto | bytes, profile_prefix: str | Path | None = None):
        """A session on this EP; with ``profile_prefix``, onnxruntime's profiler on, writing
        its events there (``ingraph``)."""
        data = proto if isinstance(proto, bytes) else proto.SerializeToString()
        so = session_options(self.threads, self.base_dir, record=self.ep != devices.CPU_EP)
        if profile_prefix is not None:
            so.enable_profiling = True
            so.profile_file_prefix = str(profile_prefix)
        from ..providers import plugins

        if self.ep in plugins.providers():  # (a plugin EP is given as its device)
            plugins.add_to_session(so, self.ep, self.options)
            sess = self.ort.InferenceSession(data, so)
        else:
            # enable_fallback=0: where the EP cannot be set up (TensorRT listed by
            # onnxruntime-gpu without its libraries), onnxruntime would print to stdout and
            # build a CPU session
            sess = self.ort.InferenceSession(data, so, providers=self.providers(), enable_fallback=0)
        if self.ep not in sess.get_providers():
            raise RuntimeError(f"onnxruntime set the session up on {', '.join(sess.get_providers())}")
        return sess

    def assigned_elsewhere(self, sess, names: Iterable[str] | None = None) -> list[str]:
        """Nodes (of ``names``, or all) that onnxruntime did not give to this EP."""
        if self.ep == devices.CPU_EP:
            return []
        try:
            info = sess.get_provider_graph_assignment_info()
        except Exception:  # no assignment record in this onnxruntime: trust the session
            return []
        where = {n.name: sg.ep_name for sg in info for n in sg.get_nodes()}
        wanted = list(names) if names is not None else list(where)
        return [n for n in wanted if where.get(n, self.ep) != self.ep]

    def bind(self, sess, feeds: Mapping[str, object]):
        """A zero-argument callable running ``sess`` once on ``feeds``."""
        plain = all(isinstance(v, np.ndarray) and v.dtype != object for v in feeds.values())
        outs = [o.name for o in sess.get_outputs()]
        if not plain:
            return lambda: sess.run(outs, dict(feeds))
        binding = sess.io_binding()
        device = self.device if self._device_ok is not False else "cpu"
        for name, v in feeds.items():
            if device == "cpu":
                binding.bind_cpu_input(name, v)
                continue
            try:
                ov = self.ort.OrtValue.ortvalue_from_numpy(v, device, 0)
                self._device_ok = True
            except Exception:  # this build cannot hold tensors there: feed from the host
                self._device_ok = False
                device = "cpu"
                binding.bind_cpu_input(name, v)
                continue
            binding.bind_ortvalue_input(name, ov)
        for o in outs:
            binding.bind_output(o, device)
        return lambda: sess.run_with_iobinding(binding)

    def time(self, sess, feeds: Mapping[str, object], warmup: int, repeats: int,
             budget_s: float | None = None) -> Timing:
        """Median and spread of ``repeats`` timed runs after ``warmup`` runs; runs under a
        millisecond get five times as many; with ``budget_s``, a slow node gets no more
        runs than fit in it (at least 3)."""
        run = self.bind(sess, feeds)
        clock = time.perf_counter
        t = clock()
        run()
        first = clock() - t
        slow = budget_s is not None and first * (warmup + repeats) > budget_s
        for _ in range(0 if slow else max(warmup - 1, 0)):
            run()
        n = repeats if first > _FAST_S else min(max(repeats, 1) * 5, 200)
        if slow:
            n = min(n, max(3, int(budget_s / max(first, 1e-9))))
        return Timing.of(sample(run, max(n, 1)))

    def overheads(self, warmup: int, repeats: int) -> tuple[float, float]:
        """(cost of one ``run`` call of a one-node model, cost of one more node in a graph),
        in seconds, from chains of 1 and ``CHAIN`` Relu nodes on a 1-element tensor."""
        x = np.ones((1,), dtype=np.float32)
        times = []
        for n in (1, CHAIN):
            try:
                sess = self.session(relu_chain(n))
            except Exception:
                return 0.0, 0.0
            reps = max(repeats, 50)
            times.append(min(self.time(sess, {"t0": x}, warmup, reps).median for _ in range(3)))
        call = times[0]
        per_node = max((times[1] - times[0]) / (CHAIN - 1), 0.0)
        return call, per_node


def relu_chain(n: int) -> onnx.ModelProto:
    """``n`` Relu nodes in a row on a 1-element tensor ``t0``: nodes that cost only what
    running a node costs."""
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"r{i}") for i in range(n)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def sample(run: Callable[[], object], n: int) -> np.ndarray:
    """Seconds taken by each of ``n`` calls of ``run``."""
    clock = time.perf_counter
    out = np.empty(n)
    for i in range(n):
        t = clock()
        run()
        out[i] = clock() - t
    return out


def whole_model(runner: Runner, model: onnx.ModelProto, feeds: Mapping[str, object]):
    """A session for the whole model on the runner's EP and the share of nodes it kept."""
    sess = runner.session(model)
    names = [n.name for n in model.graph.node]
    elsewhere = runner.assigned_elsewhere(sess, names)
    return sess, 1.0 - len(elsewhere) / max(len(names), 1)


def profile_nodes(runner: Runner, model: onnx.ModelProto, graph: OpGraph,
                  values: Mapping[str, object], *, warmup: int, repeats: int, group: bool,
                  overheads: tuple[float, float], rounds: int = 2,
                  progress: Callable[[int], None] | None = None,
                  between: Callable[[int, int], None] | None = None,
                  only: set[str] | None = None) -> dict[str, NodeTiming]:
    """Time every node of ``graph`` alone (identical single-node models once).

    Every distinct node is timed in ``rounds`` rounds over the whole graph, each with a
    fresh session, warm-up and its share of the ``repeats``; the median and percentiles
    are taken over all its samples.  A burst of noise from a shared machine then spoils
    part of a node's samples rather than all of them.  ``progress(n)`` is called with the
    number of nodes each timing stands for, ``between(step, steps)`` after each timing
    (the caller interleaves whole-model runs with the nodes').  ``only``: time just these
    nodes (and return just theirs).
    """
    call, per_node = overheads
    weights = weights_by_name(model)
    groups: dict[object, list[OpNode]] = {}
    chosen = [n for n in graph.nodes if only is None or n.name in only]
    for n in chosen:
        key = group_key(model, graph, n, values, weights) if group else None
        groups.setdefault(key if key is not None else ("node", n.name), []).append(n)
    rounds = max(1, min(rounds, repeats))
    share = math.ceil(repeats / rounds)
    samples: dict[object, list[np.ndarray]] = {}
    failed: dict[object, NodeTiming] = {}
    steps, step = rounds * len(groups), 0
    for _ in range(rounds):
        for key, members in groups.items():
            if key not in failed:
                got = _time_node(runner, model, graph, members[0], values, weights, warmup,
                                 share, NODE_BUDGET_S / rounds)
                if isinstance(got, NodeTiming):
                    failed[key] = got
                else:
                    samples.setdefault(key, []).append(got.samples)
            step += 1
            if progress is not None:
                progress(len(members))
            if between is not None:
                between(step, steps)
    out: dict[str, NodeTiming] = {}
    for key, members in groups.items():
        first = members[0]
        if key in failed:
            f = failed[key]
            timing = NodeTiming(first.op_type, f.supported, error=f.error)
        else:
            t = Timing.of(np.concatenate(samples[key]))
            timing = NodeTiming(first.op_type, True, _ms(t.median, call, per_node),
                                _ms(t.p10, call, per_node), _ms(t.p90, call, per_node))
        for n in members:
            out[n.name] = NodeTiming(n.op_type, timing.supported, timing.median_ms, timing.p10_ms,
                                     timing.p90_ms, same_as=None if n is first else first.name,
                                     error=timing.error)
    return {n.name: out[n.name] for n in chosen}


def _ms(seconds: float, call: float, per_node: float) -> float:
    return round((max(seconds - call, 0.0) + per_node) * 1e3, 6)


def _time_node(runner, model, graph, opnode, values, weights, warmup, repeats,
               budget_s) -> Timing | NodeTiming:
    """The node's timing, or a NodeTiming saying why it has none."""
    try:
        nm = node_model(model, graph, opnode, values, weights)
    except ProfileError as e:
        return NodeTiming(opnode.op_type, True, error=f"not timed alone: {e}")
    try:
        sess = runner.session(nm.proto)
    except Exception as e:
        why = shapes.one_line(e)
        if runner.ep == devices.CPU_EP:  # it ran in the whole model: a profiling limit
            return NodeTiming(opnode.op_type, True, error=f"not timed alone: {why}")
        return NodeTiming(opnode.op_type, False, error=f"{runner.ep} cannot run it: {why}")
    elsewhere = runner.assigned_elsewhere(sess, [opnode.name])
    if elsewhere:
        return NodeTiming(opnode.op_type, False,
                          error=f"{runner.ep} does not take it (onnxruntime falls back to the CPU)")
    try:
        return runner.time(sess, nm.feeds, warmup, repeats, budget_s=budget_s)
    except Exception as e:
        supported = runner.ep == devices.CPU_EP
        return NodeTiming(opnode.op_type, supported, error=f"run failed: {shapes.one_line(e)}")
