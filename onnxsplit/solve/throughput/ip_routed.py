"""The throughput integer program on several accelerator classes with priced links: what
``ip`` and ``ip_contiguous`` solve on a workload beyond the paper's model.

x[g, d] = 1 when colour class g runs on device d, each device at its class's latencies
and memory.  For every tensor: a receiving accelerator pays its host link, or where the
sender's class has a peer link to its own, the direct copy (as does the sender, once per
such receiver); a sender pays its host link once when any receiver is not a peer.  The
indicators are bounded from below only: every price is >= 0, so an optimum has them
exact.  Every load <= T; minimise T.  The plan is re-scored by the evaluator.

Write-up: docs/throughput.md (Several accelerator classes).
"""

from __future__ import annotations

import time

import mip
import numpy as np

from ...errors import OnnxsplitError
from ...plan import Plan, gap_of
from ...workload import Workload
from .. import anytime, evaluate
from ..classes import build_classes
from ..finish import status_label
from ..milp import add_contiguity, crossing, finite, new_model, optimize
from . import dp_classes
from .bounds import classes_lower_bound, unit_times


def tensor_groups(w: Workload, of_node: np.ndarray) -> list[tuple[int, tuple[int, ...], float, int]]:
    """(source unit, consumer units, total c(u), number of tensors): tensors with the same
    source and consumers together (each pays the same transfers)."""
    merged: dict[tuple, list] = {}
    for u, succ in enumerate(w.successors):
        src = int(of_node[u])
        consumers = tuple(sorted({int(of_node[t]) for t in succ} - {src}))
        if consumers:
            entry = merged.setdefault((src, consumers), [0.0, 0])
            entry[0] += float(w.out_cost[u])
            entry[1] += 1
    return [(s, m, c, n) for (s, m), (c, n) in merged.items()]


