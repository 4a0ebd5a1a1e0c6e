"""Python entry points; the CLI is a thin layer over these."""

from __future__ import annotations

import time
from pathlib import Path

from .errors import OnnxsplitError, SolveError
from .plan import Plan, read_split
from .workload import Workload

OBJECTIVES = ("throughput", "latency")
METHODS = {
    # method -> objectives it serves: optimises, or (fixed placements) is scored for
    "dp": ("throughput",),
    "dp_linear": ("throughput",),
    "dp_ring": ("throughput",),
    "ip": ("throughput", "latency"),
    "latency_dp": ("latency",),
    "latency_series": ("latency",),
    # baselines (onnxsplit/solve/baselines.py): the paper's, and what users get today
    "greedy": ("latency", "throughput"),
    "local_search": ("throughput",),
    "pipedream": ("throughput",),
    "scotch": ("throughput",),
    "metis": ("throughput",),
    "one_accelerator": ("throughput", "latency"),
    "all_cpu": ("throughput", "latency"),
    "given": ("throughput", "latency"),
    "ort_default": ("throughput", "latency"),
    "hetero_greedy": ("throughput", "latency"),
}
BASELINES = ("greedy", "local_search", "pipedream", "scotch", "metis", "one_accelerator", "all_cpu", "given",
             "ort_default", "hetero_greedy")


def load_workload(path: str | Path) -> Workload:
    return Workload.from_paper_json(path)


def solve(workload: Workload, objective: str = "throughput", method: str = "dp", *, seed: int = 0,
          restarts: int = 10, split: str | Path | dict | None = None, contiguous: bool = False,
          split_passes: bool = False, pieces: int = 1, time_limit: float = 60.0, solver: str = "highs",
          warm_start: bool = True) -> Plan:
    """Place every node; the returned plan has been re-scored and checked by the evaluator.

    ``seed`` and ``restarts`` steer the randomised baselines (local_search, scotch, metis);
    ``split`` is the split file (or node id -> device dict) that method ``given`` scores.
    A baseline's plan that breaks memory, support or a colour class comes back with status
    "infeasible" and its problems in ``details["violations"]``.

    ``ip`` options: ``contiguous`` (throughput: every device's part convex), ``split_passes``
    (training: minimise max forward load + max backward load), ``pieces`` (latency: calls per
    accelerator), ``time_limit`` seconds (also bounds ``dp``), ``solver`` (highs | cbc),
    ``warm_start`` from the best of the quick methods (QUICK_THROUGHPUT, QUICK_LATENCY).
    """
    if objective not in OBJECTIVES:
        raise OnnxsplitError(f"unknown objective '{objective}' (choose from {', '.join(OBJECTIVES)})")
    if method not in METHODS:
        raise OnnxsplitError(f"unknown method '{method}' (choose from {', '.join(METHODS)})")
    if objective not in METHODS[method]:
        able = [m for m, objs in METHODS.items() if objective in objs]
        hint = f"methods for {objective}: {', '.join(able)}" if able else f"no method optimises {objective} yet"
        raise OnnxsplitError(f"method '{method}' does not optimise {objective} ({hint})")
    from .solve import anytime

    plan = anytime.within(time_limit, workload, objective, method, lambda: _solve(
        workload, objective, method, seed=seed, restarts=restarts, split=split, contiguous=contiguous,
        split_passes=split_passes, pieces=pieces, time_limit=time_limit, solver=solver,
        warm_start=warm_start))
    return plan


def _solve(workload: Workload, objective: str, method: str, *, seed: int, restarts: int, split,
           contiguous: bool, split_passes: bool, pieces: int, time_limit: float, solver: str,
           warm_start: bool) -> Plan:
    if not workload.n:
        raise SolveError("the workload has no nodes")
    if method in BASELINES:
        from .solve import baselines

        return baselines.solve(workload, method, objective, seed=seed, restarts=restarts, split=split,
                               time_limit=time_limit)
    from .solve import anytime, dp

    if method == "latency_dp":
        from .solve import segments

        return segments.sequence_split(workload, time_limit=time_limit)
    if method == "latency_series":
        from .solve import series

        plan = series.series_split(workload, time_limit)
        if plan is None:
            raise SolveError("latency_series needs a graph with at least two cut vertices (nodes every "
                             "input-to-output path passes through), an accelerator and a CPU")
        return plan
    if method == "dp_ring":
        from .solve import ring

        plan = ring.ring_split(workload)
        if plan is None:
            raise SolveError(f"dp_ring found no split: it needs an accelerator, memory for its parts and at most "
                             f"{ring.MOST_CLASSES} colour classes")
        return plan
    if method in ("dp", "dp_linear"):
        return dp.solve(workload, linear_only=(method == "dp_linear"), time_limit=time_limit)
    from .solve import ip

    # the warm start's time counts: against the time limit, and in the plan's seconds
    began = time.perf_counter()
    if objective == "latency":
        start = _latency_warm_start(workload, time_limit) if warm_start else None
        anytime.offer(start, "warm start")
        spent = time.perf_counter() - began
        plan = ip.solve_latency(workload, pieces=pieces, time_limit=max(1.0, time_limit - spent), solver=solver,
                                warm_start=start)
    else:
        start = _throughput_warm_start(workload, time_limit) if warm_start and not split_passes else None
        anytime.offer(start, "warm start")
        spent = time.perf_counter() - began
        plan = ip.solve_throughput(workload, contiguous=contiguous, split_passes=split_passes,
                                   time_limit=max(1.0, time_limit - spent), solver=solver, warm_start=start)
    plan.seconds += spent
    plan.details["warm_start_seconds"] = spent
    return plan


