"""OpGraph + profile + cluster -> Workload: the paper's computational model, built from a
model's measurements for ``onnxsplit workload`` and the main command.

The cluster's accelerator gives the ``k`` identical accelerators, its ``cpu`` class the
``l`` cores; with several accelerators (none chosen with ``accelerator``) each is an
accelerator class of the workload named after it (the paper's ``acc`` left empty), with
its own latencies, support and memory, and every link priced by the route it gives.  Each node gets the profile's CPU and accelerator latencies (a roofline
estimate where a device or node was not measured), scaled by the device's whole-model
time over its node sum (``calibrate``); whether the accelerator supports it; and a memory
size: its weights (a shared weight charged as ``shared_weights`` says), held data and,
with ``activations="outputs"``, its outputs.  An edge costs the link's
``latency + bytes / bandwidth`` for the producer's tensors.

Write-up, with every field and policy: docs/machine.md (From an ONNX model to a workload).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Mapping

from . import shapes
from .cluster import Cluster, DeviceSpec
from .errors import ClusterError, ProfileError
from .graph import OpGraph
from .profile import costmodel as cm
from .profile import devices as dv
from .profile.store import Entry, ModelProfile
from .workload import AcceleratorClass, Edge, Link, Node, Workload

SHARED_WEIGHTS = ("first", "each", "color")
ACTIVATIONS = ("outputs", "none")
SMALL_WEIGHT_BYTES = shapes.KEEP_WEIGHT_BYTES


def choose_accelerators(cluster: Cluster, name: str | None) -> list[DeviceSpec]:
    """The accelerators a workload is built for: the one named, else every one the cluster
    has (the first is the paper's ``acc``)."""
    if name is not None:
        dev = cluster.device(name)
        if dev.is_cpu:
            raise ClusterError(f"'{name}' is the CPU class, not an accelerator")
        return [dev]
    return [d for d in cluster.accelerators if d.count > 0]


def providers_needed(cluster: Cluster, accs) -> list[str]:
    """The execution providers whose profile a workload for ``accs`` on ``cluster`` uses
    (the providers that share the CPU's cores included)."""
    accs = [accs] if isinstance(accs, DeviceSpec) else [a for a in (accs or []) if a is not None]
    eps = [cluster.cpu.execution_provider] + [a.execution_provider for a in accs if a.execution_provider]
    return list(dict.fromkeys(eps + list(cluster.cpu.shared_by)))


def class_name(spec: DeviceSpec) -> str:
    """The workload's name for an accelerator's class: the device's name made an
    identifier (``A100-80GB`` -> ``a100_80gb``)."""
    name = re.sub(r"\W", "_", spec.name.lower())
    name = name if name and not name[0].isdigit() else f"x{name}"
    return f"{name}_dev" if name in ("acc", "cpu") else name


def pick_entries(profile: ModelProfile, cpu: DeviceSpec, acc: DeviceSpec | None
                 ) -> tuple[Entry | None, Entry | None]:
    """(CPU entry, accelerator entry): this machine's where it has one; the CPU entry from
    the same host as the accelerator's when that host measured both."""
    acc_entry = None
    if acc is not None and acc.execution_provider:
        acc_entry = profile.entry(acc.execution_provider, hardware=dv.describe(acc.execution_provider))
    host = acc_entry.device.get("host") if acc_entry is not None and \
        acc_entry.execution_provider != cpu.execution_provider else None
    cpu_entry = profile.entry(cpu.execution_provider, host=host,
                              hardware=dv.describe(cpu.execution_provider))
    return cpu_entry, acc_entry


def output_bytes(graph: OpGraph) -> dict[str, int]:
    """Each node's output bytes at the graph's shapes: what ``activations="outputs"``
    counts against a device's memory."""
    return {n.name: sum(graph.tensors[o].bytes for o in n.outputs if o) for n in graph.nodes}


def build_workload(
    graph: OpGraph,
    profile: ModelProfile,
    cluster: Cluster,
    *,
    accelerator: str | None = None,
    shared_weights: str = "first",
    activations: str = "outputs",
    calibrate: bool = True,
    peak_activations: Mapping[str, int] | None = None,
) -> Workload:
    if shared_weights not in SHARED_WEIGHTS:
        raise ClusterError(f"shared_weights must be one of {', '.join(SHARED_WEIGHTS)}, "
                           f"got '{shared_weights}'")
    if activations not in ACTIVATIONS:
        raise ClusterError(f"activations must be one of {', '.join(ACTIVATIONS)}, got '{activations}'")
    cpu = cluster.cpu
    accs = choose_accelerators(cluster, accelerator)
    acc = accs[0] if accs else None
    cpu_entry, acc_entry = pick_entries(profile, cpu, acc)
    if cpu_entry is None:
        raise ProfileError(f"the profile has no {cpu.execution_provider} measurements of this "
                           "model at these input shapes: run onnxsplit profile")
    _check_matches(cpu_entry, graph)

    works = cm.works(graph)
    cpu_roof = _calibrated(graph, works, cpu_entry)
    cpu_ms, cpu_src = _latencies(graph, works, cpu_entry, cpu_roof, calibrate)
    found = [_accelerator(graph, works, profile, spec, cpu, cpu_roof, calibrate) for spec in accs]
    several = len(accs) > 1
    if acc is None or several:  # (several: the paper's class is left empty, each has its own)
        acc_ms, acc_src = dict(cpu_ms), {n: "none" for n in cpu_ms}
        supported = {n.name: False for n in graph.nodes}
        acc_entry = acc_roof = None
    else:
        acc_ms, acc_src, supported, acc_entry, acc_roof = found[0]
    links = [_host_link(cluster, cpu, spec) for spec in accs]
    link = links[0] if links else None
    ids = {n.name: i for i, n in enumerate(graph.nodes)}
    weight_bytes, colors, shared = _weights(graph, shared_weights, ids)
    nodes = []
    own = output_bytes(graph)
    for n in graph.nodes:
        act = max(own[n.name], (peak_activations or {}).get(n.name, 0))  # (the largest shape's, for a range)
        size = weight_bytes[n.name] + n.data_bytes + (act if activations == "outputs" else 0)
        extra = {"opType": n.qualified_op,
                 "latencySource": {"cpu": cpu_src[n.name], "acc": acc_src[n.name]},
                 "flops": works[n.name].flops,
                 "weightBytes": weight_bytes[n.name] + n.data_bytes,
                 "activationBytes": act}
        t = cpu_entry.nodes[n.name]
        if t.measured and t.p10_ms is not None:
            extra["cpuLatencySpread"] = [t.p10_ms, t.p90_ms]
        nodes.append(Node(id=ids[n.name], cpu_latency=cpu_ms[n.name], acc_latency=acc_ms[n.name],
                          supported=bool(supported.get(n.name, False)), backward=False,
                          color_class=colors.get(n.name), size=float(size), name=n.name,
                          extra=extra))

    names = [class_name(spec) for spec in accs]
    if len(set(names)) < len(names):
        raise ClusterError(f"{cluster.source}: accelerator names {', '.join(a.name for a in accs)} "
                           "must differ as identifiers (letters, digits, '_')")
    if several:  # each class's latencies, where it runs the node
        for j, (ms, _, sup, _, _) in enumerate(found):
            for i, n in enumerate(graph.nodes):
                more = nodes[i].latencies + ((names[j], ms[n.name]),) if sup.get(n.name) else nodes[i].latencies
                nodes[i] = replace(nodes[i], latencies=more)
                nodes[i].extra["latencySource"][names[j]] = found[j][1][n.name]
    out_cost = {}
    for n in graph.nodes:
        read = [o for o in n.outputs if o and graph.tensors[o].consumers]
        if link is None:
            out_cost[n.name] = 0.0
        elif several:  # bytes at the first class's bandwidth; each link adds its latency per transfer
            out_cost[n.name] = sum(graph.tensors[o].bytes for o in read) / link.bandwidth * 1e3
        else:
            out_cost[n.name] = sum(link.seconds(graph.tensors[o].bytes) for o in read) * 1e3
    pairs: dict[tuple[str, str], list[str]] = {}
    for e in graph.edges:
        pairs.setdefault((e.producer, e.consumer), []).append(e.tensor)
    edges = tuple(
        Edge(ids[p], ids[c], out_cost[p],
             extra={"bytes": sum(graph.tensors[t].bytes for t in ts), "tensors": ts,
                    "tensorBytes": [graph.tensors[t].bytes for t in ts]})
        for (p, c), ts in pairs.items())

    meta = {
        "model": graph.path,
        "inputShapes": {k: list(v) for k, v in graph.input_shapes.items()},
        "modelHash": profile.model_hash,
        "units": {"latency": "ms", "cost": "ms", "size": "bytes"},
        "cpu": _device_meta(cpu, cpu_entry, cpu_roof, calibrate),
        "accelerator": _device_meta(acc, acc_entry, acc_roof, calibrate) if acc is not None and not several
        else None,
        "link": link.to_json() if link is not None else None,
        "sharedWeights": shared_weights,
        "activations": activations,
        "sharedWeightReaders": shared,
        "cluster": cluster.to_json(),
    }
    on_cores = _on_cores(graph, profile, cpu, calibrate)
    if on_cores:
        meta["onCores"] = on_cores
    classes, priced = (), ()
    if several:
        meta["classes"] = {name: _device_meta(spec, f[3], f[4], calibrate)
                           for name, spec, f in zip(names, accs, found)}
        classes = tuple(AcceleratorClass(name, spec.count, float(spec.memory)) for name, spec in zip(names, accs))
        priced = _priced_links(cluster, accs, names, links)
    return Workload(
        nodes=tuple(nodes), edges=edges,
        num_accelerators=acc.count if acc is not None and not several else 0,
        num_cpus=cpu.count,
        accelerator_memory=float(acc.memory) if acc is not None and not several else 0.0,
        extra={"onnxsplit": meta},
        accelerator_classes=classes, links=priced,
    )


def _host_link(cluster: Cluster, cpu: DeviceSpec, spec: DeviceSpec):
    link = cluster.link(cpu.cls, spec.cls)
    if link is None:
        raise ClusterError(f"{cluster.source}: no link between '{cpu.cls}' and '{spec.cls}': "
                           f"add {{\"between\": [\"{cpu.cls}\", \"{spec.cls}\"], "
                           "\"bandwidth\": ..., \"latency\": ...} to 'links'")
    return link


def _priced_links(cluster: Cluster, accs, names, host) -> tuple[Link, ...]:
    """Each class's host link, and a peer link for every cluster link between two
    accelerator classes, as time per ms of transfer at the first class's host bandwidth
    (``scale``) plus a latency per transfer (ms)."""
    base = host[0].bandwidth
    out = [Link(name, "cpu", base / lk.bandwidth, lk.latency * 1e3) for name, lk in zip(names, host)]
    for i, a in enumerate(accs):
        for j in range(i, len(accs)):
            lk = cluster.link(a.cls, accs[j].cls)
            if lk is not None and not (i == j and a.count < 2):
                out.append(Link(names[i], names[j], base / lk.bandwidth, lk.latency * 1e3))
    return tuple(out)


def _unknown_provider(ep: str | None) -> str:
    """'' for no provider or one onnxruntime (or a plugin library here, or OpenVINO's
    runtime) knows by name; else what it may have meant (a misspelt name reads as a
    device to estimate)."""
    import difflib

    import onnxruntime as ort

    from .providers import openvino, plugins

    known = list(dict.fromkeys([*ort.get_all_providers(), *plugins.libraries(), openvino.RUNTIME]))
    if not ep or ep in known:
        return ""
    near = difflib.get_close_matches(ep, known, n=1)
    return f" ('{ep}' is no execution provider onnxruntime knows" + (f": did you mean '{near[0]}'?)" if near else ")")


def _accelerator(graph, works, profile: ModelProfile, acc: DeviceSpec, cpu: DeviceSpec, cpu_roof,
                 calibrate: bool):
    """(latency ms, source, supported, profile entry, roofline) of every node on one
    accelerator: measured where the profile has its execution provider, else estimated
    from its peaks."""
    _, entry = pick_entries(profile, cpu, acc)
    if entry is not None:
        _check_matches(entry, graph)
        roof = _calibrated(graph, works, entry)
        ms, src = _latencies(graph, works, entry, roof, calibrate)
        supported = {name: t.supported for name, t in entry.nodes.items()}
    else:
        if not acc.peak_flops or not acc.memory_bandwidth:
            ep = f" ({acc.execution_provider})" if acc.execution_provider else ""
            raise ClusterError(
                f"device '{acc.name}'{ep} has no measurements in the profile, so its latencies "
                f"must be estimated: give its peak_flops and memory_bandwidth in the cluster "
                f"file, or profile the model where {acc.execution_provider or 'it'} runs"
                f"{_unknown_provider(acc.execution_provider)}")
        roof = cm.device_roofline(acc.peak_flops, acc.memory_bandwidth, acc.call_overhead,
                                  acc.efficiency, cpu_roof, (cpu.peak_flops, cpu.memory_bandwidth))
        ms = {n: round(roof.seconds(w) * 1e3, 9) for n, w in works.items()}
        src = {n: "estimated" for n in works}
        supported = {n: w.covered for n, w in works.items()}
    for n in graph.nodes:
        if n.op_type in acc.unsupported_ops or n.qualified_op in acc.unsupported_ops:
            supported[n.name] = False
    return ms, src, supported, entry, roof


def _check_matches(entry: Entry, graph: OpGraph) -> None:
    missing = [n.name for n in graph.nodes if n.name not in entry.nodes]
    if missing:
        raise ProfileError(f"the {entry.execution_provider} profile does not match the model: "
                           f"it has no node '{missing[0]}'"
                           + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))


