"""Plans for the machine as onnxruntime runs it, not the paper's single-thread cores.

The solvers optimise the paper's model; for the main command this module puts the
machine into it, and keeps what a user already has as a candidate so that onnxsplit is
never slower than not using it: the model kept whole (:func:`whole_candidates`: the
default session, fewer threads, copies side by side, the accelerator's default session;
predicted by the calibration's measurements), the workload each division of the CPU cores
gives the solver (:func:`split_workloads`: node times scaled to ``t`` threads and to busy
neighbours), a latency plan run as one onnxruntime session (:func:`serial_latency`),
what the runner adds per call (:class:`CallCosts`), and a written plan's promise from
its parts' own times (:func:`parts_prediction`).

Write-up: docs/machine.md (The candidates, How predictions are made).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from . import calibrate as cal
from .export import UNFUSED, UNFUSED_CONFIG, part_deps
from .providers.openvino import PLUGIN_EP, RUNTIME
from .plan import Plan
from .profile.devices import CPU_EP
from .solve import evaluate
from .workload import AcceleratorClass

SESSION_CALL_MS = 0.05  # one onnxruntime session call's own cost (bind, hand back outputs)


@dataclass(frozen=True)
class CallCosts:
    """What the runner adds per part call beyond the part's own time
    (calibrate.runner_costs): a sample's wait at each call (``handoff_ms``), a device's
    time per call when samples queue (``call_ms``), the share all calls take of one
    interpreter lock (``gil_ms``, a call with one tensor in and one out; ``gil_tensor_ms``
    more for each further tensor), and a session call's own cost (``session_ms``), which
    a part's measured time holds and its nodes' profiled times lack.  The defaults, for
    a profile without the runner's calibration, were measured on a 2-core machine:
    tiny BERT's two 0.096 ms stages stream at 0.21-0.28 ms a sample and take 0.37-0.46
    ms alone (tools/bench_pipeline.py); models/small_bert scattered over 68 parts on two
    cores streamed at 2.8 ms a sample."""

    handoff_ms: float = 0.1
    call_ms: float = 0.1
    gil_ms: float = 0.04
    session_ms: float = 0.0
    gil_tensor_ms: float = 0.002
    measured: bool = False

    KEYS = ("handoff_ms", "call_ms", "gil_ms", "session_ms", "gil_tensor_ms")

    @classmethod
    def of(cls, cpu_rec: Mapping[str, Any] | None) -> "CallCosts":
        """The CPU calibration's runner costs, else the defaults."""
        got = (cpu_rec or {}).get("runner") or {}
        if not all(isinstance(got.get(k), (int, float)) and got[k] >= 0 for k in cls.KEYS) \
                or not got["gil_ms"] > 0:
            return cls()
        return cls(*(float(got[k]) for k in cls.KEYS), measured=True)

    def tensors_ms(self, tensors: int) -> float:
        """What a call's ``tensors`` (in and out in all) beyond one each way add to the
        runner's Python work for it: a sample alone waits this long too."""
        return self.gil_tensor_ms * max(tensors - 2, 0)

    def lock_ms(self, tensors: int) -> float:
        """A call's share of the interpreter lock, with ``tensors`` in and out in all."""
        return self.gil_ms + self.tensors_ms(tensors)

    def as_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.KEYS}, "measured": self.measured}


@dataclass
class Candidate:
    """A plan with the workload it was scored on, how it runs, and what it promises."""

    plan: Plan
    workload: Any
    execution: dict[str, Any]  # cpu_threads, optimization, replicas, run_as
    predicted: dict[str, Any] = field(default_factory=dict)
    # a split's best rival kept whole: written instead where the split's parts, timed
    # once written, promise less (workflow.write_parts)
    rival: "Candidate | None" = None

    def value(self, objective: str) -> float:
        """Lower is better: ms per sample (throughput) or ms (latency)."""
        p = self.predicted
        return 1e3 / p["throughput_per_s"] if objective == "throughput" else p["latency_ms"]


def _whole_plan(workload, device: str, objective: str, why: str, value: float) -> Plan:
    return Plan(objective, "whole", "feasible", value,
                {int(i): device for i in workload.ids}, details={"why": why})


def accelerator_fits(workload) -> bool:
    return bool(workload.num_accelerators and workload.supported.all()
                and workload.size.sum() <= workload.accelerator_memory)


