"""Local search over colour-class moves with random restarts (the paper's baseline, made
feasible): moves only between memory- and support-feasible assignments, CPU cores
allowed, loads updated one move at a time (numba kernels).  Its class state also repairs
the partitioners' parts (:mod:`.partition`), and its descent polishes the plan the
throughput IP's pairs start from (:func:`descend_from`).  Write-up: docs/baselines.md.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from ... import interrupt
from ...errors import SolveError
from ...plan import Plan
from ...workload import Workload
from ..classes import ClassGraph, class_graph
from ..finish import finish

DEFAULT_RESTARTS = 10
DESCEND_CHUNK = 64  # moves of local search between looks at the clock


@njit(cache=True, nogil=True)
def _state(dev, k, n_dev, acc, cpu, size, m_ptr, m_idx, h_weight):
    """Counts per (hyperedge, device), loads and memory use per device for an assignment."""
    H = h_weight.shape[0]
    cnt = np.zeros((H, n_dev), np.int64)
    for h in range(H):
        for q in range(m_ptr[h], m_ptr[h + 1]):
            cnt[h, dev[m_idx[q]]] += 1
    load = np.zeros(n_dev)
    mem = np.zeros(n_dev)
    for c in range(dev.shape[0]):
        d = dev[c]
        if d < k:
            load[d] += acc[c]
            mem[d] += size[c]
        else:
            load[d] += cpu[c]
    for h in range(H):
        s = m_ptr[h + 1] - m_ptr[h]
        for d in range(k):
            if 0 < cnt[h, d] < s:
                load[d] += h_weight[h]
    return cnt, load, mem


@njit(cache=True, nogil=True)
def _comm_change(c, d, step, cnt, h_ptr, h_idx, m_ptr, h_weight):
    """Change of device d's communication when class c leaves (step=-1) or joins (+1) it."""
    delta = 0.0
    for q in range(h_ptr[c], h_ptr[c + 1]):
        h = h_idx[q]
        s = m_ptr[h + 1] - m_ptr[h]
        x = cnt[h, d]
        before = 0 < x < s
        after = 0 < x + step < s
        if after and not before:
            delta += h_weight[h]
        elif before and not after:
            delta -= h_weight[h]
    return delta


@njit(cache=True, nogil=True)
def _move_loads(c, b, dev, load, k, acc, cpu, cnt, h_ptr, h_idx, m_ptr, h_weight):
    """(new load of c's device, new load of b) if class c moved to device b."""
    a = dev[c]
    if a < k:
        new_a = load[a] - acc[c] + _comm_change(c, a, -1, cnt, h_ptr, h_idx, m_ptr, h_weight)
    else:
        new_a = load[a] - cpu[c]
    if b < k:
        new_b = load[b] + acc[c] + _comm_change(c, b, 1, cnt, h_ptr, h_idx, m_ptr, h_weight)
    else:
        new_b = load[b] + cpu[c]
    return new_a, new_b


@njit(cache=True, nogil=True)
def _apply(c, b, new_a, new_b, dev, cnt, load, mem, k, size, h_ptr, h_idx):
    a = dev[c]
    load[a] = new_a
    load[b] = new_b
    if a < k:
        mem[a] -= size[c]
    if b < k:
        mem[b] += size[c]
    for q in range(h_ptr[c], h_ptr[c + 1]):
        h = h_idx[q]
        cnt[h, a] -= 1
        cnt[h, b] += 1
    dev[c] = b


@njit(cache=True, nogil=True)
def _max_other(load, a, b, m):
    for d in range(load.shape[0]):
        if d != a and d != b and load[d] > m:
            m = load[d]
    return m


@njit(cache=True, nogil=True)
def _allowed(c, b, k, unsup, size, mem, mem_cap):
    if b >= k:
        return True
    return (not unsup[c]) and mem[b] + size[c] <= mem_cap


