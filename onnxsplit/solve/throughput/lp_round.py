"""``lp_round``: the transfer-free LP relaxation (:func:`.bounds.split_lp`), rounded to a
plan, for large graphs whose accelerators cannot hold the model.

Where memory binds, the CPUs should take the units that hold the most weight for the least
CPU time, wherever they are, which a chain of ideals cannot do.  The LP says which: a unit
with a small share on the accelerators goes to the CPUs (more move, by weight per CPU
time, until the accelerators' memory holds the rest); each kind then takes its units as
contiguous runs in topological order.  Several thresholds are tried, the best plan kept;
its lower bound is the LP's (with :func:`.bounds.packing_bound`).

Write-up: docs/throughput.md (lp_round).
"""

from __future__ import annotations

import time

import numpy as np

from ...plan import Plan, gap_of
from ...workload import Workload
from .. import anytime, evaluate
from ..classes import build_classes
from ..finish import finish
from .bounds import lifted, split_lp

THRESHOLDS = (0.5, 0.25, 0.75, 0.9, 0.1)  # a unit with a smaller share goes to the CPUs
TINY = 1e-3  # of the LP bound: a unit this cheap on a CPU stays on the accelerators
ROOM = 0.97  # of the accelerators' memory, at most, that units moved back may fill (runs fragment it)


def lp_round(w: Workload, time_limit: float = 60.0) -> Plan:
    start = time.perf_counter()
    cl = build_classes(w)
    acc, cpu = cl.device_costs()
    k, l, memory = w.num_accelerators, w.num_cpus, w.accelerator_memory
    bound, share = split_lp(acc, cpu, cl.size, k, l, memory)
    bound = lifted(acc, cpu, k, l, bound)
    if np.isfinite(bound):
        anytime.prove(bound)
    if share is None:  # no accelerator or no CPU: everything on the one kind, in runs
        share = np.ones(cl.n) if l == 0 else np.zeros(cl.n)
    best, best_value = None, np.inf
    for threshold in THRESHOLDS:
        if time.perf_counter() - start > time_limit:
            break
        devices = _rounded(share, threshold, acc, cpu, cl.size, k, l, memory, bound)
        if devices is None:
            continue
        assignment = cl.assignment(w, devices)
        if evaluate.check(w, assignment):
            continue
        value = evaluate.max_load(w, assignment).value
        if value < best_value:
            best, best_value = assignment, value
            anytime.offer(assignment, f"the LP rounded at {threshold}")
    if best is None:
        return Plan("throughput", "lp_round", "infeasible" if not np.isfinite(bound) else "time_limit", None, {},
                    seconds=time.perf_counter() - start, details={"lp_bound": bound})
    plan = finish(w, "throughput", "lp_round", best, start, details={"lp_bound": bound})
    lb = min(bound, plan.value) if np.isfinite(bound) and bound > 0 else None
    plan.lower_bound, plan.gap = lb, gap_of(plan.value, lb)
    return plan


def _rounded(share, threshold: float, acc, cpu, size, k: int, l: int, memory: float,
             bound: float) -> np.ndarray | None:
    """unit -> device index (accelerators 0..k-1, CPUs k..k+l-1), or None where the
    accelerators cannot hold what the CPUs cannot take."""
    n = len(share)
    # a unit that costs a CPU next to nothing would only add transfers there (the LP does
    # not see them): it stays with the accelerators' runs
    tiny = cpu < TINY * bound if np.isfinite(bound) else np.zeros(n, dtype=bool)
    on_cpu = ((share < threshold) & ~tiny) | ~np.isfinite(acc)
    if l == 0:
        if on_cpu.any():
            return None
    elif k == 0:
        on_cpu[:] = True
    # memory: the units holding most weight per CPU time move to the CPUs until the rest fits
    if k and l and np.isfinite(memory):
        over = float(size[~on_cpu].sum()) - k * memory
        if over > 0:
            ratio = np.where(~on_cpu, size / np.maximum(cpu, 1e-12), -np.inf)
            for g in np.argsort(-ratio, kind="stable"):
                if over <= 0 or ratio[g] == -np.inf:
                    break
                on_cpu[g] = True
                over -= float(size[g])
    # time: where the CPUs got more than the LP's load, the units dearest on a CPU per
    # accelerator time go back, as long as the accelerators' memory holds them
    if k and l and np.isfinite(bound):
        excess = float(cpu[on_cpu].sum()) - l * bound
        room = ROOM * k * memory - float(size[~on_cpu].sum()) if np.isfinite(memory) else np.inf
        ratio = np.where(on_cpu & np.isfinite(acc), cpu / np.maximum(acc, 1e-12), -np.inf)
        for g in np.argsort(-ratio, kind="stable"):
            if excess <= 0 or ratio[g] == -np.inf:
                break
            if size[g] <= room:
                on_cpu[g] = False
                room -= float(size[g])
                excess -= float(cpu[g])
    devices = np.full(n, -1, dtype=np.int64)
    if k:
        homeless = _runs(np.flatnonzero(~on_cpu), acc, size, k, memory, devices, 0)
        if homeless:  # the runs left no room for them: to the CPUs, where there are any
            if not l:
                return None
            on_cpu[homeless] = True
    if l:
        _runs(np.flatnonzero(on_cpu), cpu, np.zeros(n), l, np.inf, devices, k)
    return devices if (devices >= 0).all() else None


def _runs(units: np.ndarray, cost: np.ndarray, size: np.ndarray, count: int, memory: float,
          devices: np.ndarray, first: int) -> list[int]:
    """``units`` (in topological order) as ``count`` contiguous runs, each up to an equal
    share of their cost and within ``memory``; what a run cannot hold goes to the device
    of the kind with room and the least load.  Returns the units that fit nowhere."""
    target = float(cost[units].sum()) / count
    load, used = np.zeros(count), np.zeros(count)
    d = 0
    homeless = []
    for g in units:
        while d < count - 1 and (load[d] + cost[g] > target * 1.02 and load[d] > 0 or
                                 used[d] + size[g] > memory * (1 + 1e-12)):
            d += 1
        if used[d] + size[g] > memory * (1 + 1e-12):
            room = np.flatnonzero(used + size[g] <= memory * (1 + 1e-12))
            if not len(room):
                homeless.append(int(g))
                continue
            e = int(room[np.argmin(load[room])])
        else:
            e = d
        devices[g] = first + e
        load[e] += cost[g]
        used[e] += size[g]
    return homeless