def solve(w: Workload, *, contiguous: bool = False, split_passes: bool = False, time_limit: float = 60.0,
          solver: str = "highs", warm_start: dict[int, str] | None = None, gap: float = 0.001,
          threads: int | None = None, verbose: bool = False) -> Plan:
    """Min max-load over every device of every class, warm-started from the best of the
    given plan and the class-aware DP's linearized plan."""
    if split_passes:
        raise OnnxsplitError("--split-passes takes the paper's model only (one accelerator class, "
                             "transfers at c(u))")
    began = time.perf_counter()
    method = "ip_contiguous" if contiguous else "ip"
    cl = build_classes(w)
    of_node = cl.of_node
    k, ndev = w.accelerators_total, len(w.devices)
    units = cl.n
    lat = unit_times(w, of_node, units)
    can = np.isfinite(lat)
    model = new_model(solver, gap, verbose)
    if threads:
        model.threads = threads
    x = {(g, d): model.add_var(var_type=mip.BINARY) for d in range(ndev) for g in range(units) if can[d, g]}
    for g in range(units):
        model += mip.xsum(x[g, d] for d in range(ndev) if (g, d) in x) == 1
    for d in range(k):
        model += mip.xsum(cl.size[g] * x[g, d] for g in range(units) if (g, d) in x) <= float(
            w.class_memory[w.device_class[d]])

    def xv(g, d):
        return x.get((g, d), 0)

    def on_cpu(g):
        return mip.xsum(x[g, d] for d in range(k, ndev))

    loads = {d: [mip.xsum(float(lat[d, g]) * x[g, d] for g in range(units) if (g, d) in x)] for d in range(ndev)}
    cls = w.device_class
    peers = {d: [b for b in range(k) if b != d and (int(cls[d]), int(cls[b])) in w.peer_links] for d in range(k)}
    for src, members, cost, count in tensor_groups(w, of_node):
        scale_lat = w.host_links

        def staged(d):
            return count * scale_lat[cls[d], 1] + scale_lat[cls[d], 0] * cost

        needs = {}  # d -> "d holds a consumer" (lower bound)
        for d in range(k):
            if peers[d] or any(peers[b] for b in range(k)):
                r = model.add_var(lb=0.0, ub=1.0)
                for m in members:
                    model += r >= xv(m, d)
                needs[d] = r
        for d in range(k):
            if not peers[d]:  # no peer at this device: a plain crossing at its host price
                y = crossing(model, src, (src,) + members, lambda g: xv(g, d))
                loads[d].append(staged(d) * y)
                continue
            # receiving: staged unless the sender sits on a peer device
            recv = model.add_var(lb=0.0, ub=1.0)
            model += recv >= needs[d] - xv(src, d) - mip.xsum(xv(src, b) for b in peers[d])
            # sending: staged once if a receiver is a CPU or an accelerator that is not a peer
            send = model.add_var(lb=0.0, ub=1.0)
            if w.num_cpus:
                cpu_needs = model.add_var(lb=0.0, ub=1.0)
                for m in members:
                    model += cpu_needs >= on_cpu(m)
                model += send >= xv(src, d) + cpu_needs - 1
            for b in range(k):
                if b != d and b not in peers[d]:
                    model += send >= xv(src, d) + needs[b] - 1
            loads[d] += [staged(d) * recv, staged(d) * send]
            for b in peers[d]:  # a direct copy d -> b, paid at both ends
                price = count * w.peer_links[int(cls[d]), int(cls[b])][1] + \
                    w.peer_links[int(cls[d]), int(cls[b])][0] * cost
                copy = model.add_var(lb=0.0, ub=1.0)
                model += copy >= xv(src, d) + needs[b] - 1
                loads[d].append(price * copy)
                loads[b].append(price * copy)
    floor = classes_lower_bound(lat)
    anytime.prove(floor)
    T = model.add_var(lb=floor)
    for d in range(ndev):
        model += T >= mip.xsum(loads[d])
    if contiguous:
        add_contiguity(model, w, of_node, x, ndev)
    model.objective = T
    start, start_value = _best_start(w, warm_start, contiguous, time_limit * 0.2)
    if start is not None:
        chosen = cl.devices_of(w, start)
        model.start = [(var, 1.0 if chosen[g] == d else 0.0) for (g, d), var in x.items()]
    status = optimize(model, max(1.0, time_limit - (time.perf_counter() - began)))
    details = {"solver": solver, "classes": units, "device_classes": list(w.class_names),
               "contiguous": contiguous}
    assignment, value = start, start_value
    if model.num_solutions:
        chosen = np.full(units, -1, dtype=np.int64)
        for (g, d), var in x.items():
            if var.x is not None and var.x > 0.5:
                chosen[g] = d
        found = cl.assignment(w, chosen)
        if not evaluate.check(w, found, contiguity="convex" if contiguous else "none"):
            found_value = evaluate.max_load(w, found).value
            if found_value < value:
                assignment, value = found, found_value
    seconds = time.perf_counter() - began
    bound = finite(model.objective_bound)
    bound = max(bound, floor) if bound is not None else (floor or None)
    if assignment is None:
        st = "infeasible" if status == mip.OptimizationStatus.INFEASIBLE else "time_limit"
        return Plan("throughput", method, st, None, {}, lower_bound=bound, seconds=seconds, details=details)
    lb = min(bound, value) if bound else None
    g = gap_of(value, lb)
    return Plan("throughput", method, status_label(status == mip.OptimizationStatus.OPTIMAL, g), value,
                assignment, lower_bound=lb, gap=g, seconds=seconds, details=details)


def _best_start(w: Workload, given, contiguous: bool, seconds: float):
    """(plan, max load) of the best valid start: the given one, the DP's linearized plan
    (a chain of ideals is convex, so it serves the contiguous program too)."""
    best, value = None, np.inf
    candidates = [given] if given else []
    lin = dp_classes.solve(w, linear_only=True, time_limit=max(1.0, seconds))
    if lin.value is not None:
        candidates.append(lin.assignment)
    for a in candidates:
        if a and not evaluate.check(w, a, contiguity="convex" if contiguous else "none"):
            v = evaluate.max_load(w, a).value
            if v < value:
                best, value = a, v
    return best, value
