"""The set-covering certificate's exact pricing: the accelerator set of greatest worth at
given prices with load at most T, by a DP along an order of the classes whose state is
the frontier's tensors (all members so far in the set, all out, or split and paid).

The pricing MIP's relaxation cannot see cuts (its crossing variables vanish at fractional
sets), so on op-level BERT-24 training it never proved that no set was worth the
certificate's threshold; local search missed sets worth 1.43 where it found none above
1.  Along the spectral line a 24-layer training graph has at most 15 tensors open at any
point, so the DP is exact in seconds.  Labels are kept Pareto-best in (load, worth) per
frontier state, and dropped where even the best completion cannot reach the threshold:
completion bounds come from the same DP run backwards for a few prices of load
(Lagrangian: the budget relaxed, cuts exact).  Tensors beyond the state's 31 slots, and
memory, are left out: the DP then bounds more sets than exist, so what it proves holds and
what it finds is checked before it is used.

Write-up: docs/throughput.md (The set-covering certificate, in detail).
"""

from __future__ import annotations

import heapq
import threading
import time

import numpy as np
from numba import njit

SLOTS = 31  # tensors open at once that the state tracks (2 bits each in an int64)
LABELS_MOST = 32_000_000  # labels kept over the whole order (5 bytes each for the way back: 160 MB)
CODES_MOST = 1_000_000  # frontier states over the whole order, for the completion bounds (56 bytes each)
LAM_SCALES = (0.5, 0.8, 1.0, 1.25, 1.6, 2.0, 3.0)  # prices of load, in units of threshold / T
CLASSES_MOST = 2500  # beyond, no DP: its knapsack bounds take n^2 / 2 pairs
FOUND, NONE, STOPPED = "found", "none", "stopped"


class FrontierPricing:
    """The DP over one order of ``sets`` (a :class:`.bound_setcover._Sets`): the spectral
    line or ring, or the topological order, whichever keeps fewer tensors open."""

    def __init__(self, sets):
        self.sets = sets
        orders = [np.arange(sets.n)] + [np.argsort(rank) for rank in sets.spectral.values()]
        built = [_events(sets, order) for order in orders]
        self.order, self.events, self.width = min(built, key=lambda b: b[2])
        # the frontier states after each position: the same at every price and load
        self.states_ptr, self.states, self.bounded = _reachable(self.order, sets.supported, *self.events, CODES_MOST)

    def find(self, pi: np.ndarray, T: float, threshold: float, seconds: float, stop: threading.Event,
             many: int = 20):
        """(FOUND and up to ``many`` sets worth at least ``threshold``, best first, each
        within T and memory; NONE: proven that no set is worth ``threshold``; STOPPED: out
        of time or labels, or only sets that the left-out tensors or memory rule out)."""
        deadline = time.perf_counter() + seconds
        sets, order = self.sets, self.order
        sup, work = sets.supported, sets.work
        ptrs, cw, cv = _suffix_knapsack(order, sup, work, pi)
        lams = np.array([s * threshold / T for s in LAM_SCALES], dtype=np.float64)
        hptr, hflat = self.states_ptr, self.states
        if self.bounded:
            H = _completion(order, sup, work, pi, lams, hptr, hflat, *self.events)
        else:
            lams, H = lams[:0], np.zeros((0, 0))
        codes, loads, vals = np.zeros(1, dtype=np.int64), np.zeros(1), np.zeros(1)
        way, kept = [], 1
        for p in range(len(order)):
            if stop.is_set() or time.perf_counter() > deadline:
                return STOPPED, []
            codes, loads, vals, parent, took = _step(p, order[p], codes, loads, vals, sup, work, pi, *self.events,
                                                     T, threshold, ptrs, cw, cv, H, hptr, hflat, lams)
            way.append((parent, took))
            kept += len(codes)
            if not len(codes):
                return NONE, []
            if kept > LABELS_MOST:
                return STOPPED, []
        found = []
        for i in np.argsort(-vals, kind="stable")[:many]:
            S = _way_back(order, way, int(i))
            if sets.fits(S, T):
                found.append(S)
        return (FOUND, found) if found else (STOPPED, [])


def _way_back(order, way, i: int) -> np.ndarray:
    members = []
    for p in range(len(order) - 1, -1, -1):
        parent, took = way[p]
        if took[i]:
            members.append(order[p])
        i = parent[i]
    return np.array(sorted(members), dtype=np.int64)


