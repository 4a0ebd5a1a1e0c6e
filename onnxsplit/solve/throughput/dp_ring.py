"""``dp_ring``: max-load splits of one order of the colour classes bent into a ring.

Three orders are cut, the best kept: a topological one, and the classes' two spectral
orders (:func:`..orders.spectral_ranks`), which keep a training graph's layers whole: along
a line, and around a ring.  A segment
split of one order serves tied weights badly: op-level BERT's embedding class
(table, Gather, Transpose) is used first and last, so the first device sends the
transposed table to the last.  A ring split gives one accelerator a prefix *and* a
suffix of the order and cuts the middle into segments on the other devices, exactly (a
DP over the end of each segment, for each start of the middle).  Loads are the
evaluator's; memory and accelerator support are respected.  Also a warm start of the
throughput IP.

Write-up: docs/throughput.md (dp_ring).
"""

from __future__ import annotations

import dataclasses
import time
import weakref

import numpy as np
from numba import njit

from ...plan import Plan
from ...workload import Workload
from ..classes import build_classes
from ..finish import finish
from ..orders import sources_late, spectral_ranks

STARTS = 48  # candidate starts of the middle, at most (the first few, then evenly spread)
MOST_CLASSES = 2500  # beyond, no ring split: its table of segment boundaries grows as the square
_last: tuple = (None, [])  # (the workload last split, weakly; its splits): the IP asks twice


def ring_split(w: Workload) -> Plan | None:
    """The best ring split of the classes' order (None where no plan fits -- no
    accelerator, or memory -- or the graph has more than MOST_CLASSES classes)."""
    begun = time.perf_counter()
    splits = ring_splits(w)
    if not splits:
        return None
    value, name, i, j, assignment = splits[0]
    return finish(w, "throughput", "dp_ring", assignment, begun,
                  details={"ring_value": value, "middle": [i, j], "order": name})


def ring_splits(w: Workload) -> list[tuple[float, str, int, int, dict[int, str]]]:
    """Each order's best ring split, the least max load first: (its max load, the order's
    name, where the middle starts and ends, the assignment); empty where none fits.

    The throughput IP's pairs start from one of them where it is nearly as good as the
    best start and better balanced (:meth:`.ip._Search.balanced_start`), after its warm
    start asked for the best: the last workload's splits are kept (3.3 s on op-level
    BERT-48)."""
    global _last
    if _last[0] is None or _last[0]() is not w:
        _last = (weakref.ref(w), _ring_splits(w))
    return [(value, name, i, j, dict(assignment)) for value, name, i, j, assignment in _last[1]]


def _ring_splits(w: Workload) -> list[tuple[float, str, int, int, dict[int, str]]]:
    k, l = w.num_accelerators, w.num_cpus
    if w.n == 0 or k == 0:
        return []
    cl = build_classes(w)
    n = cl.n
    if n > MOST_CLASSES:
        return []
    memory = float(w.accelerator_memory) * (1 + 1e-12)
    starts = np.unique(np.concatenate([np.arange(min(n, 8)), np.linspace(0, n, STARTS - 8).astype(np.int64)]))
    out = []
    ranks = {"topological": _late_source_rank(w, cl), **spectral_ranks(n, *cl.hyper_arrays())}
    for name, rank in ranks.items():
        ordered, tables = order_tables(cl, rank)
        value, i, j = _best_ring(*tables, starts[starts < n], k, l, memory)
        if not np.isfinite(value):
            continue
        devices = np.zeros(n, dtype=np.int64)  # the ring part: accelerator 0
        next_acc, next_cpu = 1, k
        for a, b, on_acc in _middle(*tables, i, j, k, l, memory):
            if on_acc:
                devices[a:b], next_acc = next_acc, next_acc + 1
            else:
                devices[a:b], next_cpu = next_cpu, next_cpu + 1
        out.append((float(value), name, int(i), int(j), ordered.assignment(w, devices)))
    return sorted(out, key=lambda split: split[0])


def order_tables(cl, rank: np.ndarray):
    """(``cl`` renumbered by ``rank``, its tables along that order: running totals of the
    accelerator work, CPU time, memory and unsupported classes -- a segment's are
    differences of two -- and the boundary table of every segment)."""
    ordered = _reordered(cl, rank)
    _, ptr, members, weight = ordered.hyper_arrays()
    tables = tuple(np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
                   for values in (ordered.acc_fwd + ordered.acc_bwd, ordered.cpu_fwd + ordered.cpu_bwd,
                                  ordered.size, ~ordered.supported))
    return ordered, tables + (_boundary_table(cl.n, ptr, members, weight),)


def _late_source_rank(w: Workload, cl) -> np.ndarray:
    """class -> its place in an order where every node without inputs (a weight, a
    constant) comes just before its first consumer (:func:`..orders.sources_late`)
    instead of at the front: a topological order puts them all first, where a segment
    would send them far."""
    indegree = np.array([len(p) for p in w.predecessors], dtype=np.int64)
    order = sources_late(list(w.topological_order), w.successors, indegree)
    first = np.full(cl.n, w.n)
    for i, v in enumerate(order):
        first[cl.of_node[v]] = min(first[cl.of_node[v]], i)
    return np.argsort(np.argsort(first, kind="stable"), kind="stable")


