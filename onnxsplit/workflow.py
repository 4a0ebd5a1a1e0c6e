"""The main command: model.onnx -> profile -> workload -> plan -> verified parts folder.

``split`` runs every step a user would otherwise chain by hand: import the model (with
an onnxruntime session, so an op no runtime can run is refused up front), profile it or
reuse the cached profile, build the paper's workload for the devices (this machine's, or
a cluster file's), apply pins, solve with the method that fits the objective and the
graph's size, export the parts with ``plan.json`` beside them, and run one sample through
the parts to check them against the original model (a split is timed part by part
there, its prediction remade from those times, and it gives way to the model kept whole
where they promise less).  ``export_plan`` re-applies an edited ``plan.json``.

Nothing is written before every input has been checked; the parts folder appears whole
(exporter) and is removed again if the parts cannot run.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from . import calibrate, calibrations, limits, machine, parts_report, progress, ranges
from .pins import apply_pins, parse_pins, pinned_where
from .providers import openvino
from . import export as ex
from .build import build_workload, choose_accelerators, output_bytes, providers_needed
from .cluster import Cluster
from .errors import CheckFailed, ClusterError, OnnxsplitError, SolveError, SplitError
from .export import check_out, session_ready
from .graph import OpGraph
from .plan import Plan, gap_of, read_json
from .profile import ensure_profiled
from .profile.devices import CPU_EP, shares_cpu
from .running.manifest import inputs_at
from .running.runner import RunError, random_feeds
from .running.compare import run_parts
from .running.verify import failed
from .shapes import bytes_text
from .solve import evaluate, methods
from .solve.throughput import dp

AUTO_IDEAL_LIMIT = 50_000  # above this many ideals the exact DP gives way to the linearized one
ROUND_GAP = 0.01  # a DP plan proven this close needs no rounded LP beside it
# What the runner adds per part call, where the profile has no calibration of it (which
# measures it: machine.CallCosts)
STAGE_OVERHEAD_MS = machine.CallCosts.call_ms
CALL_GIL_MS = machine.CallCosts.gil_ms
MIN_SPLIT_GAIN = 1.1  # auto keeps the model whole unless splitting promises this much more
# one session of the whole model configured otherwise (explicit threads, another
# optimisation level) must promise this much more than onnxruntime's default session,
# which is what users run: on a shared machine two such sessions measure up to 10-30%
# apart from one minute to the next, either way.  Copies side by side are taken wherever
# they promise more: on every held-out model they measured above the default session
MIN_CONFIG_GAIN = 1.1
# for throughput, copies side by side are kept over onnxruntime's default session unless
# it promises this much more: paired in the same rounds, copies measured at or above the
# default session on every held-out model, and a multi-threaded session's figure moves
# the most with a shared machine (each intra-op barrier waits for its slowest thread,
# and the default session pins its threads to cores, as onnxruntime's threading guide
# says, so a busy neighbour's core holds it back; copies slow one at a time) -- GPT-2's
# default session once calibrated 2% above its copies and then measured 17% below them
# (tools/bench_vs_ort.py)
COPIES_OVER_DEFAULT = 1.05
PLAN_FILE = "plan.json"


@dataclass
class Prepared:
    """A model made ready to place: its graph, the devices, and the paper's workload."""
    graph: Any  # OpGraph
    cluster: Any  # Cluster
    accelerator: Any  # DeviceSpec | None
    workload: Any  # Workload
    seconds: dict[str, float]
    # "cpu"/"acc" -> calibration record; also each provider that shares the CPU's cores
    # (by name: cluster.cpu.shared_by)
    as_run: dict[str, Any] = field(default_factory=dict)
    unoptimised_ms: dict[str, float | None] = field(default_factory=dict)

    @property
    def shared(self) -> dict[str, Any]:
        """The calibrations of the providers that share the CPU's cores, by provider."""
        shared = self.cluster.cpu.shared_by if self.cluster is not None else ()
        return {ep: self.as_run[ep] for ep in shared if self.as_run.get(ep)}

    @property
    def on_cores(self) -> dict[str, Any]:
        """What runs the whole model on the cores besides onnxruntime's CPU EP, by provider:
        the shared providers, and those weighed for the whole model only
        (``devices.whole_on_cores``)."""
        return {**self.shared, **(self.as_run.get("whole_only") or {})}


def prepare(model: str | Path, *, devices: str | Path | None = None, input_shapes=None,
            profile: str | Path | None = None, accelerator: str | None = None,
            quiet: bool = False, input_fills: Mapping[str, float] | None = None,
            shared_weights: str = "first", activations: str = "outputs", repeats: int = 10,
            as_run: bool = True, narrate: bool = True, recalibrate: bool = False,
            check: Callable[[Prepared], None] | None = None,
            largest: Mapping[str, Iterable[int]] | None = None) -> Prepared:
    """The one route from a model to a workload: import it (checked), profile what the
    profile file (default: the per-user cache) lacks and this machine can measure, build
    the workload for the devices (this machine's, or a cluster file's; an accelerator
    neither present nor profiled is estimated from its spec's peaks), check that it fits
    their memory together, and (``as_run``) measure the whole model as users run it
    (``recalibrate``: again, where the profile entry already holds a calibration).
    ``check``: called with what is prepared before the calibration, so that an input it
    refuses (a pin, a plan file) is refused before a minute of measuring.  ``narrate``: say each step on stderr (the main command does; a measurement's progress
    shows unless ``quiet``).  ``largest``: the largest shapes the parts will take (a
    range's upper corner), where each node's outputs are counted against memory when they
    are larger than at ``input_shapes`` (:func:`_peak_activations`)."""
    silent = quiet or not narrate
    seconds = {}
    cluster = Cluster.from_file(devices) if devices else Cluster.detect()
    accs = choose_accelerators(cluster, accelerator)
    acc = accs[0] if accs else None
    t = time.perf_counter()
    progress.say(silent, f"importing {model}")
    graph = OpGraph.from_onnx(model, input_shapes, check_runtime=True, input_fills=input_fills)
    peaks = _peak_activations(model, graph, input_shapes, largest, input_fills)
    seconds["import"] = time.perf_counter() - t
    t = time.perf_counter()
    known, cache, measured = ensure_profiled(
        graph, providers_needed(cluster, accs), cache=profile, repeats=repeats, quiet=quiet,
        on_measure=lambda eps: progress.say(silent, f"profiling {len(graph.nodes)} operators on {', '.join(eps)}"))
    if not measured:
        progress.say(silent, f"profile: cached in {cache}")
    seconds["profile"] = time.perf_counter() - t
    workload = build_workload(graph, known, cluster, accelerator=accelerator, shared_weights=shared_weights,
                              activations=activations, peak_activations=peaks)
    _check_total_memory(workload, cluster, accs)
    if check is not None:
        check(Prepared(graph, cluster, acc, workload, seconds))
    if not as_run:
        return Prepared(graph, cluster, acc, workload, seconds)
    t = time.perf_counter()
    as_run, unopt, refused = calibrations.calibrated(graph, known, cache, cluster, acc, workload, quiet, recalibrate)
    if refused:  # (a provider that failed on the whole model: the workload without it)
        known = replace(known, entries=tuple(refused.get(id(e), e) for e in known.entries))
        workload = build_workload(graph, known, cluster, accelerator=accelerator, shared_weights=shared_weights,
                                  activations=activations, peak_activations=peaks)
    seconds["calibrate"] = time.perf_counter() - t
    return Prepared(graph, cluster, acc, workload, seconds, as_run, unopt)