def _events(sets, order: np.ndarray):
    """(order, the events at each position as arrays, most tensors open at once): a tensor is
    open from its first member in the order to its last; each gets a slot of the state
    while open, and one that finds none is left out (its crossings unpaid: a relaxation)."""
    n = sets.n
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    ptr, members, weight = sets.h_ptr, sets.h_members, sets.weight
    spans = []
    for h in range(len(weight)):
        at = np.unique(pos[members[ptr[h]:ptr[h + 1]]])
        if len(at) >= 2 and weight[h] > 0:
            spans.append((int(at[0]), int(at[-1]), h, at))
    spans.sort(key=lambda s: s[0])
    free, ends, most = list(range(SLOTS)), [], 0
    per_position: list[list[tuple[int, int, bool, bool]]] = [[] for _ in range(n)]
    for first, last, h, at in spans:
        while ends and ends[0][0] < first:
            free.append(heapq.heappop(ends)[1])
        if not free:
            continue
        slot = free.pop()
        heapq.heappush(ends, (last, slot))
        most = max(most, len(ends))
        for p in at:
            per_position[p].append((h, slot, p == first, p == last))
    ptr_e = np.zeros(n + 1, dtype=np.int64)
    ptr_e[1:] = np.cumsum([len(e) for e in per_position])
    flat = [e for es in per_position for e in es]
    events = (ptr_e, np.array([weight[h] for h, _, _, _ in flat], dtype=np.float64),
              np.array([s for _, s, _, _ in flat], dtype=np.int64),
              np.array([f for _, _, f, _ in flat], dtype=np.bool_),
              np.array([l for _, _, _, l in flat], dtype=np.bool_))
    return order.astype(np.int64), events, most


@njit(cache=True, nogil=True)
def _advance(code, x, p, ev_ptr, ev_w, ev_slot, ev_first, ev_last):
    """(the state after position p's class goes in (x = 1) or out, the crossings it pays)."""
    cost = 0.0
    for e in range(ev_ptr[p], ev_ptr[p + 1]):
        shift = 2 * ev_slot[e]
        if ev_first[e]:
            cur = x
        else:
            cur = (code >> shift) & 3
            if cur != 2 and cur != x:
                cost += ev_w[e]
                cur = 2
        code &= ~(np.int64(3) << shift)
        if not ev_last[e]:
            code |= np.int64(cur) << shift
    return code, cost


@njit(cache=True, nogil=True)
def _suffix_knapsack(order, sup, work, pi):
    """Per position: the later priced classes by worth per work, cumulated (the fractional
    knapsack bound on what a completion can add, cuts ignored)."""
    n = len(order)
    ptrs = np.zeros(n + 1, dtype=np.int64)
    count = 0
    for p in range(n):
        for q in range(p + 1, n):
            if sup[order[q]] and pi[order[q]] > 0:
                count += 1
        ptrs[p + 1] = count
    cw, cv = np.zeros(count), np.zeros(count)
    for p in range(n):
        m = ptrs[p + 1] - ptrs[p]
        if m == 0:
            continue
        items = np.empty(m, dtype=np.int64)
        ratio = np.empty(m)
        j = 0
        for q in range(p + 1, n):
            g = order[q]
            if sup[g] and pi[g] > 0:
                items[j] = g
                ratio[j] = pi[g] / work[g] if work[g] > 0 else 1e300
                j += 1
        a, b = 0.0, 0.0
        for j, t in enumerate(np.argsort(-ratio)):
            a += work[items[t]]
            b += pi[items[t]]
            cw[ptrs[p] + j] = a
            cv[ptrs[p] + j] = b
    return ptrs, cw, cv


@njit(cache=True, nogil=True)
def _knapsack_bound(p, budget, ptrs, cw, cv):
    lo, hi = ptrs[p], ptrs[p + 1]
    j = lo + np.searchsorted(cw[lo:hi], budget, side="right")  # the first item that no longer fits whole
    base = cv[j - 1] if j > lo else 0.0
    if j == hi:
        return base
    used = cw[j - 1] if j > lo else 0.0
    return base + (cv[j] - base) * (budget - used) / (cw[j] - used)


