"""Bounds on a plan's latency: the path bound below, the best known plan above.

Along any path of the graph, every plan's calls meet the path in consecutive segments,
one after another, each taking at least the least call holding that segment
(:mod:`.call_times`).  So the best cut of a heavy path (:func:`.dp.cut_sequence`) is below
every plan's latency: it sees the memory limit forcing layers apart and the branches
beside the path.  Above: all on the CPUs, or a warm start the latency program accepts.
Also used by the CP-SAT worker, so nothing here imports python-mip.

Write-up: docs/latency.md (Path bound).
"""

from __future__ import annotations

import time

import numpy as np

from ...errors import SplitError
from ...workload import Workload
from .. import evaluate
from .call_times import segment_call_times
from .dp import cut_sequence


def latency_lower_bound(w: Workload, pieces: int = 1, seconds: float = 30.0, call_cuts: bool = True) -> float:
    """A latency no plan with at most ``pieces`` calls per accelerator beats: the best cut
    of each of a few heavy paths (longest by accelerator time, CPU time, memory, transfer
    cost, and their mixes), the largest of them.  Each accelerator segment costs at least
    the nodes between its ends (its hull: calls are convex), then, where time is left, the
    least call that can run it, nodes off the path included (:mod:`.call_times`, a minimum
    cut per segment; not without ``call_cuts``), for the most promising paths first; for at
    most ``seconds`` (the first path's hull cut is always made)."""
    if w.n == 0:
        return 0.0
    deadline = time.perf_counter() + seconds
    slots = w.num_accelerators * pieces
    scale = lambda a: a / a.max() if a.size and a.max() > 0 else a  # noqa: E731
    weights = [w.acc_latency, w.cpu_latency, w.size, w.out_cost,
               scale(w.acc_latency) + scale(w.size), scale(w.size) + scale(w.out_cost),
               scale(w.acc_latency) + scale(w.size) + scale(w.out_cost)]
    paths = list(dict.fromkeys(tuple(heaviest_path(w, weight)) for weight in weights))
    alone, took = [], 0.0
    for path in paths:
        if alone and time.perf_counter() + took > deadline:
            break
        began = time.perf_counter()
        alone.append(cut_sequence(w, path, slots, hull=True)[0])
        took = max(took, time.perf_counter() - began)
    best = max(alone)
    for _, path in sorted(zip(alone, paths), reverse=True) if call_cuts else ():
        if time.perf_counter() + 2 * took > deadline:  # the cuts, then the cut that reads them
            break
        times = segment_call_times(w, path, pieces, deadline - 1.5 * took)
        best = max(best, cut_sequence(w, path, slots, call_times=times, hull=True)[0])
    return best


def heaviest_path(w: Workload, weight: np.ndarray) -> list[int]:
    """The path (node indices, in order) with the largest total ``weight``."""
    total, prev = longest_paths(w, weight)
    v = int(np.argmax(total))
    path = []
    while v >= 0:
        path.append(v)
        v = int(prev[v])
    return path[::-1]


def longest_paths(w: Workload, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the heaviest path ending at each node, the node included; its previous node or -1)."""
    weight = np.asarray(weight, dtype=np.float64)
    total = weight.copy()
    prev = np.full(w.n, -1, dtype=np.int64)
    for v in w.topological_order:
        for u in w.predecessors[v]:
            if total[u] + weight[v] > total[v]:
                total[v], prev[v] = total[u] + weight[v], u
    return total, prev


def runs_nowhere(w: Workload) -> str | None:
    """Why no plan exists where a node has no device to run on; None where every node has one."""
    if w.num_cpus > 0:
        return None
    runs = (w.class_supported & (np.array(w.class_counts) > 0)[:, None]).any(axis=0)
    if not runs.all():
        return ("a node runs on no device: no CPU core and it is not accelerator-supported"
                if w.accelerators_total else "no devices")
    return None


def cheapest_latency(w: Workload) -> np.ndarray:
    """Each node's least latency on any device the workload has (inf: none can run it)."""
    present = (np.array(w.class_counts) > 0)[:, None] & w.class_supported
    best = np.where(present, w.class_latency, np.inf).min(axis=0, initial=np.inf)
    return np.minimum(best, w.cpu_latency if w.num_cpus > 0 else np.inf)


def most_transfer(w: Workload) -> np.ndarray:
    """Each tensor's dearest single transfer over any link (staged or direct)."""
    out = np.max([w.staged_cost(c, np.arange(w.n)) for c in range(len(w.class_names))], axis=0)
    for a, b in w.peer_links:
        out = np.maximum(out, w.peer_cost(a, b, np.arange(w.n)))
    return out


def in_symmetry_order(w: Workload, assignment: dict[int, str], pieces: dict[int, int]) -> dict[int, str]:
    """``assignment`` with its accelerators renamed so that the first pieces begin in
    topological order, as the latency IP's symmetry breaking asks: a start that breaks it
    is one the solver rejects (and searches without an incumbent)."""
    pos = np.empty(w.n, dtype=np.int64)
    pos[list(w.topological_order)] = np.arange(w.n)
    first: dict[str, int] = {}
    for nid, piece in pieces.items():
        d = assignment[nid]
        if piece == 1:
            first[d] = min(first.get(d, w.n), int(pos[w.index[nid]]))
    rename = {}
    for c in range(len(w.class_names)):  # devices are interchangeable within their class
        names = [dv.name for dv in w.devices if w.device_class[dv.index] == c]
        used = sorted((d for d in first if d in names), key=first.get)
        rename.update({d: names[i] for i, d in enumerate(used)})
    return {nid: rename.get(d, d) for nid, d in assignment.items()}


def latency_upper_bound(w: Workload, warm_start: dict[int, str] | None, pieces: int):
    """The best latency known before solving (all on the CPUs, or the warm start) and, when
    the warm start fits the IP (at most ``pieces`` calls per accelerator), its pieces."""
    best = np.inf
    plan = None
    k = w.accelerators_total
    if w.num_cpus > 0:
        cpu = w.devices[k].name
        best = evaluate.latency(w, {int(i): cpu for i in w.ids}).value
    if warm_start:
        dev = evaluate.device_array(w, warm_start)
        pc = evaluate.accelerator_pieces(w, dev)
        if not evaluate.check(w, warm_start) and pc.max(initial=0) <= pieces:
            cpu_name = w.devices[k].name if w.num_cpus else None
            a = {int(i): (cpu_name if dev[j] >= k else warm_start[int(i)])
                 for j, i in enumerate(w.ids)}
            pc_map = {int(w.ids[j]): int(pc[j]) for j in range(w.n) if dev[j] < k}
            a = in_symmetry_order(w, a, pc_map)
            try:
                value = evaluate.latency(w, a, pc_map).value
            except SplitError:  # the pieces wait on each other: no schedule with these calls
                value = None
            if value is not None and value <= best:
                best, plan = value, (a, pc_map)
    if not np.isfinite(best):
        # no CPU and no usable start: the sum of all latencies bounds any schedule
        best = float(w.cpu_latency.sum() + w.class_latency.sum() + 2 * most_transfer(w).sum()) + 1.0
    return float(best) * (1 + 1e-9) + 1e-9, plan