def _peak_activations(model, graph, given, largest, input_fills) -> dict[str, int] | None:
    """Each node's output bytes at ``largest`` (the model imported again at those shapes,
    the other inputs ``given`` as planned or following by dimension names), where they
    differ from ``graph``'s: parts made for a range of shapes hold each shape of it, so a
    device's memory must hold the activations of the largest (a decoder's prefill of 128
    tokens, not its one-token step; a batch of 8, not the planning shape's 3).  None where
    ``largest`` is the planning shape or not given."""
    if not largest:
        return None
    wanted = {k: tuple(int(d) for d in v) for k, v in largest.items()}
    if all(tuple(graph.input_shapes.get(k, ())) == v for k, v in wanted.items()):
        return None
    return output_bytes(OpGraph.from_onnx(model, {**dict(given or {}), **wanted}, check_runtime=False,
                                          input_fills=input_fills))


def _check_total_memory(workload, cluster, accs) -> None:
    """Refuse a model the devices cannot hold even all together (sizes as the solver sees
    them: weights plus every output activation)."""
    cpu_memory = cluster.cpu.memory
    if not cpu_memory:
        return  # the host's memory is not limited in the cluster: the CPU can hold anything
    capacity = cpu_memory + sum(a.count * a.memory for a in accs)
    need = float(workload.size.sum())
    if need > capacity:
        raise ClusterError(f"the model needs {bytes_text(need)} (weights and activations) but all "
                           f"devices together hold {bytes_text(capacity)}: {bytes_text(need - capacity)} "
                           "short")


# ------------------------------------------------------------------------------- solving


def choose_plan(workload, objective: str, method: str = "auto", time_limit: float = 30.0) -> Plan:
    """Solve: ``auto`` takes the exact DP for throughput where the lattice is small enough
    and the linearized DP otherwise; for latency the IP (warm-started) with accelerators,
    and all on one core without (every plan is then a serial run on some core).  With
    several accelerator classes, the best of :func:`weighed_plans`: never worse than the
    plan a command given any one class alone would make."""
    plans = weighed_plans(workload, objective, method, time_limit)
    plan = min(plans, key=lambda p: float("inf") if p.value is None else p.value)
    if "alone" in plan.details:
        plan.details["why"] = f"planned for {plan.details['alone']} alone: better than for all classes"
    if len(_classes_present(workload)) > 1 and method == "auto":
        alone: dict[str, float] = {}
        for p in plans:
            if "alone" in p.details:
                alone[p.details["alone"]] = min(p.value, alone.get(p.details["alone"], p.value))
        plan.details["each_class_alone"] = alone
    return plan


def weighed_plans(workload, objective: str, method: str = "auto", time_limit: float = 30.0) -> list[Plan]:
    """The plans a choice weighs: an explicit method's; for throughput the DP's and the
    rounded LP's (:func:`throughput_plans`); with several accelerator classes, the plan
    for all at once and beside it the plans a command given each class alone would weigh,
    each in the time that command would give them (re-scored on ``workload``, marked
    ``details["alone"]``).  Whichever figure the choice is made on -- the solver's or the
    machine's prediction -- it is then never worse than any class alone's: a promise kept
    exactly, where a share of the time for each class let it slip (0.5% on a held-out
    cluster of three classes).  The time the solver takes grows with the classes."""
    if method != "auto":
        return [methods.solve(workload, objective, method, methods.options_for(method, time_limit=time_limit))]
    kinds = _classes_present(workload)
    if len(kinds) <= 1:
        return throughput_plans(workload, time_limit) if objective == "throughput" else \
            [_one_plan(workload, objective, method, time_limit)]
    together = _one_plan(workload, objective, method, time_limit)
    plans = [together]
    for c in kinds:
        sub = _alone(workload, c)
        name = workload.class_names[c]
        for other in weighed_plans(sub, objective, method, time_limit):
            other = _plan_on(workload, sub, objective, other)
            if other.value is None:
                continue
            other.details["alone"] = name
            if together.lower_bound is not None:  # the bound for all classes holds for it too
                other.lower_bound = min(together.lower_bound, other.value)
                other.gap = gap_of(other.value, other.lower_bound)
            plans.append(other)
    return plans


def _classes_present(workload) -> list[int]:
    """The accelerator classes (and the paper's accelerators, class 0) the workload has."""
    return [c for c, count in enumerate(workload.class_counts) if count]


def _alone(workload, c: int):
    """The workload with accelerators of class ``c`` only (device names unchanged)."""
    counts = [count if i == c else 0 for i, count in enumerate(workload.class_counts)]
    return workload.replace(num_accelerators=counts[0], accelerator_classes=tuple(
        replace(k, count=n) for k, n in zip(workload.accelerator_classes, counts[1:])))


def _plan_on(workload, sub, objective: str, plan: Plan) -> Plan:
    """A plan made on ``sub`` (fewer devices, same names), re-scored on ``workload``."""
    if plan.value is not None:
        plan.value = evaluate.score(workload, plan.assignment, objective, plan.pieces or None).value
        plan.lower_bound = plan.gap = None  # a bound for the one class is none for all
        plan.status = "feasible"
    return plan


def throughput_plans(workload, time_limit: float) -> list[Plan]:
    """What ``auto`` weighs for throughput: the DP's plan (a chain of ideals: one
    contiguous part per device), and where it is not proven within ROUND_GAP and memory
    binds, the LP relaxation rounded beside it -- the CPUs should take the weight-heavy
    units wherever they are, which no chain of ideals does (seconds on 10,000 nodes); its
    plan may scatter a core's nodes over many calls, which the runner pays for."""
    # past AUTO_IDEAL_LIMIT ideals (or the memory limit) its plan is the linearized one
    plan = dp.solve(workload, ideal_limit=AUTO_IDEAL_LIMIT, time_limit=time_limit)
    if workload.multi_class or (plan.gap is not None and plan.gap <= ROUND_GAP):
        return [plan]
    rounded = methods.solve(workload, "throughput", "lp_round", methods.options_for("lp_round",
                                                                                    time_limit=time_limit))
    return [plan] if rounded.value is None else [plan, rounded]


def _one_plan(workload, objective: str, method: str, time_limit: float) -> Plan:
    if method != "auto":
        return methods.solve(workload, objective, method, methods.options_for(method, time_limit=time_limit))
    if objective == "throughput":
        plans = throughput_plans(workload, time_limit)
        return min(plans, key=lambda p: float("inf") if p.value is None else p.value)
    if workload.accelerators_total == 0:
        return methods.solve(workload, "latency", "all_cpu")
    return methods.solve(workload, "latency", "ip", methods.IPOptions(time_limit=time_limit))


