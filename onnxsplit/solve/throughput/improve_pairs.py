"""Pairwise re-optimisation of a max-load plan: a large-neighbourhood search on the IP
(the throughput IP's pairs phase).

Take the most loaded device and one other, free every colour class on the two, keep the
rest where it is, and solve that small program to within PAIR_GAP: the best division of
the two devices' classes, transfers included.  No other device's load changes, so a
division whose larger load is below the old maximum is kept; the search stops at a local
optimum or when its time is up.  Where no pair helps, a group of three (the most loaded
device and two others) often still does: one device passes work on through a second.

Write-up: docs/throughput.md (ip, phase 3: Pairs).
"""

from __future__ import annotations

import itertools
import time

import mip
import numpy as np

from ...workload import Workload
from .. import evaluate
from ..milp import crossing, new_model, optimize

PAIR_GAP = 1e-3  # each division is solved this close to its optimum ...
# ... or for at most this long, per device beyond the first: op-level BERT-24 training's
# triples, after pairs at 659.68, found 658.20 in 37 s with 10 s each and nothing with 5 s
PAIR_SECONDS = 5.0


def improve(w: Workload, cl, assignment: dict[int, str], seconds: float, solver: str = "highs",
            group: int = 2) -> dict[int, str]:
    """A plan with max load at or below ``assignment``'s (the max-load objective; classes
    from :func:`..classes.build_classes`), re-divided ``group`` devices at a time."""
    start = time.perf_counter()
    names = [d.name for d in w.devices]
    cls_dev = cl.devices_of(w, assignment)
    loads = _loads(w, cls_dev, cl, names)
    improved = True
    while improved and time.perf_counter() - start < seconds:
        improved = False
        worst = int(np.argmax(loads))
        others = [int(d) for d in np.argsort(loads, kind="stable") if d != worst]  # the least loaded first
        for rest in itertools.combinations(others, group - 1):
            if time.perf_counter() - start >= seconds:
                break
            devices = (worst, *rest)
            new = _best_division(w, cl, cls_dev, devices, solver, seconds - (time.perf_counter() - start))
            if new is None:
                continue
            new_loads = _loads(w, new, cl, names)
            if new_loads[list(devices)].max() < loads[worst] * (1 - 1e-9):
                cls_dev, loads, improved = new, new_loads, True
                break
    return cl.assignment(w, cls_dev)


def _loads(w: Workload, cls_dev: np.ndarray, cl, names: list[str]) -> np.ndarray:
    """Every device's load, by the evaluator."""
    per = evaluate.max_load(w, cl.assignment(w, cls_dev)).loads
    return np.array([per.get(n, 0.0) for n in names])


def _best_division(w: Workload, cl, cls_dev: np.ndarray, devices: tuple[int, ...], solver: str, seconds: float):
    """The classes on ``devices`` divided among them to minimise the largest of their
    loads (memory, support and transfers as in the full program); None if the solver
    returns nothing."""

    k = w.num_accelerators
    free = [g for g in range(cl.n) if cls_dev[g] in devices]
    if not free:
        return None
    acc_cost, cpu_cost = cl.device_costs()
    model = new_model(solver, PAIR_GAP, False)
    x = {}
    for g in free:
        for d in devices:
            if d >= k or cl.supported[g]:
                x[g, d] = model.add_var(var_type=mip.BINARY)
        model += mip.xsum(x[g, d] for d in devices if (g, d) in x) == 1
    for d in devices:
        if d < k:
            model += mip.xsum(cl.size[g] * x[g, d] for g in free if (g, d) in x) <= w.accelerator_memory

    def on(g, d):  # x, or the fixed class's 0/1
        if (g, d) in x:
            return x[g, d]
        return 1.0 if cls_dev[g] == d else 0.0

    free_set = set(free)
    comm: dict[int, list] = {d: [] for d in devices}
    for src, members, weight, _ in cl.hyper:
        if not free_set.intersection(members):
            continue
        for d in devices:
            if d >= k:
                continue
            comm[d].append(weight * crossing(model, src, members, lambda g: on(g, d)))
    T = model.add_var(lb=0.0)
    for d in devices:
        cost = acc_cost if d < k else cpu_cost
        model += T >= mip.xsum(float(cost[g]) * x[g, d] for g in free if (g, d) in x) + mip.xsum(comm[d])
    model.objective = T
    model.start = [(var, 1.0 if cls_dev[g] == d else 0.0) for (g, d), var in x.items()]
    optimize(model, max(0.5, min(seconds, PAIR_SECONDS * (len(devices) - 1))))
    if model.num_solutions == 0:
        return None
    new = cls_dev.copy()
    for (g, d), var in x.items():
        if var.x is not None and var.x > 0.5:
            new[g] = d
    return new
