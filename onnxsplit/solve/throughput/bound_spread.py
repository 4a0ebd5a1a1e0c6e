"""A lower bound on the max load that sees transfers: a spreading-metric LP (the throughput
IP's bound).

The IP's LP relaxation splits every class evenly, so no tensor crosses and transfers drop
out of its bound.  A plan is a partition of the classes, so a metric in which a crossing
tensor has length 1; the LP keeps what every plan with max load T satisfies: all work and
transfers fit on the devices, every part weighs at most T, and a class that must run on
an accelerator pays its part's transfers.  Spreading rows are added one source class at a
time as cutting planes (a shortest-path check finds violated ones); every round's value
is already a bound.

Write-up: docs/throughput.md (The spreading metric, in detail).
"""

from __future__ import annotations

import time

import highspy
import numpy as np
from numba import njit

INITIAL_SOURCES = 8  # source classes in the first LP: the heaviest
PER_ROUND = 8  # violated sources added per round, at most
SLACK = 1e-7  # relative: a row violated by less is satisfied; the bound is lowered by as much


def spreading_bound(cl, k: int, l: int, floor: float, upper: float, seconds: float) -> float | None:
    """The LP's least T (at least ``floor``, at most ``upper``) for the classes ``cl``
    (:class:`..classes.Classes`) on ``k`` accelerators and ``l`` CPUs; None where there is nothing
    to add (no accelerator or no tensor with a cost) or no round finished in ``seconds``."""
    if k == 0 or not cl.hyper or not np.isfinite(upper):
        return None
    deadline = time.perf_counter() + seconds
    lp = _SpreadingLP(cl, k, l, floor, upper)
    for u in np.argsort(-lp.w, kind="stable")[:INITIAL_SOURCES]:
        lp.add_source(int(u))
    best = None
    while True:
        value = lp.solve(deadline - time.perf_counter())
        if value is None:
            break
        best = value
        violated = lp.violated_sources(value)
        if not violated or time.perf_counter() >= deadline:
            break
        for u in violated[:PER_ROUND]:
            lp.add_source(u)
    if best is None:
        return None
    return float(min(best * (1 - SLACK), upper))