def _calibrated(graph: OpGraph, works: Mapping[str, cm.Work], entry: Entry) -> cm.Roofline:
    names = [n.name for n in graph.nodes
             if entry.nodes[n.name].measured and works[n.name].covered]
    if not names:
        names = [n.name for n in graph.nodes if entry.nodes[n.name].measured]
    if not names:
        raise ProfileError(f"the {entry.execution_provider} profile has no measured node")
    return cm.calibrate([works[n] for n in names], [entry.nodes[n].median_ms / 1e3 for n in names])


def _on_cores(graph: OpGraph, profile: ModelProfile, cpu: DeviceSpec, calibrate: bool) -> dict:
    """Each provider that shares the CPU's cores (``cpu.shared_by``) and has a profile
    that it did not refuse: its execution provider, latency scale and every node's
    latency (ms, one thread, scaled to its whole model; None where it does not run it),
    in node order -- what a division of the cores that gives it some hands its class."""
    out = {}
    for ep in cpu.shared_by:
        entry = profile.entry(ep, hardware=dv.describe(ep))
        if entry is None or entry.settings.get("refused") or \
                any(n.name not in entry.nodes for n in graph.nodes):
            continue
        scale = latency_scale(entry) if calibrate else 1.0
        out[ep] = {"latencyScale": round(scale, 6),
                   "latency": [round(float(entry.nodes[n.name].median_ms) * scale, 9)
                               if entry.nodes[n.name].measured else None for n in graph.nodes]}
    return out


