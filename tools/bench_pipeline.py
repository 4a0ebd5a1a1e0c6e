#!/usr/bin/env python3
"""Pipelined parts against the whole model: one core per stage vs. one and two threads.

The claim this checks: on a 2-core machine, a 2-stage pipeline of a transformer model (one
single-threaded onnxruntime session per stage, each stage on its own core) reaches >= 1.7x
the throughput of the whole model in one single-threaded session, and its measured
throughput is within 15% of what the plan predicted.  The same run also times
onnxruntime's own 2-thread session of the whole model (intra-op parallelism; ``--threads``,
default: as many as stages), the other way to use the cores, so that the table shows
where pipelining wins and where it does not.

For each model, ``onnxsplit.split()`` profiles it (or reuses the cached profile), plans for
throughput on ``--stages`` CPU cores and exports + verifies the parts in a temporary
folder.  On a machine with exactly ``--stages`` cores the detected cluster is used (what
``onnxsplit MODEL --out DIR`` does); otherwise a cluster file with exactly ``--stages`` CPU
cores is passed.  Then, ``--repeat`` times, with the order of the three rotated each time:

  (a) the whole model in one single-threaded session (``runner.measure_single``);
  (b) the whole model in one session with ``intra_op_num_threads=2`` (``--threads``);
  (c) the parts in the pipelined runner (``runner.measure_pipeline``, default depth):
      steady-state throughput and single-stream latency.

Every session has onnxruntime's graph optimisations off, as the profiler timed the nodes
and ``onnxsplit run`` runs the parts (``--optimize``: on, in every session).  Whole-model
throughput is 1 / median latency (one sample at a time: there is no batching on either
side).  Each column is the median over the repeats (in ``--json``, "mt" is the T-thread
session); the ratios pipe/1t and pipe/2t are medians of the per-repeat ratios (each pairs
measurements taken side by side, so they can differ a little from the ratio of the median
columns), and ``spread`` is the min-max of the per-repeat pipe/1t.  ``pred`` is the
plan's prediction (workflow.predict): one sample per max stage load plus the runner's
hand-off cost per stage, latency with each core running its
part(s) serially.

    python tools/bench_pipeline.py                                  # default models
    python tools/bench_pipeline.py --model /tmp/models/bert_base.onnx --samples 40 --repeat 3
    python tools/bench_pipeline.py --model M.onnx --input-shape input_ids=1x128 --json

Models default to tests/data/tiny_bert.onnx plus whichever of /tmp/models/bert_base.onnx,
/tmp/models/gpt2.onnx and /tmp/models/vit.onnx exist.  Those three are built (random
weights, no download) by ``python tools/build_test_models.py /tmp/models``, which needs
torch, onnxscript and transformers (see that script's docstring).  Inputs are bound to
input_ids/attention_mask=1x32 and pixel_values=1x3x224x224 unless ``--input-shape`` says
otherwise (a shape is applied to each model that has that input).

Timings are wall-clock: run it on an otherwise idle machine.  The ``others`` column is
the most CPU (in cores) that other processes used during any one of the model's
measurements, from /proc/stat ('-': every measurement was under half a second, too short
to gauge); well above 0 means the row is not clean (another process took a core from the
pipeline or the 2-thread session).  On a shared machine,
``--quiet-wait S`` waits up to S seconds before each split (which may profile the model)
and each measurement for the others to go quiet.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = [ROOT / "tests" / "data" / "tiny_bert.onnx"] + [
    Path("/tmp/models") / f"{m}.onnx" for m in ("bert_base", "gpt2", "vit")]
DEFAULT_SHAPES = {"input_ids": (1, 32), "attention_mask": (1, 32), "token_type_ids": (1, 32),
                  "pixel_values": (1, 3, 224, 224)}
TARGET_SPEEDUP = 1.7  # pipeline / whole model on one thread
TARGET_PREDICTION = 0.15  # |measured / predicted - 1|
TIE = 0.05  # pipeline vs 2-thread session: closer than this is called even
MIN_GAUGE_S = 0.5  # /proc/stat counts in clock ticks (10 ms): shorter blocks are not gauged
NOISY_CORES = 0.25  # other processes busier than this during a measurement: a noisy row


def model_inputs(path: Path) -> list[str]:
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    weights = {t.name for t in g.initializer}
    return [i.name for i in g.input if i.name not in weights]


def shapes_for(path: Path, given: dict) -> dict:
    """The default binding updated by ``--input-shape``, for the inputs ``path`` has."""
    wanted = dict(DEFAULT_SHAPES, **given)
    return {n: wanted[n] for n in model_inputs(path) if n in wanted}


def _cpu_seconds() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine, of this process) so far; None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = sum(fields[:8]) - fields[3] - fields[4]  # all but idle and iowait
    t = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), t.user + t.system


class OtherLoad:
    """How many cores other processes kept busy while a block ran (a noise gauge)."""

    def __enter__(self):
        self.t, self.c = time.perf_counter(), _cpu_seconds()
        return self

    def __exit__(self, *exc):
        c = _cpu_seconds()
        wall = time.perf_counter() - self.t
        self.cores = None  # unknown: no /proc/stat, or too short for its clock ticks
        if c is not None and self.c is not None and wall >= MIN_GAUGE_S:
            others = ((c[0] - self.c[0]) - (c[1] - self.c[1])) / wall
            self.cores = min(max(0.0, others), float(os.cpu_count() or 1))


def wait_quiet(limit_s: float, below: float = 0.25) -> float | None:
    """Wait (up to ``limit_s``) for a second in which other processes keep fewer than
    ``below`` cores busy; the last second's reading."""
    start, cores = time.monotonic(), None
    while time.monotonic() - start < limit_s:
        with OtherLoad() as load:
            time.sleep(1.0)
        cores = load.cores
        if cores is None or cores < below:
            break
    return cores


