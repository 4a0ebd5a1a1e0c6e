"""The calibration: the whole model as users run onnxruntime, measured on this machine.

It turns the per-node profile (one thread, graph optimisations off) into the time of a
machine run with every optimisation on and all cores.  Each execution provider present
gets a short calibration, stored with its profile entry (``as_run``): ``threads`` (the
whole model at each thread count a CPU device may get, and unoptimised on one thread),
``default`` (onnxruntime's default session: the baseline every plan must beat) and
``replicas`` (copies side by side: how much they slow each other down).  All run through
the runner's own pipeline (:class:`runner.Parts`), so a plan that keeps the model whole
is predicted by exactly what it will run.  The CPU's record also holds ``runner``: what
the runner itself adds per part call on this machine (:func:`runner_costs`), which a
split's prediction charges for every call it makes.

Write-up: docs/machine.md (Calibration).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from .export import UNFUSED
from .profile.devices import CPU_EP, shares_cpu
from .running.timing import scale

if TYPE_CHECKING:  # (the runner is imported where a model is loaded: it brings onnxruntime)
    from .running.runner import Parts

TARGET_S = 3.0  # seconds each configuration is timed for, over ROUNDS rounds
ROUNDS = 5  # a shared machine's noise comes in slow minutes: alternate, keep medians
ROUND_S = 0.3  # each round of a configuration at least this long
MIN_SAMPLES, MAX_SAMPLES = 5, 200
MEMORY_SHARE = 0.5  # copies of the model may take this share of the host's memory
CHAIN_CALLS = 16  # the runner's costs are measured on chains of this many parts
CHAIN_WIDTH, WORK_ROWS = 256, 64  # a part that works: a 64x256 by 256x256 MatMul
GIL_DEVICES = 4  # tiny parts spread over this many devices for the calls' GIL share
WIDE_TENSORS = 6  # tensors in and out of each part of the chain that prices a tensor's GIL share
COST_ROUNDS, COST_SAMPLES = 3, 100
WARM_S = 1.0  # each calibration first runs its configurations this long in all, untimed
# rounds of one configuration further apart than this (largest over smallest throughput,
# less one) are measured again, at most AGAIN times: the first `make demo` on a fresh
# clone calibrated the default session at 193.5/s and its copies at 505.4/s, which `run`
# then measured at 534.2/s and 690.7/s; with one try more the default session was still kept
# at 66% spread once (523/s against 858-864/s measured again): a third, and past it a note
SPREAD_AGAIN, AGAIN = 0.25, 2
# providers whose calibrated best is within this factor of the best of all are measured
# again side by side (:func:`side_by_side`): separately calibrated figures moved 4-10%
# against each other on this shared machine
CLOSE = 1.25
# a session runs at another graph optimisation level than "all" (what users run, and what
# `run`'s copies run) only where that level measured this much faster.  Unoptimised: 1.1x
# -- GPT-2's whole model on one thread measured 119.5 ms at "all" and 118.6 ms unoptimised,
# its copies were then planned unoptimised and measured 3% below onnxruntime's own copies,
# while models/small_bert's unoptimised session is 1.17-1.27x faster; losing every fusion
# costs much where it is wrong (ResNet-50: 1.24x slower).  UNFUSED only leaves out a fusion
# whose kernel measured 5-7x slower than what it fuses, and is the same session where the
# fusion does not fire: 1.03x (BERT-base on one thread: 239.4 against 228.4 ms)
LEVEL_GAIN = {"disabled": 1.1, UNFUSED: 1.03}


def thread_counts(cores: int) -> list[int]:
    """Threads per CPU device the planner considers: powers of two below ``cores``, and
    ``cores``."""
    out, t = [], 1
    while t < cores:
        out.append(t)
        t *= 2
    return out + [max(cores, 1)]


def calibrate(model_path: str | Path, feeds: Mapping[str, Any], ep: str, *, cores: int | None = None,
              model_bytes: float = 0.0, host_memory: float | None = None) -> dict[str, Any]:
    """The ``as_run`` record of ``ep`` (see the module docstring).  Every configuration is
    loaded first and measured in rounds, in turn (``compare.measure_rounds``), where all
    copies fit MEMORY_SHARE of the host's memory (``model_bytes``: weights and activations
    of one copy; memory is estimated before any is loaded); else one at a time."""
    cores = cores or os.cpu_count() or 1
    if host_memory is None:
        from .profile.devices import host_memory_bytes

        host_memory = float(host_memory_bytes())
    budget = MEMORY_SHARE * host_memory
    configs: dict[str, dict[str, Any]] = {"default": {"threads": 0}}
    unfused = ep == CPU_EP and may_fuse_slowly(model_path)
    on_cores = shares_cpu(ep)  # (OpenVINO's runtime too: threads and copies, no levels)
    if on_cores:
        for t in thread_counts(cores):
            configs[f"t{t}"] = {"threads": t}
            if t == 1 and ep == CPU_EP:
                configs["t1_disabled"] = {"threads": 1, "optimization": "disabled"}
            if unfused:  # (on every core, as the default session runs: see whole_candidates)
                configs[f"t{t}_{UNFUSED}"] = {"threads": 0 if t == cores else t, "optimization": UNFUSED}
    copies_of = {name: how.get("replicas", 1) for name, how in configs.items()}

    def load(how) -> Any:
        return load_whole(model_path, ep, how)

    results: dict[str, dict[str, Any]] = {}
    if sum(copies_of.values()) * model_bytes <= budget:
        results = measure_loaded({k: load(how) for k, how in configs.items()}, feeds)
    else:
        for k, how in configs.items():
            results.update(measure_loaded({k: load(how)}, feeds))
    record: dict[str, Any] = {"default": _rounded(results["default"])}
    if scale() != 1.0:
        record["scale"] = scale()
    noisy = noisiest(results)
    if noisy:
        record["noisy"] = noisy
    if not on_cores:
        return record
    record["cores"] = cores
    record["threads"] = {}
    record["replicas"] = {}
    copies_runs: dict[str, dict[str, Any]] = {}
    for t in thread_counts(cores):
        lat = {"all": results.get(f"t{t}", {})}
        if t == 1:
            lat["disabled"] = results.get("t1_disabled", {})
        if unfused:
            lat[UNFUSED] = results.get(f"t{t}_{UNFUSED}", {})
        record["threads"][str(t)] = {k: v.get("latency_ms") for k, v in lat.items()}
        level = faster_level(record["threads"][str(t)])
        copies = cores // t
        if copies == 1:
            record["replicas"][str(t)] = dict(_rounded(lat[level]), copies=1, optimization=level)
        elif copies * model_bytes <= budget:
            copies_runs[str(t)] = {"threads": t, "optimization": level, "replicas": copies}
    # copies side by side: measured after the single sessions are gone (their memory too),
    # in the same rounds as the default session again where it fits beside them: the
    # choice between the two is then made on one stretch of the machine's time, and the
    # default's figure is the median of both stretches' rounds
    first = results["default"]
    results = None
    if copies_runs:
        fit = (1 + sum(how["replicas"] for how in copies_runs.values())) * model_bytes <= budget
        got: dict[str, dict[str, Any]] = {}
        if fit:
            got = measure_loaded({"default": load(configs["default"]),
                                  **{t: load(how) for t, how in copies_runs.items()}}, feeds)
            record["default"] = _rounded(_pooled(first, got.get("default", {})))
        else:
            for t, how in copies_runs.items():
                got.update(measure_loaded({t: load(how)}, feeds))
        for t, how in copies_runs.items():
            record["replicas"][t] = dict(_rounded(got[t]), copies=how["replicas"],
                                         optimization=how["optimization"])
    if ep == CPU_EP:  # (the runner's own costs: one record holds them)
        record["runner"] = runner_costs()
    return record


def load_whole(model_path: str | Path, ep: str, how: Mapping[str, Any]) -> "Parts | dict[str, str]":
    """The whole model loaded on ``ep`` as ``how`` says (``Parts.whole``'s keywords), or
    {"error": ...} where it will not load: what :func:`measure_loaded` takes."""
    from .running.runner import Parts, RunError

    try:
        return Parts.whole(model_path, ep, **how)
    except RunError as e:
        return {"error": str(e)}


def measure_loaded(named: Mapping[str, Any], feeds: Mapping[str, Any],
                   pair_with: str | None = None) -> dict[str, dict[str, Any]]:
    """Measure what loaded (name -> Parts or :class:`.apart.Apart`, or {"error": ...} where
    it did not), after WARM_S of runs of each (caches, thread pools and the clock of a
    machine that was idle come up to speed, as they have by the time `run` measures); the
    first runs say how many samples fill TARGET_S.  Where the rounds
    of a configuration spread wider than SPREAD_AGAIN, all are measured again (at most
    AGAIN times) and the measurement whose widest spread is least is kept.  Rounds
    shortened by the timing scale F spread wider by their shortness alone (noise over
    a round falls as the square root of its length): the bound is SPREAD_AGAIN / sqrt(F),
    so that a shortened calibration is not measured twice for being short.  ``pair_with``:
    each other configuration measured right beside it (``compare.measure_rounds``), the
    spread that of their pairs' ratios, and all tries' rounds kept."""
    from .running.compare import measure_rounds

    loaded = {k: v for k, v in named.items() if not isinstance(v, dict)}
    out = {k: v for k, v in named.items() if isinstance(v, dict)}
    if loaded:
        import time

        t = time.perf_counter()
        for p in loaded.values():
            p.run(feeds)
        once = max((time.perf_counter() - t) / len(loaded), 1e-6)
        f = scale()
        for p in loaded.values():
            for _ in range(int(min(MAX_SAMPLES, f * WARM_S / len(loaded) / once))):
                p.run(feeds)
        samples = int(min(max(MIN_SAMPLES, f * MAX_SAMPLES), max(MIN_SAMPLES, f * TARGET_S / once)))
        tries = []
        for _ in range(1 + AGAIN):
            got = measure_rounds(loaded, feeds, samples, warmup=1, rounds=ROUNDS,
                                 min_round_s=ROUND_S, pair_with=pair_with)
            tries.append((widest_spread(got, pair_with), got))
            if tries[-1][0] <= allowed_spread():
                break
        best = min(tries, key=lambda x: x[0])[1]
        if pair_with is not None:  # (ratios of pairs: every try's are as good, all kept)
            best = _pooled_tries([got for _, got in tries])
        for k, v in best.items():
            out[k] = dict(v, spread=round(spread_of(v), 4), tries=len(tries)) if "error" not in v else v
    return out


def best_rate(record: Mapping[str, Any]) -> float:
    """A calibration's best throughput run whole: its default, or its single-thread copies."""
    rep = (record.get("replicas") or {}).get("1") or {}
    return max((record.get("default") or {}).get("throughput_per_s") or 0.0,
               rep.get("throughput_per_s") or 0.0)


def finalists(records: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
    """What a choice between providers turns on, ``provider:default`` or
    ``provider:copies`` -> (provider, how ``Parts.whole`` runs it): each provider's default
    and its single-thread copies (or streams), as its calibration ran them (``records``:
    provider -> calibration), of the providers whose best is within CLOSE of the best of
    all, the best calibrated first (the leader :func:`side_by_side` pairs the others with).
    {} where one provider is left: nothing turns on measuring it again (a tiny MLP:
    onnxruntime's default 31,000/s, OpenVINO's best 5,300/s)."""
    best = max((best_rate(r) for r in records.values()), default=0.0)
    close = {p: r for p, r in records.items() if best_rate(r) * CLOSE >= best > 0}
    if len(close) < 2:
        return {}
    rated = []  # (calibrated throughput, name, run)
    for provider, rec in close.items():
        rated.append(((rec.get("default") or {}).get("throughput_per_s") or 0.0,
                      f"{provider}:default", (provider, {"threads": 0})))
        rep = (rec.get("replicas") or {}).get("1") or {}
        if rep.get("copies", 1) > 1:
            rated.append((rep.get("throughput_per_s") or 0.0, f"{provider}:copies",
                          (provider, {"threads": 1, "replicas": int(rep["copies"]),
                                      "optimization": rep.get("optimization", "all")})))
    return {name: run for _, name, run in sorted(rated, key=lambda x: -x[0])}


def side_by_side(model_path: str | Path, feeds: Mapping[str, Any],
                 runs: Mapping[str, tuple[str, dict[str, Any]]], *, model_bytes: float = 0.0,
                 host_memory: float | None = None) -> dict[str, dict[str, Any]]:
    """``runs`` (:func:`finalists`, the leader first) measured as `run` measures: each in a
    process of its own (:class:`.apart.Apart`), each beside the leader in adjacent pairs,
    and each figure the leader's median times the median of its pairs' ratios
    (:func:`on_leaders_scale`).  Each provider is calibrated in a process of its own, a
    minute or more apart from the others: on a shared machine that moves their figures
    against each other (T5's encoder: OpenVINO's streams calibrated above onnxruntime's
    copies, then measured 0.96x them side by side).  Measured in turn in one process, the
    choice still turned on noise: ResNet-50's OpenVINO streams measured 18.8/s against
    copies' 18.33/s, rounds spreading 12-18%, where `run` then measured the copies
    1.10-1.12x the streams, paired, every time.  {} where they would not all fit
    MEMORY_SHARE of the host's memory."""
    from .errors import RunError
    from .running.apart import Apart

    if host_memory is None:
        from .profile.devices import host_memory_bytes

        host_memory = float(host_memory_bytes())
    copies = sum(int(how.get("replicas", 1)) for _, how in runs.values())
    if copies * model_bytes > MEMORY_SHARE * host_memory:
        return {}
    loaded: dict[str, Any] = {}
    try:
        for name, (provider, how) in runs.items():
            try:
                loaded[name] = Apart(("whole", str(model_path), provider, how), feeds)
            except RunError as e:
                loaded[name] = {"error": str(e)}
        leader = next((k for k, v in loaded.items() if not isinstance(v, dict)), None)
        got = measure_loaded(loaded, feeds, pair_with=leader)
    finally:
        for held in loaded.values():
            if isinstance(held, Apart):
                held.close()
    return {k: _rounded(v) for k, v in on_leaders_scale(got, leader).items()}


def on_leaders_scale(got: Mapping[str, Mapping[str, Any]], leader: str | None) -> dict[str, dict[str, Any]]:
    """Each configuration's figures measured beside ``leader`` (``measure_rounds``'
    ``pair_with``) as the leader's median times the median of their pairs' ratios
    (``compare.paired_ratios``): a comparison of measurements seconds apart, on one scale."""
    from .running.compare import paired_ratios

    lead = got.get(leader) if leader is not None else None
    if not lead or "error" in lead:
        return {k: dict(v) for k, v in got.items()}
    ratios = paired_ratios(lead, {k: v for k, v in got.items() if k != leader})
    out = {}
    for k, v in got.items():
        v = {key: x for key, x in v.items() if key != "beside"}
        if k in ratios:
            v.update(throughput_per_s=lead["throughput_per_s"] / ratios[k]["throughput"],
                     latency_ms=lead["latency_ms"] * ratios[k]["latency"], paired_with=leader)
        out[k] = v
    return out


def take_side_by_side(records: dict[str, dict[str, Any]], got: Mapping[str, Mapping[str, Any]]) -> None:
    """Each provider's default and copies in ``records`` replaced by their side-by-side
    figures (``got``, from :func:`side_by_side`), each marked ``side_by_side``."""
    for name, v in got.items():
        provider, _, what = name.rpartition(":")
        rec = records.get(provider)
        if rec is None or "error" in v or not v.get("throughput_per_s"):
            continue
        if what == "default":
            rec["default"] = dict(v, side_by_side=True)
        else:
            rep = rec["replicas"]["1"]
            rec["replicas"]["1"] = dict(v, copies=rep["copies"], optimization=rep.get("optimization", "all"),
                                        side_by_side=True)


def spread_of(got: Mapping[str, Any]) -> float:
    """How far a configuration's rounds spread: their largest throughput over their
    smallest, less one (0 for one round)."""
    return _spread((got.get("by_round") or {}).get("throughput_per_s", []))


def _spread(values) -> float:
    """The largest of the positive ``values`` over the smallest, less one (0 for one)."""
    values = [v for v in values if v > 0]
    return max(values) / min(values) - 1 if len(values) > 1 else 0.0


def allowed_spread() -> float:
    """How far a configuration's rounds may spread before they are measured again:
    SPREAD_AGAIN, wider for rounds shortened by the timing scale (noise over a round falls
    as the square root of its length)."""
    return SPREAD_AGAIN / math.sqrt(scale())


def noisiest(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The configuration whose kept rounds still spread wider than :func:`measure_loaded`
    allows after its last try ({config, spread, tries}), or None: figures resting on it
    may be far off (a busy machine), which the split says."""
    spread, name = max(((v.get("spread", 0.0), k) for k, v in results.items() if "error" not in v),
                       default=(0.0, None))
    if name is None or spread <= allowed_spread():
        return None
    return {"config": name, "spread": round(spread, 3), "tries": results[name].get("tries", 1)}


def widest_spread(results: Mapping[str, Mapping[str, Any]], pair_with: str | None = None) -> float:
    """The widest :func:`spread_of` among measured configurations; with ``pair_with``
    (measured beside each, ``measure_rounds``), that of each other's ratios to it, pair by
    pair: a slow minute that moves both sides of a pair is not noise in the comparison."""
    lead = results.get(pair_with) if pair_with is not None else None
    if not lead or "error" in lead:
        return max((spread_of(v) for v in results.values() if "error" not in v), default=0.0)
    key = "throughput_per_s"
    return max((_spread([y / x for x, y in zip(mine[key], results[name]["by_round"][key]) if x > 0])
                for name, mine in (lead.get("beside") or {}).items()), default=0.0)


def runner_costs() -> dict[str, Any]:
    """What the runner adds per part call beyond the part's own time, on two chains of
    CHAIN_CALLS parts:

    * ``handoff_ms``: a chain of small MatMuls (about 0.1 ms each), alternating between
      two devices, one sample alone: its latency less its parts' own times (each timed
      alone, :func:`runner.time_calls`), over its calls and the hand-off out -- a sample
      waits this long at every call (thread wake-up, queues);
    * ``call_ms``: the same chain streamed: a device's period less its parts' own
      times, over its calls -- what a device spends per call when samples queue;
    * ``session_ms``: a part that computes next to nothing (an Add on 64 floats), timed
      alone: a session call's own cost, which a node's profiled time lacks;
    * ``gil_ms``: a chain of those streamed over GIL_DEVICES devices: its period over
      its calls -- the calls' Python work shares one interpreter lock, which caps a
      pipeline of many parts at one sample per (all calls x this), however many cores;
    * ``gil_tensor_ms``: the same chain with WIDE_TENSORS tensors into and out of each
      part (the tiny ones copied through): what each tensor beyond one in and one out
      adds to a call's share of the lock (each is converted and handed on in Python)."""
    import tempfile

    import numpy as np

    from .running.runner import measure_pipeline, time_calls
    from .running.compare import round_order

    n = CHAIN_CALLS
    f = scale()
    with tempfile.TemporaryDirectory(prefix="onnxsplit-calls-") as tmp:
        work = _chain([_chain_part(Path(tmp), i, WORK_ROWS) for i in range(n)], 2)
        tiny = _chain([_chain_part(Path(tmp), i, 1) for i in range(n)], GIL_DEVICES)
        wide = _chain([_chain_part(Path(tmp), i, 1, WIDE_TENSORS) for i in range(n)],
                      GIL_DEVICES, WIDE_TENSORS)
    one = np.ones((1, CHAIN_WIDTH), dtype=np.float32)
    feeds = {"work": {"x0": np.ones((WORK_ROWS, CHAIN_WIDTH), dtype=np.float32)},
             "tiny": {"x0": one},
             "wide": dict.fromkeys(_chain_names(0, WIDE_TENSORS), one)}
    chains = {"work": work, "tiny": tiny, "wide": wide}
    got: dict[str, list[dict[str, float]]] = {k: [] for k in chains}
    alone: list[list[float]] = []
    for r in range(COST_ROUNDS):
        alone.append(time_calls(work, feeds["work"], budget_s=0.05 * f))
        for k in round_order(list(chains), r):
            got[k].append(measure_pipeline(chains[k], feeds[k], max(10, int(f * COST_SAMPLES)), warmup=5))
    own = np.median(np.array(alone), axis=0)  # each work part's own time
    busiest = max(float(own[d::2].sum()) for d in range(2))

    def median(k: str, key: str) -> float:
        return float(np.median([g[key] for g in got[k]]))

    session = float(np.median(time_calls(tiny, feeds["tiny"], budget_s=0.05 * f)))
    gil = 1e3 / median("tiny", "throughput_per_s") / n
    # (the two chains' rounds ran side by side: their differences, round by round)
    per_tensor = float(np.median([1e3 / w["throughput_per_s"] - 1e3 / t["throughput_per_s"]
                                  for w, t in zip(got["wide"], got["tiny"])])) \
        / n / (2 * (WIDE_TENSORS - 1))
    return {"handoff_ms": round(max(median("work", "latency_ms") - float(own.sum()), 0.0) / (n + 1), 6),
            "call_ms": round(max(1e3 / median("work", "throughput_per_s") - busiest, 0.0) / (n / 2), 6),
            "session_ms": round(session, 6),
            "gil_ms": round(gil, 6), "gil_tensor_ms": round(max(per_tensor, 0.0), 6),
            "part_ms": round(float(own.mean()), 6), "calls": n, "devices": [2, GIL_DEVICES],
            "tensors": [1, WIDE_TENSORS]}


def _chain_names(i: int, tensors: int) -> list[str]:
    """The tensors into part ``i`` of a cost chain (out of part i-1)."""
    return [f"x{i}"] + [f"x{i}_{j}" for j in range(1, tensors)]


def _chain_part(folder: Path, i: int, rows: int, tensors: int = 1) -> Path:
    """Part ``i`` of a cost chain: x{i+1} = x{i} @ I on ``rows`` x CHAIN_WIDTH floats,
    and ``tensors`` - 1 more tensors copied through (Identity)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    xs, ys = _chain_names(i, tensors), _chain_names(i + 1, tensors)
    shape = [rows, CHAIN_WIDTH]
    graph = helper.make_graph(
        [helper.make_node("MatMul", [xs[0], "w"], [ys[0]])]
        + [helper.make_node("Identity", [x], [y]) for x, y in zip(xs[1:], ys[1:])], f"call{i}",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape) for x in xs],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, shape) for y in ys],
        [numpy_helper.from_array(np.eye(CHAIN_WIDTH, dtype=np.float32), "w")])
    path = folder / f"call{i}_{rows}_{tensors}.onnx"
    onnx.save(helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]),
              path)
    return path


def _chain(files: list[Path], devices: int, tensors: int = 1):
    """Parts as one pipeline, part i on device i mod ``devices``, one thread each."""
    from .running.runner import Parts

    specs = [{"name": f"call{i}", "file": str(f), "device": f"d{i % devices}",
              "execution_provider": CPU_EP, "threads": 1, "optimization": "all", "replicas": 1,
              "config": {}, "inputs": [{"name": x} for x in _chain_names(i, tensors)],
              "outputs": [{"name": y} for y in _chain_names(i + 1, tensors)]}
             for i, f in enumerate(files)]
    io = {"inputs": [{"name": x, "dtype": "tensor(float)", "shape": None}
                     for x in _chain_names(0, tensors)],
          "outputs": [{"name": y} for y in _chain_names(len(files), tensors)]}
    return Parts.of_specs(specs, io)


def _pooled(*runs: Mapping[str, Any]) -> dict[str, Any]:
    """Measurements of one configuration as one: medians over all their rounds, and the
    measurements beside each other configuration (``beside``) one after another too."""
    from .running.compare import summarised

    if not all("by_round" in r for r in runs):
        return dict(runs[0])
    out = summarised({k: [x for r in runs for x in r["by_round"][k]] for k in runs[0]["by_round"]},
                     sum(r["samples"] for r in runs))
    if all("beside" in r for r in runs):
        out["beside"] = {name: {k: [x for r in runs for x in r["beside"][name][k]] for k in theirs}
                         for name, theirs in runs[0]["beside"].items()
                         if all(name in r["beside"] for r in runs)}
    return out


def _pooled_tries(tries: list[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each configuration's tries as one (:func:`_pooled`), or its error where one failed."""
    out = {}
    for name in tries[-1]:
        runs = [got.get(name, {"error": "not measured"}) for got in tries]
        failed = [r for r in runs if "error" in r]
        out[name] = dict(failed[0]) if failed else _pooled(*runs)
    return out


def _rounded(got: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in got.items()
            if k != "by_round"}


def may_fuse_slowly(model_path: str | Path) -> bool:
    """Whether onnxruntime may fuse the model's nodes into a kernel UNFUSED leaves out: an
    Add feeding a LayerNormalization (or the ReduceMean a decomposed one starts with),
    what SkipLayerNormFusion fuses.  Only then is the model also calibrated without."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    added = {o for n in graph.node if n.op_type == "Add" for o in n.output}
    return any(n.op_type in ("LayerNormalization", "ReduceMean") and n.input and n.input[0] in added
               for n in graph.node)


def faster_level(latency: Mapping[str, float | None]) -> str:
    """The graph optimisation level to run at, of those measured (level -> ms, None where
    it failed): the fastest of ``all`` and the levels that measured their LEVEL_GAIN
    times faster than it (any, where ``all`` failed)."""
    options = {k: v for k, v in latency.items() if v}
    if options.get("all"):
        options = {k: v for k, v in options.items()
                   if k == "all" or v * LEVEL_GAIN.get(k, max(LEVEL_GAIN.values())) <= options["all"]}
    return min(options, key=options.get, default="all")


def level_of(record: Mapping[str, Any], threads: int) -> str:
    """The level a session with ``threads`` threads runs at (:func:`faster_level`)."""
    return faster_level((record.get("threads") or {}).get(str(threads)) or {})


def latency_ms(record: Mapping[str, Any], threads: int) -> float | None:
    """The whole model's latency on ``threads`` threads, at the level it runs at."""
    lat = (record.get("threads") or {}).get(str(threads)) or {}
    return lat.get(level_of(record, threads)) or None


def stale(record: Mapping[str, Any]) -> bool:
    """Whether a stored calibration measured copies at a level :func:`level_of` no longer
    picks (made under an earlier rule): they are not what the plan would run; or was made
    in less time than this command's (:func:`scale`) gives one."""
    if record and record.get("scale", 1.0) < scale():
        return True
    return any(rep.get("optimization", "all") != level_of(record, int(t))
               for t, rep in (record.get("replicas") or {}).items())


def contention(record: Mapping[str, Any], threads: int) -> float:
    """How much ``cores // threads`` busy devices slow each other: their copies' period
    over one copy's latency alone (at least 1)."""
    rep = (record.get("replicas") or {}).get(str(threads)) or {}
    alone = latency_ms(record, threads)
    if not alone or not rep.get("throughput_per_s") or rep.get("copies", 1) <= 1:
        return 1.0
    period = 1e3 * rep["copies"] / rep["throughput_per_s"]
    return max(1.0, period / alone)
