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
    free = [g for g in range(cl.n) if cls_dev[g] in devices]
    if not free:
        return None
    return _redivide(w, cl, cls_dev, {g: devices for g in free}, solver,
                     max(0.5, min(seconds, PAIR_SECONDS * (len(devices) - 1))))


def shift_boundaries(w: Workload, cl, assignment: dict[int, str], seconds: float,
                     solver: str = "highs") -> dict[int, str]:
    """A plan with max load at or below ``assignment``'s: every boundary between devices
    moved at once.  The classes within RADII[i] tensors of a boundary are freed, each
    to the devices found that near it or a CPU, the rest kept, and the program re-solved
    over every device; where it helps the new boundaries are freed again, where not the
    next radius is tried.  Pairs and triples move work between two or three devices while
    the others wait, so balance that needs every device to pass a little on to the next
    escapes them: op-level BERT-48 training, after pairs at 1252.07, 1249.41 in 9 s (its
    first program 2 s, then nothing better at either radius).  Where the first radius frees
    too many (a large graph cut in many places), only the classes next to a boundary: a
    10,000-node graph of varied blocks on 8 accelerators, 60 s, 117.28 -> 116.98 in 4.8 s
    (2,499 classes, 6,826 binaries)."""
    start = time.perf_counter()
    names = [d.name for d in w.devices]
    cls_dev = cl.devices_of(w, assignment)
    best = _loads(w, cls_dev, cl, names).max()
    members = _tensor_classes(cl)
    radii, most = list(RADII), WINDOW_MOST
    while radii and (left := seconds - (time.perf_counter() - start)) > 0.5:
        allowed = _near_boundaries(w, cl, cls_dev, members, radii[0])
        size = sum(len(d) for d in allowed.values())
        if size > most and most == WINDOW_MOST:
            # many boundaries (a large graph): the classes next to them only, in a larger program
            radii, most = [1], WIDE_MOST
            continue
        if not allowed or size > most:
            break
        new = _redivide(w, cl, cls_dev, allowed, solver, min(left, WINDOW_SECONDS))
        value = _loads(w, new, cl, names).max() if new is not None else best
        if value < best * (1 - 1e-9):
            cls_dev, best = new, value
        else:
            radii.pop(0)
    return cl.assignment(w, cls_dev)


def _tensor_classes(cl) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(CSR pointer, the classes of each tensor -- its members, the source among them --,
    the tensor of each entry)."""
    _, ptr, members, _ = cl.hyper_arrays()
    return ptr, members, np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))


def _near_boundaries(w: Workload, cl, cls_dev: np.ndarray, members, radius: int) -> dict[int, tuple[int, ...]]:
    """Free class -> the devices it may take: those of the classes within ``radius``
    tensors of it, and the CPUs (accelerators only where it is supported); a class is free
    where that is more than its own device."""
    ptr, classes, owner = members
    n_dev = len(w.devices)
    near = np.zeros((cl.n, n_dev), dtype=bool)
    near[np.arange(cl.n), cls_dev] = True
    for _ in range(radius):
        if not len(classes):
            break
        per_tensor = np.logical_or.reduceat(near[classes], ptr[:-1], axis=0)
        reached = np.zeros_like(near)
        np.logical_or.at(reached, classes, per_tensor[owner])
        near |= reached
    boundary = near.sum(axis=1) > 1
    near[:, w.num_accelerators:] = True
    near[~cl.supported, :w.num_accelerators] = False
    return {int(g): tuple(int(d) for d in np.flatnonzero(near[g])) for g in np.flatnonzero(boundary)}


def _redivide(w: Workload, cl, cls_dev: np.ndarray, allowed: dict[int, tuple[int, ...]], solver: str,
              seconds: float):
    """The free classes (``allowed``: class -> the devices it may take) placed to minimise
    the largest load of the devices they may take, every other class where it is (memory,
    support and transfers as in the full program); None if the solver returns nothing.
    Every tensor that crosses a boundary must have a free class beside each kept one on
    those devices (pairs free whole devices, shift_boundaries every class at a boundary):
    the kept classes' transfers are then all in the program."""
    k = w.num_accelerators
    acc_cost, cpu_cost = cl.device_costs()
    devices = list(dict.fromkeys(d for ds in allowed.values() for d in ds))
    model = new_model(solver, PAIR_GAP, False)
    x = {}
    for g, ds in allowed.items():
        for d in ds:
            if d >= k or cl.supported[g]:
                x[g, d] = model.add_var(var_type=mip.BINARY)
        model += mip.xsum(x[g, d] for d in ds if (g, d) in x) == 1
    kept = np.ones(cl.n, dtype=bool)
    kept[list(allowed)] = False
    for d in devices:
        if d < k:
            fixed = float(cl.size[kept & (cls_dev == d)].sum())
            model += fixed + mip.xsum(cl.size[g] * x[g, d] for g in allowed if (g, d) in x) <= w.accelerator_memory

    def on(g, d):  # x, or the kept class's 0/1 (a free class off its devices: 0)
        if (g, d) in x:
            return x[g, d]
        return 1.0 if kept[g] and cls_dev[g] == d else 0.0

    comm: dict[int, list] = {d: [] for d in devices}
    for src, members, weight, _ in cl.hyper:  # (the source is among the members)
        if kept[list(members)].all():
            continue
        for d in devices:
            if d < k and any((g, d) in x for g in members):
                comm[d].append(weight * crossing(model, src, members, lambda g: on(g, d)))
    T = model.add_var(lb=0.0)
    for d in devices:
        cost = acc_cost if d < k else cpu_cost
        fixed = float(cost[kept & (cls_dev == d)].sum())
        model += T >= fixed + mip.xsum(float(cost[g]) * x[g, d] for g in allowed if (g, d) in x) + mip.xsum(comm[d])
    model.objective = T
    model.start = [(var, 1.0 if cls_dev[g] == d else 0.0) for (g, d), var in x.items()]
    optimize(model, max(0.5, seconds))
    if model.num_solutions == 0:
        return None
    new = cls_dev.copy()
    for (g, d), var in x.items():
        if var.x is not None and var.x > 0.5:
            new[g] = d
    return new


RADII = (2, 3)  # tensors from a boundary, in turn, for the classes shift_boundaries frees
WINDOW_SECONDS = 10.0  # at most, for each of its programs (op-level BERT-48 training: 2.1 s, 5.7 s)
WINDOW_MOST = 6000  # binaries, at most, in its program at RADII ...
WIDE_MOST = 12000  # ... and at radius 1, where RADII's first is over WINDOW_MOST