# Warm starts come from methods that take seconds at most on any graph; the exact DP is
# not among them (a real operator graph can have millions of ideals).
QUICK_THROUGHPUT = (("dp_linear", "throughput"), ("dp_ring", "throughput"), ("local_search", "throughput"))
QUICK_LATENCY = (("latency_dp", "latency"), ("greedy", "latency"), ("hetero_greedy", "latency"),
                 ("dp_linear", "throughput"), ("pipedream", "throughput"))
SERIES_SHARE = 0.25  # of the latency IP's time limit, at most, for the plans composed along cut vertices
POLISH_SHARE = 0.05  # of the time limit, at most, for the local search on the best latency warm start


def _best_quick_plan(workload: Workload, candidates, objective: str,
                    time_limit: float) -> tuple[dict[int, str] | None, float]:
    """(the best valid plan among the candidate methods' or None, its value), each method
    given what is left of ``time_limit`` (on a large graph they are not so quick), the
    first plan offered as soon as it is known."""
    from .solve import anytime, evaluate

    best, best_value = None, float("inf")
    deadline = time.perf_counter() + time_limit
    for method, objective_of_method in candidates:
        left = deadline - time.perf_counter()
        if left <= 0 and best is not None:
            break
        try:
            plan = solve(workload, objective_of_method, method, time_limit=max(left, 0.01))
        except OnnxsplitError:
            continue
        if plan.assignment and not evaluate.check(workload, plan.assignment):
            value = evaluate.score(workload, plan.assignment, objective).value
            if value < best_value:
                best, best_value = plan.assignment, value
                anytime.offer(best, f"warm start from {method}")
    return best, best_value


WARM_START_SHARE = 0.3  # of the time limit, at most, for the quick methods' warm starts


def _throughput_warm_start(workload: Workload, time_limit: float) -> dict[int, str] | None:
    """The best valid max-load among the linearized DP's, the ring split's and local search's
    plans (at most WARM_START_SHARE of ``time_limit``)."""
    return _best_quick_plan(workload, QUICK_THROUGHPUT, "throughput", WARM_START_SHARE * time_limit)[0]


def _latency_warm_start(workload: Workload, time_limit: float) -> dict[int, str] | None:
    """The best valid latency among the latency DP over topological orders, the paper's
    greedy, HETERO's greedy, the splits of the linearized max-load DP and PipeDream, and
    the plans composed along the graph's cut vertices (at most SERIES_SHARE of ``time_limit``),
    polished by moving colour classes one at a time (at most POLISH_SHARE of it)."""
    from .solve import series
    from .solve.polish import polish_latency

    best, best_value = _best_quick_plan(workload, QUICK_LATENCY, "latency", WARM_START_SHARE * time_limit)
    composed = series.series_split(workload, SERIES_SHARE * time_limit)
    if composed is not None and composed.value < best_value:
        best = composed.assignment
    return polish_latency(workload, best, POLISH_SHARE * time_limit)[0] if best else best


COMPARED = ("dp", "dp_linear", "dp_ring", "ip", "latency_dp", "latency_series", "greedy", "local_search", "pipedream",
            "scotch", "metis", "one_accelerator", "all_cpu", "ort_default", "hetero_greedy")


def compare(workload: Workload, objective: str = "throughput", *, time_limit: float = 60.0,
            methods: tuple[str, ...] | None = None) -> dict:
    """Every method's plan on one workload, and the best proven lower bound among them.

    A method that cannot run (e.g. too many ideals for the DP, a missing partitioner) is
    listed with its one-line reason instead of a plan.
    """
    rows = []
    for method in methods or COMPARED:
        if objective not in METHODS.get(method, ()):
            continue
        try:
            plan = solve(workload, objective, method, time_limit=time_limit)
        except OnnxsplitError as e:
            rows.append({"method": method, "error": str(e)})
            continue
        rows.append({"method": method, "plan": plan})
    bounds = [r["plan"].lower_bound for r in rows if "plan" in r and r["plan"].lower_bound is not None
              and not r["plan"].details.get("contiguous")]
    best_bound = max(bounds) if bounds else None
    return {"objective": objective, "best_lower_bound": best_bound, "rows": rows}


