"""latency_dp: a topological order of the blocks cut into consecutive segments, each an
accelerator call or a run on the CPUs, the least time of running them one after another.

:func:`cut_sequence` is the exact DP over (position, accelerator segments used) that cuts
one sequence; it also gives the path bound (:mod:`.bounds`).  Running segments one after
another is one schedule of the plan, so the evaluator's latency is at most the DP's
value.  Write-up: docs/latency.md.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from ... import interrupt
from ...errors import SolveError
from ...plan import Plan
from ...workload import Workload, csr
from .. import anytime
from ..classes import inseparable_blocks
from ..finish import finish
from ..orders import block_orders
from .call_times import reach


def cut_sequence(w: Workload, seq, slots: int, can_cut: np.ndarray | None = None,
                 call_times: np.ndarray | None = None, hull: bool = False):
    """(least total time, segments as (start, end, on_accelerator)) for ``seq`` (node
    indices, in an order every edge among them follows); at most ``slots`` accelerator
    segments, each within one accelerator's memory and of supported nodes.  ``can_cut[i]``:
    a segment may start at position i (default: anywhere).  ``call_times[i, e]``: a least
    time of the call running seq[i:e] known from elsewhere (:mod:`.call_times`), used where it
    is larger.  With ``hull`` (``seq`` a path of the graph), a call holding seq[i:e] holds
    every node between its ends too (calls are convex): their accelerator time, memory and
    support count, found as the segment grows, in O(nodes + edges) per start rather than
    the call cut's minimum cut per segment.  Value inf if none is valid."""
    seq = np.asarray(seq, dtype=np.int64)
    L = len(seq)
    pos = np.full(w.n, -1, dtype=np.int64)
    pos[seq] = np.arange(L)
    preds = [[int(pos[u]) for u in w.predecessors[v] if pos[u] >= 0] for v in seq]
    ptr = np.zeros(L + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(p) for p in preds])
    idx = np.array([p for ps in preds for p in ps], dtype=np.int64)
    if idx.size and np.any(idx >= np.repeat(np.arange(L), np.diff(ptr))):
        raise ValueError("the sequence is not in topological order")
    last_succ = np.full(L, -1, dtype=np.int64)
    for v_pos, ps in enumerate(preds):
        for p in ps:
            last_succ[p] = max(last_succ[p], v_pos)
    if can_cut is None:
        can_cut = np.ones(L, dtype=np.bool_)
    cpu = w.cpu_latency[seq].astype(np.float64) if w.num_cpus else np.full(L, np.inf)  # no CPU: none on it
    if hull:
        succ_ptr, succ_idx = csr(w.successors)
        pred_ptr, pred_idx = csr(w.predecessors)
        graph = (seq, succ_ptr, succ_idx, pred_ptr, pred_idx, w.acc_latency.astype(np.float64),
                 w.size.astype(np.float64), w.supported.astype(np.bool_))
    else:
        none_i, none_f = np.zeros(0, dtype=np.int64), np.zeros(0)
        graph = (none_i, none_i, none_i, none_i, none_i, none_f, none_f, np.zeros(0, dtype=np.bool_))
    f, back_i, back_acc = _cut_kernel(
        w.acc_latency[seq].astype(np.float64), cpu,
        w.out_cost[seq].astype(np.float64), w.size[seq].astype(np.float64), w.supported[seq].astype(np.bool_),
        np.asarray(can_cut, dtype=np.bool_), ptr, idx, last_succ, int(slots),
        np.zeros((1, 1)) if call_times is None else call_times,
        float(w.accelerator_memory) * (1 + 1e-12), hull, *graph)
    j = int(np.argmin(f[L]))
    value = float(f[L, j])
    if not np.isfinite(value):
        return value, []
    segments = []
    e = L
    while e > 0:
        i, acc = int(back_i[e, j]), bool(back_acc[e, j])
        segments.append((i, e, acc))
        e, j = i, j - int(acc)
    return value, segments[::-1]


