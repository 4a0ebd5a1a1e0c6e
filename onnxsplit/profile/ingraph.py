"""Time every node inside whole-model runs, with onnxruntime's own profiler.

A node timed alone (``measure``) starts with its weights in cache and no neighbours to
evict them, so on short inputs its time undershoots what it costs inside the model
(``python tools/bench_profile.py`` prints the sums against the whole).  Here the model
runs whole, in a session like the runner's (one intra-op thread, graph optimisations off),
with onnxruntime's profiler on: with optimisations off every node keeps its name and
reports one ``<name>_kernel_time`` event per run, timed in the same cache state as when
the model (or a part of it) runs for real.

The profiler has a cost of its own, paid inside each event (a few microseconds, whatever
the node does): :func:`profiler_cost` measures it as a trivial node's event less what that
node costs in an unprofiled graph, and it is taken off every node.  Events are whole
microseconds, so a node's typical time is the mean of its middle half of samples rather
than their median, which would round a 1.4 us node to 1.

The whole model's time, to compare with, comes from an unprofiled session run in bursts
between the profiled ones, so both see the same machine.  This is the CPU's method: on an
accelerator the events time the kernel launches, not the kernels (``measure`` is used).
"""

from __future__ import annotations

import bisect
import json
import tempfile
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import onnx

from .measure import CHAIN, Runner, Timing, relu_chain, sample
from .store import NodeTiming

BURST_S = 0.01  # a fast model runs in bursts this long, so its caches are warm as in serving
TARGET_S = 0.25  # a fast model gets as many runs as fit in this (up to 20x repeats) ...
BUDGET_S = 60.0  # ... and a slow one no more than fit in this (at least 3)


def kernel_times(events: list[dict], keep: Callable[[int], bool],
                 cost_s: float = 0.0) -> dict[str, list[float]]:
    """Seconds of each node's ``_kernel_time`` events, summed per run, in the runs whose
    index ``keep`` accepts, each less ``cost_s`` for itself and for every kernel event
    nested in it (an If, Loop or Scan's event holds its subgraph's).  Runs are told apart
    by the profiler's ``model_run`` events."""
    starts = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    kernels = sorted((e for e in events if e.get("cat") == "Node"
                      and e.get("name", "").endswith("_kernel_time")), key=lambda e: e["ts"])
    begins = [e["ts"] for e in kernels]
    per: dict[str, dict[int, float]] = {}
    for i, e in enumerate(kernels):
        run = bisect.bisect_right(starts, e["ts"]) - 1
        if not keep(run):
            continue
        end = e["ts"] + e["dur"]
        nested = sum(1 for k in kernels[i + 1:bisect.bisect_left(begins, end)]
                     if k["ts"] + k["dur"] <= end) if e["dur"] else 0
        runs = per.setdefault(e["name"][: -len("_kernel_time")], {})
        runs[run] = runs.get(run, 0) + e["dur"]  # whole microseconds
        runs[run] -= cost_s * 1e6 * (1 + nested)
    return {n: [max(us, 0.0) / 1e6 for us in r.values()] for n, r in per.items()}


def typical(samples: np.ndarray) -> float:
    """The mean of the middle half of ``samples`` (all of them when there are few)."""
    s = np.sort(np.asarray(samples, dtype=float))
    if len(s) < 4:
        return float(np.median(s))
    lo, hi = len(s) // 4, len(s) - len(s) // 4
    return float(s[lo:hi].mean())


def profiler_cost(runner: Runner, per_node_s: float, warmup: int, runs: int = 100) -> float:
    """Seconds the profiler adds to each ``_kernel_time`` event: a 1-element Relu's event
    less that Relu's cost inside an unprofiled graph (``per_node_s``, from
    ``Runner.overheads``)."""
    with tempfile.TemporaryDirectory(prefix="onnxsplit-prof") as tmp:
        try:
            sess = runner.session(relu_chain(CHAIN), profile_prefix=Path(tmp) / "chain")
        except Exception:
            return 0.0
        run = runner.bind(sess, {"t0": np.ones((1,), dtype=np.float32)})
        for _ in range(warmup + runs):
            run()
        events = _read(sess)
    times = kernel_times(events, lambda run: run >= warmup)
    if not times:
        return 0.0
    event = float(np.median([typical(np.array(v)) for v in times.values()]))
    return max(event - per_node_s, 0.0)


def _read(sess) -> list[dict]:
    path = Path(sess.end_profiling())
    try:
        return json.loads(path.read_text())
    finally:
        path.unlink(missing_ok=True)


def plan_runs(first_s: float, repeats: int) -> tuple[int, int]:
    """(timed runs of each session, runs per burst) for a model whose run takes ``first_s``."""
    first_s = max(first_s, 1e-6)
    n = min(max(repeats, int(TARGET_S / first_s)), 20 * repeats)
    if first_s * n > BUDGET_S:
        n = max(3, min(repeats, int(BUDGET_S / first_s)))
    burst = max(1, min(n, int(BURST_S / first_s)))
    return n, burst


def time_in_graph(runner: Runner, model: onnx.ModelProto, feeds: Mapping[str, object],
                  op_types: Mapping[str, str], *, warmup: int, repeats: int, cost_s: float,
                  whole_run: Callable[[], object],
                  progress: Callable[[int, int], None] | None = None
                  ) -> tuple[dict[str, NodeTiming], Timing, int]:
    """Every node of ``op_types`` (name -> op type) timed inside profiled whole-model runs, less ``cost_s``
    (:func:`profiler_cost`); and the whole model's unprofiled ``whole_run`` timed in bursts
    between them.  Returns (timings of the nodes that reported events, whole-model timing,
    profiled runs); a node without events is left out for the caller to time otherwise.
    ``progress(k, total)`` after each burst of ``k`` runs."""
    with tempfile.TemporaryDirectory(prefix="onnxsplit-prof") as tmp:
        sess = runner.session(model, profile_prefix=Path(tmp) / "model")
        run = runner.bind(sess, feeds)
        for _ in range(max(warmup, 1)):
            whole_run()
        first = min(sample(whole_run, 1)[0], sample(run, 1)[0])
        for _ in range(max(warmup - 1, 0)):
            run()
        n, burst = plan_runs(first, repeats)
        # each burst's first run follows the other session (whose copy of the weights is
        # in cache): with bursts of more than one run it is run once more and dropped
        extra = int(burst > 1)
        kept: set[int] = set()
        index = max(warmup, 1)  # profiled runs so far
        whole: list[np.ndarray] = []
        done = 0
        while done < n:
            k = min(burst, n - done)
            sample(run, k + extra)
            kept.update(range(index + extra, index + extra + k))
            index += k + extra
            whole.append(sample(whole_run, k + extra)[extra:])
            done += k
            if progress is not None:
                progress(k, n)
        events = _read(sess)
    samples = kernel_times(events, kept.__contains__, cost_s)
    out: dict[str, NodeTiming] = {}
    for name, op_type in op_types.items():
        got = samples.get(name)
        if not got:
            continue
        s = np.array(got)
        p10, p90 = np.percentile(s, [10, 90])
        out[name] = NodeTiming(op_type, True, _ms(typical(s)), _ms(p10), _ms(p90))
    return out, Timing.of(np.concatenate(whole)), n


def _ms(seconds: float) -> float:
    return round(max(seconds, 0.0) * 1e3, 6)