@njit(cache=True, nogil=True)
def _reachable(order, sup, ev_ptr, ev_w, ev_slot, ev_first, ev_last, most):
    """The states after each position (sorted, flattened with a pointer); False if over ``most``."""
    n = len(order)
    ptr = np.zeros(n + 1, dtype=np.int64)
    cur = np.zeros(1, dtype=np.int64)
    chunks = []
    for p in range(n):
        nxt = np.empty(2 * len(cur), dtype=np.int64)
        c = 0
        for i in range(len(cur)):
            for x in range(2):
                if x == 1 and not sup[order[p]]:
                    continue
                nxt[c] = _advance(cur[i], x, p, ev_ptr, ev_w, ev_slot, ev_first, ev_last)[0]
                c += 1
        cur = np.unique(nxt[:c])
        ptr[p + 1] = ptr[p] + len(cur)
        if ptr[p + 1] > most:
            return ptr, np.zeros(0, dtype=np.int64), False
        chunks.append(cur)
    flat = np.empty(ptr[n], dtype=np.int64)
    for p in range(n):
        flat[ptr[p]:ptr[p + 1]] = chunks[p]
    return ptr, flat, True


@njit(cache=True, nogil=True)
def _completion(order, sup, work, pi, lams, ptr, flat, ev_ptr, ev_w, ev_slot, ev_first, ev_last):
    """H[j, l]: from the j-th state (after some position p), the most that positions after
    p can add to worth - lams[l] * load, cuts and all."""
    n, L = len(order), len(lams)
    H = np.zeros((len(flat), L))
    for p in range(n - 2, -1, -1):
        q = p + 1
        g = order[q]
        lo, hi = ptr[q], ptr[q + 1]
        for j in range(ptr[p], ptr[p + 1]):
            for l in range(L):
                H[j, l] = -1e300
            for x in range(2):
                if x == 1 and not sup[g]:
                    continue
                code, cost = _advance(flat[j], x, q, ev_ptr, ev_w, ev_slot, ev_first, ev_last)
                k = lo + np.searchsorted(flat[lo:hi], code)
                for l in range(L):
                    v = H[k, l] - lams[l] * (cost + (work[g] if x == 1 else 0.0)) + (pi[g] if x == 1 else 0.0)
                    if v > H[j, l]:
                        H[j, l] = v
    return H


@njit(cache=True, nogil=True)
def _step(p, g, codes, loads, vals, sup, work, pi, ev_ptr, ev_w, ev_slot, ev_first, ev_last, T, threshold,
          ptrs, cw, cv, H, hptr, hflat, lams):
    """Position p's class in and out of every label; those within T that can still reach the
    threshold, Pareto-best in (load, worth) per state.  (states, loads, worths, parents, took)."""
    m = len(codes)
    nc, nl, nv = np.empty(2 * m, dtype=np.int64), np.empty(2 * m), np.empty(2 * m)
    parent, took = np.empty(2 * m, dtype=np.int32), np.empty(2 * m, dtype=np.bool_)
    c = 0
    lo, hi = hptr[p], hptr[p + 1]
    for i in range(m):
        for x in range(2):
            if x == 1 and not sup[g]:
                continue
            code, cost = _advance(codes[i], x, p, ev_ptr, ev_w, ev_slot, ev_first, ev_last)
            load = loads[i] + cost + (work[g] if x == 1 else 0.0)
            val = vals[i] + (pi[g] if x == 1 else 0.0)
            if load > T or val + _knapsack_bound(p, T - load, ptrs, cw, cv) < threshold:
                continue
            if len(lams):
                k = lo + np.searchsorted(hflat[lo:hi], code)
                best = 1e300
                for l in range(len(lams)):
                    best = min(best, lams[l] * (T - load) + H[k, l])
                if val + best < threshold:
                    continue
            nc[c], nl[c], nv[c], parent[c], took[c] = code, load, val, i, x == 1
            c += 1
    o = np.argsort(-nv[:c], kind="mergesort")
    o = o[np.argsort(nl[:c][o], kind="mergesort")]
    o = o[np.argsort(nc[:c][o], kind="mergesort")]  # by state, then load, then worth (highest first)
    keep = np.zeros(c, dtype=np.bool_)
    state, best = np.int64(-1), -1e300
    for i in o:
        if nc[i] != state:
            state, best = nc[i], -1e300
        if nv[i] > best + 1e-12:
            best = nv[i]
            keep[i] = True
    sel = o[keep[o]]
    return nc[sel], nl[sel], nv[sel], parent[sel], took[sel]