def _reordered(cl, rank: np.ndarray):
    """``cl`` with class g renumbered rank[g]."""
    inverse = np.argsort(rank)
    return dataclasses.replace(
        cl, of_node=rank[cl.of_node], acc_fwd=cl.acc_fwd[inverse], acc_bwd=cl.acc_bwd[inverse],
        cpu_fwd=cl.cpu_fwd[inverse], cpu_bwd=cl.cpu_bwd[inverse], size=cl.size[inverse],
        supported=cl.supported[inverse],
        hyper=[(int(rank[src]), tuple(int(rank[g]) for g in m), wt, b) for src, m, wt, b in cl.hyper])


@njit(cache=True, nogil=True)
def _boundary_table(n, ptr, members, weight):
    """comm[a, b]: the tensors crossing the boundary of classes a..b-1 (each once)."""
    incident_ptr = np.zeros(n + 1, dtype=np.int64)
    for t in range(len(members)):
        incident_ptr[members[t] + 1] += 1
    for g in range(n):
        incident_ptr[g + 1] += incident_ptr[g]
    incident = np.empty(len(members), dtype=np.int64)
    fill = incident_ptr[:-1].copy()
    for h in range(len(weight)):
        for t in range(ptr[h], ptr[h + 1]):
            g = members[t]
            incident[fill[g]] = h
            fill[g] += 1
    comm = np.zeros((n + 1, n + 1))
    inside = np.zeros(len(weight), dtype=np.int64)
    for a in range(n):
        inside[:] = 0
        running = 0.0
        for b in range(a, n):
            for t in range(incident_ptr[b], incident_ptr[b + 1]):
                h = incident[t]
                size = ptr[h + 1] - ptr[h]
                if inside[h] == 0 and size > 1:
                    running += weight[h]
                inside[h] += 1
                if inside[h] == size:
                    running -= weight[h]
            comm[a, b + 1] = running
    return comm


@njit(cache=True, nogil=True)
def _middle_dp(acc_pre, cpu_pre, mem_pre, uns_pre, comm, i, k, l, memory):
    """f[j, m, c]: the least max load splitting classes i..j-1 into m accelerator and c
    CPU segments; choice[j, m, c]: where the last segment starts (negative: a CPU one)."""
    n = len(acc_pre) - 1
    f = np.full((n + 1, k, l + 1), np.inf)
    choice = np.zeros((n + 1, k, l + 1), dtype=np.int64)
    f[i, 0, 0] = 0.0
    for j in range(i + 1, n + 1):
        for p in range(i, j):
            on_acc = np.inf
            if mem_pre[j] - mem_pre[p] <= memory and uns_pre[j] == uns_pre[p]:
                on_acc = acc_pre[j] - acc_pre[p] + comm[p, j]
            on_cpu = cpu_pre[j] - cpu_pre[p]
            for m in range(k):
                for c in range(l + 1):
                    before = f[p, m, c]
                    if before == np.inf:
                        continue
                    if m + 1 < k and max(before, on_acc) < f[j, m + 1, c]:
                        f[j, m + 1, c] = max(before, on_acc)
                        choice[j, m + 1, c] = p
                    if c + 1 <= l and max(before, on_cpu) < f[j, m, c + 1]:
                        f[j, m, c + 1] = max(before, on_cpu)
                        choice[j, m, c + 1] = -1 - p
    return f, choice


@njit(cache=True, nogil=True)
def _best_ring(acc_pre, cpu_pre, mem_pre, uns_pre, comm, starts, k, l, memory):
    """(least max load, i, j): the ring part holds classes ..i-1 and j.., the middle i..j-1."""
    n = len(acc_pre) - 1
    best, best_i, best_j = np.inf, -1, -1
    for i in starts:
        f, _ = _middle_dp(acc_pre, cpu_pre, mem_pre, uns_pre, comm, i, k, l, memory)
        for j in range(i, n + 1):
            middle = np.inf
            for m in range(k):
                for c in range(l + 1):
                    middle = min(middle, f[j, m, c])
            if middle >= best:
                continue
            ring_mem = mem_pre[i] + mem_pre[n] - mem_pre[j]
            ring_uns = uns_pre[i] + uns_pre[n] - uns_pre[j]
            if ring_mem > memory or ring_uns > 0:
                continue
            ring = acc_pre[i] + acc_pre[n] - acc_pre[j] + comm[i, j]
            if max(ring, middle) < best:
                best, best_i, best_j = max(ring, middle), i, j
    return best, best_i, best_j


def _middle(acc_pre, cpu_pre, mem_pre, uns_pre, comm, i, j, k, l, memory) -> list[tuple[int, int, bool]]:
    """The best middle split's segments (start, end, on an accelerator)."""
    f, choice = _middle_dp(acc_pre, cpu_pre, mem_pre, uns_pre, comm, i, k, l, memory)
    m, c = np.unravel_index(int(np.argmin(f[j])), f[j].shape)
    out = []
    while j > i:
        p = int(choice[j, m, c])
        if p >= 0:
            out.append((p, j, True))
            m -= 1
        else:
            p = -1 - p
            out.append((p, j, False))
            c -= 1
        j = p
    return out[::-1]
