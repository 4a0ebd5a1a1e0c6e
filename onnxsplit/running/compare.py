"""What ``onnxsplit run`` prints: a parts folder verified against its original model,
measured, and compared in the same run with what a user would run instead.

:func:`run_parts` checks the outputs of one sample against the original model on the same
inputs (``verify``: within tolerances that scale with each output and with how far the
original's own outputs move between onnxruntime's configurations,
:mod:`onnxsplit.running.verify`), then measures single-stream latency and pipelined
throughput (``measured``) beside the baselines (:func:`baseline_runs`: onnxruntime's
default session, copies of the model, OpenVINO's hints, each accelerator's session), each
held in a process of its own (:mod:`onnxsplit.running.apart`) and measured in rounds,
paired with the plan (:func:`measure_rounds`), with the ratios and the prediction's
errors.  Loading and running parts is :mod:`onnxsplit.running.runner`'s.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from ..errors import RunError
from ..profile.devices import CPU_EP, shares_cpu
from ..profile.measure import session_options
from ..providers import openvino
from . import timing
from . import verify as verify_outputs
from .runner import (Parts, build_configuration, compare_outputs, measure_pipeline,
                     random_feeds, session_providers, time_calls)


# measurements alternate between the plan and the baselines, medians kept: on this shared
# 2-core machine one round of two copies moves by 5% either way, so the median of 5
# rounds' ratios put identical copies 0.92-0.95x apart in two runs of T5's encoder
ROUNDS = 9
# A round of one session at least this long (more samples for a fast model): two copies
# of light_shufflenet, identical, measured 0.93-1.18x apart over 0.3 s rounds and
# 0.95-1.03x over 1 s ones on this shared 2-core machine.  The calibration, which weighs
# many configurations, keeps shorter rounds (calibrate.ROUND_S).
MIN_ROUND_S = 1.0
MAX_ROUND_SAMPLES = 1000
# ``run``'s measurement within this many seconds by default (``--time-limit``): ViT-S at a
# batch of 4 took over 12 minutes here in 9 paired rounds of five sessions.  A budget that
# binds cuts warm-ups, then samples a round, then rounds, never below these
TIME_LIMIT_S = 300.0
MIN_ROUNDS = 3
MIN_SAMPLES = 2
# a pause before a measurement that follows a session whose intra-op threads spin on
# after its run (``Parts.spins``): they take a core from whatever runs next.  Two
# single-thread copies of T5's encoder took 98.7 ms a pair right after the default
# session's runs, 73.1 ms 20 ms later and 61.7-63.3 ms after 50-300 ms (medians of 15,
# this shared 2-core machine)
SETTLE_S = 0.1


def default_session_name(ep: str) -> str:
    """The baseline name of onnxruntime's default session on ``ep``."""
    return f"ort_default_{_short(ep)}"


def _short(ep: str) -> str:
    """``CUDAExecutionProvider`` -> ``cuda``: how baseline names spell an EP."""
    return ep.removesuffix("ExecutionProvider").lower()


def copies_name(cores: int) -> str:
    """The baseline name of one single-thread copy of the model per core."""
    return f"ort_replicas_cpu_{cores}x1"


def openvino_name(hint: str) -> str:
    """The baseline name of OpenVINO's runtime with one of its performance hints."""
    return f"openvino_{hint.lower()}"