@njit(cache=True, nogil=True)
def _descend(dev, cnt, load, mem, k, acc, cpu, size, unsup, mem_cap, h_ptr, h_idx, m_ptr, h_weight,
             max_moves):
    """Steepest descent on (max load, sum of squared loads), moves only between feasible
    assignments.  Returns the number of moves made."""
    n_dev = load.shape[0]
    C = dev.shape[0]
    moves = 0
    while moves < max_moves:
        cur_max = load.max()
        cur_sq = (load * load).sum()
        tol = 1e-9 * max(1.0, cur_max)
        tol_sq = 1e-9 * max(1.0, cur_sq)
        best_c, best_b = -1, -1
        best_max, best_sq = cur_max, cur_sq
        best_na, best_nb = 0.0, 0.0
        for c in range(C):
            a = dev[c]
            for b in range(n_dev):
                if b == a or not _allowed(c, b, k, unsup, size, mem, mem_cap):
                    continue
                na, nb = _move_loads(c, b, dev, load, k, acc, cpu, cnt, h_ptr, h_idx, m_ptr, h_weight)
                m = _max_other(load, a, b, max(na, nb))
                if m > best_max + tol:
                    continue
                sq = cur_sq - load[a] * load[a] - load[b] * load[b] + na * na + nb * nb
                # a lower max load, or (never raising it) a lower sum of squares
                if m < best_max - tol or (m <= cur_max and sq < best_sq - tol_sq):
                    best_c, best_b, best_max, best_sq, best_na, best_nb = c, b, m, sq, na, nb
        if best_c < 0:
            break
        _apply(best_c, best_b, best_na, best_nb, dev, cnt, load, mem, k, size, h_ptr, h_idx)
        moves += 1
    return moves


@njit(cache=True, nogil=True)
def _repair(dev, cnt, load, mem, k, acc, cpu, size, unsup, mem_cap, h_ptr, h_idx, m_ptr, h_weight):
    """Move classes off over-full accelerators (and unsupported classes off accelerators)
    to where they raise the max load least, until nothing is violated.  Returns the number of
    moves, or -1 when some violation cannot be removed."""
    n_dev = load.shape[0]
    C = dev.shape[0]
    moves = 0
    while True:
        bad = False
        best_c, best_b = -1, -1
        best_max, best_sq = np.inf, np.inf
        best_na, best_nb = 0.0, 0.0
        cur_sq = (load * load).sum()
        for c in range(C):
            a = dev[c]
            if a >= k or not (mem[a] > mem_cap or unsup[c]):
                continue
            bad = True
            if not unsup[c] and size[c] <= 0.0:
                continue  # moving it frees no memory
            for b in range(n_dev):
                if b == a or not _allowed(c, b, k, unsup, size, mem, mem_cap):
                    continue
                na, nb = _move_loads(c, b, dev, load, k, acc, cpu, cnt, h_ptr, h_idx, m_ptr, h_weight)
                m = _max_other(load, a, b, max(na, nb))
                sq = cur_sq - load[a] * load[a] - load[b] * load[b] + na * na + nb * nb
                if m < best_max or (m == best_max and sq < best_sq):
                    best_c, best_b, best_max, best_sq, best_na, best_nb = c, b, m, sq, na, nb
        if not bad:
            return moves
        if best_c < 0:
            return -1
        _apply(best_c, best_b, best_na, best_nb, dev, cnt, load, mem, k, size, h_ptr, h_idx)
        moves += 1


