"""Single-stream latency of a node sequence cut into consecutive segments.

A sequence of nodes is cut into segments; each runs either as one accelerator call
(incoming tensors, compute, outgoing tensors -- the latency model's call) or on the CPUs
(the longest path through it), one segment after another.  :func:`cut_sequence` finds the
best cut exactly, by a DP over (position, accelerator segments used).  Only edges between
nodes of the sequence count, unless the caller knows more of a segment's call
(``call_times``).  The one DP serves two ends:

* **a lower bound** (:func:`latency_lower_bound`): along any path of the graph, every
  plan's calls meet the path in consecutive segments (calls are convex), one after
  another, and each takes at least the least time of a call holding that segment and no
  other path node (:mod:`callcut`: its compute and every tensor entering or leaving it,
  nodes off the path included, within one accelerator's memory).  So the best cut of a
  path, at most ``k * pieces`` accelerator segments, is below every plan's latency.  It
  sees what the solver's relaxation does not: the memory limit forcing a chain of layers
  apart, and the branches beside the path that a cut must also send tensors to.
* **a plan** (:func:`sequence_split`): cut a whole topological order, each accelerator
  taking one segment.  Running segments one after another is one schedule of the plan,
  so the evaluator's latency is at most the DP's value.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from .. import interrupt
from . import anytime
from ..errors import SolveError
from ..plan import Plan
from ..workload import Workload


def cut_sequence(w: Workload, seq, slots: int, can_cut: np.ndarray | None = None,
                 call_times: np.ndarray | None = None):
    """(least total time, segments as (start, end, on_accelerator)) for ``seq`` (node
    indices, in an order every edge among them follows); at most ``slots`` accelerator
    segments, each within one accelerator's memory and of supported nodes.  ``can_cut[i]``:
    a segment may start at position i (default: anywhere).  ``call_times[i, e]``: a least
    time of the call running seq[i:e] known from elsewhere (:mod:`callcut`), used where it
    is larger.  Value inf if none is valid."""
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
    f, back_i, back_acc = _cut_kernel(
        w.acc_latency[seq].astype(np.float64), cpu,
        w.out_cost[seq].astype(np.float64), w.size[seq].astype(np.float64), w.supported[seq].astype(np.bool_),
        np.asarray(can_cut, dtype=np.bool_), ptr, idx, last_succ, int(slots),
        np.zeros((1, 1)) if call_times is None else call_times,
        float(w.accelerator_memory) * (1 + 1e-12))
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
def _cut_kernel(acc, cpu, cost, size, sup, can_cut, ptr, idx, last_succ, slots, call_times, mem):
    L = len(acc)
    inf = np.inf
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
        fits = True
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
            work += acc[e]
            if last_succ[e] > e:
                out += cost[e]
                leaving[last_succ[e]] += cost[e]
            out -= leaving[e]  # members whose last consumer is e send nothing out any more
            if e + 1 < L and not can_cut[e + 1]:
                continue
            on_acc = incoming + work + max(out, 0.0)
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

def latency_lower_bound(w: Workload, pieces: int = 1, seconds: float = 30.0) -> float:
    """A latency no plan with at most ``pieces`` calls per accelerator beats: the best cut
    of each of a few heavy paths (longest by accelerator time, CPU time, memory, transfer
    cost, and their mixes), the largest of them.  Each accelerator segment costs at least
    the least call that can run it, nodes off the path included (:mod:`callcut`); those
    cuts are computed for the most promising paths first, for at most ``seconds``."""
    from .callcut import segment_call_times

    if w.n == 0:
        return 0.0
    deadline = time.perf_counter() + seconds
    slots = w.num_accelerators * pieces
    scale = lambda a: a / a.max() if a.size and a.max() > 0 else a  # noqa: E731
    weights = [w.acc_latency, w.cpu_latency, w.size, w.out_cost,
               scale(w.acc_latency) + scale(w.size), scale(w.size) + scale(w.out_cost),
               scale(w.acc_latency) + scale(w.size) + scale(w.out_cost)]
    paths = list(dict.fromkeys(tuple(heaviest_path(w, weight)) for weight in weights))
    alone = [cut_sequence(w, path, slots)[0] for path in paths]
    best = max(alone)
    for _, path in sorted(zip(alone, paths), reverse=True):
        if time.perf_counter() > deadline:
            break
        times = segment_call_times(w, path, pieces, deadline)
        best = max(best, cut_sequence(w, path, slots, call_times=times)[0])
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


# ---- the plan ----------------------------------------------------------------------------------

def sequence_split(w: Workload, objective: str = "latency", time_limit: float | None = None) -> Plan:
    """Cut a topological order of the inseparable blocks (colour classes together) into
    segments, each accelerator taking at most one: the least latency of running the
    segments one after another.  Scored by the evaluator (which lets independent calls
    overlap, so its latency is at most the DP's).  Past ``time_limit`` no further order is
    tried."""
    from .baselines import finish, inseparable_blocks

    start = time.perf_counter()
    if w.is_training:
        raise SolveError("latency_dp splits inference graphs: a training graph's blocks span both passes")
    blocks = inseparable_blocks(w)
    order_pos = np.empty(w.n, dtype=np.int64)
    order_pos[list(w.topological_order)] = np.arange(w.n)
    best = (np.inf, None, None)
    deadline = start + time_limit if time_limit else np.inf
    for block_order in _block_orders(blocks, order_pos):
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


RANDOM_ORDERS = 64  # seeded: the same orders on every run


def _block_orders(blocks, order_pos: np.ndarray):
    """Distinct topological orders of the blocks, whose cuts differ: the reference's
    (depth-first-ish), ready blocks taken earliest-first and latest-first, and
    RANDOM_ORDERS random ones (each step continues the newest ready block with probability
    0, 1/2 or 9/10, or takes any ready one); each also with its source blocks moved late
    (:func:`sources_late`).  On Inception-v3 the random ones cut 1312 to 1279: which of a
    module's branches ends up next to the following module decides what one call holds.
    Made one at a time (the caller may stop at its deadline), each distinct order once."""
    import random

    nb, succ = len(blocks.members), blocks.succ
    first = [int(order_pos[m].min()) for m in blocks.members]
    indegree = np.zeros(nb, dtype=np.int64)
    for b in range(nb):
        for t in succ[b]:
            indegree[t] += 1
    seen: set[tuple[int, ...]] = set()

    def fresh(order):
        key = tuple(order)
        if len(key) == nb and key not in seen:
            seen.add(key)
            return True
        return False

    def base():
        yield list(blocks.order)
        for sign in (1, -1):
            yield _kahn(succ, indegree, lambda ready, sign=sign: min(
                range(len(ready)), key=lambda j: (sign * first[ready[j]], ready[j])))
        rng = random.Random(0)
        for i in range(RANDOM_ORDERS if nb > 1 else 0):
            newest = (0.0, 0.5, 0.9)[i % 3]
            yield _kahn(succ, indegree, lambda ready, newest=newest: (
                len(ready) - 1 if rng.random() < newest else rng.randrange(len(ready))))

    made = []
    for order in base():
        made.append(order)
        if fresh(order):
            yield list(order)
    for order in made:
        late = sources_late(order, succ, indegree)
        if fresh(late):
            yield list(late)


def _kahn(succ, indegree: np.ndarray, choose) -> list[int]:
    """A topological order of the blocks: ``choose(ready)`` picks the index of the next one
    among those whose predecessors are all placed."""
    indeg = indegree.copy()
    ready = [b for b in range(len(indeg)) if indeg[b] == 0]
    out = []
    while ready:
        b = ready.pop(choose(ready))
        out.append(b)
        for t in succ[b]:
            indeg[t] -= 1
            if indeg[t] == 0:
                ready.append(t)
    return out


def sources_late(order: list[int], succ, indegree: np.ndarray) -> list[int]:
    """``order`` with every source (a weight, a constant: indegree 0) moved to just before
    its first consumer: an interval of the order then holds a layer with its weights (on a
    ResNet-50 whose weights are ConstantOfShape nodes, latency_dp 8.46 -> 8.31 ms).  Used
    on blocks here and on nodes by :mod:`ring`."""
    at = {b: i for i, b in enumerate(order)}
    before: dict[int, list[int]] = {}
    for b in order:
        if indegree[b] == 0:
            first = min((at[t] for t in succ[b]), default=len(order))
            before.setdefault(first, []).append(b)
    out = []
    for i, b in enumerate(order):
        out += before.get(i, [])
        if indegree[b] != 0:
            out.append(b)
    return out + before.get(len(order), [])
