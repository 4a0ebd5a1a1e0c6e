"""The whole model as users run onnxruntime, measured on this machine: the calibration that
turns the per-node profile into the machine's time.

The profile times each node on one thread with graph optimisations off (its names must
match the graph).  Users run onnxruntime with every optimisation on and all cores; a plan
runs its parts the same way.  So beside the nodes, each execution provider present gets a
short calibration, stored with its profile entry (``as_run``):

- ``threads``: the whole model's single-stream latency with all optimisations at each
  thread count the planner may give a CPU device (1, 2, 4, ... and every core), and at one
  thread with optimisations off as well (on one thread they can be slower);
- ``default``: onnxruntime's default session (all optimisations, default threads): the
  baseline every plan must beat;
- ``replicas``: copies of the whole model side by side, ``cores // t`` sessions of ``t``
  threads each, their throughput -- what a serving system's instance count gives, and
  the measure of how much copies (or pipeline stages) slow each other down.

All are measured through the runner's own pipeline (:class:`runner.Parts`), so a plan that
keeps the model whole is predicted by exactly what it will run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from .profile.devices import CPU_EP

TARGET_S = 1.0  # seconds each configuration is timed for
MIN_SAMPLES, MAX_SAMPLES = 5, 200
MEMORY_SHARE = 0.5  # copies of the model may take this share of the host's memory


def thread_counts(cores: int) -> list[int]:
    """Threads per CPU device the planner considers: powers of two below ``cores``, and
    ``cores``."""
    out, t = [], 1
    while t < cores:
        out.append(t)
        t *= 2
    return out + [max(cores, 1)]


def _timed(parts, feeds: Mapping[str, Any]) -> dict[str, float]:
    import time

    from .runner import measure_pipeline

    t = time.perf_counter()
    parts.run(feeds)
    parts.run(feeds)
    once = max((time.perf_counter() - t) / 2, 1e-6)
    samples = int(min(MAX_SAMPLES, max(MIN_SAMPLES, TARGET_S / once)))
    got = measure_pipeline(parts, feeds, samples, warmup=2)
    return {"latency_ms": round(got["latency_ms"], 6),
            "throughput_per_s": round(got["throughput_per_s"], 4), "samples": samples}


def calibrate(model_path: str | Path, feeds: Mapping[str, Any], ep: str, *, cores: int | None = None,
              model_bytes: float = 0.0, host_memory: float | None = None) -> dict[str, Any]:
    """The ``as_run`` record of ``ep`` (see the module docstring).  ``model_bytes`` (weights
    and activations of one copy) bounds the copies: memory is estimated before any is
    loaded."""
    from .runner import Parts, RunError

    def run(**how) -> dict[str, Any]:
        try:
            return _timed(Parts.whole(model_path, ep, **how), feeds)
        except RunError as e:
            return {"error": str(e)}

    record: dict[str, Any] = {"default": run(threads=0)}
    if ep != CPU_EP:
        return record
    cores = cores or os.cpu_count() or 1
    if host_memory is None:
        from .profile.devices import host_memory_bytes

        host_memory = float(host_memory_bytes())
    counts = thread_counts(cores)
    record["cores"] = cores
    record["threads"] = {}
    record["replicas"] = {}
    for t in counts:
        lat = {"all": run(threads=t)}
        if t == 1:
            lat["disabled"] = run(threads=1, optimization="disabled")
        record["threads"][str(t)] = {k: v.get("latency_ms") for k, v in lat.items()}
        copies = cores // t
        level = min((k for k in lat if "error" not in lat[k]),
                    key=lambda k: lat[k]["latency_ms"], default="all")
        if copies > 1 and copies * model_bytes <= MEMORY_SHARE * host_memory:
            got = run(threads=t, optimization=level, replicas=copies)
            record["replicas"][str(t)] = dict(got, copies=copies, optimization=level)
        elif copies == 1:
            record["replicas"][str(t)] = dict(lat[level], copies=1, optimization=level)
    return record


def level_of(record: Mapping[str, Any], threads: int) -> str:
    """The faster graph optimisation level at ``threads`` (``all`` unless measured slower)."""
    lat = (record.get("threads") or {}).get(str(threads)) or {}
    options = {k: v for k, v in lat.items() if v}
    return min(options, key=options.get) if options else "all"


def latency_ms(record: Mapping[str, Any], threads: int) -> float | None:
    """The whole model's latency on ``threads`` threads, at its faster level."""
    lat = (record.get("threads") or {}).get(str(threads)) or {}
    options = [v for v in lat.values() if v]
    return min(options) if options else None


def contention(record: Mapping[str, Any], threads: int) -> float:
    """How much ``cores // threads`` busy devices slow each other: their copies' period
    over one copy's latency alone (at least 1)."""
    rep = (record.get("replicas") or {}).get(str(threads)) or {}
    alone = latency_ms(record, threads)
    if not alone or not rep.get("throughput_per_s") or rep.get("copies", 1) <= 1:
        return 1.0
    period = 1e3 * rep["copies"] / rep["throughput_per_s"]
    return max(1.0, period / alone)
