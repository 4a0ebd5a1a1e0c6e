"""The one judge of every plan: pure functions of (Workload, assignment).

* :func:`max_load` -- time per sample of a pipelined split (throughput): a device's node
  latencies plus, on an accelerator, ``c(u)`` once for every tensor it sends or receives.
* :func:`latency` -- single-stream latency: CPU nodes run with unbounded parallelism,
  each contiguous piece of an accelerator is one call.
* :func:`check` -- the list of violations: memory, support, colour classes, device
  counts, contiguity and cycles between parts.

Nothing here knows which solver made the assignment.  Write-up: docs/README.md (The
model the solvers optimise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SplitError
from ..workload import Workload


@dataclass(frozen=True)
class Score:
    value: float
    loads: dict[str, float]  # device name -> load (max-load) or finish time (latency)


def device_array(workload: Workload, assignment: dict[int, str]) -> np.ndarray:
    """node index -> device index; raises SplitError on unknown nodes/devices or gaps."""
    dev = np.full(workload.n, -1, dtype=np.int64)
    for nid, name in assignment.items():
        i = workload.index.get(int(nid))
        if i is None:
            raise SplitError(f"node {nid} is not in the workload")
        d = workload.device_index.get(name)
        if d is None:
            names = ", ".join(x.name for x in workload.devices)
            raise SplitError(f"node {nid}: unknown device '{name}' (devices: {names})")
        dev[i] = d
    missing = np.flatnonzero(dev < 0)
    if missing.size:
        raise SplitError(f"node {workload.nodes[missing[0]].id} has no device "
                         f"({missing.size} nodes unplaced)")
    return dev


def communication(workload: Workload, dev: np.ndarray, sources: np.ndarray | None = None) -> np.ndarray:
    """Per-device communication time: c(u) once per device sending or receiving tensor u.

    With links (:attr:`Workload.multi_class`) each transfer is priced by its route: a
    direct copy where the two accelerators' classes have a peer link (each end pays it,
    once per receiving device), else staged through host memory (the sender pays its host
    link once per tensor, each receiving accelerator its own).  CPU cores pay nothing.
    ``sources``: a node mask; only tensors produced by those nodes are counted."""
    comm = np.zeros(len(workload.devices))
    src, dst = workload.edge_src, workload.edge_dst
    cut = dev[src] != dev[dst]
    if sources is not None:
        cut &= sources[src]
    if not cut.any():
        return comm
    if workload.multi_class:
        return _routed_communication(workload, dev, src[cut], dst[cut], comm)
    s, d = src[cut], dev[dst[cut]]
    senders = np.unique(s)
    np.add.at(comm, dev[senders], workload.out_cost[senders])
    pairs = np.unique(s * len(workload.devices) + d)
    np.add.at(comm, pairs % len(workload.devices), workload.out_cost[pairs // len(workload.devices)])
    return comm * (np.arange(len(workload.devices)) < workload.accelerators_total)


def _routed_communication(w: Workload, dev: np.ndarray, src: np.ndarray, dst: np.ndarray,
                          comm: np.ndarray) -> np.ndarray:
    """:func:`communication` with every transfer priced by the link it takes."""
    cls = w.device_class
    receivers: dict[int, set[int]] = {}
    for u, t in zip(src.tolist(), dst.tolist()):
        receivers.setdefault(u, set()).add(int(dev[t]))
    for u, devs in receivers.items():
        a = int(dev[u])
        staged = False
        for b in devs:
            peer = _direct(w, a, b, u)
            if peer is not None:
                comm[a] += peer
                comm[b] += peer
                continue
            staged = True
            if cls[b] >= 0:
                comm[b] += w.staged_cost(cls[b], u)
        if staged and cls[a] >= 0:
            comm[a] += w.staged_cost(cls[a], u)
    return comm


def _direct(w: Workload, a: int, b: int, u: int) -> float | None:
    """Seconds of a direct copy of tensor ``u`` from device ``a`` to device ``b`` at each
    end; None where it is staged through host memory (the same device, a CPU core at
    either end, or no peer link between their classes)."""
    ca, cb = int(w.device_class[a]), int(w.device_class[b])
    return None if a == b or ca < 0 or cb < 0 else w.peer_cost(ca, cb, u)


def _loads(workload: Workload, dev: np.ndarray, mask: np.ndarray | None = None) -> dict[str, float]:
    """Compute + communication per device, over the nodes (and tensors) in ``mask``."""
    nodes = np.ones(workload.n, dtype=bool) if mask is None else mask
    compute = np.zeros(len(workload.devices))
    cls = workload.device_class[dev]
    rows = np.where(cls >= 0, cls, 0)
    lat = np.where(cls >= 0, workload.class_latency[rows, np.arange(workload.n)], workload.cpu_latency)
    np.add.at(compute, dev[nodes], lat[nodes])
    load = compute + communication(workload, dev, mask)
    return {d.name: float(load[d.index]) for d in workload.devices}


def widened(workload: Workload, assignment: dict[int, str]) -> tuple[Workload, list[str]]:
    """The workload with enough devices for a split that names more than it has, and the
    over-count as violations (the paper's bert24 latency expert split uses 6 accelerators
    of 5): such a split is scored and reported rather than refused."""
    prefixes = {"acc": ("acc", "accelerators"), "cpu": ("cpu", "CPU cores")}
    for c in workload.accelerator_classes:
        prefixes[c.device_name(0)[:-1]] = (c.name, f"'{c.name}' accelerators")
    counts = dict(zip(workload.class_names, workload.class_counts), cpu=workload.num_cpus)
    needed = dict(counts)
    for dev in assignment.values():
        head = dev.rstrip("0123456789")
        num = dev[len(head):]
        if head not in prefixes or not num or (num != "0" and num.startswith("0")):
            names = ", ".join(sorted({p + "0.." for p in prefixes}))
            raise SplitError(f"unknown device '{dev}' (devices are {names})")
        cls = prefixes[head][0]
        needed[cls] = max(needed[cls], int(num) + 1)
    over = [(cls, label) for cls, label in prefixes.values() if needed[cls] > counts[cls]]
    violations = [f"devices: the split uses {needed[cls]} {label}, the workload has {counts[cls]}"
                  for cls, label in over]
    if not violations:
        return workload, []
    more = {c.name: needed[c.name] for c in workload.accelerator_classes}
    return workload.replace(num_accelerators=needed["acc"], num_cpus=needed["cpu"],
                            accelerator_classes=tuple(type(c)(c.name, more[c.name], c.memory, c.extra)
                                                      for c in workload.accelerator_classes)), violations


def device_rows(w: Workload, assignment: dict[int, str], order=None) -> list[dict]:
    """Per device of a plan, in ``order`` (default: the devices it uses, by name): its node
    count and max-load load -- the one table the CLI prints and the main command reports."""
    loads = max_load(w, assignment).loads
    counts: dict[str, int] = {}
    for d in assignment.values():
        counts[d] = counts.get(d, 0) + 1
    return [{"device": d, "nodes": counts.get(d, 0), "load": loads.get(d, 0.0)}
            for d in (order if order is not None else sorted(counts))]


def max_load(workload: Workload, assignment: dict[int, str]) -> Score:
    loads = _loads(workload, device_array(workload, assignment))
    return Score(max(loads.values(), default=0.0), loads)


def pass_loads(workload: Workload, assignment: dict[int, str], backward: bool) -> dict[str, float]:
    """Loads of the forward (or backward) pass alone: its nodes and the tensors they produce.

    For the training objective max forward load + max backward load."""
    mask = workload.backward if backward else ~workload.backward
    return _loads(workload, device_array(workload, assignment), mask)


def accelerator_pieces(workload: Workload, dev: np.ndarray, cpus: bool = False) -> np.ndarray:
    """Split each accelerator's nodes into contiguous pieces (the reference's rule).

    piece(v) = 1 + the number of times a path into v has left v's device, maximised over
    paths; pieces of one device are convex and their contraction is acyclic.  A split that
    is already contiguous per device keeps one piece per device.  Returns the piece number
    (1-based) per node; 0 for CPU nodes (unless ``cpus``: CPU cores get pieces too).
    """
    k = workload.accelerators_total
    piece = np.zeros(workload.n, dtype=np.int64)
    order = workload.topological_order
    preds = workload.predecessors
    for d in np.unique(dev if cpus else dev[dev < k]):
        label = np.zeros(workload.n, dtype=np.int64)
        for v in order:
            inside = dev[v] == d
            best = 1 if inside else 0
            for u in preds[v]:
                best = max(best, label[u] + (1 if inside and dev[u] != d else 0))
            label[v] = best
        members = dev == d
        piece[members] = label[members]
    return piece


def switch_pieces(workload: Workload, dev: np.ndarray, cpus: bool = False) -> np.ndarray:
    """Pieces that are always schedulable: a new piece at every device switch on a path.

    piece(v) = max over predecessors u of piece(u) + [u on another device].  Along every
    edge the piece number grows or the edge stays inside one piece, so pieces of all
    devices together contract to a DAG.  Used when the per-device rule leaves a cycle
    between pieces of different accelerators.
    """
    label = _switch_labels(workload, dev)
    return label if cpus else np.where(dev < workload.accelerators_total, label, 0)


def _switch_labels(workload: Workload, key: np.ndarray) -> np.ndarray:
    """1 + the most times a path into each node changes ``key``."""
    label = np.ones(workload.n, dtype=np.int64)
    preds = workload.predecessors
    for v in workload.topological_order:
        for u in preds[v]:
            label[v] = max(label[v], label[u] + (1 if key[u] != key[v] else 0))
    return label


def runner_pieces(workload: Workload, dev: np.ndarray, given: np.ndarray | None = None) -> np.ndarray:
    """Calls for every node when CPU cores run their nodes one after another (the runner).

    Without ``given``: :func:`call_pieces` with serial CPUs.  With ``given`` (the
    accelerator pieces a latency plan chose; CPU entries ignored) the accelerators keep
    them, and a CPU core starts a new call whenever a path reaches it from another call --
    one call for all of a core's nodes would wait on the accelerator calls between them.
    Where that still leaves calls waiting on each other, a new call at every switch.
    """
    if given is None:
        return call_pieces(workload, dev, serial_cpus=True)
    k = workload.accelerators_total
    on_acc = dev < k
    key = np.where(on_acc, dev * (workload.n + 2) + given + 1, dev * (workload.n + 2))
    piece = np.where(on_acc, given, _switch_labels(workload, key))
    if _blocks(workload, dev, piece, serial_cpus=True)[2] is None:
        piece = switch_pieces(workload, dev, cpus=True)
    return piece


def call_pieces(workload: Workload, dev: np.ndarray, serial_cpus: bool = False) -> np.ndarray:
    """The pieces :func:`schedule` uses when none are given: the reference's per-device
    rule, or where those wait on each other across devices, a new piece at every switch.
    (With ``serial_cpus`` CPU cores get pieces too; otherwise CPU nodes are 0.)"""
    piece = accelerator_pieces(workload, dev, serial_cpus)
    if _blocks(workload, dev, piece, serial_cpus)[2] is None:
        piece = switch_pieces(workload, dev, serial_cpus)
    return piece


def _blocks(workload: Workload, dev: np.ndarray, piece: np.ndarray, serial_cpus: bool = False):
    """Group nodes into calls: each CPU node alone (with ``serial_cpus``: each (core,
    piece) together), each (accelerator, piece) together.

    Returns (block of each node, members of each block, blocks in topological order or
    None when the blocks form a cycle)."""
    from ..workload import topological_sort

    k = workload.accelerators_total
    grouped = np.ones(workload.n, dtype=bool) if serial_cpus else dev < k
    key = np.where(grouped, dev * (workload.n + 1) + piece, -1 - np.arange(workload.n))
    _, block = np.unique(key, return_inverse=True)
    nblocks = int(block.max()) + 1
    members: list[list[int]] = [[] for _ in range(nblocks)]
    for v in range(workload.n):
        members[block[v]].append(v)
    succ: list[set[int]] = [set() for _ in range(nblocks)]
    for s, t in zip(workload.edge_src, workload.edge_dst):
        if block[s] != block[t]:
            succ[block[s]].add(int(block[t]))
    return block, members, topological_sort(nblocks, succ)


@dataclass(frozen=True)
class Call:
    """One call of a sample's run: nodes a device runs together, and when."""

    device: str
    nodes: tuple[int, ...]  # node indices
    start: float  # inputs ready
    compute_start: float  # after incoming transfers
    compute_end: float
    finish: float  # after outgoing transfers


