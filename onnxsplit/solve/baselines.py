"""Baselines: the placements the paper compares against, and the ones users get today.

Every function here returns a :class:`~onnxsplit.plan.Plan` that has been re-scored by
:mod:`onnxsplit.solve.evaluate` for the requested objective and checked by
:func:`evaluate.check`.  A plan that breaks memory, accelerator support or a colour class
is returned with ``status="infeasible"`` and the problems in ``details["violations"]``
(its ``value`` is still the score, so it can be compared with the paper's numbers, which
ignore memory for these baselines); it is never called feasible.

The paper's baselines (Tarnawski et al., NeurIPS 2020, Section 6):

* :func:`greedy` -- the latency greedy: colour classes (fused where they lie on a cycle)
  become inseparable blocks, taken in topological order; accelerators are filled one
  after the other by memory; a block that fits no accelerator, or comes after the last
  one is full, goes to the CPU.
* :func:`local_search` -- steepest descent over colour-class moves with random
  restarts.  Unlike the reference it moves only between feasible assignments (memory,
  support), may use CPU cores, updates loads incrementally, and breaks ties in the max
  load by the sum of squared loads so that it does not stop on the first plateau.
* :func:`pipedream` -- PipeDream's planner: collapse branches by biconnected components
  of the forward layer graph, then the max-load DP over the prefixes of one topological
  order.
* :func:`graph_partition` (``scotch``, ``metis``) -- partition the communication-weighted
  graph of colour classes into ``k`` parts balanced by accelerator latency.
* :func:`fixed` -- ``one_accelerator``, ``all_cpu``, ``given`` (a split file).

And what users get today:

* ``ort_default`` -- ONNX Runtime's default: every node the accelerator's execution
  provider supports runs on one accelerator, the rest on the CPU.
* ``hetero_greedy`` -- OpenVINO HETERO-style pipeline distribution: nodes in topological
  order go to the highest-priority device that supports them, the accelerators filled in
  priority order by memory.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from .. import interrupt
from ..errors import SolveError
from ..plan import Plan
from ..workload import Workload, topological_sort
from . import evaluate, isolated, partitioners, preprocess

BOTH = ("throughput", "latency")

#: method -> the objectives it serves (optimises, or -- for fixed placements -- is scored for)
OBJECTIVES = {
    "greedy": BOTH,
    "local_search": ("throughput",),
    "pipedream": ("throughput",),
    "scotch": ("throughput",),
    "metis": ("throughput",),
    "one_accelerator": BOTH,
    "all_cpu": BOTH,
    "given": BOTH,
    "ort_default": BOTH,
    "hetero_greedy": BOTH,
}

DEFAULT_RESTARTS = 10
PARTITION_TIMEOUT = 60.0  # seconds for one Scotch run (it has hung on some graphs)
DESCEND_CHUNK = 64  # moves of local search between looks at the clock


def solve(workload: Workload, method: str, objective: str = "throughput", *, seed: int = 0,
          restarts: int = DEFAULT_RESTARTS, split: str | Path | dict | None = None,
          time_limit: float | None = None) -> Plan:
    """Run one baseline; the plan is scored for ``objective`` and checked.  With
    ``time_limit`` (seconds) the randomised baselines stop restarting (and local search
    descending) once it has passed, and PipeDream stops trying further orders: the best
    so far is the plan."""
    deadline = time.perf_counter() + time_limit if time_limit else float("inf")
    if method not in OBJECTIVES:
        raise SolveError(f"unknown baseline '{method}'")
    if workload.n == 0:
        raise SolveError("the workload has no nodes")
    if method == "greedy":
        return greedy(workload, objective)
    if method == "local_search":
        return local_search(workload, seed=seed, restarts=restarts, deadline=deadline)
    if method == "pipedream":
        return pipedream(workload, deadline=deadline)
    if method in ("scotch", "metis"):
        return graph_partition(workload, method, seed=seed, restarts=restarts, deadline=deadline)
    if method == "hetero_greedy":
        return hetero_greedy(workload, objective)
    if method == "given" and split is None:
        raise SolveError("method 'given' needs a split file (--split FILE)")
    return fixed(workload, method, objective, split=split)


# ---- shared: scoring, checking, devices ------------------------------------------------------

def finish(workload: Workload, objective: str, method: str, assignment: dict[int, str], start: float, *,
           details: dict | None = None, stages: list[str] | None = None) -> Plan:
    """Score (both objectives), check, and wrap an assignment as a Plan.

    ``status`` is "feasible" only when :func:`evaluate.check` finds nothing; otherwise it is
    "infeasible" and ``details["violations"]`` lists the problems.
    """
    violations = evaluate.check(workload, assignment)
    scores = {obj: evaluate.score(workload, assignment, obj).value for obj in BOTH}
    details = {**(details or {}), "scores": scores, "violations": violations}
    return Plan(objective, method, "infeasible" if violations else "feasible", scores[objective], assignment,
                seconds=time.perf_counter() - start, stages=stages or used_devices(workload, assignment),
                details=details)


def used_devices(workload: Workload, assignment: dict[int, str]) -> list[str]:
    used = set(assignment.values())
    return [d.name for d in workload.devices if d.name in used]


def _need_devices(workload: Workload, acc: bool = False, cpu: bool = False, method: str = "") -> None:
    if acc and workload.num_accelerators == 0:
        raise SolveError(f"method '{method}' needs an accelerator; the workload has none")
    if cpu and workload.num_cpus == 0:
        raise SolveError(f"method '{method}' needs a CPU core; the workload has none")


def class_members(workload: Workload) -> list[np.ndarray]:
    """The nodes of each colour class, by class label."""
    label = workload.color_class
    order = np.argsort(label, kind="stable")
    cuts = np.searchsorted(label[order], np.arange(int(label.max(initial=-1)) + 2))
    return [order[cuts[i]:cuts[i + 1]] for i in range(len(cuts) - 1)]


# ---- fixed placements ---------------------------------------------------------------------------

def fixed(workload: Workload, method: str, objective: str = "throughput", *,
          split: str | Path | dict | None = None) -> Plan:
    """``one_accelerator``, ``all_cpu``, ``ort_default`` or ``given``."""
    start = time.perf_counter()
    ids = [int(x) for x in workload.ids]
    details: dict = {}
    if method == "one_accelerator":
        # the paper's -oneFpga: everything on one accelerator (support and memory are
        # checked, not avoided: the reference ignores both)
        _need_devices(workload, acc=True, method=method)
        assignment = {i: "acc0" for i in ids}
    elif method == "all_cpu":
        _need_devices(workload, cpu=True, method=method)
        assignment = {i: "cpu0" for i in ids}
    elif method == "ort_default":
        # ONNX Runtime: a node runs on the accelerator's EP when that EP supports it, else on
        # the CPU EP.  A colour class must share a device, so a class with any unsupported
        # node runs on the CPU.  ORT does not split by memory: too big is infeasible.
        _need_devices(workload, acc=True, method=method)
        unsupported_class = np.zeros(int(workload.color_class.max(initial=-1)) + 1, dtype=bool)
        np.logical_or.at(unsupported_class, workload.color_class, ~workload.supported)
        if unsupported_class.any():
            _need_devices(workload, cpu=True, method=method)
        on_cpu = unsupported_class[workload.color_class]
        assignment = {i: ("cpu0" if c else "acc0") for i, c in zip(ids, on_cpu)}
    elif method == "given":
        assignment = split if isinstance(split, dict) else _read_split(split, workload)
        return _given(workload, objective, assignment, start)
    else:
        raise SolveError(f"unknown fixed placement '{method}'")
    return finish(workload, objective, method, assignment, start, details=details)


def _read_split(path, workload: Workload) -> dict[int, str]:
    from ..plan import read_split

    return read_split(path, workload)


def _given(workload: Workload, objective: str, assignment: dict[int, str], start: float) -> Plan:
    """A user's split.  One that names more devices than the workload has (the paper's
    bert24 latency expert split uses 6 accelerators of 5) is scored on a widened device set
    and reported infeasible, rather than refused."""
    assignment = {int(k): v for k, v in assignment.items()}
    scored_on, extra = evaluate.widened(workload, assignment)
    plan = finish(scored_on, objective, "given", assignment, start)
    if extra:
        plan.details["violations"] = extra + plan.details["violations"]
        plan.status = "infeasible"
    return plan


# ---- the paper's latency greedy -----------------------------------------------------------------

@dataclass(frozen=True)
class Blocks:
    """Inseparable blocks in topological order: forward supernodes after contracting colour
    classes and fusing forward cycles, each with its backward partner (training)."""

    members: list[np.ndarray]  # block -> original node indices (forward and backward)
    size: np.ndarray
    unsupported: np.ndarray  # bool per block
    order: list[int]  # a topological order of the blocks
    succ: list[list[int]]  # successor blocks (forward edges, then order-only edges)


def inseparable_blocks(workload: Workload) -> Blocks:
    c = preprocess.contract_color_classes(preprocess.initial(workload))
    c = preprocess.add_orphan_standins(c)
    c = preprocess.fuse_forward_sccs(c)
    fwd = [s for s in range(c.size) if not c.backward[s]]
    block_of_label = {int(c.label[s]): b for b, s in enumerate(fwd)}
    block_of_super = np.array([block_of_label[int(c.label[s])] for s in range(c.size)], dtype=np.int64)
    nb = len(fwd)
    members: list[list[int]] = [[] for _ in range(nb)]
    for v in range(workload.n):
        members[block_of_super[c.group[v]]].append(v)
    # successors in the order the file lists edges (forward edges only), then order-only edges
    succ: list[dict[int, None]] = [{} for _ in range(nb)]
    back = c.backward
    for s, d in zip(c.group[workload.edge_src], c.group[workload.edge_dst]):
        if s != d and not back[s] and not back[d]:
            succ[block_of_super[s]][int(block_of_super[d])] = None
    for s, d in sorted(c.artificial):
        if not back[s] and not back[d] and block_of_super[s] != block_of_super[d]:
            succ[block_of_super[s]][int(block_of_super[d])] = None
    order = topological_sort(nb, succ)  # depth-first-ish, as the reference does
    if order is None:
        raise SolveError("internal error: the blocks of the greedy form a cycle")
    arr = [np.array(m, dtype=np.int64) for m in members]
    return Blocks(
        members=arr,
        size=np.array([workload.size[m].sum() for m in arr]),
        unsupported=np.array([bool((~workload.supported[m]).any()) for m in arr], dtype=bool),
        order=order,
        succ=[list(x) for x in succ],
    )


def greedy(workload: Workload, objective: str = "latency") -> Plan:
    """The paper's latency greedy (its ``greedy.cpp``), respecting accelerator support.

    Blocks in topological order; open an accelerator and put blocks on it while they fit
    its memory; a block too large for any accelerator (or not supported, or arriving after
    the last accelerator is used) goes to the CPU, and the next block opens a fresh
    accelerator.  Each accelerator holds a range of one topological order, so its part is
    convex and the plan runs as a pipeline.
    """
    start = time.perf_counter()
    blocks = inseparable_blocks(workload)
    k, memory = workload.num_accelerators, workload.accelerator_memory
    ids = workload.ids
    assignment: dict[int, str] = {}
    stages: list[str] = []
    used = 0
    order = blocks.order
    i = 0

    def place(b: int, name: str) -> None:
        for v in blocks.members[b]:
            assignment[int(ids[v])] = name

    while i < len(order):
        b = order[i]
        if blocks.size[b] > memory or blocks.unsupported[b] or used == k:
            if workload.num_cpus == 0:
                raise SolveError("greedy: a block fits no accelerator and the workload has no CPU core")
            place(b, "cpu0")
            i += 1
            continue
        name = f"acc{used}"
        used += 1
        stages.append(name)
        total = 0.0
        while i < len(order) and not blocks.unsupported[order[i]] and total + blocks.size[order[i]] <= memory:
            total += blocks.size[order[i]]
            place(order[i], name)
            i += 1
    if "cpu0" in assignment.values():
        stages.append("cpu0")
    return finish(workload, objective, "greedy", assignment, start, stages=stages,
                  details={"blocks": len(order), "accelerators_used": used})


# ---- OpenVINO HETERO-style --------------------------------------------------------------------

def hetero_greedy(workload: Workload, objective: str = "throughput") -> Plan:
    """Walk nodes in topological order (file order among ready nodes); each goes to the
    highest-priority device that supports it and still has room: acc0 until its memory is
    full, then acc1, ...; never back to an earlier one.  Unsupported nodes, and nodes that
    fit no accelerator (or come after the last is full), run on the CPU.  A colour class is
    placed whole, when its first node is reached."""
    import heapq

    start = time.perf_counter()
    k, memory = workload.num_accelerators, workload.accelerator_memory
    members = class_members(workload)
    label = workload.color_class
    class_size = np.array([workload.size[m].sum() for m in members])
    class_unsup = np.array([bool((~workload.supported[m]).any()) for m in members], dtype=bool)
    device_of_class: dict[int, str] = {}
    current, used_mem = 0, 0.0
    indeg = [len(p) for p in workload.predecessors]
    ready = [v for v in range(workload.n) if indeg[v] == 0]
    heapq.heapify(ready)
    while ready:
        v = heapq.heappop(ready)
        c = int(label[v])
        if c not in device_of_class:
            dev = None
            if not class_unsup[c] and class_size[c] <= memory:
                if current < k and used_mem + class_size[c] > memory:
                    current, used_mem = current + 1, 0.0
                if current < k:
                    dev = f"acc{current}"
                    used_mem += class_size[c]
            if dev is None:
                _need_devices(workload, cpu=True, method="hetero_greedy")
                dev = "cpu0"
            device_of_class[c] = dev
        for w in workload.successors[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(ready, w)
    assignment = {int(workload.ids[v]): device_of_class[int(label[v])] for v in range(workload.n)}
    return finish(workload, objective, "hetero_greedy", assignment, start)


# ---- colour-class graph with incremental loads (local search, repair) ---------------------------

@dataclass(frozen=True)
class ClassGraph:
    """Colour classes as units, and each tensor as a hyperedge over the classes it touches.

    An accelerator pays hyperedge h's weight iff it holds some but not all of h's classes
    (0 < cnt[h, d] < size[h]): the producer's device pays when a consumer is elsewhere, a
    consumer's device pays when the producer is elsewhere.  That is the evaluator's
    once-per-device rule, so loads can be updated one move at a time.
    """

    label: np.ndarray  # node index -> class
    acc: np.ndarray
    cpu: np.ndarray
    size: np.ndarray
    unsupported: np.ndarray  # bool
    h_ptr: np.ndarray  # class -> hyperedges (CSR)
    h_idx: np.ndarray
    m_ptr: np.ndarray  # hyperedge -> member classes (CSR)
    m_idx: np.ndarray
    h_weight: np.ndarray

    @property
    def n(self) -> int:
        return len(self.acc)


def class_graph(workload: Workload) -> ClassGraph:
    w = workload
    label = w.color_class
    nc = int(label.max(initial=-1)) + 1

    def per_class(values: np.ndarray) -> np.ndarray:
        return np.bincount(label, weights=values, minlength=nc)

    members: dict[int, set[int]] = {}
    for s, d in zip(w.edge_src, w.edge_dst):
        members.setdefault(int(s), {int(label[s])}).add(int(label[d]))
    weight_of: dict[tuple[int, ...], float] = {}
    for u, cls in members.items():
        if len(cls) > 1 and w.out_cost[u] > 0:
            key = tuple(sorted(cls))
            weight_of[key] = weight_of.get(key, 0.0) + float(w.out_cost[u])
    hyper = list(weight_of.items())
    incid: list[list[int]] = [[] for _ in range(nc)]
    for h, (cls, _) in enumerate(hyper):
        for c in cls:
            incid[c].append(h)
    return ClassGraph(
        label=label,
        acc=per_class(w.acc_latency),
        cpu=per_class(w.cpu_latency),
        size=per_class(w.size),
        unsupported=per_class((~w.supported).astype(np.float64)) > 0.5,
        h_ptr=np.concatenate([[0], np.cumsum([len(x) for x in incid])]).astype(np.int64),
        h_idx=np.array([h for x in incid for h in x], dtype=np.int64),
        m_ptr=np.concatenate([[0], np.cumsum([len(c) for c, _ in hyper])]).astype(np.int64),
        m_idx=np.array([c for cls, _ in hyper for c in cls], dtype=np.int64),
        h_weight=np.array([wt for _, wt in hyper], dtype=np.float64),
    )


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


# ---- graph partitioners (Scotch, METIS) ----------------------------------------------------------

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
    _need_devices(workload, acc=True, method=tool)
    if restarts < 1:
        raise SolveError(f"{tool} needs at least one restart")
    g = class_graph(workload)
    k = workload.num_accelerators
    classes = np.flatnonzero(~g.unsupported)
    if len(classes) < g.n:
        _need_devices(workload, cpu=True, method=tool)
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


# ---- PipeDream ------------------------------------------------------------------------------

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
    import networkx as nx

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
    import heapq

    c = inst.contracted
    members = c.members
    first = []
    for it in range(inst.n):
        idx = [int(m.min()) for s in (inst.item_super[it], inst.item_partner[it]) if s >= 0
               for m in (members[s],) if len(m)]
        first.append(min(idx) if idx else c.workload.n)
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
    from . import dp, lattice

    start = time.perf_counter()
    labels = pipedream_labels(workload)
    nodes = tuple(dataclasses.replace(nd, color_class=int(lab)) for nd, lab in zip(workload.nodes, labels))
    coarse = workload.replace(nodes=nodes)
    inst = dp.build_instance(coarse)
    k, l, memory = workload.num_accelerators, workload.num_cpus, workload.accelerator_memory
    orders = {"file": file_order(inst)}
    orders.update(zip(("dfs", "bfs", "heavy_first"), dp.topological_orders(inst)))
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
    assignment, stages = dp._assignment(coarse, inst, best.parts)
    plan = finish(workload, "throughput", "pipedream", assignment, start, details=details, stages=stages)
    if abs(plan.value - best.value) > 1e-6 * max(1.0, abs(plan.value)):
        raise SolveError(f"internal error: PipeDream DP value {best.value} but the evaluator scores {plan.value}")
    problems = evaluate.check(workload, assignment, contiguity="ideal_chain")
    if problems:
        raise SolveError("internal error: PipeDream plan is not a pipeline: " + problems[0])
    return plan