class _SpreadingLP:
    """The LP on highspy (the HiGHS that python-mip runs), grown one source class at a time."""

    def __init__(self, cl, k: int, l: int, floor: float, upper: float):

        self.highs = h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        self.inf = inf = highspy.kHighsInf
        self.ok = highspy.HighsModelStatus.kOptimal
        n, nh = cl.n, len(cl.hyper)
        self.n, self.nh, self.l = n, nh, l
        acc = np.where(cl.supported, cl.acc_fwd + cl.acc_bwd, 0.0)
        cpu = cl.cpu_fwd + cl.cpu_bwd
        self.acc, self.supported = acc, cl.supported
        self.w = np.where(cl.supported, np.minimum(acc, cpu) if l else acc, cpu)
        # a class that must run on an accelerator in any plan better than ``upper``
        self.on_accelerator = cl.supported & ((cpu > upper) if l else True)
        self.src, self.ptr, self.members, self.cost = cl.hyper_arrays()
        sizes = np.diff(self.ptr)
        self.member_src = np.repeat(self.src, sizes)  # each member's tensor's source
        # tensors with more than two classes meet at a hub (a column of each source's own)
        self.big = np.flatnonzero(sizes > 2)
        self.sources: set[int] = set()
        # columns: T, a[n] (CPU share), l[nh] (length), kappa[nh]
        self.T, self.a, self.len, self.kappa = 0, 1, 1 + n, 1 + n + nh
        lb = np.zeros(1 + n + 2 * nh)
        ub = np.ones(1 + n + 2 * nh)
        lb[0], ub[0] = floor, inf
        if l == 0:
            ub[self.a:self.a + n] = 0.0
            ub[self.kappa:self.kappa + nh] = 0.0
        else:
            lb[self.a:self.a + n][~cl.supported] = 1.0
        h.addVars(len(lb), lb, ub)
        h.changeColsCost(1, np.array([0], dtype=np.int32), np.array([1.0]))
        rows = _Rows()
        # k T >= sum acc (1 - a) + sum c (2 l - kappa)
        rows.add(-inf, -float(acc.sum()),
                 np.concatenate([[self.T], self.a + np.arange(n), self.len + np.arange(nh), self.kappa + np.arange(nh)]),
                 np.concatenate([[-float(k)], -acc, 2 * self.cost, -self.cost]))
        if l:
            rows.add(-inf, 0.0, np.concatenate([[self.T], self.a + np.arange(n)]), np.concatenate([[-float(l)], cpu]))
            for j in range(nh):
                mem = self.members[self.ptr[j]:self.ptr[j + 1]]
                rows.add(-inf, 0.0, [self.kappa + j, self.len + j], [1.0, -1.0])
                rows.add(-inf, 0.0, np.concatenate([[self.kappa + j], self.a + mem]),
                         np.concatenate([[1.0], -np.ones(len(mem))]))
                for m in mem:
                    if m != self.src[j]:
                        for sign in (1.0, -1.0):
                            rows.add(-inf, 0.0, [self.a + m, self.a + self.src[j], self.len + j], [sign, -sign, -1.0])
        rows.flush(h)
        # shortest paths: the classes, then one hub per tensor; member <-> hub costs l_h / 2
        self.adj_ptr, self.adj_node, self.adj_edge = _adjacency(n, nh, self.ptr, self.members)

    def add_source(self, u: int) -> None:
        """The spreading row of class u (with its part's transfers where it must run on an
        accelerator), on potentials of its own."""
        h, n, nh, inf = self.highs, self.n, self.nh, self.inf
        own = bool(self.on_accelerator[u])
        base = h.getNumCol()
        big = self.big
        hub = np.full(nh, -1, dtype=np.int64)
        hub[big] = base + n + np.arange(len(big))
        count = n + len(big) + (nh if own else 0)
        lb, ub = np.zeros(count), np.ones(count)
        ub[u] = 0.0
        if own:
            lb[:n][~self.supported] = 1.0  # an accelerator's part holds no unsupported class
        h.addVars(count, lb, ub)
        p = base + np.arange(n)
        rows = _Rows()
        for j in range(nh):
            mem = self.members[self.ptr[j]:self.ptr[j + 1]]
            if hub[j] < 0:
                a, b = p[mem[0]], p[mem[1]]
                rows.add(-inf, 0.0, [a, b, self.len + j], [1.0, -1.0, -1.0])
                rows.add(-inf, 0.0, [b, a, self.len + j], [1.0, -1.0, -1.0])
            else:
                for m in mem:
                    rows.add(-inf, 0.0, [hub[j], p[m], self.len + j], [1.0, -1.0, -0.5])
                    rows.add(-inf, 0.0, [p[m], hub[j], self.len + j], [1.0, -1.0, -0.5])
        if own:
            sigma = base + n + len(big) + np.arange(nh)
            for j in range(nh):
                s = self.src[j]
                for m in self.members[self.ptr[j]:self.ptr[j + 1]]:
                    if m != s:
                        rows.add(-inf, 0.0, [p[m], p[s], sigma[j]], [1.0, -1.0, -1.0])
                        rows.add(-inf, 0.0, [p[s], p[m], sigma[j]], [1.0, -1.0, -1.0])
            # sum acc (1 - p) + sum c sigma <= T
            rows.add(float(self.acc.sum()), inf, np.concatenate([[self.T], p, sigma]),
                     np.concatenate([[1.0], self.acc, -self.cost]))
        else:
            # sum w (1 - p) <= max(1, l) T
            rows.add(float(self.w.sum()), inf, np.concatenate([[self.T], p]),
                     np.concatenate([[float(max(1, self.l))], self.w]))
        rows.flush(h)
        self.sources.add(u)

    def solve(self, seconds: float) -> float | None:
        """The LP's optimum, or None where it was not reached in ``seconds``."""
        if seconds <= 0:
            return None
        self.highs.setOptionValue("time_limit", float(seconds))
        self.highs.run()
        if self.highs.getModelStatus() != self.ok:
            return None
        self.x = np.array(self.highs.getSolution().col_value)
        return float(self.x[self.T])

    def violated_sources(self, T: float) -> list[int]:
        """Classes not yet sources whose row the current lengths violate, most violated first:
        their potentials at min(1, distance) -- the largest any can be -- do not satisfy it.
        Exact for the spreading rows.  For a part's own transfers it is a test, not a proof
        (larger potentials also mean more transfers, and unsupported classes are held at 1):
        a row it passes may still be violated, which leaves the bound weaker, never wrong."""
        length = np.clip(self.x[self.len:self.len + self.nh], 0.0, 1.0)
        out = []
        for u in range(self.n):
            if u in self.sources:
                continue
            p = _capped_distances(u, self.n, self.adj_ptr, self.adj_node, self.adj_edge, length)
            if self.on_accelerator[u]:
                p = np.where(self.supported, p, 1.0)
                sigma = np.maximum.reduceat(np.abs(p[self.members] - p[self.member_src]), self.ptr[:-1])
                excess = float(self.acc @ (1 - p) + self.cost @ sigma) - T
            else:
                excess = float(self.w @ (1 - p)) - max(1, self.l) * T
            if excess > SLACK * max(1.0, T):
                out.append((excess, u))
        return [u for _, u in sorted(out, reverse=True)]