def baseline_runs(accelerators: Iterable[str] = (), capacity_kb: int | None = None
                  ) -> dict[str, tuple[str, dict[str, Any]]]:
    """What a user runs instead of onnxsplit, name -> (EP, how ``Parts.whole`` runs it, or
    with ``hint`` how :class:`openvino.Hinted` does): onnxruntime's default session on the
    CPU (all graph optimisations, default threads); copies of the whole model side by
    side, one single-thread session per core; where installed, OpenVINO's own runtime
    with its LATENCY and THROUGHPUT hints (in what it computes in by default: bf16 on a CPU
    with bf16 units) and each plugin EP on the CPU as onnxruntime runs it by default
    (OpenVINO's EP in what onnxsplit's OpenVINO parts compute in: ``plugins.precision_config``); on each accelerator EP, its default session
    (onnxruntime puts what the EP cannot run on the CPU) and, with ``capacity_kb``, its
    capacity-aware partitioning under that memory budget, ad hoc and with the per-node
    memory statistics it collects first."""
    import os

    from ..profile.devices import cpu_providers

    cores = os.cpu_count() or 1
    runs: dict[str, tuple[str, dict[str, Any]]] = {
        default_session_name(CPU_EP): (CPU_EP, {"threads": 0}),
        copies_name(cores): (CPU_EP, {"threads": 1, "replicas": cores}),
    }
    for ep in cpu_providers():
        if ep == openvino.RUNTIME:
            for hint in openvino.HINTS:
                runs[openvino_name(hint)] = (ep, {"threads": 0, "hint": hint})
        else:
            runs[default_session_name(ep)] = (ep, {"threads": 0})
    for ep in dict.fromkeys(accelerators):
        short = _short(ep)
        runs[default_session_name(ep)] = (ep, {"threads": 0})
        if capacity_kb is not None and ep == "CUDAExecutionProvider":
            setting = f"{int(capacity_kb)},"
            runs[f"ort_capacity_{short}"] = (ep, {"threads": 0, "config": {
                "session.resource_cuda_partitioning_settings": setting}})
            runs[f"ort_capacity_stats_{short}"] = (ep, {"threads": 0, "config": {
                "session.resource_cuda_partitioning_settings": setting + "{stats}"}})
    return runs


def baselines(model_path: str | Path, feeds: Mapping[str, Any], *, samples: int, warmup: int,
              accelerators: Iterable[str] = (), capacity_kb: int | None = None,
              plan: "Parts | None" = None, rounds: int = ROUNDS,
              also: Mapping[str, Any] | None = None, time_limit: float | None = None,
              apart: bool = True) -> dict[str, dict[str, Any]]:
    """The baselines (:func:`baseline_runs`) measured on ``feeds``, and ``plan`` (as
    ``"onnxsplit"``) and ``also`` (name -> loaded parts) alongside: every session is
    loaded first, then ``rounds`` rounds each measure every one in turn, so a shared
    machine's slow minute hits all alike; the medians over the rounds are kept, within
    ``time_limit`` seconds where one is given (:func:`measure_rounds`).  ``apart``: each
    baseline held in a process of its own (:class:`.apart.Apart`; the caller's ``plan``
    and ``also`` are as it loaded them), none then slowed by having been loaded first."""
    import shutil

    from .. import interrupt
    from .apart import Apart

    loaded: dict[str, Any] = {}
    out: dict[str, dict[str, Any]] = {}
    if plan is not None:
        loaded["onnxsplit"] = plan
    loaded.update(also or {})
    mine: list[Any] = []  # the processes this call started, ended on the way out
    stats_dir = None
    try:
        for name, (ep, how) in baseline_runs(accelerators, capacity_kb).items():
            config = dict(how.get("config") or {})
            try:
                for k, v in config.items():
                    if "{stats}" in v:
                        stats_dir = stats_dir or interrupt.fresh_dir(prefix="onnxsplit-stats-")
                        stats = Path(stats_dir) / "node_memory.csv"
                        _collect_memory_stats(model_path, ep, feeds, stats)
                        config[k] = v.replace("{stats}", str(stats))
                recipe = ("hinted", str(model_path), how["hint"]) if "hint" in how \
                    else ("whole", str(model_path), ep, dict(how, config=config))
                if apart:
                    loaded[name] = Apart(recipe, feeds)
                    mine.append(loaded[name])
                else:
                    loaded[name] = build_configuration(recipe)
            except (RunError, openvino.OpenVINOError) as e:
                out[name] = {"error": str(e)}
                continue
            out[name] = {"execution_provider": ep, "threads": how["threads"],
                         "replicas": getattr(loaded[name], "requests", how.get("replicas", 1)),
                         **({"hint": how["hint"], "precision": loaded[name].precision} if "hint" in how else {})}
        measured = measure_rounds(loaded, feeds, samples, warmup, rounds,
                                  pair_with="onnxsplit" if plan is not None else None, time_limit=time_limit)
    finally:
        for held in mine:
            held.close()
        if stats_dir is not None:  # (made above by fresh_dir: nothing of the user's)
            shutil.rmtree(stats_dir, ignore_errors=True)
            interrupt.unregister(stats_dir)
    for name, got in measured.items():
        if "error" in got:
            out[name] = got
        elif "error" not in out.get(name, {}):
            out.setdefault(name, {}).update(got)
    return out


