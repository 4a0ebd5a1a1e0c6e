"""Local search on a latency plan: move one colour class at a time while latency drops.

The latency DP runs its segments one after another, so it cannot see a node cheaper on
the CPUs beside the calls than inside one (op-level BERT's tied embedding class).  Each
colour class is tried on the CPUs, on a neighbour's accelerator and on an unused one;
the first move that lowers the latency is kept, until none does or time runs out.  Plans
have one call per accelerator; a candidate's latency comes from a compiled schedule,
and the result is scored again by :func:`evaluate.latency`.

Write-up: docs/latency.md (ip: Polish).
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from ...workload import Workload, csr
from .. import evaluate
from ..classes import class_members


def polish_latency(w: Workload, assignment: dict[int, str], seconds: float) -> tuple[dict[int, str], float]:
    """(a plan at least as good as ``assignment``, its latency).  ``assignment`` is
    returned unchanged where it is invalid or some accelerator's part is not convex."""
    value = evaluate.latency(w, assignment).value
    k, n = w.num_accelerators, w.n
    if n == 0 or k == 0 or evaluate.check(w, assignment):
        return assignment, value
    dev = evaluate.device_array(w, assignment)
    cpu = k if w.num_cpus > 0 else -1
    dev = np.where(dev >= k, k, dev).astype(np.int64)  # the latency model's CPUs are one pool
    graph = _Graph(w)
    if not graph.convex(dev, k):
        return assignment, value
    deadline = time.perf_counter() + seconds
    classes = [m for m in class_members(w) if len(m)]
    supported = [bool(w.supported[m].all()) for m in classes]
    size = [float(w.size[m].sum()) for m in classes]
    memory = float(w.accelerator_memory) * (1 + 1e-12)
    used = np.array([float(w.size[dev == d].sum()) for d in range(k)])
    count = np.bincount(dev, minlength=k + 1)  # nodes per device (the CPUs: index k)
    best = graph.latency(dev, k)
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for c, members in enumerate(classes):
            if time.perf_counter() >= deadline:
                break
            here = int(dev[members[0]])
            targets = set(int(dev[u]) for v in members for u in w.predecessors[v] + w.successors[v])
            if cpu >= 0:
                targets.add(cpu)
            free = np.flatnonzero(count[:k] == 0)
            if free.size:
                targets.add(int(free[0]))
            targets.discard(here)
            for d in sorted(targets):
                if d < k and (not supported[c] or used[d] + size[c] > memory):
                    continue
                dev[members] = d
                value_d = graph.latency(dev, k) if graph.convex(dev, k, (here, d)) else np.inf
                if value_d < best * (1 - 1e-12):
                    best = value_d
                    if here < k:
                        used[here] -= size[c]
                    if d < k:
                        used[d] += size[c]
                    count[here] -= len(members)
                    count[d] += len(members)
                    here = d
                    improved = True
                    break
                dev[members] = here
    names = [dv.name for dv in w.devices]
    out = {int(w.ids[v]): names[int(dev[v])] for v in range(n)}
    return (out, evaluate.latency(w, out).value) if best < value else (assignment, value)


class _Graph:
    """The workload's arrays in the form the compiled kernels take."""

    def __init__(self, w: Workload):
        self.order = np.asarray(w.topological_order, dtype=np.int64)
        self.pred_ptr, self.pred_idx = csr(w.predecessors)
        self.succ_ptr, self.succ_idx = csr(w.successors)
        self.acc = w.acc_latency.astype(np.float64)
        self.cpu = w.cpu_latency.astype(np.float64)
        self.cost = w.out_cost.astype(np.float64)

    def latency(self, dev: np.ndarray, k: int) -> float:
        return _latency(dev, k, self.order, self.pred_ptr, self.pred_idx, self.succ_ptr, self.succ_idx,
                        self.acc, self.cpu, self.cost)

    def convex(self, dev: np.ndarray, k: int, devices=None) -> bool:
        for d in (range(k) if devices is None else devices):
            if 0 <= d < k and not _convex(dev, d, self.order, self.pred_ptr, self.pred_idx):
                return False
        return True


@njit(cache=True, nogil=True)
def _convex(dev, d, order, pred_ptr, pred_idx) -> bool:
    """No path leaves accelerator d's part and comes back (its nodes make one call)."""
    n = len(dev)
    state = np.zeros(n, dtype=np.int8)  # 1: in the part, 2: reached from the part outside it
    for v in order:
        left = False
        for t in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[t]
            if state[u] == 2 or (state[u] == 1 and dev[v] != d):
                left = True
        if dev[v] == d:
            if left:
                return False
            state[v] = 1
        elif left:
            state[v] = 2
    return True


@njit(cache=True, nogil=True)
def _latency(dev, k, order, pred_ptr, pred_idx, succ_ptr, succ_idx, acc, cpu, cost) -> float:
    """The latency model with one call per accelerator (CPU nodes each on their own, in
    parallel): a call starts when every tensor it receives is ready, then receives,
    computes and sends.  inf if the calls wait on each other in a cycle."""
    n = len(dev)
    units = n + k  # CPU node v is unit v; accelerator d's call is unit n + d
    unit = np.empty(n, dtype=np.int64)
    for v in range(n):
        unit[v] = n + dev[v] if dev[v] < k else v
    # the members of each unit, together (a sender is paid once per call)
    start_of = np.zeros(units + 1, dtype=np.int64)
    for v in range(n):
        start_of[unit[v] + 1] += 1
    for x in range(units):
        start_of[x + 1] += start_of[x]
    fill = start_of[:-1].copy()
    members = np.empty(n, dtype=np.int64)
    for v in order:
        members[fill[unit[v]]] = v
        fill[unit[v]] += 1
    indeg = np.zeros(units, dtype=np.int64)
    duration = np.zeros(units)
    seen = np.full(n, -1, dtype=np.int64)  # sender already paid by this call
    for x in range(units):
        for j in range(start_of[x], start_of[x + 1]):
            v = members[j]
            if x >= n:
                duration[x] += acc[v]
                for t in range(succ_ptr[v], succ_ptr[v + 1]):
                    if unit[succ_idx[t]] != x:
                        duration[x] += cost[v]
                        break
                for t in range(pred_ptr[v], pred_ptr[v + 1]):
                    u = pred_idx[t]
                    if unit[u] != x and seen[u] != x:
                        seen[u] = x
                        duration[x] += cost[u]
            else:
                duration[x] = cpu[v]
            for t in range(pred_ptr[v], pred_ptr[v + 1]):
                if unit[pred_idx[t]] != x:
                    indeg[x] += 1
    ready = np.zeros(units)
    finish = np.zeros(units)
    stack = np.empty(units, dtype=np.int64)
    top = 0
    for x in range(units):
        if start_of[x + 1] > start_of[x] and indeg[x] == 0:
            stack[top] = x
            top += 1
    done = 0
    latest = 0.0
    while top > 0:
        top -= 1
        x = stack[top]
        finish[x] = ready[x] + duration[x]
        latest = max(latest, finish[x])
        done += 1
        for j in range(start_of[x], start_of[x + 1]):
            v = members[j]
            for t in range(succ_ptr[v], succ_ptr[v + 1]):
                y = unit[succ_idx[t]]
                if y != x:
                    ready[y] = max(ready[y], finish[x])
                    indeg[y] -= 1
                    if indeg[y] == 0:
                        stack[top] = y
                        top += 1
    expected = 0
    for x in range(units):
        if start_of[x + 1] > start_of[x]:
            expected += 1
    return latest if done == expected else np.inf