class _Rows:
    """Rows gathered in CSR form, handed to HiGHS in one call."""

    def __init__(self):
        self._clear()

    def _clear(self) -> None:
        self.lower, self.upper, self.starts, self.index, self.value = [], [], [], [], []
        self.nnz = 0

    def add(self, lower: float, upper: float, index, value) -> None:
        self.lower.append(lower)
        self.upper.append(upper)
        self.starts.append(self.nnz)
        self.index.append(np.asarray(index, dtype=np.int32))
        self.value.append(np.asarray(value, dtype=np.float64))
        self.nnz += len(self.index[-1])

    def flush(self, highs) -> None:
        if self.lower:
            highs.addRows(len(self.lower), np.array(self.lower), np.array(self.upper), self.nnz,
                          np.array(self.starts, dtype=np.int32), np.concatenate(self.index),
                          np.concatenate(self.value))
        self._clear()


def _adjacency(n: int, nh: int, ptr: np.ndarray, members: np.ndarray):
    """CSR adjacency of classes and tensor hubs (hub of tensor j: node n + j)."""
    ends = []
    for j in range(nh):
        for m in members[ptr[j]:ptr[j + 1]]:
            ends.append((int(m), n + j, j))
            ends.append((n + j, int(m), j))
    ends.sort()
    adj_ptr = np.zeros(n + nh + 1, dtype=np.int64)
    for a, _, _ in ends:
        adj_ptr[a + 1] += 1
    return (np.cumsum(adj_ptr), np.array([b for _, b, _ in ends], dtype=np.int64),
            np.array([j for _, _, j in ends], dtype=np.int64))


@njit(cache=True, nogil=True)
def _capped_distances(u, n, adj_ptr, adj_node, adj_edge, length):
    """min(1, shortest distance from class u) to every class; member <-> hub costs length / 2."""
    total = len(adj_ptr) - 1
    dist = np.full(total, 1.0)
    done = np.zeros(total, dtype=np.bool_)
    heap_d = np.empty(len(adj_node) + 1)
    heap_v = np.empty(len(adj_node) + 1, dtype=np.int64)
    size = 0
    dist[u] = 0.0
    heap_d[0], heap_v[0], size = 0.0, u, 1
    while size > 0:
        d, v = heap_d[0], heap_v[0]
        size -= 1
        heap_d[0], heap_v[0] = heap_d[size], heap_v[size]
        i = 0
        while True:  # sift down
            c = 2 * i + 1
            if c >= size:
                break
            if c + 1 < size and heap_d[c + 1] < heap_d[c]:
                c += 1
            if heap_d[c] >= heap_d[i]:
                break
            heap_d[i], heap_d[c] = heap_d[c], heap_d[i]
            heap_v[i], heap_v[c] = heap_v[c], heap_v[i]
            i = c
        if done[v] or d > dist[v]:
            continue
        done[v] = True
        for q in range(adj_ptr[v], adj_ptr[v + 1]):
            y = adj_node[q]
            nd = d + 0.5 * length[adj_edge[q]]
            if nd < dist[y]:
                dist[y] = nd
                i = size  # sift up
                heap_d[i], heap_v[i] = nd, y
                size += 1
                while i > 0:
                    parent = (i - 1) // 2
                    if heap_d[parent] <= heap_d[i]:
                        break
                    heap_d[i], heap_d[parent] = heap_d[parent], heap_d[i]
                    heap_v[i], heap_v[parent] = heap_v[parent], heap_v[i]
                    i = parent
    return dist[:n]