def schedule(workload: Workload, assignment: dict[int, str], pieces: dict[int, int] | None = None,
             serial_cpus: bool = False) -> list[Call]:
    """The calls of one sample in the latency model, in the order they run.

    ``pieces`` (node id -> piece number, for accelerator nodes) gives the calls explicitly,
    as the latency IP does; they must be schedulable (no cycle between calls).  Without
    them, pieces follow the reference's per-device rule (:func:`accelerator_pieces`); where
    those wait on each other across accelerators (no order can run them), every device
    switch starts a new piece instead (:func:`switch_pieces`).

    ``serial_cpus``: a CPU core runs its nodes one after another, in calls (pieces) like an
    accelerator's but with no transfer cost -- how the runner executes exported parts, where
    the paper's model lets CPU nodes run with unbounded parallelism.
    """
    dev = device_array(workload, assignment)
    k = workload.accelerators_total
    grouped = np.ones(workload.n, dtype=bool) if serial_cpus else dev < k
    if pieces:
        given = np.array([pieces.get(int(i), 0) for i in workload.ids], dtype=np.int64)
        block, members, order = _blocks(workload, dev, np.where(grouped, given, 0), serial_cpus)
        if order is None:
            raise SplitError("the given pieces wait on each other in a cycle (a piece is not convex, "
                             "or two calls need each other's output)")
    else:
        block, members, order = _blocks(workload, dev, call_pieces(workload, dev, serial_cpus),
                                        serial_cpus)
    finish = np.zeros(workload.n)
    preds, succs = workload.predecessors, workload.successors
    calls = []
    for b in order:
        nodes = members[b]
        first = nodes[0]
        inside = set(nodes)
        senders = {u for v in nodes for u in preds[v] if u not in inside}
        start = max((finish[u] for u in senders), default=0.0)
        if dev[first] >= k:  # CPU nodes: no transfer cost
            incoming = outgoing = 0.0
            compute = float(workload.cpu_latency[nodes].sum())
        else:
            incoming, outgoing = _call_transfers(workload, dev, int(dev[first]), inside, senders, succs)
            compute = float(workload.device_latency(int(dev[first]))[nodes].sum())
        done = start + incoming + compute + outgoing
        finish[nodes] = done
        calls.append(Call(workload.devices[dev[first]].name, tuple(nodes), float(start),
                          float(start + incoming), float(start + incoming + compute), float(done)))
    return calls


