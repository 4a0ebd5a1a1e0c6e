"""Per-node latency of an ONNX model on every execution provider present, cached.

``profile(path, input_shapes)`` times every node on each EP -- inside whole-model runs
on the CPU (``ingraph``), alone on accelerators (``measure``) --, the whole model the
same way for comparison, and stores the result in a
profile file keyed by the model's hash and the device (``store``).  Asking again for a
(model, device) pair the file holds runs nothing.  ``costmodel`` estimates latencies for
devices that are not present, calibrated on the measured CPU.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from .. import progress
from ..providers import openvino
from ..errors import ProfileError
from ..solve import isolated
from .devices import CPU_EP, available_providers, describe, device_key, preferred_providers
from .store import Entry, ModelProfile, NodeTiming, ProfileFile, model_hash, profile_key

__all__ = ["profile", "ensure_profiled", "default_cache", "Entry", "ModelProfile", "NodeTiming", "ProfileFile",
           "model_hash", "available_providers", "bind", "CPU_EP"]


METHODS = ("auto", "in_graph", "alone")
IN_GRAPH_MIN_NODE_S = 20e-6  # auto times nodes in the graph when they average this or more


def default_cache(model_hash_: str) -> Path:
    """Where profiles are cached when no file is named: $ONNXSPLIT_CACHE_DIR, else
    $XDG_CACHE_HOME/onnxsplit, else ~/.cache/onnxsplit; one file per model."""
    base = os.environ.get("ONNXSPLIT_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "onnxsplit")
    return Path(base) / "profiles" / f"{model_hash_[:20]}.json"


def bind(path: str | Path, input_shapes: Mapping[str, Iterable[int]] | None,
         fills: Mapping[str, float] | None = None):
    """(model proto without weight data, bound input shapes, model hash); reads no weights
    and starts no session, so a cache lookup costs only the parse of the graph.  Input
    ``fills`` (values that steer control flow) are part of the key."""
    from .. import shapes
    from ..graph import load_model

    model = load_model(Path(path))
    g = model.graph
    weights = {t.name for t in g.initializer} | {s.values.name for s in g.sparse_initializer}
    bound = shapes.bind_inputs(g, weights, input_shapes)
    return model, bound, profile_key(model, bound, fills)


def profile(
    path: str | Path,
    input_shapes: Mapping[str, Iterable[int]] | None = None,
    *,
    providers: Sequence[str] | None = None,
    cache: str | Path | None = None,
    repeats: int = 10,
    warmup: int = 2,
    group: bool = True,
    force: bool = False,
    quiet: bool = False,
    threads: int = 1,
    rounds: int = 2,
    input_fills: Mapping[str, float] | None = None,
    method: str = "auto",
    graph=None,
) -> ModelProfile:
    """Profile ``path`` on ``providers`` (default: every EP present, one per device class:
    CUDA rather than TensorRT) and return every entry
    the cache file holds for the model (entries from other machines included).

    ``cache``: a profile file to read and update (default: :func:`default_cache`); pass
    ``False`` to neither read nor write one.  ``force`` re-measures even on a cache hit.

    ``method``: ``in_graph`` times the nodes inside whole-model runs with onnxruntime's
    profiler (``ingraph``): at least ``repeats`` runs after ``warmup``, more for a fast
    model, interleaved with the whole model's unprofiled runs.  ``alone`` times each node
    in a model of its own (``measure``): ``repeats`` runs per node (nodes under a
    millisecond get five times as many) in ``rounds`` rounds over the graph, each after
    ``warmup`` runs, identical single-node models once when ``group``.  ``auto``:
    ``in_graph`` on the CPU, ``alone`` on accelerators (whose profiler events time kernel
    launches, not kernels) and for models whose nodes average under 20 us.

    ``graph``: the model's OpGraph where the caller has imported it already (its bound
    shapes and fills are the profile's; the file is not parsed again).
    """
    if method not in METHODS:
        raise ProfileError(f"unknown profiling method '{method}' (known: {', '.join(METHODS)})")
    if repeats < 1 or warmup < 0 or rounds < 1:
        raise ProfileError(f"repeats and rounds must be >= 1 and warmup >= 0, got {repeats}, "
                           f"{rounds} and {warmup}")
    rounds = min(rounds, repeats)
    present = available_providers()
    eps = list(dict.fromkeys(providers)) if providers else preferred_providers()
    for ep in eps:
        if ep not in present:
            raise ProfileError(f"execution provider '{ep}' is not available in this onnxruntime "
                               f"(available: {', '.join(present)})")
    if graph is not None:
        bound, key, input_fills = graph.input_shapes, graph.profile_key, dict(graph.input_fills)
    else:
        bound, key = bind(path, input_shapes, input_fills)[1:]
    names = [n.name for n in graph.nodes] if graph is not None else None
    store = ProfileFile(None) if cache is False else ProfileFile.load(Path(cache)) if cache \
        else ProfileFile.load_cache(default_cache(key), key, names)
    todo = [ep for ep in eps if force or store.find(key, device_key(ep, threads)) is None]
    if todo:
        for entry in _measure(Path(path), bound, input_fills, key, todo, repeats, warmup, group, quiet, threads,
                              rounds, method, graph):
            store.put(entry)
        if cache is not False:
            _keep(store, cache and Path(cache) != default_cache(key))
    return ModelProfile(key, bound, tuple(store.for_model(key)), fresh=tuple(todo), path=store.path)


def _keep(store, named: bool) -> None:
    """The profile saved: a file the user named must be written (ProfileError naming it);
    the cache need not be (a note: the measurements are used, not kept)."""
    try:
        store.save()
    except OSError as e:
        why = e.strerror or str(e)
        if named:
            raise ProfileError(f"cannot write the profile file '{store.path}': {why}") from None
        print(f"onnxsplit: note: the profile cache '{store.path}' cannot be written ({why}; "
              "$ONNXSPLIT_CACHE_DIR or ~/.cache/onnxsplit): the measurements are used, not kept",
              file=sys.stderr, flush=True)


def ensure_profiled(graph, providers: Sequence[str], *, cache: str | Path | None = None, repeats: int = 10,
                    quiet: bool = False, on_measure=None) -> tuple[ModelProfile, Path, list[str]]:
    """What a workload needs: every entry the profile file (default: the cache) holds for
    the model, after measuring here each of ``providers`` that is present and that no entry
    covers -- from any machine, so a GPU server's profile serves a laptop.  An absent
    provider without an entry is left to the cost model.  ``on_measure(eps)`` is called
    before measuring.  Returns (profile, profile file, providers measured now).  ``graph``
    is the model's OpGraph, as imported (its bound shapes and fills key the profile)."""
    bound, key = graph.input_shapes, graph.profile_key
    file = Path(cache) if cache else default_cache(key)
    store = ProfileFile.load(file) if cache else \
        ProfileFile.load_cache(file, key, [n.name for n in graph.nodes])
    known = ModelProfile(key, bound, tuple(store.for_model(key)))
    present = available_providers()
    todo = [ep for ep in dict.fromkeys(providers) if known.entry(ep) is None and ep in present]
    if todo:
        if on_measure is not None:
            on_measure(todo)
        known = profile(graph.path, providers=todo, cache=file, repeats=repeats, quiet=quiet, graph=graph)
    return known, file, todo


