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


def max_load_lower_bound(w: Workload) -> float:
    """The larger of :func:`work_bound` and :func:`packing_bound`: no plan's max load
    (forward plus backward on one device) is below it."""
    return packing_bound(*build_classes(w).device_costs(), w.num_accelerators, w.num_cpus)


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


def packing_bound(acc: np.ndarray, cpu: np.ndarray, k: int, l: int) -> float:
    """The least T for which :func:`could_fit` holds, at least :func:`work_bound`, for
    units (colour classes) costing ``acc`` on each of ``k`` accelerators (inf where not
    supported) and ``cpu`` on each of ``l`` CPUs."""
    lo = work_bound(acc, cpu, k, l)
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
