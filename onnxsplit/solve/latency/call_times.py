"""The call cut: the least time of an accelerator call that runs a given segment of a path.

A call meets a path in a segment (calls are convex); whatever else it holds, its time is
at least that of the least node set holding the segment and its hull, within one
accelerator's memory, of supported nodes.  Without the memory limit that least is a
minimum cut (a node pays its accelerator time, a tensor the cut separates its cost once);
memory is priced in by a Lagrangian whose multiplier Kelley's cutting planes choose.
Dropping convexity beyond the hull only lowers the value: it stays a bound.  What
:func:`segment_call_times` adds to the path bound (:func:`.bounds.latency_lower_bound`):
off the path, branches cost a call transfers or memory the path alone does not see.

Write-up: docs/latency.md (Path bound: The call cut in detail).
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from ...workload import Workload, csr

BIG = 1e18  # an arc no finite cut crosses


def segment_call_times(w: Workload, seq, pieces: int = 1, deadline: float | None = None) -> np.ndarray:
    """times[i, e]: a lower bound on the time of any accelerator call whose nodes on the
    path ``seq`` (node indices, in path order) are exactly seq[i:e]; inf where no call can
    hold them (memory or support, of the segment and every node between its ends, or a
    colour class that would need a path node outside).  Past ``deadline`` (a
    time.perf_counter() value) the entries not reached stay 0: no claim.  Each entry is a
    minimum cut of the whole graph's network: the cuts run in batches sized by the time
    the last ones took, so that a long path on a large graph stops near its deadline."""
    seq = np.asarray(seq, dtype=np.int64)
    net = _network(w, pieces)
    succ_ptr, succ_idx = csr(w.successors)
    pred_ptr, pred_idx = csr(w.predecessors)
    on_path = np.zeros(w.n, dtype=np.bool_)
    on_path[seq] = True
    out = np.zeros((len(seq) + 1, len(seq) + 1))
    i, e, budget, per_cut = 0, 0, FIRST_BATCH, None
    while i < len(seq):
        began = time.perf_counter()
        if deadline is not None:
            if began > deadline:
                break
            if per_cut is not None:
                budget = max(1, int((deadline - began) / per_cut / 2))
        i, e, cuts = _least_call_times(out, i, e, len(seq), budget, seq, on_path, w.acc_latency.astype(np.float64),
                                    w.size.astype(np.float64), w.supported.astype(np.bool_),
                                    float(w.accelerator_memory) * (1 + 1e-12), succ_ptr, succ_idx, pred_ptr,
                                    pred_idx, *net)
        if cuts:
            per_cut = (time.perf_counter() - began) / cuts
    return out


FIRST_BATCH = 16  # cuts, before their time is known


def _network(w: Workload, pieces: int = 1):
    """Arcs of the cut network (forward arc 2j, its reverse 2j+1), as arrays; with one
    call per accelerator, a colour class is one call's or none's."""
    one_call_per_device = pieces == 1
    n = w.n
    tensors = np.unique(w.edge_src)
    nv = n + 2 * len(tensors) + 2
    src, snk = nv - 2, nv - 1
    tails: list[int] = []
    heads: list[int] = []
    caps: list[float] = []

    def arc(a: int, b: int, c: float) -> int:
        tails.append(a)
        heads.append(b)
        caps.append(c)
        return len(tails) - 1

    node_arc = np.array([arc(v, snk, 0.0) for v in range(n)], dtype=np.int64)
    source_arc = np.array([arc(src, v, 0.0) for v in range(n)], dtype=np.int64)
    member_ptr = [0]
    members: list[int] = []
    for j, u in enumerate(tensors.tolist()):
        a, b = n + 2 * j, n + 2 * j + 1
        group = [u, *w.successors[u]]
        for m in group:
            arc(m, a, BIG)
            arc(b, m, BIG)
        arc(a, b, float(w.out_cost[u]))
        members += group
        member_ptr.append(len(members))
    if one_call_per_device:
        first: dict[int, int] = {}
        for v in range(n):
            c = int(w.color_class[v])
            if c in first:
                arc(first[c], v, BIG)
                arc(v, first[c], BIG)
            else:
                first[c] = v
    m = len(tails)
    to = np.empty(2 * m, dtype=np.int64)
    cap = np.zeros(2 * m)
    to[0::2], to[1::2] = heads, tails
    cap[0::2] = caps
    head = np.full(nv, -1, dtype=np.int64)
    nxt = np.empty(2 * m, dtype=np.int64)
    for a in range(2 * m):  # adjacency lists: arc a leaves the head of its reverse
        tail = to[a ^ 1]
        nxt[a] = head[tail]
        head[tail] = a
    return (head, nxt, to, cap, 2 * node_arc, 2 * source_arc, src, snk,
            np.asarray(tensors, dtype=np.int64), np.array(member_ptr, dtype=np.int64),
            np.array(members, dtype=np.int64), w.out_cost.astype(np.float64))


@njit(cache=True, nogil=True)
def _least_call_times(out, i_from, e_from, i_to, budget, seq, on_path, acc, size, sup, mem, succ_ptr, succ_idx, pred_ptr,
                      pred_idx, head, nxt, to, base_cap, node_arc, source_arc, src, snk, tensors, member_ptr,
                      members, cost):
    """Fill rows i_from..i_to-1 of ``out`` (row i_from from column e_from) with at most
    ``budget`` cuts: (the row and column to go on from, the cuts made).  A call holding
    seq[i] and seq[e-1] holds every node between them (calls are convex): the hull,
    desc(seq[i]) ∩ anc(seq[e-1]), grows with e, and is tied into the call."""
    L = len(seq)
    n = len(acc)
    nv = len(head)
    work = (base_cap.copy(), np.empty(nv, dtype=np.int64), np.empty(nv, dtype=np.int64),
            np.empty(nv, dtype=np.int64), np.empty(nv + 1, dtype=np.int64), np.zeros(nv, dtype=np.bool_))
    graph = (head, nxt, to, base_cap, node_arc, source_arc, src, snk, tensors, member_ptr, members, cost)
    in_seg = np.zeros(n, dtype=np.bool_)
    below = np.zeros(n, dtype=np.bool_)  # descendants of seq[i], itself included
    everywhere = np.ones(n, dtype=np.bool_)
    stack = np.empty(n, dtype=np.int64)
    found = np.empty(n, dtype=np.int64)
    smallest = np.inf
    for v in range(n):
        if size[v] > 0 and size[v] < smallest:
            smallest = size[v]
    # above this price of memory no node with a size is worth taking in
    lam_top = (acc.sum() + cost.sum() + 1.0) / smallest if np.isfinite(smallest) else 0.0
    cuts = 0
    for i in range(i_from, i_to):
        below[:] = False
        below[seq[i]] = True
        reach(seq[i], succ_ptr, succ_idx, below, everywhere, stack, found)
        in_seg[:] = False
        used = 0.0
        fits = True
        for e in range(i + 1, L + 1):
            # the hull's new nodes: ancestors of seq[e-1] below seq[i] not yet in it (an
            # ancestor of a hull node below seq[i] is in the hull already)
            in_seg[seq[e - 1]] = True
            found[0] = seq[e - 1]
            count = 1 + reach(seq[e - 1], pred_ptr, pred_idx, in_seg, below, stack, found[1:])
            for j in range(count):
                used += size[found[j]]
                fits = fits and sup[found[j]]
            if used > mem or not fits:
                out[i, e:] = np.inf  # and every longer segment: its hull holds this one
                break
            if i == i_from and e < e_from:
                continue  # filled by the last batch
            if cuts == budget:  # this row's later entries stay 0: no claim
                return i, e, cuts
            out[i, e] = _least_call(lam_top, on_path, in_seg, acc, size, sup, mem, graph, work)
            cuts += 1
    return i_to, 0, cuts


@njit(cache=True, nogil=True)
def reach(root, ptr, idx, mark, allowed, stack, found) -> int:
    """Mark what ``root`` reaches along the CSR arcs through allowed, unmarked nodes; the
    newly marked nodes go to found[:count], and count is returned."""
    stack[0] = root
    top = 1
    count = 0
    while top > 0:
        top -= 1
        v = stack[top]
        for a in range(ptr[v], ptr[v + 1]):
            u = idx[a]
            if allowed[u] and not mark[u]:
                mark[u] = True
                found[count] = u
                count += 1
                stack[top] = u
                top += 1
    return count


@njit(cache=True, nogil=True)
def _least_call(lam_top, on_path, in_seg, acc, size, sup, mem, graph, work):
    """The Lagrangian bound on the least call holding exactly ``in_seg`` of the path."""
    g0, s0 = _dual(0.0, on_path, in_seg, acc, size, sup, mem, graph, work)
    if s0 <= 0.0 or not np.isfinite(g0):  # the least call fits (or none can hold the segment)
        return g0
    g1, s1 = _dual(lam_top, on_path, in_seg, acc, size, sup, mem, graph, work)
    if s1 > 0.0 or not np.isfinite(g1):  # even the least call is over memory
        return np.inf
    best = max(g0, g1)
    lo, g_lo, s_lo = 0.0, g0, s0
    hi, g_hi, s_hi = lam_top, g1, s1
    for _ in range(40):
        lam = (g_hi - g_lo + s_lo * lo - s_hi * hi) / (s_lo - s_hi)
        if not (lo < lam < hi):
            break
        predicted = g_lo + s_lo * (lam - lo)
        g, s = _dual(lam, on_path, in_seg, acc, size, sup, mem, graph, work)
        best = max(best, g)
        if g >= predicted - 1e-9 * (1.0 + abs(predicted)):
            break  # the two planes meet on the dual: its maximum
        if s > 0.0:
            lo, g_lo, s_lo = lam, g, s
        else:
            hi, g_hi, s_hi = lam, g, s
    return best


@njit(cache=True, nogil=True)
def _dual(lam, on_path, in_seg, acc, size, sup, mem, graph, work):
    """(min_C time(C) + lam (size(C) - mem), size(C) - mem) for the minimising C; (inf, 0)
    when every C needs a node it may not hold."""
    head, nxt, to, base_cap, node_arc, source_arc, src, snk, tensors, member_ptr, members, cost = graph
    cap, level, cur, queue, stack, side = work
    n = len(acc)
    cap[:] = base_cap
    for v in range(n):
        if (on_path[v] and not in_seg[v]) or not sup[v]:
            cap[node_arc[v]] = BIG
        else:
            cap[node_arc[v]] = acc[v] + lam * size[v]
        cap[source_arc[v]] = BIG if in_seg[v] else 0.0
    flow = _max_flow(src, snk, head, nxt, to, cap, level, cur, queue, stack)
    if flow >= BIG * 0.5:
        return np.inf, 0.0
    # the source side of a minimum cut: what the residual graph reaches from the source
    side[:] = False
    side[src] = True
    queue[0] = src
    qh, qt = 0, 1
    while qh < qt:
        x = queue[qh]
        qh += 1
        a = head[x]
        while a >= 0:
            y = to[a]
            if cap[a] > 1e-12 and not side[y]:
                side[y] = True
                queue[qt] = y
                qt += 1
            a = nxt[a]
    # C's time and size summed directly (flow - lam * mem would cancel where lam is large);
    # the flow's value, a feasible flow's, is never above the least cut: the smaller of
    # the two stays a bound even where the flow stopped a rounding error short
    time = 0.0
    used = 0.0
    for v in range(n):
        if side[v]:
            time += acc[v]
            used += size[v]
    for j in range(len(tensors)):
        inside = side[tensors[j]]
        for t in range(member_ptr[j] + 1, member_ptr[j + 1]):
            if side[members[t]] != inside:
                time += cost[tensors[j]]
                break
    return min(time + lam * (used - mem), flow - lam * mem), used - mem


@njit(cache=True, nogil=True)
def _max_flow(src, snk, head, nxt, to, cap, level, cur, queue, stack):
    """Dinic's algorithm on the residual capacities ``cap`` (changed in place)."""
    flow = 0.0
    nv = len(head)
    while True:
        level[:] = -1
        level[src] = 0
        queue[0] = src
        qh, qt = 0, 1
        while qh < qt:
            x = queue[qh]
            qh += 1
            if level[snk] >= 0 and level[x] >= level[snk]:
                break
            a = head[x]
            while a >= 0:
                y = to[a]
                if cap[a] > 1e-12 and level[y] < 0:
                    level[y] = level[x] + 1
                    queue[qt] = y
                    qt += 1
                a = nxt[a]
        if level[snk] < 0:
            return flow
        for x in range(nv):
            cur[x] = head[x]
        while True:  # blocking flow: augment along level paths until none is left
            depth = 0
            x = src
            while x != snk:
                a = cur[x]
                while a >= 0 and not (cap[a] > 1e-12 and level[to[a]] == level[x] + 1):
                    a = nxt[a]
                cur[x] = a
                if a >= 0:
                    stack[depth] = a
                    depth += 1
                    x = to[a]
                elif depth == 0:
                    break
                else:  # dead end: never enter x again in this phase
                    level[x] = -1
                    depth -= 1
                    x = to[stack[depth] ^ 1]
                    cur[x] = nxt[cur[x]]
            if x != snk:
                break
            push = BIG
            for d in range(depth):
                if cap[stack[d]] < push:
                    push = cap[stack[d]]
            for d in range(depth):
                cap[stack[d]] -= push
                cap[stack[d] ^ 1] += push
            flow += push