def cluster_file(stages: int, folder: Path) -> Path | None:
    """None where this machine has exactly ``stages`` cores (the detected cluster is what
    a user gets), else a cluster file with ``stages`` CPU cores."""
    from onnxsplit.profile import devices as dv

    cores = os.cpu_count() or 1
    if cores == stages and dv.available_providers() == [dv.CPU_EP]:
        return None
    if cores < stages:
        print(f"warning: {stages} stages on a machine with {cores} cores: the stages share "
              "cores, the pipeline cannot reach its prediction", file=sys.stderr)
    path = folder / "cluster.json"
    path.write_text(json.dumps({"devices": [
        {"name": "cpu", "class": "cpu", "count": stages, "execution_provider": dv.CPU_EP,
         "memory": float(dv.host_memory_bytes())}], "links": []}))
    return path


class Case:
    """One model split into parts, with its whole-model sessions, ready to time."""

    def __init__(self, path: Path, shapes: dict, stages: int, work: Path, optimize: bool,
                 threads: int):
        from onnxsplit.running.runner import Parts, random_feeds, session_options
        from onnxsplit.workflow import split

        import onnxruntime as ort

        self.path = path
        self.name = path.stem
        t = time.perf_counter()
        self.split = split(path, work / self.name, devices=cluster_file(stages, work),
                           input_shapes=shapes, force=True, quiet=True)
        self.split_s = time.perf_counter() - t
        self.parts = Parts(self.split["out"], optimize=optimize)
        self.feeds = random_feeds(self.parts.inputs)
        self.threads = threads
        self.sessions = {
            key: ort.InferenceSession(str(path), session_options(n, optimize=optimize),
                                      providers=["CPUExecutionProvider"])
            for key, n in (("1t", 1), ("mt", threads))}
        self.runs: list[dict] = []

    def measure(self, samples: int, warmup: int, order: list[str], quiet_wait: float) -> dict:
        from onnxsplit.running.runner import measure_pipeline, measure_single

        run = {}
        for what in order:
            if quiet_wait > 0:
                wait_quiet(quiet_wait)
            with OtherLoad() as load:
                if what == "pipe":
                    run[what] = measure_pipeline(self.parts, self.feeds, samples, warmup)
                else:
                    run[what] = measure_single(self.sessions[what], self.feeds, samples, warmup)
            run[what]["other_cores"] = load.cores
        self.runs.append(run)
        return run

    def row(self) -> dict:
        def med(key: str, field: str) -> float:
            return statistics.median(r[key][field] for r in self.runs)

        pred = self.split["predicted"]
        ratios = [r["pipe"]["throughput_per_s"] / r["1t"]["throughput_per_s"] for r in self.runs]
        pipe_tp = med("pipe", "throughput_per_s")
        t1, tm = med("1t", "throughput_per_s"), med("mt", "throughput_per_s")
        pred_tp = pred["throughput_per_s"]
        return {
            "model": self.name, "path": str(self.path),
            "input_shapes": self.split["model"]["input_shapes"],
            "ops": self.split["model"]["operators"],
            "stages": [{"device": d["device"], "nodes": d["nodes"], "load_ms": d["load_ms"]}
                       for d in self.split["devices"]],
            "plan": {k: self.split["plan"].get(k) for k in ("method", "status")},
            "max_abs_error": self.split.get("verify", {}).get("max_abs_error"),
            "split_s": self.split_s,
            "threads": self.threads,
            "throughput_1t": t1, "throughput_mt": tm, "throughput_pipe": pipe_tp,
            "pipe_over_1t": statistics.median(ratios),
            "pipe_over_1t_min": min(ratios), "pipe_over_1t_max": max(ratios),
            "pipe_over_mt": statistics.median(
                r["pipe"]["throughput_per_s"] / r["mt"]["throughput_per_s"] for r in self.runs),
            "throughput_pred": pred_tp,
            "measured_over_pred": pipe_tp / pred_tp if pred_tp else None,
            "latency_1t_ms": med("1t", "latency_ms"), "latency_mt_ms": med("mt", "latency_ms"),
            "latency_pipe_ms": med("pipe", "latency_ms"), "latency_pred_ms": pred["latency_ms"],
            "other_cores": max((r[k]["other_cores"] for r in self.runs for k in r
                                if r[k]["other_cores"] is not None), default=None),
            "pred_single_core_ms": (pred.get("single_device") or {}).get("latency_ms"),
            "runs": self.runs,
        }


