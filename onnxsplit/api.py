"""Python entry points; the CLI is a thin layer over these."""

from __future__ import annotations

from pathlib import Path

from .errors import OnnxsplitError, SplitError
from .plan import Plan, read_split
from .workload import Workload

OBJECTIVES = ("throughput", "latency")
METHODS = {
    # method -> objectives it optimises
    "dp": ("throughput",),
    "dp_linear": ("throughput",),
    "ip": ("throughput",),
}


def load_workload(path: str | Path) -> Workload:
    return Workload.from_paper_json(path)


def solve(workload: Workload, objective: str = "throughput", method: str = "dp", *,
          contiguous: bool = False, split_passes: bool = False, time_limit: float = 60.0,
          solver: str = "highs", warm_start: bool = True) -> Plan:
    """Place every node; the returned plan has been re-scored and checked by the evaluator.

    ``ip`` options: ``contiguous`` (every device's forward part convex), ``split_passes``
    (training: minimise max forward load + max backward load), ``time_limit`` seconds,
    ``solver`` (highs | cbc), ``warm_start`` from the DP's plan.
    """
    if objective not in OBJECTIVES:
        raise OnnxsplitError(f"unknown objective '{objective}' (choose from {', '.join(OBJECTIVES)})")
    if method not in METHODS:
        raise OnnxsplitError(f"unknown method '{method}' (choose from {', '.join(METHODS)})")
    if objective not in METHODS[method]:
        able = [m for m, objs in METHODS.items() if objective in objs]
        hint = f"methods for {objective}: {', '.join(able)}" if able else f"no method optimises {objective} yet"
        raise OnnxsplitError(f"method '{method}' does not optimise {objective} ({hint})")
    from .solve import dp

    if method in ("dp", "dp_linear"):
        return dp.solve(workload, linear_only=(method == "dp_linear"))
    from .solve import ip

    start = None
    if warm_start and not split_passes:
        seed = dp.solve(workload, linear_only=workload.n > 2000)
        start = seed.assignment or None
    return ip.solve_throughput(workload, contiguous=contiguous, split_passes=split_passes,
                               time_limit=time_limit, solver=solver, warm_start=start)


def evaluate_split(workload: Workload, assignment: dict[int, str], objective: str = "throughput") -> dict:
    """Score an assignment and list its violations.

    A split that names more devices than the workload has (the paper's bert24 latency
    expert split uses 6 accelerators of 5) is scored on a widened device set, and the
    over-count is reported as a violation rather than refused.
    """
    from .solve import evaluate

    if objective not in OBJECTIVES:
        raise OnnxsplitError(f"unknown objective '{objective}' (choose from {', '.join(OBJECTIVES)})")
    counts = {"acc": workload.num_accelerators, "cpu": workload.num_cpus}
    needed = dict(counts)
    for dev in assignment.values():
        kind, num = dev[:3], dev[3:]
        if kind not in counts or not num.isdigit():
            raise SplitError(f"unknown device '{dev}' (devices are acc0.., cpu0..)")
        needed[kind] = max(needed[kind], int(num) + 1)
    violations = [f"devices: the split uses {needed[kind]} {label}, the workload has {counts[kind]}"
                  for kind, label in (("acc", "accelerators"), ("cpu", "CPU cores")) if needed[kind] > counts[kind]]
    scored_on = workload
    if violations:
        scored_on = workload.replace(num_accelerators=needed["acc"], num_cpus=needed["cpu"])
    result = evaluate.score(scored_on, assignment, objective)
    violations += evaluate.check(scored_on, assignment)
    return {
        "objective": objective,
        "value": result.value,
        "loads": result.loads,
        "violations": violations,
        "valid": not violations,
    }


def read_split_file(path: str | Path, workload: Workload) -> dict[int, str]:
    return read_split(path, workload)