def measure_rounds(loaded: Mapping[str, Parts], feeds: Mapping[str, Any], samples: int,
                   warmup: int, rounds: int = ROUNDS, min_round_s: float = MIN_ROUND_S,
                   pair_with: str | None = None, time_limit: float | None = None
                   ) -> dict[str, dict[str, Any]]:
    """Each of ``loaded`` measured in ``rounds`` rounds, all in turn each round, the order
    varied (:func:`round_order`: a shared machine's slow minute then hits all alike, and
    none always runs right after the copies), each SETTLE_S after one whose threads spin
    (``Parts.spins``): medians over the rounds, or the error.  Both waits are times the
    timing scale (:func:`timing.scale`).

    ``pair_with`` (the plan's name): each other session is measured right beside a
    measurement of it (:func:`paired_order`), which ``beside`` keeps per session, so a
    ratio to the plan pairs figures taken seconds apart, not a round apart: on this
    shared 2-core machine identical copies of small_bert measured 0.87-1.23x apart in
    turn and 0.94-1.03x in adjacent pairs (8 runs each).  Where the plan fails (a part,
    or its node, lost), nothing more is measured: its error alone is returned.

    ``time_limit`` (seconds, times the timing scale): the rounds planned to fit it from
    each session's quicker of its second and third runs (:func:`fit_rounds`), and no round begun once it is spent
    after the first :data:`MIN_ROUNDS`; each summary then says so (``time_limited``)."""
    began = time.perf_counter()
    got: dict[str, list[dict[str, float]]] = {name: [] for name in loaded}
    beside: dict[str, list[dict[str, float]]] = {name: [] for name in loaded}
    out: dict[str, dict[str, Any]] = {}
    per_round: dict[str, int] = {}
    once: dict[str, float] = {}
    for name, parts in loaded.items():  # a round lasts at least min_round_s: a fast model's
        try:                             # rounds then spread over seconds, not milliseconds
            # (a first run can be slow, and any one run on a busy machine: the quicker of
            # the next two plans the rounds; beside two test workers a run planned on one
            # had fitted 29 samples a round of a 0.06 ms model into a minute's limit)
            for k in range(1 if time_limit is None else 3):
                t = time.perf_counter()
                parts.run(feeds)
                took = max(time.perf_counter() - t, 1e-6)
                once[name] = took if k < 2 else min(once[name], took)
        except RunError as e:
            out[name] = {"error": str(e)}
            if name == pair_with:
                return {name: out[name]}
            continue
        per_round[name] = max(1, samples // max(rounds, 1),
                              min(MAX_ROUND_SAMPLES, int(timing.scale() * min_round_s / once[name])))
    names = [name for name in loaded if name not in out]  # (those that ran once)
    keys = ("latency_ms", "throughput_per_s")
    spinning = True  # (whatever ran before this call may have)
    settle_s = SETTLE_S * timing.scale()
    limit = None if time_limit is None else time_limit * timing.scale()
    limited = False
    if limit is not None and names:
        depth = {name: loaded[name].default_depth() for name in names}
        asked = (rounds, warmup, per_round)
        rounds, warmup, per_round = fit_rounds(names, once, depth, per_round, warmup, rounds, pair_with,
                                               limit - (time.perf_counter() - began))
        limited = (rounds, warmup, per_round) != asked
    done = 0
    for r in range(max(rounds, 1)):
        if limit is not None and r >= MIN_ROUNDS and time.perf_counter() - began > limit:
            limited = True  # (the estimate was short: the rounds so far are the figures)
            break
        done = r + 1
        for group in paired_order(names, r, pair_with if pair_with not in out else None):
            if any(name in out for name in group):
                continue
            for name in group:
                if spinning:
                    time.sleep(settle_s)
                # (an engine that does not say, as RayParts' actors do not, counts as spinning)
                spinning = getattr(loaded[name], "spins", True)
                try:
                    got[name].append(measure_pipeline(loaded[name], feeds, per_round[name], warmup))
                except RunError as e:
                    out[name] = {"error": str(e)}
                    if name == pair_with:
                        return {name: out[name]}
                    break
            else:
                if len(group) == 2:  # the plan's measurement beside the other's
                    other = group[1] if group[0] == pair_with else group[0]
                    beside[other].append(got[pair_with][-1])
    for name, runs in got.items():
        if runs and name not in out:
            out[name] = summarised({k: [float(r[k]) for r in runs] for k in keys},
                                   per_round[name] * len(runs))
            if limited:
                out[name]["time_limited"] = {"time_limit_s": time_limit, "rounds": done,
                                             "per_round": per_round[name], "warmup": warmup}
    if pair_with in out and "error" not in out[pair_with]:
        out[pair_with]["beside"] = {
            name: {k: [float(r[k]) for r in runs] for k in keys}
            for name, runs in beside.items() if runs and name in out and "error" not in out[name]}
    return out


