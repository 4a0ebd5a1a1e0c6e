"""Lower bounds on the max load that need no solver: the average work and a packing bound.

The IP's LP relaxation spreads work evenly, so its bound starts at the average work and,
where the colour classes are few and large, branch and bound may never lift it.  The
packing argument does what the LP cannot: if some number of the largest classes cannot
all fit on the CPUs, some accelerator holds several of them, and its load is at least the
sum of the smallest of those.  Both ignore transfers and memory (which only add load or
remove plans), so they hold for every plan, contiguous or not.

Write-up: docs/throughput.md (ip, phase 1: Packing bound).
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from ...workload import Workload
from ..classes import build_classes

_STEPS = 50  # bisection steps for the packing bound (relative precision ~1e-15)


def max_load_lower_bound(w: Workload, packing: bool = True) -> float:
    """The larger of :func:`packing_bound` (at least :func:`work_bound`) and
    :func:`split_bound`: no plan's max load (forward plus backward on one device) is below
    it.  ``packing=False``: the split bound alone (milliseconds, where the packing search
    takes seconds on 30,000 classes: for a method already at its time limit)."""
    cl = build_classes(w)
    acc, cpu = cl.device_costs()
    split = split_bound(acc, cpu, cl.size, w.num_accelerators, w.num_cpus, w.accelerator_memory)
    return lifted(acc, cpu, w.num_accelerators, w.num_cpus, split) if packing else split


PACKING_MOST = 12_000  # classes: the packing test is quadratic (seconds at 10,000, minutes at 30,000)


def lifted(acc: np.ndarray, cpu: np.ndarray, k: int, l: int, split: float) -> float:
    """``split`` lifted by :func:`packing_bound` where that is affordable (at most
    PACKING_MOST units); the split bound alone otherwise."""
    if not np.isfinite(split) or len(acc) > PACKING_MOST:
        return split
    return packing_bound(acc, cpu, k, l, floor=split)


def split_bound(acc: np.ndarray, cpu: np.ndarray, size: np.ndarray, k: int, l: int, memory: float) -> float:
    """The LP relaxation of placing units without transfers (:func:`split_lp`): each
    unit's share on the accelerators together, accelerator work <= k T, the rest's CPU
    work <= l T, the accelerators' memory <= k M; at least :func:`work_bound` (a unit is
    not split).  Where CPUs are far slower than accelerators, the average of
    :func:`work_bound` counts a core as an accelerator; this does not (a transformer of
    10,000 nodes on 4 accelerators and 2 cores: 44.25 against 29.87)."""
    return split_lp(acc, cpu, size, k, l, memory)[0]


def split_lp(acc: np.ndarray, cpu: np.ndarray, size: np.ndarray, k: int, l: int, memory: float
             ) -> tuple[float, np.ndarray | None]:
    """(:func:`split_bound`, each unit's share on the accelerators in the LP's optimum, or
    None where the LP was not solved: no accelerator, or no CPU)."""
    lo = work_bound(acc, cpu, k, l)
    if not len(acc) or not (k + l) or not np.isfinite(lo):
        return lo, None
    if k == 0:
        return max(lo, float(cpu.sum()) / l), None
    ok = np.isfinite(acc)
    if l == 0:
        if not ok.all() or float(size.sum()) > k * memory * (1 + 1e-12):
            return float("inf"), None
        return max(lo, float(acc.sum()) / k), None
    if not np.isfinite(memory) or float(size[ok].sum()) <= k * memory:
        return _split_without_memory(acc, cpu, k, l, lo, ok)
    import mip  # deliberate: the DP imports this module, and its plans need no solver

    from ..milp import new_model

    model = new_model("highs", 1e-9, False)
    x = [model.add_var(lb=0.0, ub=1.0 if ok[g] else 0.0) for g in range(len(acc))]
    T = model.add_var(lb=lo)
    idx = np.flatnonzero(ok)
    model += mip.xsum(float(acc[g]) * x[g] for g in idx) <= k * T
    model += mip.xsum(float(cpu[g]) * (1 - x[g]) for g in range(len(acc))) <= l * T
    if np.isfinite(memory) and float(size[ok].sum()) > k * memory:
        model += mip.xsum(float(size[g]) * x[g] for g in idx) <= k * memory
    model.objective = T
    status = model.optimize()
    if status == mip.OptimizationStatus.INFEASIBLE:
        return float("inf"), None
    if status != mip.OptimizationStatus.OPTIMAL or model.objective_value is None:
        return lo, None
    share = np.array([v.x or 0.0 for v in x])
    return max(lo, float(model.objective_value) * (1 - 1e-9)), share


def _split_without_memory(acc, cpu, k: int, l: int, lo: float, ok: np.ndarray) -> tuple[float, np.ndarray]:
    """:func:`split_lp` where memory does not bind, in closed form: units move to the CPUs
    cheapest CPU time per accelerator time first, until the CPUs' load per core meets the
    accelerators' (the last one in part)."""
    share = np.where(ok, 1.0, 0.0)
    fixed = float(cpu[~ok].sum())  # units only a CPU runs
    idx = np.flatnonzero(ok)
    a, c = acc[idx], cpu[idx]
    order = np.argsort(np.where(a > 0, c / np.where(a > 0, a, 1.0), np.inf), kind="stable")
    A, C = float(a.sum()), fixed
    if C / l >= A / k:
        return max(lo, C / l, A / k), share
    for j in order:
        nA, nC = A - float(a[j]), C + float(c[j])
        if nC / l >= nA / k:  # the crossing: part of unit j moves
            f = (A / k - C / l) / (float(c[j]) / l + float(a[j]) / k)
            share[idx[j]] = 1.0 - f
            return max(lo, (C + f * float(c[j])) / l), share
        A, C = nA, nC
        share[idx[j]] = 0.0
    return max(lo, C / l), share