# how a candidate's description names a level other than onnxruntime's default
LEVEL_SAYS = {"disabled": ", graph optimisations off",
              UNFUSED: f", all optimisations but {UNFUSED_CONFIG['optimization.disable_specified_optimizers']}"}


def whole_candidates(workload, objective: str, cpu_rec: Mapping[str, Any],
                     acc_rec: Mapping[str, Any] | None,
                     shared: Mapping[str, Mapping[str, Any]] | None = None) -> list[Candidate]:
    """The model kept whole, as onnxruntime runs it (see the module docstring), and as
    each provider that shares the CPU's cores runs it (``shared``: provider -> its
    calibration; OpenVINO's runtime: its LATENCY hint on every core, streams side by
    side, fewer threads).  A candidate's ``execution["provider"]`` names a provider other
    than the CPU EP that runs its CPU device."""
    out = []

    def add(device: str, got: Mapping[str, Any], execution: dict[str, Any], what: str) -> None:
        if not got or "error" in got or not got.get("throughput_per_s"):
            return
        pred = {"latency_ms": got["latency_ms"], "throughput_per_s": got["throughput_per_s"],
                "parts": 1, "from": "calibration"}
        value = pred["latency_ms"] if objective == "latency" else 1e3 / pred["throughput_per_s"]
        out.append(Candidate(_whole_plan(workload, device, objective, what, value), workload,
                             dict(execution, run_as="pipeline"), pred))

    if workload.num_cpus:
        for provider, rec in [(CPU_EP, cpu_rec)] + list((shared or {}).items()):
            for what, got, execution in _on_cores(workload, objective, provider, rec, cpu_rec):
                add("cpu0", got, execution, what)
    if acc_rec and accelerator_fits(workload):
        add("acc0", acc_rec.get("default"), {"cpu_threads": 0, "optimization": "all",
                                             "replicas": 1, "baseline": True},
            "onnxruntime's default session on the accelerator")
    return out


# how a candidate's description names a provider that runs the whole model on the cores,
# and its default configuration
PROVIDER_SAYS = {CPU_EP: ("onnxruntime", "onnxruntime's default session on the CPU"),
                 RUNTIME: ("OpenVINO", "OpenVINO's LATENCY hint on every core"),
                 PLUGIN_EP: ("onnxruntime with OpenVINO's EP", "onnxruntime's session on OpenVINO's EP")}


def _on_cores(workload, objective: str, provider: str, rec: Mapping[str, Any],
              cpu_rec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], dict[str, Any]]]:
    """(what, calibrated figures, execution) of each way ``provider`` runs the whole
    model on the host's cores: its default, and each calibrated thread count (copies
    side by side where fewer threads than cores)."""
    name, default_says = PROVIDER_SAYS.get(provider, (provider, f"{provider}'s default session"))
    mark = {} if provider == CPU_EP else {"provider": provider}
    found = [(default_says, rec.get("default"), {"cpu_threads": 0, "optimization": "all",
                                                 "replicas": 1, "baseline": True, **mark})]
    cores = int(rec.get("cores") or cpu_rec.get("cores") or workload.num_cpus)
    for t, rep in (rec.get("replicas") or {}).items():
        copies = rep.get("copies", 1)
        if int(t) * copies > workload.num_cpus or (copies > 1 and objective == "latency"):
            continue  # more cores than the cluster has; copies do not cut latency
        level = rep.get("optimization", "all")
        every_core = copies == 1 and int(t) >= cores
        if every_core and level == "all":
            continue  # the default session by another name
        # on every core at another level: the default session's own threads (which it
        # pins to cores, where explicit threads are not), so that the level alone differs
        if provider == CPU_EP:
            what = (f"{copies} copies of the model side by side, {t} thread(s) each" if copies > 1
                    else "onnxruntime's default session" if every_core
                    else f"one onnxruntime session with {t} intra-op threads") + LEVEL_SAYS.get(level, "")
        else:
            what = (f"{name}, {copies} streams side by side, {t} thread(s) each" if copies > 1
                    else f"{name} with {t} thread(s)")
        found.append((what, rep, {"cpu_threads": 0 if every_core else int(t), "optimization": level,
                                  "replicas": copies, **mark}))
    return found


