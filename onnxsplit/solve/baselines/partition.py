"""Graph-partitioner baselines (``scotch``, ``metis``): the communication-weighted graph of
colour classes cut into ``k`` parts balanced by accelerator latency, best of seeded
restarts; parts over memory are repaired by local search's class state.
Write-up: docs/baselines.md.
"""

from __future__ import annotations

import time

import numpy as np

from ... import interrupt
from ...errors import SolveError
from ...plan import Plan
from ...workload import Workload
from .. import isolated, partitioners
from ..classes import ClassGraph, class_graph
from ..finish import finish, need_devices
from .local_search import DEFAULT_RESTARTS, ClassState


PARTITION_TIMEOUT = 60.0  # seconds for one Scotch run (it has hung on some graphs)


def partition_graph(workload: Workload, g: ClassGraph, classes: np.ndarray):
    """The reference's partitioning graph over ``classes``: vertex weight = accelerator
    latency, edge weight between two classes = the transfer costs of the nodes of one with an
    edge into the other (each such node once per direction pair), summed over both
    directions.  Weights are scaled by 1e6 and truncated to integers, as the reference does.

    Returns CSR arrays (xadj, adjncy, vertex weights, edge weights).
    """
    w = workload
    pos = np.full(g.n, -1, dtype=np.int64)
    pos[classes] = np.arange(len(classes))
    cs, cd = g.label[w.edge_src], g.label[w.edge_dst]
    keep = (cs != cd) & (pos[cs] >= 0) & (pos[cd] >= 0)
    pairs = {}
    for src, a, b in set(zip(w.edge_src[keep].tolist(), pos[cs[keep]].tolist(), pos[cd[keep]].tolist())):
        cost = float(w.out_cost[src])
        for x, y in ((a, b), (b, a)):
            pairs[(x, y)] = pairs.get((x, y), 0.0) + cost
    nv = len(classes)
    adj: list[list[tuple[int, int]]] = [[] for _ in range(nv)]
    for (x, y), wt in sorted(pairs.items()):
        adj[x].append((y, int(1e6 * wt)))
    xadj = np.concatenate([[0], np.cumsum([len(a) for a in adj])]).astype(np.int64)
    adjncy = np.array([y for a in adj for y, _ in a], dtype=np.int64)
    eweights = np.array([wt for a in adj for _, wt in a], dtype=np.int64)
    vweights = (1e6 * g.acc[classes]).astype(np.int64)
    return xadj, adjncy, vweights, eweights


def _permuted(xadj, adjncy, vweights, eweights, inv: np.ndarray):
    """The same graph with its vertices renumbered: new vertex i is old vertex inv[i]."""
    perm = np.argsort(inv)
    rows = [slice(xadj[o], xadj[o + 1]) for o in inv]
    new_xadj = np.concatenate([[0], np.cumsum([xadj[o + 1] - xadj[o] for o in inv])]).astype(np.int64)
    new_adj = np.concatenate([perm[adjncy[r]] for r in rows] or [np.zeros(0, np.int64)]).astype(np.int64)
    new_ew = np.concatenate([eweights[r] for r in rows] or [np.zeros(0, np.int64)]).astype(np.int64)
    return new_xadj, new_adj, vweights[inv], new_ew


def graph_partition(workload: Workload, tool: str = "scotch", seed: int = 0,
                    restarts: int = DEFAULT_RESTARTS, deadline: float = float("inf")) -> Plan:
    """Partition colour classes into ``k`` parts with Scotch or METIS, then score.

    Both tools are randomised, and their result depends on the vertex numbering too: run
    ``restarts`` times (the first in class order with ``seed``, then random renumberings
    with ``seed + r``) and keep the best.  Classes an accelerator cannot run go to the
    CPU.  The partitioners balance latency and know nothing of memory: where a part is over
    memory, classes are moved off it (to where they raise the max load least);
    ``details["runs"]`` records each run's value before and after that repair.
    """
    start = time.perf_counter()
    need_devices(workload, acc=True, method=tool)
    if restarts < 1:
        raise SolveError(f"{tool} needs at least one restart")
    g = class_graph(workload)
    k = workload.num_accelerators
    classes = np.flatnonzero(~g.unsupported)
    if len(classes) < g.n:
        need_devices(workload, cpu=True, method=tool)
    nparts = min(k, len(classes))
    arrays = partition_graph(workload, g, classes) if nparts > 1 else None
    child = isolated.Child() if tool == "scotch" and nparts > 1 else None  # see isolated.py
    try:
        best, runs = _partition_runs(workload, g, classes, tool, nparts, arrays, seed, restarts,
                                     deadline, child)
    finally:
        if child is not None:
            child.close()
    details = {"seed": seed, "restarts": restarts, "classes": g.n, "runs": runs}
    return finish(workload, "throughput", tool, best.assignment(workload), start, details=details)


def _partition_runs(workload: Workload, g: ClassGraph, classes, tool: str, nparts: int, arrays,
                    seed: int, restarts: int, deadline: float, child):
    """(best state, runs) of graph_partition's restarts."""
    k = workload.num_accelerators
    rng = np.random.default_rng(seed)
    best: ClassState | None = None
    runs = []
    for r in range(restarts if nparts > 1 else 1):
        if runs and interrupt.past(deadline):
            break
        dev = np.full(g.n, k, dtype=np.int64)  # unsupported classes: cpu0
        if nparts == 1:
            dev[classes] = 0
        elif nparts > 1:
            inv = np.arange(len(classes)) if r == 0 else rng.permutation(len(classes))
            graph = (nparts, *_permuted(*arrays, inv), seed + r)
            if child is None:
                parts = partitioners.metis_parts(*graph)
            else:
                left = deadline - time.perf_counter()
                try:
                    parts = child.call("onnxsplit.solve.partitioners:scotch_parts", *graph,
                                       timeout=left if left < PARTITION_TIMEOUT else PARTITION_TIMEOUT)
                except SolveError as e:
                    if "package" in str(e):  # pyscotch missing: no run will do better
                        raise
                    runs.append({"error": str(e)})  # Scotch failed on this numbering
                    continue
            dev[classes[inv]] = parts
        st = ClassState(g, workload, dev)
        run = {"partition_value": float(st.load.max(initial=0.0))}
        if not st.feasible:
            run["repair_moves"] = st.repair()
        run["value"] = float(st.load.max(initial=0.0))
        runs.append(run)
        if best is None or st.key() < best.key():
            best = st
    if best is None:
        raise SolveError(f"{tool} failed on every run: {runs[-1]['error']}")
    return best, runs