def unit_times(w: Workload, of_node: np.ndarray, units: int) -> np.ndarray:
    """(device, unit) -> the unit's (colour class's) time on that device, inf where the
    device cannot run all of it: every device of every accelerator class, then the cores."""
    k = w.accelerators_total
    out = np.full((len(w.devices), units), np.inf)
    for d in range(len(w.devices)):
        times = np.bincount(of_node, weights=w.device_latency(d), minlength=units)
        ok = np.ones(units, dtype=bool) if d >= k else np.bincount(
            of_node, weights=(~w.class_supported[w.device_class[d]]).astype(float), minlength=units) == 0
        out[d] = np.where(ok, times, np.inf)
    return out


def classes_lower_bound(lat: np.ndarray) -> float:
    """With several accelerator classes (``lat``: :func:`unit_times`): no plan beats its
    largest unit on that unit's cheapest device, nor the least total work spread over every
    device.  0 where a unit runs nowhere."""
    cheapest = lat.min(axis=0, initial=np.inf)
    if not np.isfinite(cheapest).all():
        return 0.0
    return float(max(cheapest.max(initial=0.0), cheapest.sum() / max(1, lat.shape[0])))


def work_bound(acc: np.ndarray, cpu: np.ndarray, k: int, l: int) -> float:
    """Every unit costs at least its cheaper device's time: the largest such cost and the
    average over all devices are bounds."""
    cheapest = np.minimum(acc if k else np.full(len(cpu), np.inf),
                          cpu if l else np.full(len(acc), np.inf))
    if not len(cheapest) or not (k + l):
        return 0.0
    return float(max(cheapest.max(), cheapest.sum() / (k + l)))


def packing_bound(acc: np.ndarray, cpu: np.ndarray, k: int, l: int, floor: float = 0.0) -> float:
    """The least T for which :func:`could_fit` holds, at least :func:`work_bound` and
    ``floor`` (a bound already proven: the search starts there, and each test takes
    seconds on 10,000 units), for units (colour classes) costing ``acc`` on each of ``k``
    accelerators (inf where not supported) and ``cpu`` on each of ``l`` CPUs."""
    lo = max(work_bound(acc, cpu, k, l), floor)
    if not np.isfinite(lo) or k == 0 or could_fit(acc, cpu, k, l, lo):
        return lo
    hi = max(lo, 1e-12)
    while not could_fit(acc, cpu, k, l, hi):  # every unit on its cheaper device fits
        hi *= 2
    for _ in range(_STEPS):
        mid = (lo + hi) / 2
        if could_fit(acc, cpu, k, l, mid):
            hi = mid
        else:
            lo = mid
    return lo


def could_fit(acc: np.ndarray, cpu: np.ndarray, k: int, l: int, T: float) -> bool:
    """False when no plan has max load <= T, by counting: the units only a CPU runs take
    CPU time first; then for each s, of the s units largest on an accelerator the CPUs
    can take at most r (the r cheapest on a CPU fit in the CPU time left), so some
    accelerator holds m = ceil((s - r) / k) of them, costing at least the m smallest."""
    eps = 1e-9 * max(T, 1.0)
    only_cpu = ~np.isfinite(acc)
    if np.any(np.minimum(acc, cpu if l else np.inf) > T + eps):
        return False
    cpu_left = l * T - float(cpu[only_cpu].sum())
    if cpu_left < -eps:
        return False
    a = acc[~only_cpu]
    c = cpu[~only_cpu] if l else np.full(len(a), np.inf)
    order = np.argsort(-a, kind="stable")
    a, c = a[order], c[order]
    prefix = np.concatenate([[0.0], np.cumsum(a)])
    cheapest_cpu: list[float] = []  # CPU costs of the units so far that fit one CPU, sorted
    for s in range(1, len(a) + 1):
        if c[s - 1] <= T + eps:
            bisect.insort(cheapest_cpu, float(c[s - 1]))
        r = _fitting(cheapest_cpu, cpu_left + eps)
        m = math.ceil((s - r) / k)
        if m >= 2 and prefix[s] - prefix[s - m] > T + eps:
            return False
    return True


def _fitting(sorted_costs: list[float], budget: float) -> int:
    """How many of the cheapest costs fit in ``budget`` together."""
    total, n = 0.0, 0
    for x in sorted_costs:
        total += x
        if total > budget:
            break
        n += 1
    return n
