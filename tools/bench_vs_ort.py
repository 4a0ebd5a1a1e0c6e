#!/usr/bin/env python3
"""onnxsplit against what users run today, one table per machine: per model and objective,
onnxsplit measured and predicted, onnxruntime's default session, copies of the whole model
side by side (one single-thread session per core), and where an accelerator is present its
default session and capacity-aware partitioning -- all measured in the same run, on the
same inputs, by ``onnxsplit run --json``.

    python tools/bench_vs_ort.py MODEL.onnx:SHAPES [...] [--objective throughput,latency]
        [--devices CLUSTER.json] [--samples N] [--method M] [--json OUT.json]
    python tools/bench_vs_ort.py --show OUT.json [...]   # a saved run's table and verdict

SHAPES is ``name=1x128,name2=1x128`` (empty for static models).  Each model is split with
the main command's defaults (``onnxsplit MODEL --out TMP``, the profile cached as usual;
``--method`` another solver's split)
and then measured with ``onnxsplit run TMP --json``.  Columns: ``plan`` (method, how it
runs, parts; threads x copies; a level other than ``all``), ``meas``/``pred``
(throughput in samples/s for the throughput objective, latency in ms for the latency
objective), ``err`` (measured over predicted, -1),
``ort`` (onnxruntime's default session on the CPU), ``ov`` (OpenVINO's own runtime with
the objective's performance hint, as its documentation runs it), ``ov ep`` (onnxruntime with
OpenVINO's plugin EP, where it offers a device), ``ort err`` (that session measured
over its figure in the calibration the prediction came from, -1: how far the machine
itself moved between the split and the run -- an ``err`` near it is the machine's;
``cp err`` the same for the copies), ``copies`` (one single-thread copy per
core), ``acc`` (the accelerator's default session; ``acc err`` its drift), ``cap``
(capacity-aware partitioning, the better of ad hoc and with memory statistics), ``x ...``
the ratios (above 1: onnxsplit is faster), and ``rel ...`` each measured ratio over the
one the prediction implies against that session's calibrated figure, -1: the
prediction with the machine's drift since the split cancelled out.  Below the table, the
verdict: how many rows meet each bar onnxsplit is held to (:func:`verdict`), and the
worst.  Exits 1 if a check failed.

Held-out models: ``python tools/build_heldout.py /tmp/ho`` builds ViT-S, GPT-2 (6 layers),
T5-small's encoder and ResNet-50 (random weights).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxsplit.files import write_atomic  # noqa: E402


def _onnxsplit(*args: str) -> tuple[int, dict | None, str]:
    p = subprocess.run([sys.executable, "-m", "onnxsplit", *args], capture_output=True, text=True)
    try:
        return p.returncode, json.loads(p.stdout), p.stderr
    except json.JSONDecodeError:
        return p.returncode, None, p.stderr.strip().splitlines()[-1:] and p.stderr.strip().splitlines()[-1]


def _metric(r: dict | None, objective: str) -> float | None:
    if not r or "error" in r:
        return None
    return r["throughput_per_s"] if objective == "throughput" else r["latency_ms"]


def _better(a: float | None, b: float | None, objective: str) -> float | None:
    """onnxsplit's a against baseline b: above 1 when onnxsplit is faster."""
    if a is None or b is None:
        return None
    return a / b if objective == "throughput" else b / a


def _plan_label(plan: dict, split: dict) -> str:
    """method/run_as/parts, threads x copies, a level other than every optimisation, the
    provider that runs the cores where not the CPU EP, and devices given to another."""
    ex = split["execution"]
    level = ex.get("optimization") or "all"
    on = "".join(f" +{n} {_short(p)}" for p, n in (ex.get("shared") or {}).items())
    return (f"{plan['method']}/{split['run_as']}/{len(split['parts'])}p "
            f"t{ex.get('cpu_threads')}x{ex.get('replicas', 1)}" + ("" if level == "all" else f" {level}")
            + (f" {_short(ex['provider'])}" if ex.get("provider") else "") + on)


def _short(provider: str) -> str:
    """OpenVINORuntime -> ov: how the plan column names a provider on the cores."""
    return {"OpenVINORuntime": "ov"}.get(provider, provider.removesuffix("ExecutionProvider").lower())


