#!/usr/bin/env python3
"""Parts made once for a range of shapes, measured at each of the range's check shapes
beside what a user runs instead, in the same run: per shape, onnxsplit's promise and its
measurement, onnxruntime's default session, copies of the whole model (one single-thread
session per core) and OpenVINO's THROUGHPUT hint where installed.

    python tools/bench_ranges.py MODEL.onnx:RANGES [...] [--objective throughput] [--samples N] [--time-limit S]

RANGES is the main command's ``--input-shape`` values, comma-separated
(``input_ids=1..8x16..128,attention_mask=1..8x16..128``).  Each model is split once with
``onnxsplit MODEL --input-shape ... --out TMP --json`` (the main command's defaults; the
profile cached as usual), then ``onnxsplit run TMP --shape ... --json`` measures it at
every shape the split checked.  Columns: ``pred``/``meas`` (samples/s for throughput, ms
for latency), ``err`` (measured over predicted, -1), the baselines, and ``x best`` (onnxsplit
over the best of them; above 1: onnxsplit is faster).  Exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BASELINES = ("ort_default_cpu", "ort_replicas", "openvino_throughput")


def _onnxsplit(*args: str) -> tuple[int, dict | None, str]:
    p = subprocess.run([sys.executable, "-m", "onnxsplit", *args], capture_output=True, text=True)
    try:
        return p.returncode, json.loads(p.stdout), p.stderr
    except json.JSONDecodeError:
        lines = p.stderr.strip().splitlines()
        return p.returncode, None, lines[-1] if lines else f"exit {p.returncode}"


def _value(r: dict | None, objective: str) -> float | None:
    if not r or "error" in r:
        return None
    return r.get("throughput_per_s") if objective == "throughput" else r.get("latency_ms")


def _baseline(base: dict, prefix: str) -> dict | None:
    return next((v for k, v in base.items() if k.startswith(prefix)), None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", metavar="MODEL.onnx:RANGES")
    ap.add_argument("--objective", default="throughput", choices=("throughput", "latency"))
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--time-limit", type=float, default=300.0, metavar="S",
                    help="each shape's run measures in about S seconds (run's --time-limit, default 300)")
    args = ap.parse_args()
    unit = "/s" if args.objective == "throughput" else " ms"
    better = (lambda a, b: a / b) if args.objective == "throughput" else (lambda a, b: b / a)
    failed = False
    head = f"{'model':<14} {'shape':<40} {'pred':>9} {'meas':>9} {'err':>6}" + "".join(
        f" {b.split('_')[-1] if 'openvino' in b else b.split('_')[1]:>9}" for b in BASELINES) + f" {'x best':>7}"
    rows = []
    for spec in args.models:
        path, _, ranges = spec.partition(":")
        shape_args = [a for r in ranges.split(",") if r for a in ("--input-shape", r)]
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "parts")
            rc, split, err = _onnxsplit(path, *shape_args, "--out", out, "--objective", args.objective, "--json")
            if split is None:
                print(f"{Path(path).stem}: split failed: {err}", file=sys.stderr)
                failed = True
                continue
            failed |= rc != 0
            how = split["plan"]["method"] + f", {len(split['parts'])} part(s)"
            for row in split.get("per_shape") or []:
                shape = ",".join(f"{k}={'x'.join(map(str, v))}" for k, v in row["shapes"].items())
                rc, run, err = _onnxsplit("run", out, "--samples", str(args.samples), "--json",
                                          "--time-limit", str(args.time_limit),
                                          *[a for s in shape.split(",") for a in ("--shape", s)])
                if run is None:
                    print(f"{Path(path).stem} at {shape}: run failed: {err}", file=sys.stderr)
                    failed = True
                    continue
                failed |= rc != 0
                pred = row.get("throughput_per_s" if args.objective == "throughput" else "latency_ms")
                meas = _value(run.get("measured"), args.objective)
                base = [_value(_baseline(run.get("baselines") or {}, b), args.objective) for b in BASELINES]
                best = [b for b in base if b]
                bestv = (max(best) if args.objective == "throughput" else min(best)) if best else None
                rows.append((Path(path).stem, shape, how, pred, meas, base, bestv))
    print(head)
    for stem, shape, how, pred, meas, base, bestv in rows:
        err = f"{meas / pred - 1:+.0%}" if pred and meas else "-"
        cells = "".join(f" {b:>9.1f}" if b else f" {'-':>9}" for b in base)
        ratio = f"{better(meas, bestv):>7.2f}" if meas and bestv else f"{'-':>7}"
        print(f"{stem[:14]:<14} {shape[:40]:<40} {pred or float('nan'):>9.1f} {meas or float('nan'):>9.1f} "
              f"{err:>6}{cells} {ratio}   ({how}; {unit.strip()})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