def _call_transfers(w: Workload, dev: np.ndarray, d: int, inside: set, senders: set, succs) -> tuple[float, float]:
    """(incoming, outgoing) seconds of one accelerator call: each tensor it receives, and
    each it sends (staged once through host memory; with peer links, a direct copy to each
    peer device that needs it instead)."""
    cost = w.out_cost
    if not w.multi_class:
        return (sum(cost[u] for u in senders),
                sum(cost[u] for u in inside if any(x not in inside for x in succs[u])))
    cls = w.device_class
    incoming = 0.0
    for u in senders:
        a = int(dev[u])
        peer = _direct(w, a, d, u)
        incoming += peer if peer is not None else w.staged_cost(cls[d], u)
    outgoing = 0.0
    for u in inside:
        away = {int(dev[x]) for x in succs[u] if x not in inside}
        staged = False
        for b in away:
            peer = _direct(w, d, b, u)
            if peer is None:
                staged = True
            else:
                outgoing += peer
        if staged:
            outgoing += w.staged_cost(cls[d], u)
    return float(incoming), float(outgoing)


def latency(workload: Workload, assignment: dict[int, str], pieces: dict[int, int] | None = None,
            serial_cpus: bool = False) -> Score:
    """Single-stream latency: when the last call of :func:`schedule` finishes (per device:
    when its last call does)."""
    per_device = {d.name: 0.0 for d in workload.devices}
    for c in schedule(workload, assignment, pieces, serial_cpus):
        per_device[c.device] = max(per_device[c.device], c.finish)
    return Score(max(per_device.values(), default=0.0), per_device)