def bench(model: str, shapes: str, objective: str, devices: str | None, samples: int,
          time_limit: float, method: str = "auto", precision: str = "auto") -> dict:
    args = [model, "--method", method, "--precision", precision] + (["--input-shape", shapes] if shapes else [])
    if devices:
        args += ["--devices", devices]
    with tempfile.TemporaryDirectory(prefix="bench_vs_ort.") as tmp:
        out = str(Path(tmp) / "parts")
        code, split, err = _onnxsplit(*args, "--out", out, "--objective", objective,
                                      "--time-limit", str(time_limit), "--json")
        if split is None:
            return {"model": model, "objective": objective, "error": f"split failed: {err}"}
        code_run, run, err = _onnxsplit("run", out, "--json", "--samples", str(samples))
        if run is None:
            return {"model": model, "objective": objective, "error": f"run failed: {err}"}
    base = run.get("baselines") or {}
    cap = [k for k, b in base.items() if k.startswith("ort_capacity") and "error" not in b]
    hint = "openvino_throughput" if objective == "throughput" else "openvino_latency"
    names = {
        "ort": next((k for k in base if k == "ort_default_cpu"), None),
        "copies": next((k for k in base if k.startswith("ort_replicas_cpu")), None),
        "acc": next((k for k in base if k.startswith("ort_default_") and k not in
                     ("ort_default_cpu", OV_EP_NAME)), None),
        # the peers a user on a CPU would pick: OpenVINO's runtime with the objective's
        # hint, and onnxruntime with OpenVINO's plugin EP (where it offers a device)
        "ov": hint if hint in base else None,
        "ovep": OV_EP_NAME if OV_EP_NAME in base else None,
        "cap": (min if objective == "latency" else max)(
            cap, key=lambda k: _metric(base[k], objective), default=None),
    }
    rows = {k: base.get(name) if name else None for k, name in names.items()}
    def per_baseline(field: str, keys=tuple(names)) -> dict:
        """The run's ``field`` (name -> {objective: figure}) for each of ``keys``."""
        return {k: (run.get(field) or {}).get(names[k] or "", {}).get(objective) for k in keys}

    # the run's own ratios: medians of the ratios of the pairs measured side by side
    paired = per_baseline("ratios")
    meas = _metric(run["measured"], objective)
    pred = _metric(run["predicted"], objective)
    plan = split["plan"]
    drift = per_baseline("drift", ("ort", "copies", "acc"))
    wins = split.get("providers") or {}
    relative = per_baseline("relative_error", ("ort", "copies", "acc"))
    return {
        "model": Path(model).stem, "objective": objective,
        "plan": _plan_label(plan, split),
        "measured": meas, "predicted": pred,
        "error": None if code_run == 0 and code == 0 else "check failed",
        "prediction_error": meas / pred - 1 if meas and pred else None,
        "ort_drift": drift["ort"], "copies_drift": drift["copies"], "acc_drift": drift["acc"],
        "relative_error": relative,
        "baselines": {k: _metric(v, objective) for k, v in rows.items()},
        "ratios": {k: paired[k] if paired[k] is not None
                   else _better(meas, _metric(v, objective), objective) for k, v in rows.items()},
        "providers": {k: {f: v[f] for f in ("faster_on", "operators", "time_share",
                                            "best_of_both_ms", "cpu_ms", "own_ms")}
                      for k, v in wins.items()},
        # what the parts' OpenVINO parts and OpenVINO's own runs computed in
        "precision": run.get("precision", "f32"),
        "ov_precision": (base.get(hint) or {}).get("precision"),
        "split": split, "run": run,
    }


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


OV_EP_NAME = "ort_default_openvino"  # onnxruntime with OpenVINO's plugin EP, as `run` names it
HEAD = (f"{'model':<12} {'objective':<10} {'plan':<36} {'meas':>8} {'pred':>8} {'err':>6} "
        f"{'ort':>8} {'ort err':>7} {'copies':>8} {'cp err':>6} {'ov':>8} {'ov ep':>8} {'acc':>8} "
        f"{'acc err':>7} {'cap':>8}  {'x ort':>6} {'x copies':>8} {'x ov':>6} {'x ov ep':>7} {'x acc':>6} "
        f"{'x cap':>6}  {'rel ort':>7} {'rel cp':>6} {'rel acc':>7}")


