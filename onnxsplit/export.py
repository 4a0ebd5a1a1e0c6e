"""Export: a placement becomes a folder of runnable per-device ONNX parts and a manifest.

A part is a set of nodes one device runs in one call (by default one per device; a
latency plan's pieces give several).  :func:`export` writes ``part<i>_<device>.onnx``
per part, one shared ``weights.bin``, ``annotated.onnx`` (the whole model, each node
tagged with its device, in ``layer_ann`` and in ONNX's multi-device fields) and
``manifest.json`` (the parts, the tensors that cross them, the prediction).  Parts are
built from the protobuf directly and weights are streamed, so models over 2 GB work; a
plan whose parts form a cycle raises ``SplitError`` before anything is written, and the
folder is staged beside its target and renamed into place at the end.

Write-up: docs/machine.md (The parts, annotated.onnx and session.json).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple

import onnx
from onnx import AttributeProto, TensorProto

from . import genai_config, interrupt, progress, ranges
from .errors import OnnxsplitError, SplitError
from .files import loads
from .graph import OpGraph, subgraphs
from .profile.devices import CPU_EP
from .providers import openvino, plugins
from .shapes import KEEP_WEIGHT_BYTES, elem_type, proto_bytes

FORMAT = "onnxsplit-parts/1"
MANIFEST = "manifest.json"
WEIGHTS = "weights.bin"
INLINE_BYTES = 1024  # weights this small stay inside each part that reads them
_ALIGN_BIG = 64 * 1024  # page-aligned offsets let onnxruntime map big tensors from the file
_BIG = 1 << 20
MODEL_INPUT = "input"  # the producer named for a model input
ANNOTATED = "annotated.onnx"  # the whole model, each node annotated with its device
SESSION_FILE = "session.json"  # how one onnxruntime session runs the annotated model
LAYER_ANN = "layer_ann"
# the graph optimisation levels a plan runs its sessions at: onnxruntime's own, and all of
# its optimisations but the fusions whose CPU kernels measured slower than what they
# fuse (onnxruntime 1.32 on this project's 2-core machine: SkipLayerNormalization 87 us
# against 17 us for its Add and LayerNormalization, 64x256, one thread)
UNFUSED = "all_unfused"
LEVELS = ("all", "disabled", UNFUSED)
UNFUSED_CONFIG = {"optimization.disable_specified_optimizers": "SkipLayerNormFusion"}
CONFIGURATION = "onnxsplit"  # the annotated model's multi-device configuration, by name
_MULTI_DEVICE_IR = 11  # the IR version that brought the multi-device fields
# onnxruntime's device type for an EP in session.layer_assignment_settings
_ORT_DEVICE = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "gpu"}


def level_fields(optimization: str | None, cpu_only: bool = True) -> dict[str, Any]:
    """A plan's optimisation level as a manifest entry spells it: onnxruntime's level, and
    for UNFUSED the session config entry that leaves the slow fusions out -- only for a
    session on the CPU alone (``cpu_only``): the option holds for every EP in a session,
    and an accelerator's own SkipLayerNormalization is not the CPU's slow one."""
    if optimization == UNFUSED:
        return {"optimization": "all", "config": dict(UNFUSED_CONFIG)} if cpu_only else {"optimization": "all"}
    return {} if optimization is None else {"optimization": optimization}


@dataclass(frozen=True)
class Part:
    name: str  # "part<i>_<device>", also the file's stem
    device: str
    execution_provider: str
    nodes: tuple[str, ...]  # graph order
    inputs: tuple[str, ...]  # tensors it reads from other parts or the model's inputs
    outputs: tuple[str, ...]  # tensors other parts read, and model outputs it makes

    @property
    def file(self) -> str:
        return f"{self.name}.onnx"


@dataclass
class Export:
    """What :func:`export` wrote: the folder, the parts in order, and the manifest."""

    out: Path
    parts: list[Part]
    manifest: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------ the parts


def make_parts(graph: OpGraph, device_of: Mapping[str, str], providers: Mapping[str, str],
               piece_of: Mapping[str, int] | None = None) -> list[Part]:
    """Group nodes into parts (device, piece) in an execution order; SplitError on a cycle.

    ``device_of``: node name -> device; ``providers``: device -> execution provider;
    ``piece_of`` (optional): node name -> call number on its device.
    """
    missing = [n.name for n in graph.nodes if n.name not in device_of]
    if missing:
        raise SplitError(f"node '{missing[0]}' is not placed"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    unknown = sorted({d for d in device_of.values() if d not in providers})
    if unknown:
        raise SplitError(f"device '{unknown[0]}' has no execution provider "
                         f"(known devices: {', '.join(sorted(providers)) or 'none'})")
    key_of = {n.name: (device_of[n.name], (piece_of or {}).get(n.name, 0)) for n in graph.nodes}
    members: dict[tuple[str, int], list[str]] = {}
    for n in graph.nodes:
        members.setdefault(key_of[n.name], []).append(n.name)
    keys = list(members)  # order of first node: a topological tie-break

    producer_key = {o: key_of[n.name] for n in graph.nodes for o in n.outputs if o}
    succ: dict[tuple[str, int], dict[tuple[str, int], str]] = {k: {} for k in keys}
    for n in graph.nodes:
        for t in n.dependencies:
            src = producer_key.get(t)
            if src is not None and src != key_of[n.name]:
                succ[src].setdefault(key_of[n.name], t)
    order = part_order(keys, succ)

    names = {k: f"part{i}_{k[0]}" for i, k in enumerate(order)}
    outputs_of_model = set(graph.outputs)
    parts = []
    for k in order:
        inside = set(members[k])
        produced = [o for m in members[k] for o in graph.node(m).outputs if o]
        reads = dict.fromkeys(t for m in members[k] for t in graph.node(m).dependencies)
        inputs = tuple(t for t in reads if graph.tensors[t].kind != "initializer"
                       and (graph.tensors[t].producer is None or graph.tensors[t].producer not in inside))
        outputs = tuple(o for o in produced
                        if o in outputs_of_model
                        or any(c not in inside for c in graph.tensors[o].consumers))
        if not outputs:  # a part whose results nothing reads still needs a graph output
            outputs = (produced[-1],)
        parts.append(Part(names[k], k[0], providers[k[0]], tuple(members[k]), inputs, outputs))
    return parts


def part_deps(inputs: list[list[str]], outputs: list[list[str]]) -> list[list[int]]:
    """Each part's producers (indices into the parts), from the tensor names into and
    out of each, as a manifest lists them (a name no part makes is a model input)."""
    producer = {o: i for i, names in enumerate(outputs) for o in names}
    return [sorted({producer[t] for t in names if t in producer}) for names in inputs]


def part_order(keys, succ) -> list:
    """Kahn's order of the parts (earliest first node first); SplitError naming a cycle."""
    import heapq

    pos = {k: i for i, k in enumerate(keys)}
    indeg = {k: 0 for k in keys}
    for k in keys:
        for t in succ[k]:
            indeg[t] += 1
    ready = [pos[k] for k in keys if indeg[k] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = keys[heapq.heappop(ready)]
        order.append(k)
        for t in succ[k]:
            indeg[t] -= 1
            if indeg[t] == 0:
                heapq.heappush(ready, pos[t])
    if len(order) < len(keys):
        import networkx as nx

        left = [k for k in keys if indeg[k] > 0]
        g = nx.DiGraph((a, b, {"tensor": t}) for a in left for b, t in succ[a].items() if b in left)
        cycle = nx.find_cycle(g)
        label = lambda k: k[0] + (f" (call {k[1]})" if k[1] else "")  # noqa: E731
        steps = ", ".join(f"{label(a)} -> {label(b)} via '{g.edges[a, b]['tensor']}'"
                          for a, b in cycle)
        raise SplitError(f"the parts wait on each other in a cycle ({steps}): a device's nodes "
                         "must be one convex part per call; split them into pieces or change "
                         "the plan")
    return order


# --------------------------------------------------------------------------- the writing


def export(graph: OpGraph, device_of: Mapping[str, str], out: str | Path, *,
           providers: Mapping[str, str], piece_of: Mapping[str, int] | None = None,
           threads: Mapping[str, int] | None = None, predicted: Mapping[str, Any] | None = None,
           plan: Mapping[str, Any] | None = None, files: Mapping[str, str] | None = None,
           force: bool = False, check: bool = True, optimization: str | None = None,
           replicas: Mapping[str, int] | None = None, session: Mapping[str, Any] | None = None,
           before_swap: Callable[[Path], None] | None = None,
           device_ids: Mapping[str, int] | None = None, machines: Mapping[str, str] | None = None,
           shape_range: Mapping[str, Any] | None = None, quiet: bool = True) -> Export:
    """Write the parts of ``graph`` placed by ``device_of`` into the new folder ``out``.

    ``threads``: device -> intra-op threads its session should use (1 for a CPU core, 0
    for onnxruntime's default); ``optimization``: the parts' graph optimisation level
    (``all`` or ``disabled``; None: not recorded, the runner's default); ``replicas``:
    device -> copies of its sessions run side by side; ``device_ids``: device -> the id its
    execution provider addresses (cuda:1 for a second GPU); ``machines``: device -> the
    machine it is on (the Ray engine places its part there).  ``annotated.onnx`` (the whole
    model, each node tagged with its device) is always written; ``session`` ({"threads",
    "config"}): also write ``session.json`` so that one onnxruntime session runs the plan,
    and mark the folder ``run_as: session``.
    ``before_swap(folder)`` checks the finished folder before it takes ``out``'s place (the
    runner's verification): if it raises, ``out`` is left as it was.
    ``predicted`` ({"latency_ms", "throughput_per_s"}) and ``plan`` go into the manifest;
    ``files`` (name -> text) are written beside it.  ``shape_range`` (input -> [lo, hi]
    per dimension, :mod:`onnxsplit.ranges`): the shapes the parts are made for, completed
    for every input (:func:`onnxsplit.ranges.complete`) and recorded as ``model.shape_range``.
    ``force`` replaces an existing ``out``; otherwise an existing ``out`` is an error.
    ``quiet``: no progress over the parts written (:mod:`onnxsplit.progress`).
    """
    out = Path(out)
    parts = make_parts(graph, device_of, providers, piece_of)  # raises before any write
    tags = _layer_tags(device_of, providers, strict=session is not None)  # so does this
    check_out(out, force)
    model = graph.proto()
    for o in graph.outputs:
        if graph.tensors[o].kind == "initializer":
            raise SplitError(f"model output '{o}' is a weight, not computed by any node: "
                             "such a model cannot be split")
    types = _declared_types(model)
    if shape_range:  # every input's range, by the dimension names the model gives them
        shape_range = ranges.complete(shape_range, {t: _dim_names(types[t]) for t in graph.inputs if t in types},
                                      graph.input_shapes)
    base_dir = Path(graph.path).parent

    links = _Links.of(parts)
    initializers = {t.name: t for t in model.graph.initializer}

    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        # (removed should Ctrl-C end the process mid-write)
        staging = interrupt.fresh_dir(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    except OSError as e:
        raise OnnxsplitError(f"output '{out}' cannot be written: {e.strerror or e}") from None
    swap = contextlib.ExitStack()
    try:
        bar = progress.bar(2 * len(parts) + 1, f"writing {len(parts)} part(s)", quiet, unit="file")
        with _WeightWriter(staging / WEIGHTS, base_dir) as weights:
            protos = []
            for p in parts:
                protos.append(_part_model(model, graph, p, links, types, weights, initializers))
                bar.update()
            whole = Part("annotated", "session", CPU_EP, tuple(n.name for n in graph.nodes),
                         tuple(t for t in graph.inputs), tuple(graph.outputs))
            annotated = _part_model(model, graph, whole, _Links.of([whole]), types, weights,
                                    initializers)
            session_json = _annotate(annotated, graph, device_of, providers, tags, session)
            _configure_devices(annotated, parts,
                               pipelined=(plan or {}).get("objective") == "throughput")
            (staging / ANNOTATED).write_bytes(annotated.SerializeToString())
            bar.update()
            if session_json is not None:
                (staging / SESSION_FILE).write_text(json.dumps(session_json, indent=1) + "\n")
        for p, proto in zip(parts, protos):
            (staging / p.file).write_bytes(proto.SerializeToString())
            bar.update()
        bar.close()
        for what, file, ep in ([(f"part {p.name}", p.file, p.execution_provider) for p in parts]
                               + [(ANNOTATED, ANNOTATED, CPU_EP)] if check else []):
            check_part(staging / file, what, ep)
        manifest = _manifest(graph, parts, links, weights, threads or {}, predicted, plan, device_ids or {},
                             machines or {}, types, model.graph.node)
        if shape_range:
            manifest["model"]["shape_range"] = ranges.as_json(shape_range)
        for entry in manifest["parts"]:
            entry.update(level_fields(optimization, entry["execution_provider"] == CPU_EP))
            entry["replicas"] = int((replicas or {}).get(entry["device"], 1))
            held = plugins.part_config(entry["execution_provider"])  # (its precision, where reduced)
            if held:
                entry["config"] = {**(entry.get("config") or {}), **held}
                manifest["precision"] = openvino.precision()
        manifest["run_as"] = "session" if session is not None else "pipeline"
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        for name, text in (files or {}).items():
            (staging / name).write_text(text)
        genai = genai_config.pipeline_config(graph.path, manifest)
        if genai is not None:  # (a decoder onnxruntime-genai's builder wrote: it runs the parts too)
            (staging / genai_config.FILE).write_text(json.dumps(genai, indent=1) + "\n")
            for f in genai_config.tokenizer_files(graph.path):
                shutil.copyfile(f, staging / f.name)
        if not weights.count:
            (staging / WEIGHTS).unlink()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 is for the staging only
        if before_swap is not None:
            before_swap(staging)
        swap.enter_context(interrupt.held())  # (swapped and the old folder removed, or neither)
        interrupt.unregister(staging)  # after the swap it names the old folder
        replaced = _move_into_place(staging, out, force)
    except BaseException as e:
        swap.close()
        shutil.rmtree(staging, ignore_errors=True)  # (still the staging folder: nothing swapped)
        if isinstance(e, OSError) and not e.filename:
            # (a full disk fails a write, which names no file: say which output it was)
            raise OSError(e.errno, e.strerror, str(out)) from None
        raise
    finally:
        interrupt.unregister(staging)
    with swap:  # (outside the handler above: what is left in the old folder is the user's)
        if replaced is not None:
            _remove_made(replaced)
    return Export(out, parts, manifest)


# the domains whose operators onnx's checker knows (their schemas ship with onnx)
_ONNX_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"})
# where onnx's checker is shown the operators it does not know (a domain it skips)
UNCHECKED_DOMAIN = "onnxsplit.unchecked"


def runtime_operators(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes (subgraphs included) onnx's checker cannot judge: onnxruntime's own operators,
    in com.microsoft and other domains of their own, and in onnx's domains where onnx has no
    such operator at the model's opset (SimplifiedLayerNormalization; LayerNormalization
    before opset 17).  Calls of the model's own functions are the checker's to judge."""
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    functions = {(f.domain, f.name) for f in model.functions}
    found = []
    graphs = [model.graph]
    while graphs:
        for node in graphs.pop().node:
            graphs.extend(subgraphs(node))
            domain = "" if node.domain == "ai.onnx" else node.domain
            if (node.domain, node.op_type) in functions:
                continue
            if domain not in _ONNX_DOMAINS or not onnx.defs.has(node.op_type, opsets.get(domain, 1),
                                                                  domain):
                found.append(node)
    return found


def check_part(path: Path, what: str, ep: str = CPU_EP) -> None:
    """OnnxsplitError where the model file at ``path`` is not valid.  onnx's checker judges
    it; where it holds onnxruntime's own operators (:func:`runtime_operators`), the checker is
    shown them in a domain it skips (a copy beside it, removed after) and onnxruntime judges
    them by building a CPU session of the file (graph optimisations off); a part for another
    provider may hold an operator only that provider has a kernel for."""
    def refuse(why: str) -> OnnxsplitError:  # the exporter's own bug, named per file
        return OnnxsplitError(f"{what} is not a valid ONNX model: {' '.join(why.split())[:300]}")

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        raise refuse(str(e)) from None
    own = runtime_operators(model)
    target = path
    if own:
        for node in own:
            if node.domain in _ONNX_DOMAINS:
                node.domain = UNCHECKED_DOMAIN
        model.opset_import.add(domain=UNCHECKED_DOMAIN, version=1)
        # a file of its own beside the part (its weights are found relative to it), made
        # here, so the unlink below can only remove what this call wrote
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".checked", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(model.SerializeToString())
        target = Path(name)
    try:
        onnx.checker.check_model(str(target))
    except Exception as e:
        raise refuse(str(e)) from None
    finally:
        if target != path:
            target.unlink(missing_ok=True)
    if own:
        from .providers.sessions import SessionError, open_sessions
        from .shapes import NO_KERNEL

        try:
            open_sessions(path, [CPU_EP], threads=1, optimize=False)
        except SessionError as e:
            if ep == CPU_EP or not NO_KERNEL.search(str(e)):
                raise refuse(f"onnxruntime refuses it: {e}") from None


def session_ready(providers: Mapping[str, str], devices) -> bool:
    """Whether one onnxruntime session can run a plan on ``devices``: at most one device
    per EP, each an EP that layer assignment knows."""
    eps = [providers[d] for d in devices]
    return len(set(eps)) == len(eps) and all(ep in _ORT_DEVICE for ep in eps)


def _annotate(model: onnx.ModelProto, graph: OpGraph, device_of: Mapping[str, str],
              providers: Mapping[str, str], tag: Mapping[str, str],
              session: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Tag every node of the whole ``model`` with ``layer_ann`` = its device's part (``tag``:
    device -> tag); with a ``session``, say how one session runs it: the EPs in order and
    the session config entries (None without)."""
    for node in model.graph.node:
        node.metadata_props.add(key=LAYER_ANN, value=tag[device_of[node.name]])
    if session is None:
        return None
    used = sorted(set(device_of.values()), key=lambda d: providers[d] == CPU_EP)
    eps = list(dict.fromkeys(providers[d] for d in used))
    if CPU_EP not in eps:
        eps.append(CPU_EP)
    config = {"session.layer_assignment_settings":
              "; ".join(f"{_ORT_DEVICE[providers[d]]}(={tag[d]})" for d in used),
              "session.record_ep_graph_assignment_info": "1"}
    level = level_fields(session.get("optimization") or "all", eps == [CPU_EP])
    config.update(level.get("config") or {})
    config.update(session.get("config") or {})
    return {"file": ANNOTATED, "execution_providers": eps,
            "threads": int(session.get("threads", 0)),
            "optimization": level["optimization"], "config": config,
            "node_providers": {n.name: providers[device_of[n.name]] for n in graph.nodes}}


def _layer_tags(device_of: Mapping[str, str], providers: Mapping[str, str],
                strict: bool) -> dict[str, str]:
    """device -> its ``layer_ann``: onnxruntime's device type, which a session's layer
    assignment names (``strict``: an EP it does not know cannot run as one session);
    otherwise such a device is tagged by its own name, as nothing reads it as a setting."""
    tags = {}
    for d in dict.fromkeys(device_of.values()):
        kind = _ORT_DEVICE.get(providers[d])
        if kind is None and strict:
            raise SplitError(f"device '{d}' ({providers[d]}) cannot run in one onnxruntime "
                             f"session: layer assignment knows {', '.join(_ORT_DEVICE)}")
        tags[d] = f"{kind or re.sub(r'[^A-Za-z0-9_.-]', '_', d)}_part"
    return tags


def _configure_devices(model: onnx.ModelProto, parts: list[Part], pipelined: bool) -> None:
    """ONNX's own multi-device metadata beside ``layer_ann``, for tools that read the
    standard fields: one configuration whose devices are the plan's, in part order, and
    per node a sharding spec placing its results, unsplit, on its device's index.
    ``pipelined`` (a throughput plan, its parts a pipeline in part order): each node's
    ``pipeline_stage`` is its part's index; a latency plan's parts run one after another
    on one input, so no stage is set (the proto's field is optional)."""
    # onnx_ir has the types (ModelConfiguration, NodeDeviceConfiguration, ShardingSpec) and
    # their serializers; only the metadata goes through them: a whole-model round trip
    # through onnx_ir would drop sparse initializers and rewrite the graph as built here.
    if not hasattr(model, "configuration"):  # an onnx before IR 11 cannot hold them
        return
    import onnx_ir as ir

    devices = tuple(dict.fromkeys(p.device for p in parts))
    config = ir.ModelConfiguration(name=CONFIGURATION, num_devices=len(devices),
                                   device_names=devices)
    index = {d: i for i, d in enumerate(devices)}
    part_of = {n: (i, p.device) for i, p in enumerate(parts) for n in p.nodes}
    model.ir_version = max(model.ir_version, _MULTI_DEVICE_IR)
    del model.configuration[:]
    model.configuration.append(ir.serde.serialize_model_configuration(config))
    for node in model.graph.node:
        stage, device = part_of[node.name]
        named = [o for o in node.output if o] or [i for i in node.input if i]
        specs = tuple(ir.ShardingSpec(value=ir.Value(name=t), device=(index[device],))
                      for t in named)
        entry = ir.NodeDeviceConfiguration(configuration=config, sharding_specs=specs,
                                           pipeline_stage=stage if pipelined else None)
        del node.device_configurations[:]
        node.device_configurations.append(ir.serde.serialize_node_device_configuration(entry))


# the files onnxsplit writes into a parts folder: --force replaces a folder holding these
# (and a manifest) and nothing else
_MADE = re.compile(r"^(part\d+_[A-Za-z0-9_.-]+\.onnx|weights\.bin|manifest\.json|plan\.json|"
                   r"annotated\.onnx|session\.json|report\.html|genai_config\.json|"
                   + "|".join(re.escape(f) for f in genai_config.TOKENIZER_FILES) + r")$")


def _writable_parent(out: Path) -> None:
    """The folder ``out`` is made in (or its nearest existing ancestor) must take new
    entries: said before any profiling, not after it."""
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:  # tried, not judged from permission bits (root passes those, and /proc is no folder);
        # an unnamed file (O_TMPFILE where Linux has it): it never shows in the folder,
        # however the process ends, and no name is ever removed
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise OnnxsplitError(f"output '{out}' cannot be written: '{parent}' does not take new "
                             f"files ({e.strerror or e})") from None


def check_out(out: str | Path, force: bool, probe: bool = False) -> Path:
    """``out`` as a Path, if it may be written: absent, or with ``force`` a parts folder
    onnxsplit made (its manifest and only the files onnxsplit writes).  A symbolic link, a
    file, or a folder holding anything else -- the model, a plan, a profile, a user's
    files -- is refused, whatever ``force`` says.  ``probe``: also try that a folder can be
    made beside it (before the work, not after)."""
    out = Path(out)
    if out.is_symlink():
        raise OnnxsplitError(f"output '{out}' is a symbolic link: onnxsplit writes a folder of "
                             "its own (choose another --out)")
    if probe:
        _writable_parent(out)
    if not out.exists():
        return out
    if not out.is_dir():
        raise OnnxsplitError(f"output '{out}' exists and is not a folder")
    if not force:
        raise OnnxsplitError(f"output folder '{out}' already exists: pass --force to replace it")
    try:  # (a pipe or a device there is not read: that would block, or never end)
        manifest = loads((out / MANIFEST).read_text()) if (out / MANIFEST).is_file() else None
        ours = isinstance(manifest, dict) and manifest.get("format") == FORMAT
    except (OSError, ValueError):
        ours = False
    if not ours:
        raise OnnxsplitError(f"--force replaces only a parts folder onnxsplit made, and "
                             f"'{out}' has no onnxsplit {MANIFEST}: choose another --out")
    try:
        foreign = sorted(p.name for p in out.iterdir() if p.is_symlink() or not p.is_file()
                         or not _MADE.match(p.name))
    except OSError as e:
        raise OnnxsplitError(f"cannot read output folder '{out}': {e.strerror or e}") from None
    if foreign:
        raise OnnxsplitError(f"--force replaces only a parts folder onnxsplit made, and "
                             f"'{out}' also holds '{foreign[0]}'"
                             + (f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else "")
                             + ", which onnxsplit did not write: choose another --out")
    return out


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 with RENAME_EXCHANGE); False where the
    system or the filesystem cannot."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return fn(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), rename_exchange) == 0


def _move_into_place(staging: Path, out: Path, force: bool) -> Path | None:
    """The finished folder takes ``out``'s place: swapped in one step where the system can
    (an interruption leaves the old folder or the new one, never neither), else moved aside
    and replaced.  Returns the old folder (None where there was none), for the caller to
    remove what onnxsplit made in it (:func:`_remove_made`), never in its error handling."""
    if not out.exists():
        try:
            staging.rename(out)
            return None
        except OSError as e:  # another command wrote it meanwhile
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            if not force:
                raise OnnxsplitError(f"output folder '{out}' appeared while the parts were written "
                                     "(another command's?): left as it is; pass --force to "
                                     "replace it") from None
    check_out(out, force)  # again: it may have changed while the parts were written
    if _exchange(staging, out):
        return staging  # now the old folder
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    out.rename(old)
    try:
        staging.rename(out)
    except BaseException:
        old.rename(out)
        raise
    return old


def _remove_made(folder: Path) -> None:
    """Remove a replaced parts folder: only the files onnxsplit writes, then the folder if
    that left it empty.  Anything else found there by then is left where it is."""
    for p in folder.iterdir():
        if _MADE.match(p.name) and p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass


def _declared_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Each tensor's type with the original's symbolic dims (inference on a weightless copy)."""
    sk = onnx.ModelProto()
    sk.ir_version = model.ir_version
    sk.opset_import.extend(model.opset_import)
    sk.functions.extend(model.functions)
    g = sk.graph
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    g.value_info.extend(model.graph.value_info)
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL and proto_bytes(t) <= KEEP_WEIGHT_BYTES:
            g.initializer.append(t)
        else:  # dims and type are all inference needs of a big weight
            g.initializer.append(onnx.TensorProto(name=t.name, dims=t.dims, data_type=t.data_type))
    try:
        inferred = onnx.shape_inference.infer_shapes(sk, check_type=False, strict_mode=False)
    except Exception:
        inferred = sk
    types: dict[str, onnx.TypeProto] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if vi.type.WhichOneof("value") is not None:
            types[vi.name] = vi.type
    return types


def _value_info(name: str, graph: OpGraph, types: Mapping[str, onnx.TypeProto]) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto(name=name)
    declared = types.get(name)
    if declared is not None and (declared.WhichOneof("value") != "tensor_type"
                                 or declared.tensor_type.elem_type):
        vi.type.CopyFrom(declared)
        if declared.WhichOneof("value") != "tensor_type" or (
                declared.tensor_type.HasField("shape")
                and _holds(declared.tensor_type.shape, graph.tensors[name])):
            return vi
        # inference knew the type but not the rank (a Loop's output), or the model declares
        # a shape its values do not have (onnxruntime-genai's builder declares its Constant
        # [1] a scalar): a graph input or output must have a shape for the checker, so the
        # measured rank with free sizes, as below
        _free_dims(vi, graph.tensors[name].shape)
        return vi
    dtype = graph.tensors[name].dtype
    et = elem_type(dtype)
    if et is None:
        raise SplitError(f"tensor '{name}' ({dtype}) crosses parts but its type cannot be declared")
    vi.type.tensor_type.elem_type = et
    _free_dims(vi, graph.tensors[name].shape)
    return vi


def _holds(declared: onnx.TensorShapeProto, tensor) -> bool:
    """Whether a declared shape fits the tensor as measured: its rank, its fixed sizes (an
    empty optional or a sequence, measured without a tensor's shape, is not judged)."""
    if tensor.dtype == "none" or tensor.dtype.startswith("seq("):
        return True
    return len(declared.dim) == len(tensor.shape) and all(
        not d.HasField("dim_value") or d.dim_value == n for d, n in zip(declared.dim, tensor.shape))


def _free_dims(vi: onnx.ValueInfoProto, shape) -> None:
    """Rank known, sizes left free; a scalar's empty shape is still set (not left absent)."""
    vi.type.tensor_type.shape.CopyFrom(onnx.TensorShapeProto())
    for _ in shape:
        vi.type.tensor_type.shape.dim.add()


class _Links(NamedTuple):
    """Which part makes each boundary tensor, and which parts read it."""

    producer: dict[str, str]  # tensor -> part name (absent: a model input)
    consumers: dict[str, list[str]]  # tensor -> part names, in part order

    @classmethod
    def of(cls, parts: list[Part]) -> "_Links":
        consumers: dict[str, list[str]] = {}
        for p in parts:
            for t in p.inputs:
                consumers.setdefault(t, []).append(p.name)
        return cls({o: p.name for p in parts for o in p.outputs}, consumers)


def _part_model(model: onnx.ModelProto, graph: OpGraph, part: Part, links: _Links, types,
                weights: "_WeightWriter", initializers: Mapping[str, TensorProto]) -> onnx.ModelProto:
    src = model.graph
    m = onnx.ModelProto()
    m.ir_version = model.ir_version
    m.opset_import.extend(model.opset_import)
    m.functions.extend(model.functions)
    m.producer_name = "onnxsplit"
    m.domain = model.domain
    m.model_version = model.model_version
    g = m.graph
    g.name = f"{src.name or 'graph'}_{part.name}"
    for name in part.nodes:
        node = g.node.add()
        node.CopyFrom(src.node[graph.node(name).index])
        weights.relocate_attributes(node)
    for t in part.inputs:
        g.input.append(_value_info(t, graph, types))
    for t in part.outputs:
        g.output.append(_value_info(t, graph, types))
    reads = dict.fromkeys(t for n in part.nodes for t in graph.node(n).dependencies)
    for t in reads:
        if graph.tensors[t].kind == "initializer":
            if t in initializers:
                g.initializer.append(weights.reference(initializers[t]))
            else:
                g.sparse_initializer.extend(s for s in src.sparse_initializer if s.values.name == t)
    producer, consumers = links
    meta = {
        "onnxsplit.format": FORMAT,
        "onnxsplit.part": part.name,
        "onnxsplit.device": part.device,
        "onnxsplit.execution_provider": part.execution_provider,
        "onnxsplit.inputs": json.dumps({t: producer.get(t, MODEL_INPUT) for t in part.inputs}),
        "onnxsplit.outputs": json.dumps({t: consumers.get(t, []) + (["output"] if t in graph.outputs else [])
                                         for t in part.outputs}),
    }
    for p in model.metadata_props:
        if p.key not in meta:
            m.metadata_props.add(key=p.key, value=p.value)
    for k, v in meta.items():
        m.metadata_props.add(key=k, value=v)
    return m


def _tensor_entry(graph: OpGraph, name: str) -> dict[str, Any]:
    t = graph.tensors[name]
    return {"name": name, "dtype": t.dtype, "shape": list(t.shape), "bytes": t.bytes}


def _lookups(graph: OpGraph, name: str) -> list | None:
    """Where input ``name`` is only ever the indices of a Gather from a weight (token ids
    into an embedding): each such Gather node with its table; else None."""
    t = graph.tensors.get(name)
    if t is None or not t.dtype.startswith(("int", "uint")) or not t.consumers:
        return None
    found = []
    for c in t.consumers:
        node = graph.node(c)
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") \
                or list(node.inputs[1:2]) != [name] or name in node.inputs[:1]:
            return None
        table = graph.tensors.get(node.inputs[0])
        if table is None or table.kind != "initializer" or not table.shape or min(table.shape) < 1:
            return None
        found.append((node, table))
    return found


def index_bound(graph: OpGraph, name: str) -> int | None:
    """Where input ``name`` is only ever the indices of a Gather from a weight (token ids
    into an embedding), a bound every index below is safe for, whatever the Gather's axis
    (the table's smallest dimension): the check then feeds ids spread over the table, not
    the one row a constant id reads (a damaged row elsewhere went unseen); else None."""
    found = _lookups(graph, name)
    return min(min(table.shape) for _, table in found) if found else None


def index_rows(graph: OpGraph, name: str, nodes) -> int | None:
    """Where input ``name`` is only ever the indices of Gathers from weights: the fewest rows
    any of those tables has along its Gather's axis (``nodes``: the model file's, which hold
    the axes); else None.  An index must lie in [-rows, rows) (ONNX's Gather); serve refuses
    one outside, which onnxruntime refuses and OpenVINO answers with zeros."""
    found = _lookups(graph, name)
    if not found:
        return None
    rows = []
    for node, table in found:
        axis = next((a.i for a in nodes[node.index].attribute if a.name == "axis"), 0)
        rows.append(table.shape[axis] if -len(table.shape) <= axis < len(table.shape) else min(table.shape))
    return min(rows)


def _dim_names(t: onnx.TypeProto) -> list[str | None]:
    """The model's name for each dimension of an input (None where it has a fixed size
    or no name): a size given for one input follows to the others by these names."""
    if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return []
    return [d.dim_param or None for d in t.tensor_type.shape.dim]


def _manifest(graph: OpGraph, parts: list[Part], links: _Links, weights: "_WeightWriter", threads,
              predicted, plan, device_ids: Mapping[str, int], machines: Mapping[str, str],
              types: Mapping[str, onnx.TypeProto], nodes) -> dict[str, Any]:
    producer, consumers = links
    device = {p.name: p.device for p in parts}
    entries = []
    for p in parts:
        entries.append({
            "name": p.name, "file": p.file, "device": p.device,
            "execution_provider": p.execution_provider,
            **({"device_id": device_ids[p.device]} if p.device in device_ids else {}),
            **({"machine": machines[p.device]} if machines.get(p.device) else {}),
            "threads": threads.get(p.device),
            "nodes": len(p.nodes),
            "inputs": [dict(_tensor_entry(graph, t), **{"from": producer.get(t, MODEL_INPUT)})
                       for t in p.inputs],
            "outputs": [dict(_tensor_entry(graph, t), to=consumers.get(t, []),
                             model_output=t in graph.outputs) for t in p.outputs],
        })
    crossing = []
    for t in dict.fromkeys(t for p in parts for t in p.inputs):
        src = producer.get(t, MODEL_INPUT)
        if src == MODEL_INPUT:
            continue
        crossing.append(dict(_tensor_entry(graph, t), producer=src, consumers=consumers[t],
                             devices=[device[src]] + sorted({device[c] for c in consumers[t]}),
                             cross_device=any(device[c] != device[src] for c in consumers[t])))
    return {
        "format": FORMAT,
        "model": {
            "path": str(Path(graph.path).resolve()),
            "input_shapes": {k: list(v) for k, v in graph.input_shapes.items()},
            "nodes": len(graph.nodes),
            "inputs": [dict(_tensor_entry(graph, t), **({"fill": graph.input_fills[t]}
                                                        if t in graph.input_fills else {}),
                            **({"index_below": below} if (below := index_bound(graph, t)) else {}),
                            **({"index_rows": rows} if (rows := index_rows(graph, t, nodes)) else {}),
                            **({"dims": _dim_names(types[t])} if t in (types or {}) else {}))
                       for t in graph.inputs],
            "outputs": [dict(_tensor_entry(graph, t), **{"from": producer.get(t, MODEL_INPUT)},
                             **({"dims": _dim_names(types[t])} if t in (types or {}) else {}))
                        for t in graph.outputs],
        },
        "weights": {"file": WEIGHTS if weights.count else None, "bytes": weights.offset,
                    "tensors": weights.count},
        "parts": entries,
        "tensors": crossing,
        "predicted": dict(predicted) if predicted else None,
        "plan": dict(plan) if plan else None,
    }


class _WeightWriter:
    """Appends each big weight once to the shared file and hands out references to it."""

    def __init__(self, path: Path, base_dir: Path):
        self.path = path
        self.base_dir = base_dir
        self.offset = 0
        self.count = 0
        self._placed: dict[tuple, tuple[int, int]] = {}  # source identity -> (offset, length)
        self._files: dict[str, Any] = {}
        self._out = None

    def __enter__(self) -> "_WeightWriter":
        self._out = open(self.path, "wb")
        return self

    def __exit__(self, *exc) -> None:
        self._out.close()
        for f in self._files.values():
            f.close()

    def reference(self, t: TensorProto) -> TensorProto:
        """``t`` as a part holds it: inline when small (or a string), else a reference."""
        if t.data_type == TensorProto.STRING or (
                t.data_location != TensorProto.EXTERNAL and proto_bytes(t) <= INLINE_BYTES):
            return t
        offset, length = self._place(t)
        ref = TensorProto(name=t.name, dims=t.dims, data_type=t.data_type,
                          data_location=TensorProto.EXTERNAL, doc_string=t.doc_string)
        for k, v in (("location", WEIGHTS), ("offset", str(offset)), ("length", str(length))):
            ref.external_data.add(key=k, value=v)
        return ref

    def relocate_attributes(self, node: onnx.NodeProto) -> None:
        """Point tensors inside ``node`` (attributes, subgraph weights) that live in the
        original's external data at the shared file instead."""
        for t in _attribute_tensors(node):
            if t.data_location == TensorProto.EXTERNAL:
                t.CopyFrom(self.reference(t))

    def _place(self, t: TensorProto) -> tuple[int, int]:
        key = self._identity(t)
        if key in self._placed:
            return self._placed[key]
        length = proto_bytes(t) if t.data_location == TensorProto.EXTERNAL else None
        align = _ALIGN_BIG if (length or 0) >= _BIG else 64
        pad = -self.offset % align
        if pad:
            self._out.write(b"\0" * pad)
            self.offset += pad
        if t.data_location == TensorProto.EXTERNAL:
            length = self._copy_external(t)
        else:
            data = self._inline_data(t)
            self._out.write(data)
            length = len(data)
        placed = (self.offset, length)
        self.offset += length
        self.count += 1
        self._placed[key] = placed
        return placed

    @staticmethod
    def _identity(t: TensorProto) -> tuple:
        if t.data_location == TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            return ("ext", info.get("location"), info.get("offset", "0"), info.get("length"))
        return ("inline", t.name, id(t))

    @staticmethod
    def _inline_data(t: TensorProto) -> bytes:
        if t.raw_data:
            return t.raw_data
        from onnx import numpy_helper

        return numpy_helper.to_array(t).tobytes()

    def _copy_external(self, t: TensorProto) -> int:
        """Copy a tensor from the original's external data file, in the kernel where it can
        (no pass through Python memory: a 3 GB model's weights copy at disk speed)."""
        info = {e.key: e.value for e in t.external_data}
        where = self.base_dir / info.get("location", "")
        f = self._files.get(str(where))
        if f is None:
            try:
                f = self._files[str(where)] = open(where, "rb")
            except OSError as e:
                raise OnnxsplitError(f"weight '{t.name}': cannot read its external data file "
                                     f"'{where}': {e.strerror or e}") from None
        offset = int(info.get("offset", 0))
        want = int(info["length"]) if "length" in info else proto_bytes(t)
        available = os.fstat(f.fileno()).st_size - offset
        if want > available:
            raise OnnxsplitError(f"weight '{t.name}': its external data file '{where}' is "
                                 f"truncated ({max(available, 0)} of {want} bytes)")
        self._out.flush()
        done = 0
        try:
            while done < want:
                n = os.copy_file_range(f.fileno(), self._out.fileno(), want - done,
                                       offset + done)
                if n == 0:
                    break
                done += n
        except (AttributeError, OSError):  # no copy_file_range here: through user space
            f.seek(offset + done)
            while done < want:
                chunk = f.read(min(want - done, 64 << 20))
                if not chunk:
                    break
                self._out.write(chunk)
                done += len(chunk)
        if done < want:
            raise OnnxsplitError(f"weight '{t.name}': its external data file '{where}' is "
                                 f"truncated ({done} of {want} bytes)")
        self._out.seek(0, os.SEEK_END)
        return want


def _attribute_tensors(node: onnx.NodeProto) -> Iterator[TensorProto]:
    for a in node.attribute:
        if a.type == AttributeProto.TENSOR:
            yield a.t
        elif a.type == AttributeProto.TENSORS:
            yield from a.tensors
        elif a.type == AttributeProto.SPARSE_TENSOR:
            yield a.sparse_tensor.values
        elif a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
            for g in ([a.g] if a.type == AttributeProto.GRAPH else a.graphs):
                yield from g.initializer
                for n in g.node:
                    yield from _attribute_tensors(n)
