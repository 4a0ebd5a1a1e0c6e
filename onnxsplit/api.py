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


# ---------------------------------------------------------------- ONNX models: profile, workload

def parse_input_shapes(specs) -> dict[str, tuple[int, ...]]:
    """``["input_ids=1x128", ...]`` -> ``{"input_ids": (1, 128)}``; one-line errors."""
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs or ():
        name, eq, dims = str(spec).rpartition("=")
        example = f"{name.strip() or 'input_ids'}=1x128"
        if not eq or not name.strip():
            raise OnnxsplitError(f"bad --input-shape '{spec}': expected NAME=DIMS, e.g. {example}")
        parts = dims.replace(",", "x").replace("X", "x").split("x")
        if not dims.strip() or not all(p.strip().isdigit() for p in parts):
            raise OnnxsplitError(f"bad --input-shape '{spec}': DIMS must be non-negative integers "
                                 f"separated by 'x', e.g. {example}")
        name = name.strip()
        if name in out:
            raise OnnxsplitError(f"--input-shape given twice for '{name}'")
        out[name] = tuple(int(p) for p in parts)
    return out


def profile_model(path: str | Path, input_shapes=None, *, output: str | Path | None = None,
                  providers=None, repeats: int = 10, warmup: int = 2, group: bool = True,
                  force: bool = False, quiet: bool = False):
    """Per-node latency on every execution provider present (or ``providers``), read from
    / added to the profile file ``output`` (default: the per-user cache)."""
    from . import profile as prof

    return prof.profile(path, input_shapes, providers=providers, cache=output, repeats=repeats,
                        warmup=warmup, group=group, force=force, quiet=quiet)


def load_cluster(path: str | Path | None = None):
    """A cluster spec file, or this machine's devices when ``path`` is None."""
    from .cluster import Cluster

    return Cluster.from_file(path) if path else Cluster.detect()


def build_workload(path: str | Path, input_shapes=None, *, devices: str | Path | None = None,
                   profile: str | Path | None = None, accelerator: str | None = None,
                   shared_weights: str = "first", activations: str = "outputs",
                   repeats: int = 10, quiet: bool = False) -> Workload:
    """The paper's workload for an ONNX model on a cluster (default: this machine).

    Measures what the profile file (default: the per-user cache) lacks and this machine can
    measure: the CPU, and the accelerator's execution provider where it is present.  An
    accelerator neither present nor in the profile is estimated from its spec's peaks.
    """
    from . import profile as prof
    from .build import build_workload as build, choose_accelerator
    from .graph import OpGraph
    from .profile.store import ModelProfile, ProfileFile

    cluster = load_cluster(devices)
    acc = choose_accelerator(cluster, accelerator)
    _, bound, key = prof.bind(path, input_shapes)
    cache = Path(profile) if profile else prof.default_cache(key)
    known = ModelProfile(key, bound, tuple(ProfileFile.load(cache).for_model(key)))
    needed = [cluster.cpu.execution_provider] + ([acc.execution_provider]
                                                 if acc is not None and acc.execution_provider else [])
    present = prof.available_providers()
    todo = [ep for ep in dict.fromkeys(needed) if known.entry(ep) is None and ep in present]
    if todo:
        known = prof.profile(path, bound, providers=todo, cache=cache, repeats=repeats, quiet=quiet)
    graph = OpGraph.from_onnx(path, bound, check_runtime=False)
    return build(graph, known, cluster, accelerator=accelerator, shared_weights=shared_weights,
                 activations=activations)