def evaluate_split(workload: Workload, assignment: dict[int, str], objective: str = "throughput") -> dict:
    """Score an assignment and list its violations.

    A split that names more devices than the workload has (the paper's bert24 latency
    expert split uses 6 accelerators of 5) is scored on a widened device set, and the
    over-count is reported as a violation rather than refused.
    """
    from .solve import evaluate

    if objective not in OBJECTIVES:
        raise OnnxsplitError(f"unknown objective '{objective}' (choose from {', '.join(OBJECTIVES)})")
    scored_on, violations = evaluate.widened(workload, assignment)
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


# ---------------------------------------------------------------- ONNX models: profile, workload

def parse_input_shapes(specs) -> dict[str, tuple[int, ...]]:
    """``["input_ids=1x128", ...]`` -> ``{"input_ids": (1, 128)}``; one-line errors."""
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs or ():
        name, eq, dims = str(spec).rpartition("=")
        example = f"{name.strip() or 'input_ids'}=1x128"
        if not eq or not name.strip():
            raise OnnxsplitError(f"bad --input-shape '{spec}': expected NAME=DIMS, e.g. {example}")
        if dims.strip() == "scalar":
            parts = []
        else:
            parts = dims.replace(",", "x").replace("X", "x").split("x")
        if not dims.strip() or not all(p.strip().isdigit() for p in parts):
            raise OnnxsplitError(f"bad --input-shape '{spec}': DIMS must be non-negative integers "
                                 f"separated by 'x' (or 'scalar'), e.g. {example}")
        name = name.strip()
        if name in out:
            raise OnnxsplitError(f"--input-shape given twice for '{name}'")
        out[name] = tuple(int(p) for p in parts)
    return out


def parse_input_values(specs) -> dict[str, float]:
    """``["sr=16000"]`` -> ``{"sr": 16000.0}``: inputs fed that value in every run."""
    out: dict[str, float] = {}
    for spec in specs or ():
        name, eq, value = str(spec).rpartition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not eq or not name.strip() or number is None:
            raise OnnxsplitError(f"bad --input-value '{spec}': expected NAME=NUMBER, e.g. sr=16000")
        if name.strip() in out:
            raise OnnxsplitError(f"--input-value given twice for '{name.strip()}'")
        out[name.strip()] = int(number) if number.is_integer() else number
    return out


def profile_model(path: str | Path, input_shapes=None, *, output: str | Path | None = None,
                  providers=None, repeats: int = 10, warmup: int = 2, group: bool = True,
                  force: bool = False, quiet: bool = False, input_fills=None, method: str = "auto"):
    """Per-node latency on every execution provider present (or ``providers``), read from
    / added to the profile file ``output`` (default: the per-user cache).  ``method``: see
    :func:`onnxsplit.profile.profile`."""
    from . import profile as prof

    return prof.profile(path, input_shapes, providers=providers, cache=output, repeats=repeats,
                        warmup=warmup, group=group, force=force, quiet=quiet,
                        input_fills=input_fills, method=method)


def load_cluster(path: str | Path | None = None):
    """A cluster spec file, or this machine's devices when ``path`` is None."""
    from .cluster import Cluster

    return Cluster.from_file(path) if path else Cluster.detect()


def build_workload(path: str | Path, input_shapes=None, *, devices: str | Path | None = None,
                   profile: str | Path | None = None, accelerator: str | None = None,
                   shared_weights: str = "first", activations: str = "outputs",
                   repeats: int = 10, quiet: bool = False, input_fills=None) -> Workload:
    """The paper's workload for an ONNX model on a cluster (default: this machine).

    Measures what the profile file (default: the per-user cache) lacks and this machine can
    measure: the CPU, and the accelerator's execution provider where it is present.  An
    accelerator neither present nor in the profile is estimated from its spec's peaks.
    """
    from .build import build_workload as build, choose_accelerator, providers_needed
    from .graph import OpGraph
    from .profile import ensure_profiled

    cluster = load_cluster(devices)
    acc = choose_accelerator(cluster, accelerator)
    known, _, _ = ensure_profiled(path, input_shapes, providers_needed(cluster, acc), cache=profile,
                                  input_fills=input_fills, repeats=repeats, quiet=quiet)
    graph = OpGraph.from_onnx(path, known.input_shapes, check_runtime=False, input_fills=input_fills)
    return build(graph, known, cluster, accelerator=accelerator, shared_weights=shared_weights,
                 activations=activations)