def row(r: dict) -> str:
    """One result as a line of the table under HEAD."""
    if "plan" not in r:
        return f"{Path(r['model']).stem:<12} {r['objective']:<10} {r['error']}"
    fmt = ".1f" if r["objective"] == "throughput" else ".2f"
    b, x, rel = r["baselines"], r["ratios"], r["relative_error"]
    return (f"{r['model']:<12} {r['objective']:<10} {r['plan']:<36} {_f(r['measured'], fmt):>8} "
            f"{_f(r['predicted'], fmt):>8} {_f(r['prediction_error'], '+.0%'):>6} "
            f"{_f(b['ort'], fmt):>8} {_f(r['ort_drift'], '+.0%'):>7} {_f(b['copies'], fmt):>8} "
            f"{_f(r['copies_drift'], '+.0%'):>6} {_f(b.get('ov'), fmt):>8} {_f(b.get('ovep'), fmt):>8} "
            f"{_f(b['acc'], fmt):>8} {_f(r['acc_drift'], '+.0%'):>7} "
            f"{_f(b['cap'], fmt):>8}  {_f(x['ort'], '.2f'):>6} {_f(x['copies'], '.2f'):>8} "
            f"{_f(x.get('ov'), '.2f'):>6} {_f(x.get('ovep'), '.2f'):>7} "
            f"{_f(x['acc'], '.2f'):>6} {_f(x['cap'], '.2f'):>6}  {_f(rel['ort'], '+.0%'):>7} "
            f"{_f(rel['copies'], '+.0%'):>6} {_f(rel['acc'], '+.0%'):>7}"
            + (f"  {r['error']}" if r["error"] else ""))


KEEP_UP, CLEARLY, LATENCY_SLACK, PREDICTED = 0.97, 1.15, 1.03, 0.10


def verdict(results: list[dict]) -> list[str]:
    """The table against the bars onnxsplit is held to: throughput at least KEEP_UP times
    the better of onnxruntime's default session and the copies (and of the accelerator's
    default session, where there is one), CLEARLY times the default session where
    splitting pays; latency at most LATENCY_SLACK times the CPU's default session's (a
    plan for a GPU too small for the model: below it), below the capacity-aware
    partitioning where it ran; every figure within PREDICTED of its prediction.  Each
    line: how many met it, and the worst."""
    done = [r for r in results if "plan" in r and r["measured"] is not None]
    lines = [f"{len(results) - len(done)} of {len(results)} failed to split or run"] \
        if len(done) < len(results) else []

    def bar(what: str, got: dict[str, float | None], ok, worst=min, fmt=".2f") -> None:
        got = {k: v for k, v in got.items() if v is not None}
        if not got:
            return
        low = worst(got, key=got.get)
        lines.append(f"{what}: {sum(ok(v) for v in got.values())} of {len(got)} "
                     f"(worst {format(got[low], fmt)}, {low})")

    def each(objective: str, f) -> dict[str, float | None]:
        return {r["model"]: f(r) for r in done if r["objective"] == objective}

    def best_of(r: dict, keys) -> float | None:
        got = [r["ratios"].get(k) for k in keys if r["ratios"].get(k) is not None]
        return min(got) if got else None

    bar(f"throughput at least {KEEP_UP}x the best of the default session, the copies, OpenVINO's "
        f"THROUGHPUT hint, its EP and the accelerator's default session",
        each("throughput", lambda r: best_of(r, ("ort", "copies", "ov", "ovep", "acc"))),
        lambda v: v >= KEEP_UP)
    bar(f"throughput at least {CLEARLY}x the default session on the CPU",
        each("throughput", lambda r: r["ratios"]["ort"]), lambda v: v >= CLEARLY)
    bar(f"latency at most {LATENCY_SLACK}x the best of the default session's, OpenVINO's LATENCY "
        f"hint's and its EP's (x at least {1 / LATENCY_SLACK:.3f})",
        each("latency", lambda r: best_of(r, ("ort", "ov", "ovep"))), lambda v: v >= 1 / LATENCY_SLACK)
    bar("latency below the capacity-aware partitioning's (x cap above 1)",
        each("latency", lambda r: r["ratios"]["cap"]), lambda v: v > 1)
    errors = {f"{r['model']} {r['objective']}": r["prediction_error"] for r in done}
    bar(f"within {PREDICTED:.0%} of the prediction", errors, lambda v: abs(v) <= PREDICTED,
        worst=lambda d, key: max(d, key=lambda k: abs(d[k])), fmt="+.0%")
    rel = {f"{r['model']} {r['objective']}": next((r["relative_error"][k] for k in ("acc", "ort")
                                                   if r["relative_error"][k] is not None), None)
           for r in done}
    bar(f"within {PREDICTED:.0%} with the machine's drift cancelled (rel acc, else rel ort)", rel,
        lambda v: abs(v) <= PREDICTED, worst=lambda d, key: max(d, key=lambda k: abs(d[k])),
        fmt="+.0%")
    return lines