def choose(prep: Prepared, workload, objective: str, method: str = "auto",
           time_limit: float = 30.0, pinned: bool = False):
    """The plan to write, as a ``machine.Candidate``: the best of the model kept whole as
    onnxruntime runs it and the solver's split on each CPU division, all predicted in the
    machine's terms.  A split must promise MIN_SPLIT_GAIN times the best whole candidate
    (the runner's hand-offs are in its prediction; noise is not).  An explicit ``method``,
    pins or a profile without calibration: the solver's plan alone."""
    cpu_rec = prep.as_run.get("cpu")
    if not cpu_rec:  # no calibration (an EP measured elsewhere): the paper's model
        plan = choose_plan(workload, objective, method, time_limit)
        if method == "auto" and not pinned:
            plan = _whole_if_split_does_not_pay(workload, plan)
        ex = {"cpu_threads": 1, "optimization": None, "replicas": 1, "run_as": "pipeline"}
        return machine.Candidate(plan, workload, ex, {})
    acc_rec = prep.as_run.get("acc")
    costs = machine.CallCosts.of(cpu_rec)
    wholes = [] if pinned or method != "auto" else \
        machine.whole_candidates(workload, objective, cpu_rec, acc_rec, prep.on_cores)
    splits = machine.split_workloads(workload, objective, cpu_rec, acc_rec, prep.unoptimised_ms,
                                     prep.shared)
    whole_on = {d for c in wholes if len(set(c.plan.assignment.values())) == 1
                for d in c.plan.assignment.values()}
    found = []
    for w, ex in splits:
        share = time_limit / max(len(splits), 1)
        # throughput: each plan the solver weighs, predicted with the calls it makes
        plans = weighed_plans(w, objective, method, share)
        for plan in plans:
            used = set(plan.assignment.values())
            # (a plan on one device that a whole candidate runs on is that candidate, measured;
            # one on an accelerator no whole candidate runs on -- estimated, or uncalibrated -- is not)
            if plan.value is None or (len(used) < 2 and used <= whole_on):
                continue
            cand = machine.Candidate(plan, w, dict(ex))
            session = objective == "latency" and _session_ready(prep, plan)
            cand.execution["run_as"] = "session" if session else "pipeline"
            cand.predicted = _predicted(cand, costs)
            found.append(cand)
    weighed_wholes = list(wholes)
    defaults = [c for c in wholes if c.execution.get("baseline")]
    if defaults:  # a session configured otherwise must clearly beat the default session
        default = min(c.value(objective) for c in defaults)
        wholes = [c for c in wholes if c.execution.get("baseline") or c.execution.get("replicas", 1) > 1
                  or MIN_CONFIG_GAIN * c.value(objective) < default]
    best_whole = min(wholes, key=lambda c: c.value(objective), default=None)
    if objective == "throughput" and best_whole is not None and best_whole.execution.get("baseline") \
            and set(best_whole.plan.assignment.values()) == {"cpu0"}:
        copies = min((c for c in wholes if c.execution.get("replicas", 1) > 1),
                     key=lambda c: c.value(objective), default=None)
        if copies is not None and copies.value(objective) < COPIES_OVER_DEFAULT * best_whole.value(objective):
            copies.plan.details["why"] += (
                f"; kept over onnxruntime's default session, which promises "
                f"{_promise(best_whole, objective)}: less than {COPIES_OVER_DEFAULT}x")
            best_whole = copies
    best_split = min(found, key=lambda c: c.value(objective), default=None)
    weighed = [{"what": c.plan.details.get("why") or _split_says(c),
                "latency_ms": c.predicted["latency_ms"],
                "throughput_per_s": c.predicted["throughput_per_s"]}
               for c in sorted(weighed_wholes + found, key=lambda c: c.value(objective))]
    for c in weighed_wholes + found:
        c.plan.details["candidates"] = weighed
    if best_split is None or (best_whole is not None and
                              best_split.value(objective) * MIN_SPLIT_GAIN > best_whole.value(objective)):
        if best_whole is None:
            raise SolveError("no plan found")
        if best_split is not None:
            best_whole.plan.details["why"] += (
                f"; the best split ({best_split.plan.method}, {best_split.execution['cpu_threads']} "
                f"thread(s) per CPU device) promises {_promise(best_split, objective)} against "
                f"{_promise(best_whole, objective)} whole: less than {MIN_SPLIT_GAIN}x")
        return best_whole
    best_split.rival = best_whole
    return best_split


def _split_says(c) -> str:
    """A split candidate in the list of what was weighed."""
    given = "".join(f", {n} device(s) on {ep}" for ep, n in (c.execution.get("shared") or {}).items())
    alone = f", planned for {c.plan.details['alone']} alone" if "alone" in c.plan.details else ""
    return (f"{c.plan.method}{alone}, {c.execution['cpu_threads']} thread(s) per CPU device{given}, "
            f"run as {c.execution['run_as']}")


def _promise(c, objective: str) -> str:
    p = c.predicted
    return f"{p['latency_ms']:.4g} ms" if objective == "latency" else \
        f"{p['throughput_per_s']:.4g}/s"


def _session_ready(prep: Prepared, plan: Plan) -> bool:

    providers, _ = device_providers(prep.workload, prep.cluster, prep.accelerator)
    return session_ready(providers, set(plan.assignment.values()))


def _calibrated_baselines(prep: Prepared) -> dict[str, dict[str, float]]:
    """onnxruntime's default session on each calibrated device, and one single-thread
    copy per core, as the calibration measured them, under the names ``run`` measures
    them by: ``run`` then shows how far the machine itself moved between the
    prediction and the measurement."""
    from .running.compare import copies_name, default_session_name

    keys = ("latency_ms", "throughput_per_s")
    eps = {"cpu": CPU_EP, "acc": getattr(prep.accelerator, "execution_provider", None)}
    found = {default_session_name(eps[kind]): (rec or {}).get("default")
             for kind, rec in prep.as_run.items() if eps.get(kind)}
    copies = ((prep.as_run.get("cpu") or {}).get("replicas") or {}).get("1") or {}
    if copies.get("copies", 1) > 1 and copies.get("optimization", "all") == "all":
        # (copies calibrated unoptimised are not the copies `run` measures)
        found[copies_name(int(copies["copies"]))] = copies
    return {name: {k: float(got[k]) for k in keys} for name, got in found.items()
            if got and all(isinstance(got.get(k), (int, float)) and got[k] > 0 for k in keys)}


def _predicted(cand, costs: "machine.CallCosts") -> dict[str, Any]:
    """What a split candidate promises in the runner's terms."""
    w, plan = cand.workload, cand.plan
    pred = predict(w, plan, costs)
    if cand.execution.get("run_as") == "session":
        lat = machine.serial_latency(w, plan.assignment)
        pred.update(latency_ms=lat, throughput_per_s=1e3 / lat, parts=1)
    pred["from"] = "profile"
    return pred


