"""Plan finishing: an assignment scored for both objectives, checked, and wrapped as a Plan.

Every baseline and every composed method ends here, so a plan's status says what the
independent evaluator found: "feasible" only where :func:`evaluate.check` finds nothing.

Write-up: docs/README.md (The model the solvers optimise: validity), docs/baselines.md.
"""

from __future__ import annotations

import time

from ..errors import SolveError
from ..plan import Plan
from ..workload import Workload
from . import evaluate

BOTH = ("throughput", "latency")


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


def need_devices(workload: Workload, acc: bool = False, cpu: bool = False, method: str = "") -> None:
    if acc and workload.accelerators_total == 0:
        raise SolveError(f"method '{method}' needs an accelerator; the workload has none")
    if cpu and workload.num_cpus == 0:
        raise SolveError(f"method '{method}' needs a CPU core; the workload has none")


def status_label(solved: bool, gap: float | None) -> str:
    """"optimal" once the gap is closed, by the solver or by a bound of our own; otherwise
    "feasible" where the solver stopped within its tolerance (it reports OPTIMAL then),
    or "time_limit" where time ran out."""
    if gap is not None and gap <= 1e-6:
        return "optimal"
    return "feasible" if solved else "time_limit"