class ClassState:
    """An assignment of classes to devices with its loads, for moves and repair."""

    def __init__(self, g: ClassGraph, workload: Workload, dev: np.ndarray):
        self.g, self.k = g, workload.num_accelerators
        self.n_dev = workload.num_accelerators + workload.num_cpus
        self.mem_cap = workload.accelerator_memory * (1 + 1e-12)
        self.dev = np.ascontiguousarray(dev, dtype=np.int64)
        self.cnt, self.load, self.mem = _state(self.dev, self.k, self.n_dev, g.acc, g.cpu, g.size,
                                               g.m_ptr, g.m_idx, g.h_weight)

    def _args(self):
        g = self.g
        return (self.dev, self.cnt, self.load, self.mem, self.k, g.acc, g.cpu, g.size, g.unsupported,
                self.mem_cap, g.h_ptr, g.h_idx, g.m_ptr, g.h_weight)

    def repair(self) -> int:
        return int(_repair(*self._args()))

    def descend(self, max_moves: int = 1_000_000, deadline: float = float("inf")) -> int:
        """Steepest descent (see _descend), DESCEND_CHUNK moves at a time until it
        converges, makes ``max_moves`` or ``deadline`` passes."""
        done = 0
        while done < max_moves:
            step = min(DESCEND_CHUNK, max_moves - done)
            moved = int(_descend(*self._args(), step))
            done += moved
            if moved < step or interrupt.past(deadline):
                break
        return done

    @property
    def feasible(self) -> bool:
        on_acc = self.dev < self.k
        return not (self.mem[: self.k] > self.mem_cap).any() and not (on_acc & self.g.unsupported).any()

    def key(self) -> tuple:
        return (not self.feasible, float(self.load.max(initial=0.0)), float((self.load ** 2).sum()))

    def assignment(self, workload: Workload) -> dict[int, str]:
        names = [d.name for d in workload.devices]
        dev_of_node = self.dev[self.g.label]
        return {int(i): names[d] for i, d in zip(workload.ids, dev_of_node)}


def descend_from(workload: Workload, assignment: dict[int, str], deadline: float) -> dict[int, str]:
    """``assignment`` after the steepest descent above (single colour-class moves between
    feasible assignments, the max load never raised), until it converges or ``deadline``
    passes: a polish of another method's plan, such as the one the throughput IP's pairs
    start from (where it breaks memory or support, it is returned as it is)."""
    g = class_graph(workload)
    index = workload.device_index
    dev = np.zeros(g.n, dtype=np.int64)
    dev[g.label] = [index[assignment[int(i)]] for i in workload.ids]
    st = ClassState(g, workload, dev)
    if not st.feasible:
        return assignment
    st.descend(deadline=deadline)
    return st.assignment(workload)


def _random_start(g: ClassGraph, workload: Workload, rng: np.random.Generator) -> np.ndarray:
    """Each class, in random order, to a uniformly random accelerator that supports it and
    has room; failing that to a random CPU core (or, with none, the emptiest accelerator)."""
    k, l, cap = workload.num_accelerators, workload.num_cpus, workload.accelerator_memory
    dev = np.zeros(g.n, dtype=np.int64)
    mem = np.zeros(max(k, 1))
    for c in rng.permutation(g.n):
        fits = [] if g.unsupported[c] else [d for d in range(k) if mem[d] + g.size[c] <= cap]
        if fits:
            d = fits[int(rng.integers(len(fits)))]
        elif l > 0:
            d = k + int(rng.integers(l))
        else:
            d = int(np.argmin(mem[:k]))
        dev[c] = d
        if d < k:
            mem[d] += g.size[c]
    return dev


def local_search(workload: Workload, seed: int = 0, restarts: int = DEFAULT_RESTARTS,
                 deadline: float = float("inf")) -> Plan:
    """Local search over colour classes with random restarts (seeded, reproducible).

    Each restart: a random memory-feasible start, a repair where none exists, then steepest
    descent over single-class moves between feasible assignments.  The best restart wins
    (feasible first, then max load, then sum of squared loads).
    """
    start = time.perf_counter()
    if restarts < 1:
        raise SolveError("local_search needs at least one restart")
    g = class_graph(workload)
    rng = np.random.default_rng(seed)
    best: ClassState | None = None
    runs = []
    for _ in range(restarts):
        if runs and interrupt.past(deadline):
            break
        st = ClassState(g, workload, _random_start(g, workload, rng))
        repaired = st.repair()
        moves = st.descend(deadline=deadline)
        runs.append({"value": float(st.load.max(initial=0.0)), "moves": moves, "repair_moves": repaired,
                     "feasible": st.feasible})
        if best is None or st.key() < best.key():
            best = st
    assignment = best.assignment(workload)
    return finish(workload, "throughput", "local_search", assignment, start,
                  details={"seed": seed, "restarts": restarts, "classes": g.n, "runs": runs})