def _whole_if_split_does_not_pay(workload, plan: Plan) -> Plan:
    """The model on its best single device when the split, runner overheads included, does
    not promise MIN_SPLIT_GAIN times the whole model in one session: throughput, or for a
    latency plan, speed of one sample (tiny models: a part would cost more in hand-offs
    than it computes; the latency model's CPUs run in parallel, the runner's one by one)."""
    single = best_single_device(workload)
    if plan.value is None or single.get("method") is None or len(set(plan.assignment.values())) < 2:
        return plan
    promised = predict(workload, plan)
    if plan.objective == "latency":
        whole_ms = single["latency_ms"] + 2 * STAGE_OVERHEAD_MS  # one part: hand-offs in and out
        if whole_ms >= MIN_SPLIT_GAIN * promised["latency_ms"]:
            return plan
        what = (f"{promised['latency_ms']:.4g} ms per sample in the runner, against "
                f"{whole_ms:.4g} ms whole")
    else:
        if promised["throughput_per_s"] >= MIN_SPLIT_GAIN * single["throughput_per_s"]:
            return plan
        what = f"{plan.value:.4g} ms per sample"
    whole = methods.solve(workload, plan.objective, single["method"])
    if whole.value is None:
        return plan
    whole.details["why"] = (f"splitting ({plan.method} on {len(set(plan.assignment.values()))} devices: "
                            f"{what}) does not pay: with "
                            f"{STAGE_OVERHEAD_MS} ms per part hand-off it promises less than "
                            f"{MIN_SPLIT_GAIN}x the whole model on one device")
    return whole


def predict(workload, plan: Plan, costs: "machine.CallCosts | None" = None) -> dict[str, Any]:
    """What the plan promises, in the runner's terms (``costs``: the calibration's, else
    the defaults): each device's load plus ``call_ms`` and ``session_ms`` per call it
    makes a sample -- a plan that scatters a core's nodes over many calls pays for each
    -- and one sample every max over devices of that, or every all calls' share of the
    GIL (their Python work holds it: :meth:`machine.CallCosts.lock_ms` of each call's
    tensors), or as the runner's schedule replayed on those calls gives
    (:func:`_replayed_period`), where more.  Single-stream latency: each device runs its
    calls serially, and the sample waits ``handoff_ms`` and ``session_ms`` at each call
    (and its tensors' share: :meth:`machine.CallCosts.tensors_ms`) and ``handoff_ms``
    once more on its way out."""
    costs = costs or machine.CallCosts()
    pieces = runner_pieces(workload, plan)
    calls = runner_calls(plan, pieces)
    total = sum(calls.values())
    loads = evaluate.max_load(workload, plan.assignment).loads
    per_call = costs.call_ms + costs.session_ms  # node times lack the session call's own
    busiest = max(loads[d] + calls.get(d, 0) * per_call for d in loads)
    lat = evaluate.latency(workload, plan.assignment, pieces if plan.pieces else None,
                           serial_cpus=True).value
    order, deps, tensors = _call_graph(workload, plan, pieces)
    period = max(busiest, sum(costs.lock_ms(t) for t in tensors),
                 _replayed_period(workload, plan, pieces, order, deps, per_call,
                                  costs.handoff_ms))
    return {"latency_ms": lat + total * (costs.handoff_ms + costs.session_ms) + costs.handoff_ms
            + sum(costs.tensors_ms(t) for t in tensors),
            "throughput_per_s": 1e3 / period, "max_load_ms": max(loads.values(), default=0.0),
            "parts": total, "call_costs": costs.as_dict(),
            "single_device": best_single_device(workload)}


def _call_graph(workload, plan: Plan, pieces: Mapping[int, int]
                ) -> tuple[list[tuple[str, int]], list[list[int]], list[int]]:
    """The calls the exporter will cut the plan into, in its order, as (device, piece):
    each call's predecessors (indices into that order) and the tensors into and out of
    it (a node's output counts once; at least one each way: the model's own inputs and
    outputs are not edges)."""
    group = {int(i): (plan.assignment[int(i)], pieces[int(i)]) for i in workload.ids}
    keys = list(dict.fromkeys(group[int(i)] for i in workload.ids))
    succ: dict[tuple[str, int], dict[tuple[str, int], None]] = {k: {} for k in keys}
    ins: dict[tuple[str, int], set[int]] = {k: set() for k in keys}
    outs: dict[tuple[str, int], set[int]] = {k: set() for k in keys}
    for e in workload.edges:
        a, b = group[int(e.source)], group[int(e.dest)]
        if a != b:
            succ[a][b] = None
            ins[b].add(int(e.source))
            outs[a].add(int(e.source))
    order = ex.part_order(keys, succ)
    at = {k: n for n, k in enumerate(order)}
    deps: list[list[int]] = [[] for _ in order]
    for a in order:
        for b in succ[a]:
            deps[at[b]].append(at[a])
    return order, deps, [max(len(ins[k]), 1) + max(len(outs[k]), 1) for k in order]


def _replayed_period(workload, plan: Plan, pieces: Mapping[int, int],
                     order: list[tuple[str, int]], deps: list[list[int]], per_call: float,
                     handoff_ms: float) -> float:
    """The runner's schedule replayed (machine.simulate_runner) on the plan's calls
    (:func:`_call_graph`), each the profile's time of its nodes plus ``per_call``: ms
    per sample."""
    if len(order) < 2:
        return 0.0
    ms = dict.fromkeys(order, per_call)
    for i, t in zip(workload.ids, machine.node_times(workload, plan.assignment)):
        ms[(plan.assignment[int(i)], pieces[int(i)])] += float(t)
    return machine.simulate_runner([k[0] for k in order], [ms[k] for k in order], deps, handoff_ms)


def best_single_device(workload) -> dict[str, Any]:
    """The whole model on one device: a CPU core, or one accelerator where it can run and
    hold every node."""
    options = []
    if workload.num_cpus:
        options.append(("cpu0", float(workload.cpu_latency.sum())))
    for c, count in enumerate(workload.class_counts):  # the first device of each class
        if count and workload.class_supported[c].all() and workload.size.sum() <= workload.class_memory[c]:
            first = workload.devices[int(workload.device_class.tolist().index(c))].name
            options.append((first, float(workload.class_latency[c].sum())))
    if not options:
        return {"device": None, "latency_ms": None, "throughput_per_s": None}
    dev, ms = min(options, key=lambda o: o[1])
    return {"device": dev, "latency_ms": ms, "throughput_per_s": 1e3 / ms if ms > 0 else None,
            "method": "all_cpu" if dev.startswith("cpu") else "one_accelerator"}


# ---------------------------------------------------------------------- export + verify


def device_providers(workload, cluster, acc, cpu_threads: int = 1, cpu_provider: str | None = None
                     ) -> tuple[dict[str, str], dict[str, int]]:
    """Workload device name -> execution provider, and -> intra-op threads (a CPU device,
    and a device of a provider that shares the cores: ``cpu_threads``, 0 for the
    provider's default; ``cpu_provider``: what runs the CPU devices where not the
    cluster's CPU EP, e.g. OpenVINO's runtime)."""
    providers, threads = {}, {}
    on_cores = _cores_classes(workload)
    for d in workload.devices:
        if d.kind == "cpu":
            providers[d.name] = cpu_provider or cluster.cpu.execution_provider
            threads[d.name] = cpu_threads
        elif workload.class_names[workload.device_class[d.index]] in on_cores:
            providers[d.name] = on_cores[workload.class_names[workload.device_class[d.index]]]
            threads[d.name] = cpu_threads
        else:
            spec = _spec_of(workload, cluster, acc, d.index)
            providers[d.name] = spec.execution_provider or f"{spec.name} (no execution provider)"
    return providers, threads


def _cores_classes(workload) -> dict[str, str]:
    """Accelerator class -> the provider sharing the CPU's cores that it stands for
    (machine.with_provider)."""
    return dict((workload.extra.get("onnxsplit") or {}).get("coresClasses") or {})


