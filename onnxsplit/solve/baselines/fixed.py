"""Fixed placements: ``one_accelerator``, ``all_cpu``, ``ort_default`` (what onnxruntime
does: every node its accelerator EP supports there, the rest on the CPU) and ``given``
(a user's split file), scored and checked like any plan.  Write-up: docs/baselines.md.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...errors import SolveError
from ...plan import Plan, read_split
from ...workload import Workload
from .. import evaluate
from ..finish import finish, need_devices


def fixed(workload: Workload, method: str, objective: str = "throughput", *,
          split: str | Path | dict | None = None) -> Plan:
    """``one_accelerator``, ``all_cpu``, ``ort_default`` or ``given``."""
    start = time.perf_counter()
    ids = [int(x) for x in workload.ids]
    details: dict = {}
    if method == "one_accelerator":
        # the paper's -oneFpga: everything on one accelerator (support and memory are
        # checked, not avoided: the reference ignores both)
        need_devices(workload, acc=True, method=method)
        assignment = {i: "acc0" for i in ids}
    elif method == "all_cpu":
        need_devices(workload, cpu=True, method=method)
        assignment = {i: "cpu0" for i in ids}
    elif method == "ort_default":
        # ONNX Runtime: a node runs on the accelerator's EP when that EP supports it, else on
        # the CPU EP.  A colour class must share a device, so a class with any unsupported
        # node runs on the CPU.  ORT does not split by memory: too big is infeasible.
        need_devices(workload, acc=True, method=method)
        unsupported_class = np.zeros(int(workload.color_class.max(initial=-1)) + 1, dtype=bool)
        np.logical_or.at(unsupported_class, workload.color_class, ~workload.supported)
        if unsupported_class.any():
            need_devices(workload, cpu=True, method=method)
        on_cpu = unsupported_class[workload.color_class]
        assignment = {i: ("cpu0" if c else "acc0") for i, c in zip(ids, on_cpu)}
    elif method == "given":
        assignment = split if isinstance(split, dict) else read_split(split, workload)
        return _given(workload, objective, assignment, start)
    else:
        raise SolveError(f"unknown fixed placement '{method}'")
    return finish(workload, objective, method, assignment, start, details=details)


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