def score(workload: Workload, assignment: dict[int, str], objective: str,
          pieces: dict[int, int] | None = None) -> Score:
    if objective == "throughput":
        return max_load(workload, assignment)
    if objective == "latency":
        return latency(workload, assignment, pieces)
    raise ValueError(f"unknown objective {objective!r}")


# ---- validity ------------------------------------------------------------------------------

CONTIGUITY = ("none", "convex", "ideal_chain")


def check(workload: Workload, assignment: dict[int, str], contiguity: str = "none",
          acyclic: bool = False) -> list[str]:
    """Every violation of the split, as readable lines (empty: valid).

    Always: every node placed on a known device, accelerator memory, accelerator support,
    colour classes.  ``contiguity="convex"``: every part is convex (no path leaves a part
    and comes back).  ``contiguity="ideal_chain"``: the forward parts form a chain of
    ideals (a linear pipeline), which is what the DP produces.  ``acyclic``: no cycle
    between parts, separately within the forward and within the backward graph (training
    pipelines run forward one way and backward the other).
    """
    try:
        dev = device_array(workload, assignment)
    except SplitError as e:
        return [str(e)]
    out: list[str] = []
    k = workload.accelerators_total
    ids = workload.ids
    on_acc = dev < k
    for d in workload.devices[:k]:
        used = float(workload.size[dev == d.index].sum())
        limit = float(workload.class_memory[workload.device_class[d.index]])
        if used > limit * (1 + 1e-12):
            out.append(f"memory: {d.name} holds {used:.6g} bytes, over its {limit:.6g} by {used - limit:.6g}")
    cls = workload.device_class[dev]
    bad = np.flatnonzero(on_acc & ~workload.class_supported[np.where(on_acc, cls, 0), np.arange(workload.n)])
    what = "accelerators" if not workload.accelerator_classes else "its device's class"
    for i in bad[:10]:
        out.append(f"support: node {ids[i]} is not supported on {what} but is on "
                   f"{workload.devices[dev[i]].name}")
    if bad.size > 10:
        out.append(f"support: ... and {bad.size - 10} more unsupported nodes on accelerators")
    classes = workload.color_class
    seen: dict[int, int] = {}
    for i in range(workload.n):
        c = int(classes[i])
        if c in seen and dev[seen[c]] != dev[i]:
            out.append(f"colour class: nodes {ids[seen[c]]} and {ids[i]} share a colour class but run on "
                       f"{workload.devices[dev[seen[c]]].name} and {workload.devices[dev[i]].name}")
        seen.setdefault(c, i)
    if contiguity not in CONTIGUITY:
        raise ValueError(f"contiguity must be one of {CONTIGUITY}")
    if contiguity == "convex":
        for mask in _passes(workload):
            out += _convexity_problems(workload, dev, mask)
    elif contiguity == "ideal_chain":
        cyc = _part_cycle(workload, dev, ~workload.backward)
        if cyc:
            out.append("contiguity: the forward parts are not a chain of ideals; they form a cycle "
                       + " -> ".join(workload.devices[d].name for d in cyc))
    if acyclic:
        for mask, label in zip(_passes(workload), ("forward", "backward")):
            cyc = _part_cycle(workload, dev, mask)
            if cyc:
                out.append(f"cycle between parts in the {label} graph: "
                           + " -> ".join(workload.devices[d].name for d in cyc))
    return out


