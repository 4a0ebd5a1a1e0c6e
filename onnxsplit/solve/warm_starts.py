"""The integer programs' warm starts: the best plan of the quick methods (those that take
seconds at most on any graph; the exact DP is not among them: a real operator graph can
have millions of ideals), for latency also the plan composed along cut vertices, polished.

The candidates and the function that runs one come from the method registry
(:func:`.methods.quick`), which calls in here.

Write-up: docs/throughput.md (ip), docs/latency.md (ip: Warm start, Polish).
"""

from __future__ import annotations

import time
from typing import Callable

from ..errors import OnnxsplitError
from ..plan import Plan
from ..workload import Workload
from . import anytime, evaluate
from .latency import series
from .latency.polish import polish_latency

WARM_START_SHARE = 0.3  # of the time limit, at most, for the quick methods' warm starts
SERIES_SHARE = 0.25  # of the latency IP's time limit, at most, for the plans composed along cut vertices
POLISH_SHARE = 0.05  # of the time limit, at most, for the local search on the best latency warm start

#: runs one quick method: (workload, objective, method name, time limit) -> plan
Solve = Callable[[Workload, str, str, float], Plan]


def best_quick_plan(workload: Workload, candidates, objective: str, time_limit: float,
                    solve: Solve, ip_limit: float | None = None) -> tuple[dict[int, str] | None, float]:
    """(the best valid plan among the candidate methods' or None, its value), each method
    given what is left of ``time_limit`` (on a large graph they are not so quick; one with
    a share, at most that share of ``ip_limit``), the first plan offered as soon as it is
    known.  ``candidates``: (method, the objective it runs for, its share or None)."""
    best, best_value = None, float("inf")
    deadline = time.perf_counter() + time_limit
    for method, objective_of_method, share in candidates:
        left = deadline - time.perf_counter()
        if left <= 0 and best is not None:
            break
        if share is not None and ip_limit is not None:
            left = min(left, share * ip_limit)
        try:
            plan = solve(workload, objective_of_method, method, max(left, 0.01))
        except OnnxsplitError:
            continue
        if plan.assignment and not evaluate.check(workload, plan.assignment):
            value = evaluate.score(workload, plan.assignment, objective).value
            if value < best_value:
                best, best_value = plan.assignment, value
                anytime.offer(best, f"warm start from {method}")
    return best, best_value


def throughput(workload: Workload, time_limit: float, candidates, solve: Solve) -> dict[int, str] | None:
    """The best valid max-load among the quick throughput methods' plans (at most
    WARM_START_SHARE of ``time_limit``)."""
    return best_quick_plan(workload, candidates, "throughput", WARM_START_SHARE * time_limit, solve, time_limit)[0]


def latency(workload: Workload, time_limit: float, candidates, solve: Solve) -> dict[int, str] | None:
    """The best valid latency among the quick methods' plans (the latency DP over
    topological orders, the greedy placements, the splits of the linearized max-load DP
    and PipeDream) and the plans composed along the graph's cut vertices (at most
    SERIES_SHARE of ``time_limit``), polished by moving colour classes one at a time (at
    most POLISH_SHARE of it)."""
    best, best_value = best_quick_plan(workload, candidates, "latency", WARM_START_SHARE * time_limit, solve,
                                       time_limit)
    if workload.multi_class:  # (the composed plans and the polish read one accelerator class)
        return best
    composed = series.series_split(workload, SERIES_SHARE * time_limit)
    if composed is not None and composed.value < best_value:
        best = composed.assignment
    return polish_latency(workload, best, POLISH_SHARE * time_limit)[0] if best else best