def measure_cost(once: float, depth: int, samples: int, warmup: int) -> float:
    """Seconds one :func:`measure_pipeline` of ``samples`` takes at most, from one run's
    time: one after another where one worker runs everything, else a stream at depth 1 for
    the latency and one at ``depth`` for the throughput (each sample no slower than alone)."""
    if depth == 1:
        return once * (warmup + samples)
    return once * (2 * warmup + samples + max(samples, 4 * depth))


def fit_rounds(names: list[str], once: Mapping[str, float], depth: Mapping[str, int],
               per_round: Mapping[str, int], warmup: int, rounds: int, pair_with: str | None,
               budget_s: float) -> tuple[int, int, dict[str, int]]:
    """Rounds, warm-up and samples a round that fit ``budget_s`` by :func:`measure_cost`:
    unchanged where they do; else the warm-up down to one sample (a session warmed in the
    first round stays warm), then each session's samples a round in proportion (at least
    :data:`MIN_SAMPLES`), then the rounds (at least :data:`MIN_ROUNDS`, whose medians and
    paired ratios still stand against one slow moment of the machine)."""
    def total(n: Mapping[str, int], w: int, rs: int) -> float:
        return rs * sum(measure_cost(once[name], depth[name], n[name], w)
                        for group in paired_order(names, 0, pair_with) for name in group)

    n = dict(per_round)
    if total(n, warmup, rounds) <= budget_s:
        return rounds, warmup, n
    warmup = min(warmup, 1)
    spent = total(n, warmup, rounds)
    while spent > budget_s and any(k > MIN_SAMPLES for k in n.values()):
        n = {name: k if k <= MIN_SAMPLES else max(MIN_SAMPLES, min(k - 1, int(k * budget_s / spent)))
             for name, k in n.items()}
        spent = total(n, warmup, rounds)
    if spent > budget_s:
        rounds = max(MIN_ROUNDS, min(rounds, int(rounds * budget_s / spent)))
    return rounds, warmup, n


def paired_order(names: list[str], r: int, pair_with: str | None = None) -> list[tuple[str, ...]]:
    """Round ``r`` as groups run back to back: each session alone in :func:`round_order`,
    or with ``pair_with``, each other session beside a run of it, the two sides taking
    turns at going first (by round and by place in it)."""
    order = round_order(names, r)
    if pair_with is None or pair_with not in names or len(names) < 2:
        return [(name,) for name in order]
    others = [name for name in order if name != pair_with]
    return [(pair_with, name) if (r + i) % 2 == 0 else (name, pair_with)
            for i, name in enumerate(others)]


def summarised(by_round: Mapping[str, list[float]], samples: int) -> dict[str, Any]:
    """A configuration's rounds as one figure: the median of each measure over the rounds."""
    return {**{k: float(np.median(v)) for k, v in by_round.items()}, "samples": samples,
            "rounds": len(next(iter(by_round.values()), [])), "by_round": dict(by_round)}


def round_order(names: list[str], r: int) -> list[str]:
    """Round ``r``'s order: rotated by ``r`` (each goes first once), the rest reversed in
    odd rounds (a plain rotation keeps who follows whom: one session would always run
    right after the copies)."""
    turned = names[r % len(names):] + names[:r % len(names)]
    return turned[:1] + turned[:0:-1] if r % 2 else turned