def fmt_loads(stages: list[dict]) -> str:
    loads = [s["load_ms"] for s in stages]
    digits = 3 if max(loads, default=0) < 1 else 2 if max(loads) < 10 else 1
    return "/".join(f"{x:.{digits}f}" for x in loads)


def print_table(rows: list[dict], args) -> None:
    from onnxsplit.profile.devices import cpu_name

    import onnxruntime as ort

    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; onnxruntime {ort.__version__}; "
          f"{args.stages} stages; {args.samples} samples x {args.repeat} repeats (medians); "
          f"graph optimisations {'on' if args.optimize else 'off'}")
    t = args.threads
    lw = max([15] + [len(fmt_loads(r["stages"])) for r in rows])
    head = (f"{'model':<10} {'ops':>5} {'stage loads ms':>{lw}} | {'1-thr/s':>8} {f'{t}-thr/s':>8} "
            f"{'pipe/s':>8} {'pipe/1t':>7} {'(spread)':>11} {f'pipe/{t}t':>7} | {'pred/s':>8} "
            f"{'meas/pred':>9} | {'lat 1t':>7} {f'lat {t}t':>7} {'lat pipe':>8} {'lat pred':>8} | "
            f"{'others':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        spread = f"({r['pipe_over_1t_min']:.2f}-{r['pipe_over_1t_max']:.2f})"
        mp = f"{r['measured_over_pred']:.2f}" if r["measured_over_pred"] is not None else "-"
        print(f"{r['model']:<10} {r['ops']:>5} {fmt_loads(r['stages']):>{lw}} | "
              f"{r['throughput_1t']:>8.1f} {r['throughput_mt']:>8.1f} {r['throughput_pipe']:>8.1f} "
              f"{r['pipe_over_1t']:>7.2f} {spread:>11} {r['pipe_over_mt']:>7.2f} | "
              f"{r['throughput_pred'] or 0:>8.1f} {mp:>9} | {r['latency_1t_ms']:>7.2f} "
              f"{r['latency_mt_ms']:>7.2f} {r['latency_pipe_ms']:>8.2f} {r['latency_pred_ms']:>8.2f} | "
              f"{'-' if r['other_cores'] is None else format(r['other_cores'], '.2f'):>6}")
    print("\nthroughput in samples/s, latency in ms (pipe: single-stream, one sample in flight); "
          "others: the most cores\nother processes kept busy during any one measurement "
          "(well above 0: the numbers are not clean).")
    print(f"targets: pipe/1t >= {TARGET_SPEEDUP}, meas/pred within {TARGET_PREDICTION:.0%} of 1; "
          f"pipe/{t}t > 1: the pipeline beats onnxruntime's own {t} threads")
    for r in rows:
        ok_speed = r["pipe_over_1t"] >= TARGET_SPEEDUP
        mp = r["measured_over_pred"]
        ok_pred = mp is not None and abs(mp - 1) <= TARGET_PREDICTION
        p2 = r["pipe_over_mt"]
        versus = (f"pipeline faster than the {t}-thread session" if p2 > 1 + TIE else
                  f"{t}-thread session faster than the pipeline" if p2 < 1 - TIE else
                  f"pipeline and {t}-thread session within {TIE:.0%}")
        noisy = (f"  (noisy: others used up to {r['other_cores']:.2f} cores)"
                 if (r["other_cores"] or 0.0) > NOISY_CORES else "")
        print(f"  {r['model']:<10} speedup {'met' if ok_speed else 'MISSED':6}  "
              f"prediction {'met' if ok_pred else 'MISSED':6}  {versus}{noisy}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", type=Path, default=[], metavar="PATH",
                    help="an ONNX model (repeatable); default: see above")
    ap.add_argument("--input-shape", action="append", default=[], metavar="NAME=DIMS",
                    help="bind an input, for each model that has it (repeatable)")
    ap.add_argument("--samples", type=int, default=40, help="timed samples per measurement")
    ap.add_argument("--warmup", type=int, default=5, help="untimed samples before each measurement")
    ap.add_argument("--repeat", type=int, default=3,
                    help="measurements per model, interleaved (1-thread, T-thread, pipeline); "
                         "medians are shown")
    ap.add_argument("--stages", type=int, default=2, help="CPU cores to plan for, one stage each")
    ap.add_argument("--threads", type=int, metavar="T",
                    help="intra-op threads of the comparison session (default: --stages)")
    ap.add_argument("--quiet-wait", type=float, default=0.0, metavar="S",
                    help="before each measurement wait up to S seconds for a second in which "
                         "other processes keep < 0.25 cores busy (for a shared machine)")
    ap.add_argument("--optimize", action="store_true",
                    help="onnxruntime graph optimisations on in every session (parts and whole "
                         "model); default off, as the profiler and `onnxsplit run` have them")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    args.threads = args.threads or args.stages
    if args.samples < 2 or args.repeat < 1 or args.stages < 1 or args.threads < 1:
        ap.error("--samples must be >= 2, --repeat, --stages and --threads >= 1")

    from onnxsplit.api import parse_input_shapes
    from onnxsplit.errors import OnnxsplitError

    try:
        given = parse_input_shapes(args.input_shape)
    except OnnxsplitError as e:
        ap.error(str(e))
    models = args.model or [p for p in DEFAULT_MODELS if p.exists()]
    missing = [str(p) for p in models if not p.exists()]
    if missing:
        ap.error(f"no such model: {', '.join(missing)}")

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_pipeline_") as tmp:
        for path in models:
            shapes = shapes_for(path, given)
            bound = " ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items())
            print(f"{path.name}: split ({bound})", file=sys.stderr, flush=True)
            if args.quiet_wait > 0:
                wait_quiet(args.quiet_wait)  # the split may profile the model
            case = Case(path, shapes, args.stages, Path(tmp), args.optimize, args.threads)
            kinds = ["1t", "mt", "pipe"]
            for rep in range(args.repeat):
                order = kinds[rep % 3:] + kinds[:rep % 3]
                run = case.measure(args.samples, args.warmup, order, args.quiet_wait)
                print(f"  repeat {rep + 1}/{args.repeat}: "
                      + ", ".join(f"{k} {run[k]['throughput_per_s']:.1f}/s" for k in kinds)
                      + "; others busy " + "/".join("-" if run[k]["other_cores"] is None
                                                    else f"{run[k]['other_cores']:.2f}" for k in kinds)
                      + " cores",
                      file=sys.stderr, flush=True)
            rows.append(case.row())
            del case  # free the sessions (the big models hold ~0.5 GB each, three times)
            gc.collect()
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print_table(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