def _spec_of(workload, cluster, acc, index: int):
    """The cluster device behind an accelerator device of the workload (for a provider
    that shares the cores: the CPU's, run by that provider)."""
    klass = workload.class_names[workload.device_class[index]]
    provider = _cores_classes(workload).get(klass)
    if provider is not None:
        return replace(cluster.cpu, execution_provider=provider)
    classes = (workload.extra.get("onnxsplit") or {}).get("classes")
    if not classes:
        return acc
    return cluster.device(classes[workload.class_names[workload.device_class[index]]]["name"])


def device_machines(workload, cluster, acc) -> dict[str, str]:
    """Device name -> the machine its cluster device names (``machine``), where it names one."""
    out = {}
    for d in workload.devices:
        spec = cluster.cpu if d.kind == "cpu" else _spec_of(workload, cluster, acc, d.index)
        if spec is not None and spec.machine:
            out[d.name] = spec.machine
    return out


def device_ids(workload, cluster, acc) -> dict[str, int]:
    """Accelerator device name -> the device id its execution provider addresses: devices
    of one class numbered in order, after those of earlier classes on the same provider
    (an A100 and an L4 class, both CUDA: cuda:0 is the A100)."""
    out, used = {}, {}
    on_cores = _cores_classes(workload)
    for d in workload.devices:
        if d.kind == "cpu" or workload.class_names[workload.device_class[d.index]] in on_cores:
            continue
        ep = _spec_of(workload, cluster, acc, d.index).execution_provider
        out[d.name] = used.get(ep, 0)
        used[ep] = out[d.name] + 1
    return out



def plan_file_json(plan: Plan, graph) -> dict[str, Any]:
    """plan.json: the solve object, with nodes named (editable, re-applied by export)."""
    obj = plan.to_json()
    names = [n.name for n in graph.nodes]
    obj["assignment"] = {names[int(k)]: v for k, v in obj["assignment"].items()}
    obj["pieces"] = {names[int(k)]: v for k, v in obj["pieces"].items()}
    return obj


