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
        assignment = {i: _best_single_accelerator(workload, objective) for i in ids}
    elif method == "all_cpu":
        need_devices(workload, cpu=True, method=method)
        assignment = {i: "cpu0" for i in ids}
    elif method == "ort_default":
        # ONNX Runtime: a node runs on the accelerator's EP when that EP supports it, else on
        # the CPU EP.  A colour class must share a device, so a class with any unsupported
        # node runs on the CPU.  ORT does not split by memory: too big is infeasible.
        # With several classes, the execution providers are tried in the order the classes
        # are listed (as a session's provider list): the first that runs the whole class.
        need_devices(workload, acc=True, method=method)
        label = workload.color_class
        first = [workload.devices[int(np.flatnonzero(workload.device_class == c)[0])].name
                 for c, count in enumerate(workload.class_counts) if count]
        runs = [c for c, count in enumerate(workload.class_counts) if count]
        device_of = np.full(int(label.max(initial=-1)) + 1, -1, dtype=np.int64)
        for j, c in reversed(list(enumerate(runs))):
            unsupported = np.zeros(len(device_of), dtype=bool)
            np.logical_or.at(unsupported, label, ~workload.class_supported[c])
            device_of[~unsupported] = j
        if (device_of < 0).any():
            need_devices(workload, cpu=True, method=method)
        assignment = {i: (first[device_of[c]] if device_of[c] >= 0 else "cpu0")
                      for i, c in zip(ids, label.tolist())}
    elif method == "given":
        assignment = split if isinstance(split, dict) else read_split(split, workload)
        return _given(workload, objective, assignment, start)
    else:
        raise SolveError(f"unknown fixed placement '{method}'")
    return finish(workload, objective, method, assignment, start, details=details)


def _best_single_accelerator(w: Workload, objective: str) -> str:
    """``acc0`` in the paper's model; with several classes, the first device of the class
    that runs the whole model best (a class that cannot hold or run it comes last)."""
    if not w.accelerator_classes:
        return "acc0"
    ranked = []
    for c, count in enumerate(w.class_counts):
        if count:
            name = w.devices[int(np.flatnonzero(w.device_class == c)[0])].name
            whole = {int(i): name for i in w.ids}
            ranked.append((bool(evaluate.check(w, whole)), evaluate.score(w, whole, objective).value, c, name))
    return min(ranked)[3]


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