def latency_scale(entry: Entry) -> float:
    """Whole-model time over the sum of node times, from one profiling run (1 if unknown)."""
    whole, total = entry.whole_model_ms.get("median"), entry.node_sum_ms()
    return float(whole) / total if whole and total > 0 else 1.0


def _latencies(graph, works, entry: Entry, roof: cm.Roofline, calibrate: bool):
    ms, src = {}, {}
    scale = latency_scale(entry) if calibrate else 1.0
    for n in graph.nodes:
        t = entry.nodes[n.name]
        if t.measured:
            ms[n.name], src[n.name] = float(t.median_ms), "measured"
        else:
            ms[n.name], src[n.name] = roof.seconds(works[n.name]) * 1e3, "estimated"
        ms[n.name] = round(ms[n.name] * scale, 9)
    return ms, src


def _weights(graph: OpGraph, policy: str, ids: Mapping[str, int]):
    """(weight bytes charged per node, colour class per node, readers of shared weights)."""
    charged = {n.name: 0 for n in graph.nodes}
    shared: dict[str, list[int]] = {}
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    for w in graph.weights:
        readers = list(w.consumers)
        if not readers:
            continue
        if len(readers) > 1 and w.bytes > SMALL_WEIGHT_BYTES:
            shared[w.name] = [ids[r] for r in readers]
        if len(readers) == 1 or w.bytes <= SMALL_WEIGHT_BYTES or policy == "each":
            for r in readers:
                charged[r] += w.bytes
            continue
        first = min(readers, key=lambda r: ids[r])
        charged[first] += w.bytes
        if policy == "color":
            root = find(first)
            for r in readers:
                parent[find(r)] = root
    colors: dict[str, int] = {}
    if policy == "color":
        groups: dict[str, list[str]] = {}
        for n in graph.nodes:
            if n.name in parent:
                groups.setdefault(find(n.name), []).append(n.name)
        for members in groups.values():
            if len(members) > 1:
                label = min(ids[m] for m in members)
                for m in members:
                    colors[m] = label
    return charged, colors, shared


def _device_meta(dev: DeviceSpec, entry: Entry | None, roof: cm.Roofline | None,
                 calibrate: bool) -> dict:
    d = {"name": dev.name, "class": dev.cls, "count": dev.count,
         "executionProvider": dev.execution_provider, "memory": dev.memory,
         "latencies": "measured" if entry is not None else "estimated"}
    if entry is not None:
        d["profile"] = {"device": entry.device_key, "host": entry.device.get("host"),
                        "measuredAt": entry.measured_at,
                        "wholeModelMs": entry.whole_model_ms.get("median"),
                        "nodeSumMs": round(entry.node_sum_ms(), 6)}
        d["latencyScale"] = round(latency_scale(entry), 6) if calibrate else 1.0
    if roof is not None:
        d["roofline"] = roof.to_json()
    return d
