"""PipeDream's planner: branches collapsed by biconnected components of the forward graph,
then the max-load DP over the prefixes of one topological order (a few orders tried).
Write-up: docs/baselines.md.
"""

from __future__ import annotations

import dataclasses
import heapq
import time

import networkx as nx
import numpy as np

from ...errors import SolveError
from ...plan import Plan
from ...workload import Workload
from .. import evaluate, preprocess
from ..finish import finish
from ..throughput import dp, lattice


def pipedream_ignored(c: preprocess.Contracted) -> set[int]:
    """Forward supernodes that are not layers PipeDream would profile, so that their
    out-edges do not tie layers together: zero-latency nodes that are inputs (no forward
    predecessor), or broadcast a tensor to several nodes that are all zero-latency glue
    (e.g. GNMT's attention context, fed to every decoder layer).  This generalises the reference's hard-coded node ids
    (bert24: the attention mask input; gnmt: two inputs and the attention broadcast)."""
    fwd = ~c.backward
    zero = (c.acc_latency < preprocess.ZERO) & (c.cpu_latency < preprocess.ZERO)
    has_pred = np.zeros(c.size, dtype=bool)
    feeds_work = np.zeros(c.size, dtype=bool)
    fan_out = np.zeros(c.size, dtype=np.int64)
    for a, b in c.true_edges:
        if fwd[a] and fwd[b]:
            has_pred[b] = True
            fan_out[a] += 1
            if not zero[b]:
                feeds_work[a] = True
    broadcast = (fan_out >= 2) & ~feeds_work
    return {int(s) for s in np.flatnonzero(fwd & zero & (~has_pred | broadcast))}


def pipedream_labels(workload: Workload) -> np.ndarray:
    """Colour-class labels after PipeDream's coarsening: in every biconnected component of
    the (undirected) forward class graph, the tails of its edges are fused, so that branches
    collapse and the layer graph becomes a chain.  Edges out of ignored supernodes
    (:func:`pipedream_ignored`) are left out, and so are edges at CPU-only supernodes:
    PipeDream assumes every layer runs on every worker, and fusing a CPU-only node into a
    branch would drag the whole branch off the accelerators."""
    c = preprocess.contract_color_classes(preprocess.initial(workload))
    ignored = pipedream_ignored(c)
    cpu_only = c.unsupported > 0
    directed = {(a, b) for a, b in c.true_edges if not c.backward[a] and not c.backward[b] and a not in ignored
                and not cpu_only[a] and not cpu_only[b]}
    und = nx.Graph()
    und.add_edges_from(directed)
    parent = {int(x): int(x) for x in np.unique(c.label)}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for comp in nx.biconnected_component_edges(und):
        tails = sorted({a for x, y in comp for a, b in ((x, y), (y, x)) if (a, b) in directed})
        for t in tails[1:]:
            ra, rb = find(int(c.label[tails[0]])), find(int(c.label[t]))
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(int(x)) for x in workload.color_class], dtype=np.int64)


def file_order(inst) -> list[int]:
    """The topological order of DP items closest to the file's node order (a profile lists
    layers in execution order): Kahn's algorithm, smallest first node index first."""
    first = []
    for it in range(inst.n):
        idx = [int(m.min()) for m in inst.items.nodes(it) if len(m)]
        first.append(min(idx) if idx else inst.contracted.workload.n)
    indeg = [len(p) for p in inst.preds]
    ready = [(first[v], v) for v in range(inst.n) if indeg[v] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, v = heapq.heappop(ready)
        order.append(v)
        for x in inst.succs[v]:
            indeg[x] -= 1
            if indeg[x] == 0:
                heapq.heappush(ready, (first[x], x))
    return order


def pipedream(workload: Workload, deadline: float = float("inf")) -> Plan:
    """PipeDream's planner: coarsen by biconnected components, then the max-load DP over the
    prefixes of one topological order of the coarsened forward graph.

    PipeDream takes the layer order its profile lists; which topological order that is, is
    an accident of the profiler.  So the chain DP runs over a few orders -- the file order
    first, then depth-first, breadth-first and heaviest-first -- and the best is kept
    (``details["order"]``); each one is a plan PipeDream could have made.
    """
    start = time.perf_counter()
    labels = pipedream_labels(workload)
    nodes = tuple(dataclasses.replace(nd, color_class=int(lab)) for nd, lab in zip(workload.nodes, labels))
    coarse = workload.replace(nodes=nodes)
    inst = dp.build_instance(coarse)
    k, l, memory = workload.num_accelerators, workload.num_cpus, workload.accelerator_memory
    orders = {"file": file_order(inst)}
    orders.update(zip(("dfs", "bfs", "heavy_first"), lattice.topological_orders(inst.preds, inst.succs, inst.acc)))
    best, best_name = None, None
    values = {}
    for name, order in orders.items():
        res = dp.run(inst, lattice.chain(order), k, l, memory, deadline=deadline if best else np.inf)
        if res is None:  # out of time: the orders so far stand
            break
        values[name] = float(res.value) if np.isfinite(res.value) else None
        if best is None or res.value < best.value:
            best, best_name = res, name
    details = {"layers": inst.n, "order": best_name, "order_values": values}
    if not np.isfinite(best.value):
        return Plan("throughput", "pipedream", "infeasible", None, {}, seconds=time.perf_counter() - start,
                    details={**details, "violations": ["no chain split satisfies memory and support"]})
    assignment, stages = dp.plan_assignment(coarse, inst, best.parts)
    plan = finish(workload, "throughput", "pipedream", assignment, start, details=details, stages=stages)
    if lattice.disagrees(best.value, plan.value, inst.n, inst.acc, inst.cpu, inst.h_weight):
        raise SolveError(f"internal error: PipeDream DP value {best.value} but the evaluator scores {plan.value}")
    problems = evaluate.check(workload, assignment, contiguity="ideal_chain")
    if problems:
        raise SolveError("internal error: PipeDream plan is not a pipeline: " + problems[0])
    return plan