def _collect_memory_stats(model_path: str | Path, ep: str, feeds: Mapping[str, Any],
                          stats: Path) -> None:
    """One run of the whole model that writes onnxruntime's per-node memory statistics."""
    import onnxruntime as ort

    so = session_options(0, optimize=True)
    so.enable_mem_pattern = False
    so.add_session_config_entry("session.collect_node_memory_stats_to_file", str(stats))
    try:
        ort.InferenceSession(str(model_path), so, providers=session_providers(ep)).run(None, dict(feeds))
    except Exception as e:
        raise RunError(f"collecting memory statistics failed: {' '.join(str(e).split())[:200]}") from None


def paired_ratios(measured: Mapping[str, Any], base: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The plan's throughput over each baseline's, and each baseline's latency over the
    plan's (above 1: onnxsplit is faster): the median of the pairs' ratios, each pair the
    baseline's round and the plan's measurement beside it (``beside``) or, without those,
    the plan's round of the same number (a slow minute on a shared machine then slows both
    sides of a ratio, not one); else the ratio of the medians."""
    def paired(name: str, key: str, b: Mapping[str, Any], flip: bool) -> float:
        mine = ((measured.get("beside") or {}).get(name) or measured.get("by_round") or {}).get(key)
        theirs = (b.get("by_round") or {}).get(key)
        if mine and theirs and len(mine) == len(theirs):
            return float(np.median([(y / x) if flip else (x / y) for x, y in zip(mine, theirs)]))
        return b[key] / measured[key] if flip else measured[key] / b[key]

    return {name: {"throughput": paired(name, "throughput_per_s", b, False),
                   "latency": paired(name, "latency_ms", b, True)}
            for name, b in base.items() if "error" not in b}


def run_parts(parts_dir: str | Path, *, model: str | Path | None = None,
              feeds: Mapping[str, Any] | None = None, samples: int = 50, warmup: int = 5,
              measure: bool = True, optimize: bool = False, seed: int = 0,
              fallback_cpu: bool = False, compare: bool = True, loaded=None,
              time_parts: bool = False, time_limit: float | None = TIME_LIMIT_S) -> dict[str, Any]:
    """Verify a parts folder against its original model and (``measure``) time it, and
    (``compare``) onnxruntime's own sessions on the same inputs.  ``loaded``: the folder
    already loaded by another engine (``onnxsplit.running.ray_engine.RayParts``), measured
    beside the threaded runner's own pipeline (``onnxsplit_threads``).  ``time_parts``:
    also each part's own time (:func:`time_calls`, ``part_ms``) where every part runs
    on its own execution provider.  ``time_limit``: the comparison's rounds fit about so
    many seconds (:func:`measure_rounds`; None: as many as asked)."""
    parts = loaded if loaded is not None else Parts(parts_dir, optimize=optimize, fallback_cpu=fallback_cpu)
    model_path = Path(model) if model else Path(parts.manifest["model"]["path"])
    if not model_path.exists():
        raise RunError(f"the original model '{model_path}' is not there: pass it with --model")
    feeds = dict(feeds) if feeds is not None else random_feeds(parts.inputs, seed)
    parts.check_feeds(feeds)
    want, own = verify_outputs.reference(model_path, feeds)
    got = parts.run(feeds)
    verify = compare_outputs(got, {o: want[o] for o in parts.output_names})
    precision = parts.manifest.get("precision")  # (parts OpenVINO ran in bf16: --precision)
    reduced = verify_outputs.reduced_spread(model_path, feeds, want, precision) if precision else None
    verify.update(verify_outputs.tolerance(verify, any(ep != CPU_EP for ep in parts.execution_providers),
                                           own, reduced))
    result: dict[str, Any] = {
        "parts_dir": str(parts.dir),
        "run_as": parts.manifest.get("run_as", "pipeline"),
        "engine": "ray" if loaded is not None else "threads",
        "parts": [p["name"] for p in parts.parts],
        "devices": parts.devices,
        "execution_providers": dict(zip((p["name"] for p in parts.parts), parts.execution_providers)),
        "fell_back": [p["name"] for p, ep in zip(parts.parts, parts.execution_providers)
                      if ep != p["execution_provider"]],
        "verify": verify,
        "predicted": parts.manifest.get("predicted"),
        "precision": precision or "f32",
    }
    at = {t["name"]: list(np.shape(feeds[t["name"]])) for t in parts.inputs}
    if parts.manifest.get("model") and at != {t["name"]: list(t["shape"]) for t in parts.inputs}:
        # another shape of the range: its own promise where the split made one, else none
        result["shapes"] = at
        pred = result["predicted"] or {}
        result["predicted"] = next((dict(p, single_device=None) for p in pred.get("per_shape") or []
                                    if p.get("shapes") == at and p.get("latency_ms")), None)
    if parts.assignment is not None:
        result["assignment"] = parts.assignment
    if time_parts and not result["fell_back"] and verify["ok"]:
        result["part_ms"] = time_calls(parts, feeds)
    if measure and not compare:
        result["measured"] = measure_pipeline(parts, feeds, samples, warmup)
    elif measure:
        from .apart import Apart

        accelerators = [ep for ep in parts.execution_providers if not shares_cpu(ep)]
        budget = (result["predicted"] or {}).get("accelerator_memory")
        # OpenVINO's EP beside parts that compute in bf16 computes so too (its own runtime's
        # hints compute in what OpenVINO picks by default, said beside their figures); the
        # plan is measured in a process of its own, as each baseline is (apart.py), and
        # the threaded runner's pipeline beside another engine's
        with openvino.computing_in(precision or "f32", quiet=True), contextlib.ExitStack() as held:
            recipe = ("parts", str(parts.dir), {"optimize": optimize, "fallback_cpu": fallback_cpu})
            if loaded is None:  # (measured in its own process: not held twice meanwhile)
                parts.release()
            plan = parts if loaded is not None else held.enter_context(Apart(recipe, feeds))
            also = {"onnxsplit_threads": held.enter_context(Apart(recipe, feeds))} if loaded is not None else None
            base = baselines(model_path, feeds, samples=samples, warmup=warmup,
                             accelerators=accelerators,
                             capacity_kb=int(budget / 1024) if budget else None, plan=plan, also=also,
                             time_limit=time_limit)
        result["measured"] = base.pop("onnxsplit")
        if "error" in result["measured"]:  # the plan itself failed while measured (a part, or
            raise RunError(result["measured"]["error"])  # its node, lost): the run fails, in one line
        result["baselines"] = base
        result["ratios"] = paired_ratios(result["measured"], base)
        pred = result["predicted"] or {}
        # the machine's own drift since the split was predicted: a default session (or
        # the copies) measured now against the calibration's figure for it
        drift = {name: _errors(base[name], cal) for name, cal in (pred.get("baselines") or {}).items()
                 if "error" not in base.get(name, {"error": None}) and "shapes" not in result}
        if drift:
            result["drift"] = drift
        if pred.get("throughput_per_s") and pred.get("latency_ms"):
            result["prediction_error"] = _errors(result["measured"], pred)
            relative = _relative_errors(pred, result["ratios"])
            if relative:
                result["relative_error"] = relative
    return result


def _relative_errors(predicted: Mapping[str, Any], ratios: Mapping[str, Mapping[str, float]]
                     ) -> dict[str, dict[str, float]]:
    """The prediction's ratio to each session the calibration measured (``predicted``'s
    ``baselines``) against the ratio this run measured in pairs, less one: what the
    prediction says of the plan beside onnxruntime, with the machine's own drift since
    then cancelled out (it moves both sides of a ratio)."""
    out = {}
    for name, cal in (predicted.get("baselines") or {}).items():
        if name in ratios:
            said = {"throughput": predicted["throughput_per_s"] / cal["throughput_per_s"],
                    "latency": cal["latency_ms"] / predicted["latency_ms"]}
            out[name] = {k: ratios[name][k] / said[k] - 1 for k in said}
    return out


def _errors(measured: Mapping[str, Any], predicted: Mapping[str, Any]) -> dict[str, float]:
    """Measured over predicted, less one: throughput and latency."""
    return {"throughput": measured["throughput_per_s"] / predicted["throughput_per_s"] - 1,
            "latency": measured["latency_ms"] / predicted["latency_ms"] - 1}