def _measure(path: Path, bound, fills, key: str, eps: list[str], repeats: int, warmup: int,
             group: bool, quiet: bool, threads: int, rounds: int, method: str, graph=None) -> list[Entry]:
    import numpy as np
    import onnxruntime as ort

    from ..graph import OpGraph
    from . import measure

    if graph is None:
        graph = OpGraph.from_onnx(path, bound, input_fills=fills)
    model = graph.proto()
    feeds = measure.input_feeds(graph)
    values: dict | None = None  # every tensor's value: only timing nodes alone needs them
    entries = []
    for ep in eps:
        start = time.perf_counter()
        if ep == openvino.RUNTIME:
            entries.append(_measure_openvino(path, graph, key, bound, feeds, repeats, warmup, threads))
            continue
        runner = measure.Runner(ep, path.parent, threads=threads)
        try:
            whole_sess, share = measure.whole_model(runner, model, feeds)
        except Exception as e:
            from ..shapes import one_line

            raise ProfileError(f"{ep} cannot build a session for the whole model: "
                               f"{one_line(e)}") from None
        overheads = runner.overheads(warmup, repeats)
        whole_run = runner.bind(whole_sess, feeds)
        try:
            whole_run()
        except Exception as e:
            from ..shapes import one_line

            raise ProfileError(f"the model fails on {ep} with the inputs profiling feeds it ({one_line(e)}); "
                               "give values it takes with --input-value NAME=VALUE") from None
        how = method if method != "auto" else _auto_method(ep, whole_run, _node_count(model.graph),
                                                           warmup)
        settings = {"method": how, "repeats": repeats, "warmup": warmup}
        if how == "in_graph":
            from . import ingraph

            cost = ingraph.profiler_cost(runner, overheads[1], warmup)
            bar = progress.bar(None, f"{_short(ep)}: {len(graph.nodes)} nodes in whole-model runs",
                               quiet, unit="run")

            def step(k: int, total: int) -> None:
                bar.total = total
                bar.update(k)

            try:
                nodes, whole_t, runs = ingraph.time_in_graph(
                    runner, model, feeds, {n.name: n.op_type for n in graph.nodes}, warmup=warmup,
                    repeats=repeats, cost_s=cost, whole_run=whole_run, progress=step)
            finally:
                bar.close()
            settings.update(runs=runs, profiler_cost_ms=round(cost * 1e3, 6))
            missing = [n.name for n in graph.nodes if n.name not in nodes]
            if missing:  # no event (onnxruntime ran them otherwise): timed alone
                values = values or measure.reference_values(model, graph, feeds)
                nodes.update(measure.profile_nodes(runner, model, graph, values, warmup=warmup,
                                                   repeats=repeats, group=group,
                                                   overheads=overheads, rounds=rounds,
                                                   only=set(missing)))
                settings["timed_alone"] = len(missing)
            nodes = {n.name: nodes[n.name] for n in graph.nodes}
            distinct = len(nodes)
        else:
            values = values or measure.reference_values(model, graph, feeds)
            # whole-model runs are spread over the node timings so both see the same machine
            for _ in range(max(warmup, 1)):
                whole_run()
            whole_samples = [measure.sample(whole_run, 1 if repeats == 1 else 2)[-1:]]

            def between(step: int, steps: int) -> None:
                while len(whole_samples) < 1 + step * (repeats - 1) // steps:
                    # a model of a few ms or less runs in a burst: its caches warm up again
                    # after the node timings in between, like the nodes' own repeated runs
                    burst = min(50, max(1, int(0.01 / max(whole_samples[0].min(), 1e-6))))
                    whole_samples.append(measure.sample(whole_run, burst)[burst // 2:])

            bar = progress.bar(len(graph.nodes) * rounds, f"{_short(ep)}: {len(graph.nodes)} nodes x "
                               f"{rounds} rounds", quiet, unit="node")
            try:
                nodes = measure.profile_nodes(runner, model, graph, values, warmup=warmup,
                                              repeats=repeats, group=group, overheads=overheads,
                                              rounds=rounds, progress=bar.update, between=between)
            finally:
                bar.close()
            between(1, 1)
            whole_t = measure.Timing.of(np.concatenate(whole_samples))
            settings.update(rounds=rounds, grouped=group)
            distinct = len({t.same_as or name for name, t in nodes.items()})
        whole_sess = whole_run = None  # the next EP loads its own
        whole = {"median": round(1e3 * whole_t.median, 6), "p10": round(1e3 * whole_t.p10, 6),
                 "p90": round(1e3 * whole_t.p90, 6), "runs": whole_t.runs, "ep_share": round(share, 4)}
        settings.update(graph_optimization="disabled", inputs="random floats in [0, 1), ones for integers")
        entries.append(Entry(
            model_hash=key, input_shapes=dict(bound), device_key=device_key(ep, threads),
            execution_provider=ep, nodes=nodes, whole_model_ms=whole,
            call_overhead_ms=round(overheads[0] * 1e3, 6), node_overhead_ms=round(overheads[1] * 1e3, 6),
            model={"path": str(path), "nodes": len(graph.nodes), "distinct_node_models": distinct},
            device={"hardware": describe(ep), "threads": threads, "host": platform.node(),
                    "onnxruntime": ort.__version__, "numpy": np.__version__},
            settings=settings,
            measured_at=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            seconds=round(time.perf_counter() - start, 3),
        ))
    return entries


def _measure_openvino(path: Path, graph, key: str, bound, feeds, repeats: int, warmup: int,
                      threads: int) -> Entry:
    """OpenVINO's runtime: every node inside whole-model runs (its per-layer counters, a
    fused layer's time spread over its ONNX nodes by their FLOPs).  Where OpenVINO
    refuses the model, the entry says so in one line (``settings.refused``) and marks every
    node unsupported: the plan goes on without it, and the refusal is not measured again."""
    from . import costmodel

    start = time.perf_counter()
    works = costmodel.works(graph)
    names = [n.name for n in graph.nodes]
    settings: dict = {"method": "in_graph", "counters": "openvino PERF_COUNT", "repeats": repeats,
                      "warmup": warmup, "inputs": "random floats in [0, 1), ones for integers"}
    try:
        readers = {n.name: [c for o in n.outputs if o in graph.tensors for c in graph.tensors[o].consumers]
                   for n in graph.nodes}
        # in a process of its own: after OpenVINO had profiled a decoder (tests/data's
        # llama_tiny_genai, on a 2-core AMD EPYC with AVX2 only), its next model's first
        # inference in the same process crashed it (a segmentation fault); a crash there is
        # the refusal below
        with isolated.Child() as child:
            node_ms, whole = child.call("onnxsplit.providers.openvino:profile_nodes", str(path), dict(feeds),
                                        names, {n: works[n].flops + 1.0 for n in names}, threads=threads,
                                        runs=max(repeats, 10), warmup=warmup, consumers=readers)
        nodes = {n.name: NodeTiming(n.op_type, True, round(node_ms[n.name], 6)) for n in graph.nodes}
        whole_ms = {k: round(v, 6) if isinstance(v, float) else v for k, v in whole.items()}
    except Exception as e:
        from ..shapes import one_line

        refused = f"OpenVINO refused the model: {e if isinstance(e, openvino.OpenVINOError) else one_line(e)}"
        # (said even where progress is not: the user should know what was left out)
        print(f"onnxsplit: note: {refused}; planning without it", file=sys.stderr, flush=True)
        settings["refused"] = refused
        nodes = {n.name: NodeTiming(n.op_type, False, error="refused") for n in graph.nodes}
        whole_ms = {}
    return Entry(model_hash=key, input_shapes=dict(bound), device_key=device_key(openvino.RUNTIME, threads),
                 execution_provider=openvino.RUNTIME, nodes=nodes, whole_model_ms=whole_ms,
                 model={"path": str(path), "nodes": len(graph.nodes)},
                 device={"hardware": describe(openvino.RUNTIME), "threads": threads, "host": platform.node(),
                         "openvino": openvino.version()},
                 settings=settings,
                 measured_at=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                 seconds=round(time.perf_counter() - start, 3))


def _auto_method(ep: str, whole_run, nodes: int, warmup: int) -> str:
    """``in_graph`` on the CPU when the model's ``nodes`` (subgraphs' included) take
    IN_GRAPH_MIN_NODE_S on average,
    ``alone`` otherwise (see ``ingraph``: the profiler's own cost per event, 2-5 us and not
    the same for every node, would then be a large share of each node) and on
    accelerators."""
    if ep != CPU_EP:
        return "alone"
    from .measure import sample

    for _ in range(max(warmup, 1)):
        whole_run()
    per_node = float(sample(whole_run, 3).min()) / max(nodes, 1)
    return "in_graph" if per_node >= IN_GRAPH_MIN_NODE_S else "alone"


def _node_count(graph) -> int:
    """Nodes of an ONNX graph, those of its If/Loop/Scan subgraphs included (each has its
    own profiler event)."""
    from ..graph import subgraphs

    return sum(1 + sum(_node_count(g) for g in subgraphs(n)) for n in graph.node)


def _short(ep: str) -> str:
    return ep.removesuffix("ExecutionProvider") or ep