@njit(cache=True, nogil=True)
def _cut_kernel(acc, cpu, cost, size, sup, can_cut, ptr, idx, last_succ, slots, call_times, mem,
                hull, seq, succ_ptr, succ_idx, pred_ptr, pred_idx, acc_all, size_all, sup_all):
    L = len(acc)
    inf = np.inf
    n = len(acc_all)
    below = np.zeros(n, dtype=np.bool_)  # with hull: the descendants of the segment's first node
    in_hull = np.zeros(n, dtype=np.bool_)
    everywhere = np.ones(n, dtype=np.bool_)
    stack = np.empty(n, dtype=np.int64)
    found = np.empty(n + 1, dtype=np.int64)
    f = np.full((L + 1, slots + 1), inf)
    f[0, 0] = 0.0
    back_i = np.full((L + 1, slots + 1), -1, dtype=np.int64)
    back_acc = np.zeros((L + 1, slots + 1), dtype=np.bool_)
    longest = np.zeros(L)  # CPU: longest path into each node, within the segment
    counted = np.full(L, -1, dtype=np.int64)  # sender already paid for the segment starting at i
    leaving = np.zeros(L + 1)  # cost that stops leaving once the segment reaches a position
    for i in range(L):
        if not can_cut[i] or not np.isfinite(f[i].min()):
            continue
        leaving[:] = 0.0
        incoming = work = used = out = cpu_path = 0.0
        hull_work = hull_used = 0.0
        fits = True
        if hull:
            below[:] = False
            below[seq[i]] = True
            reach(seq[i], succ_ptr, succ_idx, below, everywhere, stack, found)
            in_hull[:] = False
        for e in range(i, L):
            into = 0.0
            for t in range(ptr[e], ptr[e + 1]):
                p = idx[t]
                if p >= i:
                    into = max(into, longest[p])
                elif counted[p] != i:
                    counted[p] = i
                    incoming += cost[p]
            longest[e] = cpu[e] + into
            cpu_path = max(cpu_path, longest[e])
            if fits:
                used += size[e]
                fits = sup[e] and used <= mem
            if fits and hull:  # the hull's new nodes: ancestors of seq[e] below seq[i]
                in_hull[seq[e]] = True
                found[0] = seq[e]
                count = 1 + reach(seq[e], pred_ptr, pred_idx, in_hull, below, stack, found[1:])
                for t in range(count):
                    hull_work += acc_all[found[t]]
                    hull_used += size_all[found[t]]
                    fits = fits and sup_all[found[t]]
                fits = fits and hull_used <= mem
            work += acc[e]
            if last_succ[e] > e:
                out += cost[e]
                leaving[last_succ[e]] += cost[e]
            out -= leaving[e]  # members whose last consumer is e send nothing out any more
            if e + 1 < L and not can_cut[e + 1]:
                continue
            on_acc = incoming + max(work, hull_work) + max(out, 0.0)
            if call_times.shape[0] > 1:
                on_acc = max(on_acc, call_times[i, e + 1])
            for j in range(slots + 1):
                base = f[i, j]
                if base == inf:
                    continue
                if base + cpu_path < f[e + 1, j]:
                    f[e + 1, j] = base + cpu_path
                    back_i[e + 1, j] = i
                    back_acc[e + 1, j] = False
                if fits and j < slots and base + on_acc < f[e + 1, j + 1]:
                    f[e + 1, j + 1] = base + on_acc
                    back_i[e + 1, j + 1] = i
                    back_acc[e + 1, j + 1] = True
    return f, back_i, back_acc


# ---- the lower bound ----------------------------------------------------------------------------

# ---- the plan ----------------------------------------------------------------------------------

def sequence_split(w: Workload, objective: str = "latency", time_limit: float | None = None) -> Plan:
    """Cut a topological order of the inseparable blocks (colour classes together) into
    segments, each accelerator taking at most one: the least latency of running the
    segments one after another.  Scored by the evaluator (which lets independent calls
    overlap, so its latency is at most the DP's).  Past ``time_limit`` no further order is
    tried."""
    start = time.perf_counter()
    if w.is_training:
        raise SolveError("latency_dp splits inference graphs: a training graph's blocks span both passes")
    blocks = inseparable_blocks(w)
    order_pos = np.empty(w.n, dtype=np.int64)
    order_pos[list(w.topological_order)] = np.arange(w.n)
    best = (np.inf, None, None)
    deadline = start + time_limit if time_limit else np.inf
    for block_order in block_orders(blocks, order_pos):
        if best[1] is not None and interrupt.past(deadline):
            break
        seq, can_cut = [], []
        for b in block_order:
            members = sorted(blocks.members[b].tolist(), key=lambda v: order_pos[v])
            seq += members
            can_cut += [True] + [False] * (len(members) - 1)
        value, segments = cut_sequence(w, seq, w.num_accelerators, np.array(can_cut, dtype=np.bool_))
        if value < best[0]:
            best = (value, seq, segments)
            anytime.offer(_placed(w, seq, segments), "latency_dp's best order so far")
    value, seq, segments = best
    assignment = _placed(w, seq, segments) if seq is not None else {}
    if not assignment:
        raise SolveError("latency_dp found no split: the nodes fit neither the accelerators' memory nor a CPU")
    return finish(w, objective, "latency_dp", assignment, start, details={"sequential_latency": value})


def _placed(w: Workload, seq, segments) -> dict[int, str]:
    """Node id -> device for ``segments`` of ``seq``: each accelerator segment on the next
    accelerator, the rest on the first CPU."""
    names = [d.name for d in w.devices]
    assignment: dict[int, str] = {}
    acc = 0
    for i, e, on_acc in segments:
        for v in seq[i:e]:
            assignment[int(w.ids[v])] = names[acc] if on_acc else names[w.num_accelerators]
        acc += on_acc
    return assignment


