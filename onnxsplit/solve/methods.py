"""The method registry: the one list of placement methods, what each serves, its options
and how it runs.  ``api.solve``, the CLI's ``--method`` choices and help, ``compare``, the
IP's warm starts and the README's method table (tools/readme_methods.py) all read it.

To add a method: write it in throughput/, latency/ or baselines/ (a function of a
Workload returning a Plan the evaluator has scored), then add one ``Method`` below.

Each ``run`` imports its module when it runs, and :func:`solve` the time-limit watch:
deliberate lazy imports, so that ``onnxsplit --help`` reads this list without loading
numpy, numba kernels, python-mip or HiGHS.  Write-up: docs/README.md and the pages it
lists.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import OnnxsplitError, SolveError

if TYPE_CHECKING:  # the registry itself stays light: ``--help`` reads it without numpy
    from ..plan import Plan
    from ..workload import Workload

OBJECTIVES = ("throughput", "latency")
BOTH = OBJECTIVES


# ---- options: one small typed object per family ------------------------------------------------

@dataclass(frozen=True)
class Options:
    """What every method takes: ``time_limit`` seconds, after which the best plan it
    offered is returned (solve/anytime.py)."""

    time_limit: float = 60.0


@dataclass(frozen=True)
class SearchOptions(Options):
    """The randomised baselines: ``restarts`` seeded runs, the best kept."""

    seed: int = 0
    restarts: int = 10


@dataclass(frozen=True)
class GivenOptions(Options):
    """``split``: the split file (paper format, or a plan) or node id -> device dict."""

    split: str | Path | dict | None = None


@dataclass(frozen=True)
class IPOptions(Options):
    """The integer programs.  Throughput: every part convex (``contiguous``); training:
    max forward + max backward load (``split_passes``).  Latency: up to ``pieces`` calls
    per accelerator.  Both: the backend (highs | cbc) and a warm start from the quick
    methods."""

    contiguous: bool = False
    split_passes: bool = False
    pieces: int = 1
    solver: str = "highs"
    warm_start: bool = True


@dataclass(frozen=True)
class Method:
    """One placement method.  ``kind``: "method" optimises its objectives; "baseline" is
    a placement the paper compares against or one users get today (fixed placements are
    scored for either objective).  ``warm_start``: objective -> rank where its plan is one
    of the integer program's quick warm starts (tried in rank order); ``warm_share``: the
    most of the program's time limit it then has (one that wins on small graphs only)."""

    name: str
    objectives: tuple[str, ...]
    kind: str
    summary: str
    run: Callable[[Workload, str, Options], Plan]
    options: type[Options] = Options
    compared: bool = True  # run by ``compare`` (not where it needs input of the user's)
    warm_start: dict[str, int] = field(default_factory=dict)
    warm_share: float | None = None  # as a warm start, at most this share of the IP's time limit
    classes: bool = False  # runs beyond the paper's model: several accelerator classes, priced links


# ---- how each runs ---------------------------------------------------------------------------------

def _deadline(o: Options) -> float:
    return time.perf_counter() + o.time_limit if o.time_limit else float("inf")


def _dp(w, objective, o):
    from .throughput import dp

    return dp.solve(w, time_limit=o.time_limit)


def _lp_round(w, objective, o):
    from .throughput import lp_round

    return lp_round.lp_round(w, time_limit=o.time_limit)


def _dp_linear(w, objective, o):
    from .throughput import dp

    return dp.solve(w, linear_only=True, time_limit=o.time_limit)


def _dp_ring(w, objective, o):
    from .throughput import dp_ring

    plan = dp_ring.ring_split(w)
    if plan is None:
        raise SolveError(f"dp_ring found no split: it needs an accelerator, memory for its parts and at most "
                         f"{dp_ring.MOST_CLASSES} colour classes")
    return plan


def _latency_dp(w, objective, o):
    from .latency import dp

    return dp.sequence_split(w, time_limit=o.time_limit)


def _latency_series(w, objective, o):
    from .latency import series

    plan = series.series_split(w, o.time_limit)
    if plan is None:
        raise SolveError("latency_series needs a graph with at least two cut vertices (nodes every "
                         "input-to-output path passes through), an accelerator and a CPU, and times "
                         "that add up to well under the workload's limit (1e12 ms)")
    return plan