def read_plan_file(path: str | Path, graph, workload) -> Plan:
    """A plan.json (nodes by name, or by workload id) as a Plan over this workload."""
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("assignment"), dict):
        raise SplitError(f"{path}: expected a plan with an 'assignment' object (node -> device)")
    ids = {n.name: i for i, n in enumerate(graph.nodes)}

    def node_id(key: str) -> int:
        if key in ids:
            return ids[key]
        if key.isdigit() and int(key) < len(graph.nodes):
            return int(key)
        raise SplitError(f"{path}: node '{key}' is not in the model")

    assignment = {node_id(k): str(v) for k, v in data["assignment"].items()}
    raw_pieces = data.get("pieces") or {}
    if not isinstance(raw_pieces, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in raw_pieces.values()):
        raise SplitError(f"{path}: 'pieces' must map nodes to call numbers (integers from 0)")
    pieces = {node_id(k): v for k, v in raw_pieces.items()}
    missing = [graph.nodes[i].name for i in range(len(graph.nodes)) if i not in assignment]
    if missing:
        raise SplitError(f"{path}: node '{missing[0]}' is not placed"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    known = set(workload.device_index)
    bad = sorted({d for d in assignment.values() if d not in known})
    if bad:
        raise SplitError(f"{path}: device '{bad[0]}' is not one of the devices "
                         f"({', '.join(sorted(known))})")

    objective = data.get("objective", "throughput")
    if objective not in ("throughput", "latency"):
        raise SplitError(f"{path}: unknown objective '{objective}'")
    value = evaluate.score(workload, assignment, objective, pieces or None).value
    details: dict[str, Any] = {"from": str(path)}
    execution = (data.get("details") or {}).get("execution") if isinstance(data.get("details"), dict) else None
    if isinstance(execution, dict):
        details["execution"] = {k: execution[k] for k in ("cpu_threads", "optimization",
                                                          "replicas", "run_as", "provider", "shared")
                                if k in execution}
        problem = _execution_problem(details["execution"])
        if problem:
            raise SplitError(f"{path}: details.execution.{problem}")
    return Plan(objective, "given", "feasible", value, assignment, pieces=pieces,
                details=details)


def _execution_problem(execution: Mapping[str, Any]) -> str | None:
    """What is wrong with a plan file's ``details.execution`` (None: nothing)."""
    for key in ("cpu_threads", "replicas"):
        v = execution.get(key, 1)
        low = 0 if key == "cpu_threads" else 1
        if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= limits.MAX_COPIES:
            return f"{key} must be an integer from {low} to {limits.MAX_COPIES}"
    if execution.get("optimization", "all") not in ex.LEVELS:
        return f"optimization must be one of {', '.join(ex.LEVELS)}"
    if execution.get("run_as", "pipeline") not in ("pipeline", "session"):
        return "run_as must be pipeline or session"
    shared = execution.get("shared", {})
    if not isinstance(shared, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
            for k, v in shared.items()):
        return "shared must map a provider to how many CPU devices it runs (1 or more)"
    provider = execution.get("provider", CPU_EP)
    if not isinstance(provider, str) or not shares_cpu(provider):
        return (f"provider must name what runs the CPU devices ({CPU_EP}, {openvino.RUNTIME}, "
                f"or a plugin EP's CPU device), got {provider!r}")
    return None


def write_parts(prep: Prepared, plan: Plan, out: str | Path, *, force: bool = False,
                verify: bool = True, quiet: bool = False, feeds=None,
                pinned: Mapping[int, str] | None = None, candidate=None,
                shape_range: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Export ``plan`` (scored on ``candidate.workload`` and run as ``candidate.execution``
    where given) and check the parts against the original model (at each check shape of
    ``shape_range``, where given: :func:`onnxsplit.ranges.check_shapes`)."""
    graph = prep.graph
    workload = candidate.workload if candidate is not None else prep.workload
    execution = dict(candidate.execution) if candidate is not None else \
        dict(plan.details.get("execution") or {"cpu_threads": 1, "run_as": "pipeline"})
    if plan.value is None:
        why = "; ".join(plan.details.get("violations", [])[:1]) or plan.status
        raise SolveError(f"no placement found ({why})")
    violations = evaluate.check(workload, plan.assignment)
    for nid, kind in (pinned or {}).items():
        dev = plan.assignment[nid]
        if not pinned_where(workload, dev, kind):
            violations.append(f"operator '{graph.nodes[nid].name}' is pinned to {kind} but "
                              f"placed on {dev}")
    providers, threads = device_providers(workload, prep.cluster, prep.accelerator,
                                          execution.get("cpu_threads", 1), execution.get("provider"))
    names = [n.name for n in graph.nodes]
    device_of = {names[i]: d for i, d in plan.assignment.items()}
    piece_of = _pieces_by_name(workload, plan, names)
    if candidate is not None and candidate.predicted:
        predicted = dict(candidate.predicted)
    else:
        predicted = predict(workload, plan)
    predicted["single_device"] = best_single_device(prep.workload)
    calibrated = _calibrated_baselines(prep)
    if calibrated:
        predicted["baselines"] = calibrated
    if prep.accelerator is not None and not machine.accelerator_fits(prep.workload):
        predicted["accelerator_memory"] = float(prep.workload.accelerator_memory)
    plan.details["execution"] = execution
    t = time.perf_counter()
    progress.say(quiet, f"exporting parts to {out}")
    plan_obj = plan_file_json(plan, graph)
    replicas = {d: execution.get("replicas", 1) for d in set(device_of.values())}
    session = None
    if execution.get("run_as") == "session":
        session = {"threads": execution.get("cpu_threads", 0),
                   "optimization": execution.get("optimization") or "all"}
    checked: dict[str, Any] = {}
    # a split predicted from the profile is timed part by part once written (the
    # calibration's costs are the runner's), and gives way to its rival kept whole
    # where those times promise less
    timed = bool(prep.as_run.get("cpu") and max(replicas.values(), default=1) == 1
                 and (candidate is None or candidate.predicted.get("from") == "profile"))

    def check(folder: Path) -> None:
        """The parts run against the original model before they take ``out``'s place."""
        if not verify:
            return
        t = time.perf_counter()
        progress.say(quiet, "verifying the parts against the original model")

        try:
            with progress.ticking("verifying", quiet):
                checked.update(run_parts(folder, model=graph.path, feeds=feeds, measure=False,
                                         fallback_cpu=True, time_parts=timed or bool(shape_range)))
        except RunError as e:
            if candidate is None or candidate.rival is None or not execution.get("shared"):
                raise
            # a provider that shares the cores refused a part it took in whole (OpenVINO
            # compiles each part anew): the split gives way to its rival
            raise _SplitDoesNotPay(f"a part did not load as planned: {e}") from None
        if shape_range:
            with progress.ticking("verifying at the range's check shapes", quiet):
                _check_range(prep, folder, checked)
        v = checked["verify"]
        if not v["ok"]:  # (before the swap: a previous folder at ``out`` stays as it was)
            raise CheckFailed(f"{failed(v)}: not written to {out}; --no-verify writes them unchecked")
        seconds["verify"] = time.perf_counter() - t
        if timed and "part_ms" in checked:
            _predict_from_parts(prep, machine.Candidate(plan, workload, execution, predicted),
                                folder, checked["part_ms"],
                                candidate.rival if candidate is not None else None,
                                checked.get("per_shape"))
        elif checked.get("per_shape") and not checked.get("fell_back"):
            # (parts on a device this machine lacks were checked on the CPU: nothing to measure)
            with progress.ticking("measuring at the range's check shapes", quiet):
                _measure_per_shape(predicted, checked["per_shape"], folder)

    def check_and_draw(folder: Path) -> None:
        """The check, then the picture of what passed it (report.html), before the swap."""
        check(folder)
        parts_report.write(folder, workload, plan, title=f"onnxsplit: {Path(graph.path).name}",
                           predicted=predicted)

    predicted["part_profile_ms"] = _part_profile_ms(workload, plan, graph, device_of, providers, piece_of)
    seconds: dict[str, float] = dict(prep.seconds)
    try:
        exported = ex.export(graph, device_of, out, providers=providers, piece_of=piece_of,
                         threads=threads, predicted=predicted,
                         plan={k: plan_obj[k] for k in ("objective", "method", "status", "value",
                                                        "lower_bound", "gap")},
                         files={PLAN_FILE: json.dumps(plan_obj, indent=1) + "\n"}, force=force,
                         optimization=execution.get("optimization"), replicas=replicas,
                         session=session, before_swap=check_and_draw,
                         device_ids=device_ids(workload, prep.cluster, prep.accelerator),
                         machines=device_machines(workload, prep.cluster, prep.accelerator),
                         shape_range=shape_range, quiet=quiet)
    except _SplitDoesNotPay as e:
        rival = candidate.rival
        rival.plan.details["why"] += f"; {e}"
        progress.say(quiet, "the split does not pay once its parts are timed: keeping the model whole")
        return write_parts(prep, rival.plan, out, force=force, verify=verify, quiet=quiet,
                           feeds=feeds, pinned=pinned, candidate=rival, shape_range=shape_range)
    seconds["export"] = time.perf_counter() - t - seconds.get("verify", 0.0)
    result: dict[str, Any] = {
        "out": str(exported.out),
        "parts": [p.file for p in exported.parts],
        "run_as": execution.get("run_as", "pipeline"),
        "execution": execution,
        "plan": plan.to_json(),
        "predicted": predicted,
        "violations": violations,
        "devices": _device_rows(workload, plan, exported.parts),
        "model": {"path": graph.path, "operators": len(graph.nodes),
                  "weight_bytes": graph.weight_bytes,
                  "input_shapes": {k: list(v) for k, v in graph.input_shapes.items()}},
    }
    if (exported.out / parts_report.REPORT).is_file():
        result["report"] = str(exported.out / parts_report.REPORT)
    wins = machine.provider_wins(prep.workload)
    if wins:
        result["providers"] = wins
    if shape_range:
        result["model"]["shape_range"] = exported.manifest["model"]["shape_range"]
    if checked.get("per_shape"):
        result["per_shape"] = [
            {"shapes": r["shapes"], "planned": r["planned"],
             "verify": {k: r["verify"].get(k) for k in ("ok", "max_abs_error", "max_rel_error")},
             **{k: r[k] for k in ("latency_ms", "throughput_per_s") if k in r}}
            for r in checked["per_shape"]]
    if checked:
        result["verify"] = checked["verify"]
        if "assignment" in checked:
            result["assignment"] = checked["assignment"]
    result["seconds"] = {k: round(v, 3) for k, v in seconds.items()}
    return result


def _part_profile_ms(workload, plan: Plan, graph, device_of, providers, piece_of) -> dict[str, float]:
    """Each part's time as the profile predicts it (its operators' times on its device), by
    part name: what ``run --report`` draws a part's measured time against where the
    split did not time its parts."""
    ms = machine.node_times(workload, plan.assignment)
    at = {n.name: v for v, n in enumerate(graph.nodes)}
    index = workload.index
    return {p.name: round(float(sum(ms[index[at[n]]] for n in p.nodes)), 6)
            for p in ex.make_parts(graph, device_of, providers, piece_of)}


class _SplitDoesNotPay(Exception):
    """A written split's parts, timed, promise less than its rival kept whole."""


def _check_range(prep: Prepared, folder: Path, checked: dict[str, Any]) -> None:
    """The staged parts run at the other check shapes of the range their manifest records
    (the planning shape's run is ``checked``): each shape's verification (the worst
    becomes ``checked["verify"]``) and its parts' times, in ``checked["per_shape"]``."""
    planned = {k: tuple(v) for k, v in prep.graph.input_shapes.items()}
    manifest = json.loads((folder / ex.MANIFEST).read_text())
    rows = []
    for shapes in ranges.check_shapes(ranges.from_json(manifest["model"]["shape_range"]), planned):
        if shapes == planned:
            got = checked
        else:
            got = run_parts(folder, model=prep.graph.path, feeds=random_feeds(inputs_at(manifest, shapes)),
                            measure=False, fallback_cpu=True, time_parts=True)
        rows.append({"shapes": {k: list(v) for k, v in shapes.items()}, "planned": shapes == planned,
                     "verify": got["verify"], **({"part_ms": got["part_ms"]} if "part_ms" in got else {})})
    worst = max(rows, key=lambda r: (not r["verify"]["ok"], r["verify"].get("max_rel_error") or 0.0))
    checked["verify"] = dict(worst["verify"], shapes=worst["shapes"])
    checked["per_shape"] = rows


def _measure_per_shape(predicted: dict[str, Any], rows: list[dict[str, Any]], folder: Path) -> None:
    """Each check shape's promise where the plan's own is a calibration's (the model kept
    whole, its copies): the written parts measured there as the calibration measured them
    at the planning shape (calibrate.measure_loaded), whose figure that row keeps.  No
    model of how a call's own costs and the copies' slowdown of each other move with the
    shape held on small_bert kept whole as 2 copies, planned at 3x45: scaled in
    proportion its promise at 1x16 was 49% above the measurement; plus the difference in
    its parts' times, 16% and 33% above in two runs and 44% below in a third."""
    from .running.runner import Parts

    if not predicted.get("latency_ms") or not any(r["planned"] for r in rows):
        return
    manifest = json.loads((folder / ex.MANIFEST).read_text())
    parts = Parts(folder)
    out = []
    for r in rows:
        entry = {"shapes": r["shapes"]}
        if r["planned"]:
            got = predicted
        else:
            feeds = random_feeds(inputs_at(manifest, r["shapes"]))
            got = calibrate.measure_loaded({"parts": parts}, feeds)["parts"]
            entry["measured"] = True
        if got.get("latency_ms") and got.get("throughput_per_s"):
            entry.update(latency_ms=got["latency_ms"], throughput_per_s=got["throughput_per_s"])
            r.update({key: entry[key] for key in ("latency_ms", "throughput_per_s")})
        out.append(entry)
    predicted["per_shape"] = out
    manifest["predicted"]["per_shape"] = out
    (folder / ex.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def _promise_at(predicted: Mapping[str, Any], more_ms: float, copies: int = 1) -> tuple[float, float]:
    """(latency ms, throughput /s) of a calibrated promise at a shape where a sample takes
    ``more_ms`` longer (fewer where negative), ``copies`` side by side sharing it."""
    latency = max(predicted["latency_ms"] + more_ms, 1e-6)
    period = max(1e3 / predicted["throughput_per_s"] + more_ms / max(copies, 1), 1e-6)
    return latency, 1e3 / period


def _predict_from_parts(prep: Prepared, candidate, folder: Path, part_ms: list[float],
                        rival=None, per_shape: list[dict[str, Any]] | None = None) -> None:
    """Update ``candidate.predicted`` (and the staged manifest's) by what the parts' own
    times promise (machine.parts_prediction), the profile's figures kept beside; raise
    _SplitDoesNotPay where that loses to ``rival``, the candidate kept whole.  Each row of
    ``per_shape`` with its parts' times gets its own promise (``predicted.per_shape``)."""
    manifest = json.loads((folder / ex.MANIFEST).read_text())
    got = _parts_promise(prep, candidate, manifest, part_ms)
    got["profile"] = {k: candidate.predicted.get(k) for k in ("latency_ms", "throughput_per_s")}
    candidate.predicted.update(got)
    manifest["predicted"].update(got)
    if per_shape:
        shapes = []
        for row in per_shape:
            if "part_ms" in row:
                row.update({k: v for k, v in _parts_promise(prep, candidate, manifest, row["part_ms"]).items()
                            if k in ("latency_ms", "throughput_per_s")})
            shapes.append({k: row[k] for k in ("shapes", "latency_ms", "throughput_per_s") if k in row})
        candidate.predicted["per_shape"] = manifest["predicted"]["per_shape"] = shapes
    (folder / ex.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    objective = candidate.plan.objective
    if rival is None:
        return
    over = _over_the_range(per_shape or [], rival, objective)
    if over is not None and over < 1:
        raise _SplitDoesNotPay(
            f"the split, written and timed part by part at the range's check shapes, promises "
            f"{over:.2f}x the model kept whole (geometric mean over the shapes)")
    if over is None and candidate.value(objective) > rival.value(objective):
        raise _SplitDoesNotPay(
            f"the split, written and timed part by part, promises {_promise(candidate, objective)} "
            f"against {_promise(rival, objective)} whole")


def _over_the_range(rows: list[dict[str, Any]], rival, objective: str) -> float | None:
    """A split's speed over ``rival`` (the model kept whole) across a range's check shapes,
    their geometric mean (above 1: the split is faster), or None without a range: the
    whole model's promise at each shape is its calibrated one plus what the model takes
    more there (its parts' times summed), so the split's fixed costs per call, which
    weigh most at small shapes, decide (a model kept whole and written is measured at
    each shape instead: :func:`_measure_per_shape`)."""
    key = "throughput_per_s" if objective == "throughput" else "latency_ms"
    rows = [r for r in rows if r.get("part_ms") and r.get(key)]
    base = next((r for r in rows if r.get("planned")), None)
    if len(rows) < 2 or base is None or not (rival.predicted.get("latency_ms") and
                                             rival.predicted.get("throughput_per_s")):
        return None
    copies = int(rival.execution.get("replicas") or 1)
    logs = []
    for r in rows:
        latency, throughput = _promise_at(rival.predicted, sum(r["part_ms"]) - sum(base["part_ms"]), copies)
        logs.append(np.log(r[key] / throughput if objective == "throughput" else latency / r[key]))
    return float(np.exp(np.mean(logs)))


def _parts_promise(prep: Prepared, candidate, manifest: Mapping[str, Any], part_ms: list[float]) -> dict[str, Any]:
    """What the parts' own times ``part_ms`` promise (machine.parts_prediction)."""
    cpu_rec = prep.as_run["cpu"]
    parts = manifest["parts"] if manifest.get("run_as") != "session" else \
        [{"device": "session", "replicas": 1, "inputs": [], "outputs": []}]
    objective = candidate.plan.objective
    threads = int(candidate.execution.get("cpu_threads") or 1)
    w = candidate.workload
    on_cores = w.num_cpus + sum(n for c, n in zip(w.class_names, w.class_counts) if c in _cores_classes(w))
    squeeze = {}  # a device on the cores, slowed by its busy neighbours as its provider's copies were
    if objective == "throughput" and on_cores > 1:
        for p in parts:
            rec = cpu_rec if p.get("execution_provider") == CPU_EP else prep.as_run.get(p.get("execution_provider"))
            if rec:
                squeeze[p["device"]] = machine.cal.contention(rec, threads)
    # the promise from the times as written beside it (rounded first: from the unrounded
    # ones a latency read a hair below the written parts' sum, 0.0247125 against 0.024713)
    part_ms = [round(v, 6) for v in part_ms]
    got = machine.parts_prediction(parts, part_ms, machine.CallCosts.of(cpu_rec), squeeze)
    got["part_ms"] = part_ms
    return got


def runner_pieces(workload, plan: Plan) -> dict[int, int]:
    """node id -> call on its device as the runner executes the plan (and the exporter
    cuts it): a latency plan's accelerator pieces with the CPU cores' calls around them,
    else the evaluator's pieces with serial CPUs (evaluate.runner_pieces)."""

    dev = evaluate.device_array(workload, plan.assignment)
    given = np.array([plan.pieces.get(int(i), 0) for i in workload.ids], dtype=np.int64) \
        if plan.pieces else None
    piece = evaluate.runner_pieces(workload, dev, given)
    return {int(workload.ids[v]): int(piece[v]) for v in range(workload.n)}


def runner_calls(plan: Plan, pieces: Mapping[int, int]) -> dict[str, int]:
    """Device -> how many calls (parts) it makes per sample, from the plan's
    :func:`runner_pieces`."""
    calls: dict[str, set[int]] = {}
    for i, p in pieces.items():
        calls.setdefault(plan.assignment[i], set()).add(p)
    return {d: len(p) for d, p in calls.items()}


def _pieces_by_name(workload, plan: Plan, names) -> dict[str, int] | None:
    """Calls per device for the exporter: the plan's pieces (with the CPU cores' calls
    around them), else one part per device, or where that would leave parts waiting on
    each other, the evaluator's pieces."""
    pieces = runner_pieces(workload, plan)
    if not plan.pieces and max(pieces.values(), default=1) <= 1:
        return None
    return {names[i]: p for i, p in pieces.items()}


def _device_rows(workload, plan: Plan, parts) -> list[dict[str, Any]]:

    order = list(dict.fromkeys(p.device for p in parts))
    return [{"device": r["device"], "nodes": r["nodes"], "load_ms": r["load"],
             "parts": [p.file for p in parts if p.device == r["device"]]}
            for r in evaluate.device_rows(workload, plan.assignment, order)]


# ------------------------------------------------------------------------ entry points


def split(model: str | Path, out: str | Path, *, devices: str | Path | None = None,
          objective: str = "throughput", input_shapes=None, pins: Iterable[str] = (),
          method: str = "auto", time_limit: float = 30.0, force: bool = False,
          quiet: bool = False, verify: bool = True, profile: str | Path | None = None,
          accelerator: str | None = None, feeds=None,
          input_fills: Mapping[str, float] | None = None, recalibrate: bool = False,
          shape_range: Mapping[str, Any] | None = None, precision: str = "auto") -> dict[str, Any]:
    """Place ``model`` on the devices and write the verified parts into ``out``
    (``recalibrate``: measure the whole model as users run it again, see :func:`prepare`).
    ``shape_range`` (:mod:`onnxsplit.ranges`): the parts are for every shape in it, planned
    at ``input_shapes``, checked and timed at its corners too.  ``precision``: what
    OpenVINO's parts compute in (``auto``: as OpenVINO does by default here, bf16 on a CPU
    with bf16 units; :func:`openvino.computing_in`)."""
    with openvino.computing_in(precision, quiet) as computed:
        if objective not in ("throughput", "latency"):
            raise OnnxsplitError(f"unknown objective '{objective}' (choose throughput or latency)")
        check_out(out, force, probe=True)
        input_shapes = ranges.planning(shape_range, input_shapes)
        pins = list(pins)
        applied = []  # (the calibration leaves the workload as it was: pinned once, before it)

        def pins_apply(p: Prepared) -> None:
            applied.append(apply_pins(p.workload, parse_pins(pins, p.workload, p.accelerator)))

        prep = prepare(model, devices=devices, input_shapes=input_shapes, profile=profile,
                       accelerator=accelerator, quiet=quiet, input_fills=input_fills,
                       recalibrate=recalibrate, check=pins_apply,
                       largest=ranges.corners(shape_range)[1] if shape_range else None)
        pinned_workload, pinned = applied[0]
        t = time.perf_counter()
        progress.say(quiet, f"solving for {objective} ({prep.workload.n} operators, {prep.workload.device_summary()})")
        with progress.solving(quiet):
            cand = choose(prep, pinned_workload, objective, method, time_limit, pinned=bool(pinned))
        prep.seconds["solve"] = time.perf_counter() - t
        result = write_parts(prep, cand.plan, out, force=force, verify=verify, quiet=quiet, feeds=feeds,
                             pinned=pinned, candidate=cand, shape_range=shape_range)
    return result if computed == "f32" else {**result, "precision": computed}


def export_plan(model: str | Path, plan_path: str | Path, out: str | Path, *,
                devices: str | Path | None = None, input_shapes=None, force: bool = False,
                quiet: bool = False, verify: bool = True, profile: str | Path | None = None,
                accelerator: str | None = None, feeds=None,
                input_fills: Mapping[str, float] | None = None, recalibrate: bool = False,
                shape_range: Mapping[str, Any] | None = None, precision: str = "auto") -> dict[str, Any]:
    """Re-apply a (possibly edited) plan.json to ``model`` and write its verified parts
    (for every shape of ``shape_range``, and in ``precision``, as :func:`split`)."""
    with openvino.computing_in(precision, quiet) as computed:
        check_out(out, force, probe=True)
        input_shapes = ranges.planning(shape_range, input_shapes)
        if not Path(plan_path).is_file():
            raise SplitError(f"plan file '{plan_path}' does not exist")
        data = read_json(plan_path)
        details = data.get("details") if isinstance(data, dict) else None
        execution = (details.get("execution") or {}) if isinstance(details, dict) else {}
        shared = isinstance(execution, dict) and bool(execution.get("shared"))

        def plan_of(p: Prepared) -> Plan:
            # (before the calibration too, where the providers' devices are not yet timed as
            # run: what the file names is checked then, and scored once calibrated)
            return read_plan_file(plan_path, p.graph, _with_shared(p, execution, plan_path) if shared else p.workload)

        prep = prepare(model, devices=devices, input_shapes=input_shapes, profile=profile,
                       accelerator=accelerator, quiet=quiet, input_fills=input_fills,
                       recalibrate=recalibrate, check=plan_of,
                       largest=ranges.corners(shape_range)[1] if shape_range else None)
        if shared:
            prep = replace(prep, workload=_with_shared(prep, execution, plan_path))
        plan = read_plan_file(plan_path, prep.graph, prep.workload)
        result = write_parts(prep, plan, out, force=force, verify=verify, quiet=quiet, feeds=feeds,
                             shape_range=shape_range)
    return result if computed == "f32" else {**result, "precision": computed}


def _with_shared(prep: Prepared, execution: Mapping[str, Any], where) -> Any:
    """The prepared workload with the devices a plan file gives to providers that share
    the cores (``details.execution.shared``: provider -> devices), as the main command
    weighed it (machine.with_provider)."""
    shared = execution["shared"]
    problem = _execution_problem(execution)
    if problem:
        raise SplitError(f"{where}: details.execution.{problem}")
    w = prep.workload
    for provider, count in shared.items():
        if provider not in prep.cluster.cpu.shared_by or not machine.on_cores_latency(w, provider):
            raise SplitError(f"{where}: details.execution.shared names {provider}, which does not "
                             f"run on this machine's cores here (sharing them: "
                             f"{', '.join(prep.cluster.cpu.shared_by) or 'none'})")
        if count > w.num_cpus:
            raise SplitError(f"{where}: details.execution.shared gives {count} devices to {provider}, "
                             f"but the CPU has {w.num_cpus}")
        rec = prep.as_run.get(provider) or {}
        own = calibrate.latency_ms(rec, int(execution.get("cpu_threads") or 1))
        w = machine.with_provider(w, provider, count, machine.as_run_factor(own, prep.unoptimised_ms.get(provider)))
    return w