def _passes(workload: Workload) -> list[np.ndarray]:
    """Node masks judged separately: the forward graph, then (training) the backward graph.

    A training part holds forward and backward nodes; the pipeline runs forward one way and
    backward the other, so contiguity and cycles are judged within each pass.
    """
    if not workload.is_training:
        return [np.ones(workload.n, dtype=bool)]
    return [~workload.backward, workload.backward.copy()]


def _convexity_problems(workload: Workload, dev: np.ndarray, mask: np.ndarray) -> list[str]:
    """A part is convex when no path (within ``mask``) leaves it and re-enters it."""
    out = []
    succ = workload.successors
    for d in np.unique(dev[mask]):
        inside = (dev == d) & mask
        # nodes reachable from the part by a path that has left it
        frontier = [w for v in np.flatnonzero(inside) for w in succ[v] if mask[w] and not inside[w]]
        seen = np.zeros(workload.n, dtype=bool)
        while frontier:
            w = frontier.pop()
            if seen[w]:
                continue
            seen[w] = True
            if inside[w]:
                out.append(f"contiguity: part {workload.devices[d].name} is not convex: a path leaves it "
                           f"and comes back at node {workload.ids[w]}")
                break
            frontier.extend(x for x in succ[w] if mask[x])
    return out


def _part_cycle(workload: Workload, dev: np.ndarray, mask: np.ndarray) -> list[int] | None:
    """A cycle of devices in the quotient graph of the nodes in ``mask``, or None."""
    import networkx as nx

    g = nx.DiGraph()
    for s, t in zip(workload.edge_src, workload.edge_dst):
        if mask[s] and mask[t] and dev[s] != dev[t]:
            g.add_edge(int(dev[s]), int(dev[t]))
    try:
        cycle = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        return None
    return [u for u, _ in cycle]