def _ip(w, objective, o: IPOptions):
    """The integer program, warm-started from the best of the quick methods (whose time
    counts: against the time limit, and in the plan's seconds)."""
    from . import anytime, warm_starts

    began = time.perf_counter()
    if objective == "latency":
        from .latency import ip

        start = warm_starts.latency(w, o.time_limit, quick("latency"), quick_solve) if o.warm_start else None
        anytime.offer(start, "warm start")
        spent = time.perf_counter() - began
        plan = ip.solve_latency(w, pieces=o.pieces, time_limit=max(1.0, o.time_limit - spent), solver=o.solver,
                                warm_start=start)
    else:
        from .throughput import ip

        start = (warm_starts.throughput(w, o.time_limit, quick("throughput"), quick_solve)
                 if o.warm_start and not o.split_passes else None)
        anytime.offer(start, "warm start")
        spent = time.perf_counter() - began
        plan = ip.solve_throughput(w, contiguous=o.contiguous, split_passes=o.split_passes,
                                   time_limit=max(1.0, o.time_limit - spent), solver=o.solver, warm_start=start)
    plan.seconds += spent
    plan.details["warm_start_seconds"] = spent
    return plan


def _greedy(w, objective, o):
    from .baselines import greedy

    return greedy.greedy(w, objective)


def _hetero_greedy(w, objective, o):
    from .baselines import greedy

    return greedy.hetero_greedy(w, objective)


def _local_search(w, objective, o: SearchOptions):
    from .baselines import local_search

    return local_search.local_search(w, seed=o.seed, restarts=o.restarts, deadline=_deadline(o))


def _pipedream(w, objective, o):
    from .baselines import pipedream

    return pipedream.pipedream(w, deadline=_deadline(o))


def _partitioner(tool: str):
    def run(w, objective, o: SearchOptions):
        from .baselines import partition

        return partition.graph_partition(w, tool, seed=o.seed, restarts=o.restarts, deadline=_deadline(o))

    return run


def _fixed(name: str):
    def run(w, objective, o):
        from .baselines import fixed

        return fixed.fixed(w, name, objective)

    return run


def _given(w, objective, o: GivenOptions):
    from .baselines import fixed

    if o.split is None:
        raise SolveError("method 'given' needs a split file (--split FILE)")
    return fixed.fixed(w, "given", objective, split=o.split)


# ---- the registry ---------------------------------------------------------------------------------

REGISTRY: tuple[Method, ...] = (
    Method("dp", ("throughput",), "method",
           "exact DP over ideals: the optimal linear pipeline of contiguous parts", _dp, classes=True),
    Method("dp_linear", ("throughput",), "method",
           "the same DP along a few topological orders (the paper's linearized upper bound)", _dp_linear,
           warm_start={"throughput": 1, "latency": 3}, classes=True),
    Method("dp_ring", ("throughput",), "method",
           "one order bent into a ring: one accelerator holds a prefix and a suffix (tied weights)", _dp_ring,
           warm_start={"throughput": 2}),
    Method("lp_round", ("throughput",), "method",
           "the transfer-free LP rounded: CPUs take the weight-heavy units (memory binding)", _lp_round, warm_start={"throughput": 0}),
    Method("ip", BOTH, "method",
           "integer program (HiGHS) with a proven gap: non-contiguous throughput, or latency with up to "
           "--pieces calls per accelerator", _ip, IPOptions, classes=True),
    Method("latency_dp", ("latency",), "method",
           "a topological order cut into segments, each an accelerator call or a run on the CPUs", _latency_dp,
           warm_start={"latency": 0}),
    Method("latency_series", ("latency",), "method",
           "plans composed along cut vertices: a module's branches side by side, in calls and on the CPUs",
           _latency_series),
    Method("greedy", BOTH, "baseline",
           "the paper's latency greedy: blocks in topological order fill accelerators by memory, the rest "
           "on the CPU", _greedy, warm_start={"latency": 1}),
    Method("local_search", ("throughput",), "baseline",
           "steepest descent over colour-class moves, with seeded random restarts", _local_search, SearchOptions,
           # (it wins on small layer graphs, in 0.1 s; on op-level BERT-48 training it took
           # 16.3 s for a plan 66% above dp_ring's)
           warm_start={"throughput": 3}, warm_share=0.05),
    Method("pipedream", ("throughput",), "baseline",
           "PipeDream's planner: branches collapsed, then a DP over one order's prefixes", _pipedream,
           warm_start={"latency": 4}),
    Method("scotch", ("throughput",), "baseline",
           "Scotch graph partitioning into k parts balanced by accelerator latency", _partitioner("scotch"),
           SearchOptions),
    Method("metis", ("throughput",), "baseline",
           "METIS graph partitioning into k parts balanced by accelerator latency", _partitioner("metis"),
           SearchOptions),
    Method("one_accelerator", BOTH, "baseline",
           "everything on one accelerator (the paper's single-device baseline; of several classes, the best)",
           _fixed("one_accelerator"), classes=True),
    Method("all_cpu", BOTH, "baseline", "everything on one CPU core", _fixed("all_cpu"), classes=True),
    Method("given", BOTH, "baseline", "score a split file (--split): paper format or a plan", _given,
           GivenOptions, compared=False, classes=True),
    Method("ort_default", BOTH, "baseline",
           "what ONNX Runtime does: each node on the first accelerator EP that supports it, the rest on the CPU",
           _fixed("ort_default"), classes=True),
    Method("hetero_greedy", BOTH, "baseline",
           "what OpenVINO HETERO does: each node to the first device that supports it and has room",
           _hetero_greedy, warm_start={"latency": 2}, classes=True),
)
METHODS: dict[str, Method] = {m.name: m for m in REGISTRY}


