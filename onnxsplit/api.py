"""Python entry points; the CLI is a thin layer over these."""

from __future__ import annotations

from pathlib import Path

from .errors import OnnxsplitError
from .plan import Plan, read_split
from .solve import evaluate, methods
from .workload import Workload

OBJECTIVES = methods.OBJECTIVES


def load_workload(path: str | Path) -> Workload:
    return Workload.from_paper_json(path)


def solve(workload: Workload, objective: str = "throughput", method: str = "dp", *, time_limit: float = 60.0,
          options: methods.Options | None = None, **values) -> Plan:
    """Place every node by ``method`` (see :mod:`onnxsplit.solve.methods` for the list and
    each one's options); the returned plan has been re-scored and checked by the evaluator.

    Options are the method's options object, or keyword values of its fields (e.g.
    ``seed=3`` for local_search, ``contiguous=True`` or ``pieces=2`` for ip, ``split=FILE``
    for given).  A baseline's plan that breaks memory, support or a colour class comes
    back with status "infeasible" and its problems in ``details["violations"]``.
    """
    methods.get(method, objective)
    if options is None:
        options = methods.options_for(method, time_limit=time_limit, **values)
    elif values:
        raise OnnxsplitError("give a method's options either as an object or as keyword values, not both")
    return methods.solve(workload, objective, method, options)


def compare(workload: Workload, objective: str = "throughput", *, time_limit: float = 60.0,
            chosen: tuple[str, ...] | None = None) -> dict:
    """Every method's plan on one workload, and the best proven lower bound among them.

    A method that cannot run (e.g. too many ideals for the DP, a missing partitioner) is
    listed with its one-line reason instead of a plan.
    """
    rows = []
    for method in chosen or [m.name for m in methods.REGISTRY if m.compared]:
        if objective not in methods.get(method).objectives:
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

def each_spec(specs) -> list[str]:
    """The NAME=... specs of repeated flags, several to a flag where commas part them
    (``input_ids=1x128,attention_mask=1x128``, as the benchmarks take models): a comma
    parts two only where a name and '=' follow it, so ``x=1,128`` stays one."""
    import re

    return [one for spec in specs or () for one in re.split(r",(?=[^,=]+=)", str(spec))]


def parse_input_ranges(specs) -> tuple[dict[str, tuple[int, ...]], dict[str, list[tuple[int, int]]] | None]:
    """``["input_ids=1..8x16..512", ...]`` -> (the planning shape, the range: None where
    every size is fixed); see :mod:`onnxsplit.ranges`.  One-line errors."""
    from . import ranges

    shapes: dict[str, tuple[int, ...]] = {}
    whole: dict[str, list[tuple[int, int]]] = {}
    for spec in each_spec(specs):
        name, eq, dims = spec.rpartition("=")
        if not eq or not name.strip():
            raise OnnxsplitError(f"bad --input-shape '{spec}': expected NAME=DIMS, e.g. "
                                 f"{name.strip() or 'input_ids'}=1x128 or {name.strip() or 'input_ids'}=1..8x16..512")
        name = name.strip()
        if name in whole:
            raise OnnxsplitError(f"--input-shape given twice for '{name}'")
        whole[name], planned = ranges.parse_dims(spec, dims)
        shapes[name] = planned if planned is not None else ranges.middle({name: whole[name]})[name]
    return shapes, (whole if ranges.is_range(whole) else None)


def parse_input_shapes(specs) -> dict[str, tuple[int, ...]]:
    """``["input_ids=1x128", ...]`` -> ``{"input_ids": (1, 128)}``: one shape per input,
    for the commands that take no range (:func:`parse_input_ranges` parses both)."""
    shapes, whole = parse_input_ranges(specs)
    if whole is not None:
        name = next(n for n, dims in whole.items() if any(a != b for a, b in dims))
        raise OnnxsplitError(f"--input-shape for '{name}': a range of shapes is for the main command "
                             f"and export; here give one shape, e.g. {name}=1x128")
    return shapes


def parse_input_values(specs) -> dict[str, float]:
    """``["sr=16000"]`` -> ``{"sr": 16000.0}``: inputs fed that value in every run."""
    out: dict[str, float] = {}
    for spec in each_spec(specs):
        name, eq, value = spec.rpartition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not eq or not name.strip() or number is None:
            raise OnnxsplitError(f"bad --input-value '{spec}': expected NAME=NUMBER, e.g. sr=16000")
        if not abs(number) < 2.0 ** 63:  # (NaN, infinities, and what no integer input holds)
            raise OnnxsplitError(f"bad --input-value '{spec}': the value must be a finite number below 2^63")
        if name.strip() in out:
            raise OnnxsplitError(f"--input-value given twice for '{name.strip()}'")
        out[name.strip()] = int(number) if number.is_integer() else number
    return out


def profile_model(path: str | Path, input_shapes=None, *, output: str | Path | None = None,
                  providers=None, repeats: int = 10, warmup: int = 2, group: bool = True,
                  force: bool = False, quiet: bool = False, input_fills=None, method: str = "auto",
                  precision: str = "auto"):
    """Per-node latency on every execution provider present (or ``providers``), read from
    / added to the profile file ``output`` (default: the per-user cache).  ``method``: see
    :func:`onnxsplit.profile.profile`; OpenVINO timed in ``precision``, as the main
    command's (``auto``: its default here)."""
    from . import profile as prof
    from .providers import openvino

    with openvino.computing_in(precision, quiet):
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
                   repeats: int = 10, quiet: bool = False, input_fills=None,
                   precision: str = "auto") -> Workload:
    """The paper's workload for an ONNX model on a cluster (default: this machine), by the
    main command's route (:func:`onnxsplit.workflow.prepare`) without its calibration;
    OpenVINO timed in ``precision`` as the main command would (``auto``: its default here)."""
    from .providers import openvino
    from .workflow import prepare  # deliberate: onnx and onnxruntime load only where a model is read

    with openvino.computing_in(precision, quiet):
        return prepare(path, devices=devices, input_shapes=input_shapes, profile=profile, accelerator=accelerator,
                       quiet=quiet, input_fills=input_fills, shared_weights=shared_weights,
                       activations=activations, repeats=repeats, as_run=False, narrate=False).workload