def as_run_factor(as_run_ms: float | None, unoptimised_ms: float | None) -> float:
    """How much faster the model runs as users run it than its unoptimised profile (1 where
    either is unknown): what scales the profile's node times."""
    if not as_run_ms or not unoptimised_ms:
        return 1.0
    return float(as_run_ms) / float(unoptimised_ms)


def scaled(workload, *, cpu_factor: float, acc_factor: float, cpus: int):
    """``workload`` with node times scaled per device kind and ``cpus`` CPU devices."""
    nodes = tuple(replace(n, cpu_latency=n.cpu_latency * cpu_factor,
                          acc_latency=n.acc_latency * acc_factor) for n in workload.nodes)
    return replace(workload, nodes=nodes, num_cpus=cpus)


def split_workloads(workload, objective: str, cpu_rec: Mapping[str, Any],
                    acc_rec: Mapping[str, Any] | None, unoptimised: Mapping[str, float | None],
                    shared: Mapping[str, Mapping[str, Any]] | None = None
                    ) -> list[tuple[Any, dict[str, Any]]]:
    """(workload for the solver, execution) for each CPU division worth solving; for
    throughput, also each division that gives some of its devices to a provider sharing
    the cores (``shared``: provider -> calibration; :func:`with_provider`)."""
    acc_default = ((acc_rec or {}).get("default") or {}).get("latency_ms")
    acc_factor = as_run_factor(acc_default, unoptimised.get("acc"))
    cores = min(workload.num_cpus, int(cpu_rec.get("cores") or workload.num_cpus))
    out = []
    counts = [cores] if objective == "latency" else cal.thread_counts(cores)
    for t in counts:
        cpus = max(cores // t, 1) if cores else 0
        lat = cal.latency_ms(cpu_rec, t)
        if lat is None:
            continue
        squeeze = cal.contention(cpu_rec, t) if objective == "throughput" and cpus > 1 else 1.0
        w = scaled(workload, cpu_factor=as_run_factor(lat, unoptimised.get("cpu")) * squeeze,
                   acc_factor=acc_factor, cpus=cpus)
        execution = {"cpu_threads": t, "optimization": cal.level_of(cpu_rec, t), "replicas": 1}
        if workload.accelerators_total or cpus > 1:  # (one CPU device alone: a whole candidate)
            out.append((w, execution))
        if objective != "throughput":
            continue  # (a latency plan's devices would take turns on the same cores)
        for provider, rec in (shared or {}).items():
            own = cal.latency_ms(rec, t)
            if own is None or not on_cores_latency(workload, provider):
                continue
            squeezed = cal.contention(rec, t) if cpus > 1 else 1.0
            factor = as_run_factor(own, unoptimised.get(provider)) * squeezed
            for given in sorted({1, cpus // 2, cpus}):
                if given < 1 or (given == cpus and cpus == 1 and not workload.accelerators_total):
                    continue  # (the whole model on it alone: a whole candidate)
                out.append((with_provider(w, provider, given, factor),
                            dict(execution, shared={provider: given})))
    return out


# the class a provider that shares the cores gets in a workload (its devices named so)
CORES_CLASS = {RUNTIME: "openvino"}


def cores_class(provider: str) -> str:
    """The accelerator class name of a provider that runs on the CPU's cores."""
    import re

    return CORES_CLASS.get(provider) or re.sub(r"\W", "_", provider.removesuffix("ExecutionProvider").lower()) + "_cores"


def on_cores_latency(workload, provider: str) -> list[float | None] | None:
    """Every node's latency on ``provider`` (the workload's ``onCores``, built from its
    profile), None where it has none."""
    got = ((workload.extra.get("onnxsplit") or {}).get("onCores") or {}).get(provider) or {}
    return got.get("latency")


def provider_wins(workload) -> dict[str, dict[str, Any]]:
    """Per operator, the CPU EP against each provider that shares the cores (one thread
    each, each scaled to its own whole model): on how many operators each is faster, its
    share of the time when every operator runs on the faster of the two, and that time
    beside each provider's own -- how much a split across the two could gain at most,
    before hand-offs and lost fusions."""
    out = {}
    cpu = np.asarray(workload.cpu_latency, dtype=float)
    for provider in ((workload.extra.get("onnxsplit") or {}).get("onCores") or {}):
        own = np.array([np.inf if v is None else v for v in on_cores_latency(workload, provider)])
        faster = own < cpu
        best = np.minimum(cpu, own)
        total = float(best.sum()) or 1.0
        out[provider] = {"operators": int(len(cpu)), "faster_on": int(faster.sum()),
                         "cpu_faster_on": int((cpu < own).sum()),
                         "time_share": round(float(best[faster].sum()) / total, 4),
                         "best_of_both_ms": round(float(best.sum()), 6),
                         "cpu_ms": round(float(cpu.sum()), 6),
                         "own_ms": round(float(own[np.isfinite(own)].sum()), 6)}
    return out


def with_provider(workload, provider: str, count: int, factor: float):
    """``workload`` with ``count`` of its CPU devices run by ``provider`` instead: an
    accelerator class of its own (memory: the host's; latency: its profile's times times
    ``factor``, where it runs the node), named in ``extra.onnxsplit.coresClasses`` so the
    exporter gives its parts that provider.  Tensors between it and the CPU EP stay in
    host memory: no transfer is priced (the runner's hand-offs are, by the prediction)."""
    name = cores_class(provider)
    ms = on_cores_latency(workload, provider)
    nodes = tuple(replace(n, latencies=n.latencies + ((name, ms[i] * factor),))
                  if ms[i] is not None else n for i, n in enumerate(workload.nodes))
    meta = dict(workload.extra.get("onnxsplit") or {})
    meta["coresClasses"] = {**(meta.get("coresClasses") or {}), name: provider}
    memory = float(((meta.get("cpu") or {}).get("memory")) or 0.0) or float(workload.size.sum())
    cls = AcceleratorClass(name, count, memory)
    return replace(workload, nodes=nodes, num_cpus=workload.num_cpus - count,
                   accelerator_classes=workload.accelerator_classes + (cls,),
                   extra={**workload.extra, "onnxsplit": meta})


def node_times(workload, assignment: Mapping[int, str]) -> np.ndarray:
    """Each node's time on the device the plan puts it on (in ``workload.ids`` order)."""
    dev = evaluate.device_array(workload, assignment)
    cls = workload.device_class[dev]
    return np.where(cls >= 0, workload.class_latency[np.maximum(cls, 0), np.arange(workload.n)],
                    workload.cpu_latency)


def serial_latency(workload, assignment: Mapping[int, str]) -> float:
    """One session running the plan: every node one after another on its device, each
    tensor moved once to each other device that reads it, plus the call's own cost."""
    dev = evaluate.device_array(workload, assignment)
    total = float(node_times(workload, assignment).sum())
    moved = set()
    index = {int(i): k for k, i in enumerate(workload.ids)}
    for e in workload.edges:
        a, b = dev[index[e.source]], dev[index[e.dest]]
        if a != b and (e.source, b) not in moved:
            moved.add((e.source, b))
            total += e.cost
    return total + SESSION_CALL_MS


def parts_prediction(parts: list[Mapping[str, Any]], part_ms: list[float], costs: CallCosts,
                     squeeze: Mapping[str, float] | None = None) -> dict[str, Any]:
    """A written plan's promise from its parts' own times (``part_ms``: each timed alone,
    in the manifest's order, which the runner's is) rather than from the profile's node
    times: a cut through a pattern onnxruntime would fuse, or a part's own session, shows
    there.  Both figures are the runner's schedule simulated (:func:`simulate_runner`):
    throughput with its samples in flight, each part slowed by ``squeeze`` (device -> how
    much its busy neighbours slow it: the copies' calibration) plus ``call_ms``, and at
    most one sample per all calls' share of the interpreter lock (:meth:`CallCosts.lock_ms`
    of their tensors); latency with one sample alone, each call's tensors handled in
    its turn (:meth:`CallCosts.tensors_ms`).  One part
    run on its own (a plan in one session) has no hand-offs."""
    squeeze = squeeze or {}
    if len(parts) == 1 and int(parts[0].get("replicas") or 1) == 1:
        ms = max(part_ms[0], 1e-9)  # (a clock that did not tick)
        return {"latency_ms": ms, "throughput_per_s": 1e3 / ms, "parts": 1, "from": "parts"}
    deps = part_deps([[t["name"] for t in p["inputs"]] for p in parts],
                     [[t["name"] for t in p["outputs"]] for p in parts])
    devices = [p["device"] for p in parts]
    tensors = [len(p["inputs"]) + len(p["outputs"]) for p in parts]
    alone = simulate_runner(devices, [ms + costs.tensors_ms(t) for ms, t in zip(part_ms, tensors)],
                            deps, costs.handoff_ms, depth=1, samples=1)
    busy = [ms * squeeze.get(d, 1.0) + costs.call_ms for d, ms in zip(devices, part_ms)]
    load: dict[str, float] = {}
    for d, ms in zip(devices, busy):
        load[d] = load.get(d, 0.0) + ms
    # (a device's own parts bound it however the samples flow; the simulation's window
    # may hold a few finishes of its start, when a device ran ahead)
    period = max(simulate_runner(devices, busy, deps, costs.handoff_ms), max(load.values()),
                 sum(costs.lock_ms(t) for t in tensors))
    return {"latency_ms": alone + costs.handoff_ms, "throughput_per_s": 1e3 / period,
            "max_load_ms": max(load.values()), "parts": len(parts), "from": "parts"}


REPLAY_EVENTS = 300_000  # part runs one replay of the runner may take (about a second)


def simulate_runner(devices: list[str], run_ms: list[float], deps: list[list[int]],
                    handoff_ms: float, depth: int | None = None, samples: int | None = None
                    ) -> float:
    """The runner's pipeline (runner.Pipeline) replayed on part times: ``depth``
    samples in flight (default: two per device, as the runner keeps them), each device
    running one part at a time, the oldest sample's first, each part ready
    ``handoff_ms`` after its last input.  With one sample: its time through; else the ms
    per sample in steady state, over whole turns of the samples in flight (the first
    quarter of the finishes, or two turns, and the last turn left out).  Where
    calls alternate between devices, samples in flight cannot keep every device busy,
    which the sum of a device's parts does not show (GPT-2 over 121 scattered parts: the
    busiest device's parts take 63 ms a sample, the runner streamed one every 103 ms)."""
    import heapq

    order = list(dict.fromkeys(devices))
    depth = depth or 2 * len(order)
    # enough samples for the start to pass (a quarter of them is left out), within
    # REPLAY_EVENTS part runs
    samples = samples or max(6 * depth, min(max(16 * depth, 400), REPLAY_EVENTS // max(len(devices), 1)))
    consumers: list[list[int]] = [[] for _ in devices]
    for i, ds in enumerate(deps):
        for d in ds:
            consumers[d].append(i)
    roots = [i for i, ds in enumerate(deps) if not ds]
    events: list[tuple[float, int, int, int]] = []  # (time, tie, sample, part): part < 0 ends
    queues: dict[str, list[tuple[int, int]]] = {d: [] for d in order}
    waiting: dict[int, list[int]] = {}
    left: dict[int, int] = {}
    done: list[float] = []
    tie = 0

    def push(t: float, s: int, i: int) -> None:
        nonlocal tie
        tie += 1
        heapq.heappush(events, (t, tie, s, i))

    def admit(t: float, s: int) -> None:
        waiting[s] = [len(ds) for ds in deps]
        left[s] = len(devices)
        for i in roots:
            push(t + handoff_ms, s, i)  # ready

    for s in range(min(depth, samples)):
        admit(0.0, s)
    admitted = min(depth, samples)
    running: dict[str, tuple[int, int]] = {}  # device -> (sample, part) it runs
    while events:
        t, _, s, i = heapq.heappop(events)
        if i >= 0:  # part i of sample s is ready on its device
            heapq.heappush(queues[devices[i]], (s, i))
        else:  # the part running on device order[-i - 1] finished
            s, i = running.pop(order[-i - 1])
            for c in consumers[i]:
                waiting[s][c] -= 1
                if waiting[s][c] == 0:
                    push(t + handoff_ms, s, c)
            left[s] -= 1
            if left[s] == 0:
                done.append(t)
                if admitted < samples:
                    admit(t, admitted)
                    admitted += 1
        for k, d in enumerate(order):
            if d not in running and queues[d]:
                running[d] = heapq.heappop(queues[d])
                push(t + run_ms[running[d][1]], -1, -k - 1)
    if len(done) <= 2 * depth + 1:
        return done[-1] / len(done)
    a = max(2 * depth, len(done) // 4)  # whole turns of the samples in flight: bursts
    b = a + (len(done) - 1 - depth - a) // depth * depth
    return (done[b] - done[a]) / (b - a)