def names(objective: str | None = None, *, kind: str | None = None) -> list[str]:
    """The methods' names, in registry order, serving ``objective`` and of ``kind``."""
    return [m.name for m in REGISTRY if (objective is None or objective in m.objectives)
            and (kind is None or m.kind == kind)]


def get(name: str, objective: str | None = None) -> Method:
    """The method called ``name``, checked to serve ``objective``; one-line errors."""
    if objective is not None and objective not in OBJECTIVES:
        raise OnnxsplitError(f"unknown objective '{objective}' (choose from {', '.join(OBJECTIVES)})")
    if name not in METHODS:
        raise OnnxsplitError(f"unknown method '{name}' (choose from {', '.join(METHODS)})")
    method = METHODS[name]
    if objective is not None and objective not in method.objectives:
        able = names(objective)
        hint = f"methods for {objective}: {', '.join(able)}" if able else f"no method optimises {objective} yet"
        raise OnnxsplitError(f"method '{name}' does not optimise {objective} ({hint})")
    return method


def options_for(name: str, *, others: str = "error", **values) -> Options:
    """The method's options object from keyword values.  A value it does not take is an
    error, or (``others="ignore"``: a caller holding every method's settings, as the CLI
    does) left out."""
    method = get(name)
    known = {f.name for f in dataclasses.fields(method.options)}
    unknown = sorted(set(values) - known)
    if others == "ignore":
        values = {k: v for k, v in values.items() if k in known}
    elif unknown:
        raise OnnxsplitError(f"method '{name}' takes no option {', '.join(map(repr, unknown))} "
                             f"(its options: {', '.join(sorted(known))})")
    return method.options(**values)


def solve(workload: Workload, objective: str, name: str, options: Options | None = None) -> Plan:
    """Run one method within its time limit; the plan has been re-scored by the evaluator."""
    from . import anytime

    method = get(name, objective)
    if workload.multi_class and not method.classes:
        able = ", ".join(m.name for m in REGISTRY if m.classes and objective in m.objectives)
        raise OnnxsplitError(f"method '{name}' takes the paper's model only (one accelerator class, transfers "
                             f"at c(u)); on several classes or priced links: {able}")
    options = options if options is not None else method.options()
    if not isinstance(options, method.options):
        raise OnnxsplitError(f"method '{name}' takes {method.options.__name__}, not {type(options).__name__}")

    def run() -> Plan:
        if not workload.n:
            raise SolveError("the workload has no nodes")
        return method.run(workload, objective, options)

    return anytime.within(options.time_limit, workload, objective, name, run)


def quick(objective: str) -> list[tuple[str, str, float | None]]:
    """The integer program's quick warm starts for ``objective``: (method, the objective it
    runs for: the target where it serves it, else its own, its ``warm_share``), in rank
    order."""
    ranked = sorted((m.warm_start[objective], m) for m in REGISTRY if objective in m.warm_start)
    return [(m.name, objective if objective in m.objectives else m.objectives[0], m.warm_share)
            for _, m in ranked]


def quick_solve(workload: Workload, objective: str, name: str, time_limit: float) -> Plan:
    """One quick method's plan, as the warm starts (solve/warm_starts.py) call them."""
    return solve(workload, objective, name, get(name).options(time_limit=time_limit))