def footer(results: list[dict]) -> None:
    """What follows the table's rows: the legend, how much of each model's time each
    provider wins per operator, and the verdict."""
    print(LEGEND)
    for mine, theirs in sorted({(r.get("precision", "f32"), r.get("ov_precision")) for r in results
                                if r.get("ov_precision")}):
        print(f"precision: onnxsplit's OpenVINO parts and OpenVINO's EP (ov ep) computed in {mine} "
              f"(--precision), OpenVINO's own runs (ov) in {theirs} (its default on this CPU)")
    for line in provider_lines(results):
        print(line)
    for line in verdict(results):
        print(line)


def provider_lines(results: list[dict]) -> list[str]:
    """Per model (once), each provider that shares the cores against the CPU EP, operator
    by operator (one thread each): where it is faster, and what the faster of each adds
    up to."""
    out, seen = [], set()
    for r in results:
        for provider, w in (r.get("providers") or {}).items():
            if (r["model"], provider) in seen:
                continue
            seen.add((r["model"], provider))
            out.append(f"{r['model']}: per operator, {provider} is faster on {w['faster_on']} of "
                       f"{w['operators']}, {w['time_share']:.0%} of the time on the faster of each; "
                       f"that time {w['best_of_both_ms']:.3g} ms, the CPU EP's {w['cpu_ms']:.3g} ms, "
                       f"{provider}'s {w['own_ms']:.3g} ms (one thread, before fusions and hand-offs)")
    return out


LEGEND = ("throughput in samples/s, latency in ms; x: onnxsplit over the baseline (above 1: "
          "onnxsplit is faster); err: measured over predicted; ort err, cp err, acc err: the "
          "default sessions and the copies measured over their calibrated figures (the machine's "
          "own drift); rel ...: the measured ratio to that session over the predicted one, -1 (the "
          "prediction with the drift cancelled)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", metavar="MODEL.onnx:SHAPES")
    ap.add_argument("--objective", default="throughput,latency")
    ap.add_argument("--devices", metavar="CLUSTER.json")
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--method", default="auto",
                    help="the main command's --method (auto: its defaults, which the issue judges; "
                         "another: that solver's split, to check its prediction)")
    ap.add_argument("--precision", choices=("auto", "f32", "bf16"), default="auto",
                    help="the main command's --precision: what onnxsplit's OpenVINO parts compute in "
                         "(auto: as OpenVINO does by default here)")
    ap.add_argument("--json", metavar="OUT.json", help="also write every result here")
    ap.add_argument("--show", metavar="RESULTS.json", action="append", default=[],
                    help="print the table and the verdict of results a run wrote with --json "
                         "(several: one table); measures nothing")
    args = ap.parse_args(argv)
    if args.show:
        results = [r for f in args.show for r in json.loads(Path(f).read_text())]
        print(HEAD)
        for r in results:
            print(row(r))
        footer(results)
        return 1 if any(r.get("error") for r in results) else 0
    if not args.models:
        ap.error("give MODEL.onnx:SHAPES to measure, or --show RESULTS.json")
    results = []
    print(HEAD, flush=True)
    for spec in args.models:
        model, _, shapes = spec.partition(":")
        for objective in args.objective.split(","):
            r = bench(model, shapes, objective, args.devices, args.samples, args.time_limit,
                      args.method, args.precision)
            results.append(r)
            if args.json:  # each result as it comes: an interrupted bench keeps what it measured
                write_atomic(args.json, json.dumps(results, indent=1) + "\n")
            print(row(r), flush=True)
    footer(results)
    return 1 if any(r.get("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
