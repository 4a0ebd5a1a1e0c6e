#!/usr/bin/env python3
"""What OpenVINO's precision is worth on this CPU, beside onnxruntime's default session: per
model, the latency of onnxruntime's default session, of OpenVINO's LATENCY hint computing in
float32 and in bf16 (its default on a CPU with bf16 units), and how far bf16 moves the first
output (largest difference over the largest value, against onnxruntime).  The three run in
turn in one process, rounds of runs each, medians kept: one stretch of a shared machine's
time hits all alike.  Where the CPU has no bf16 units OpenVINO computes the bf16 row in
float32 too (the table says which it used).

    python tools/bench_precision.py MODEL.onnx [...] [--rounds 7] [--runs 5]

Static shapes, or free dimensions taken as 1 (batch, dim 0) and 128 (others).  What it
decides: whether ``onnxsplit ... --precision bf16`` is worth its accuracy here.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def feeds_of(session) -> dict[str, np.ndarray]:
    """Random floats in [0, 1), ones for integers; free dims 1 (dim 0) or 128."""
    rng = np.random.default_rng(0)
    out = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else (1 if k == 0 else 128) for k, d in enumerate(i.shape)]
        out[i.name] = rng.random(shape).astype(np.float32) if "float" in i.type else np.ones(shape, np.int64)
    return out


def bench(path: str, rounds: int, runs: int) -> dict:
    import onnxruntime as ort
    import openvino as ov

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = feeds_of(sess)
    calls = {"ort": lambda: sess.run(None, feeds)[0]}
    used = {}
    for precision in ("f32", "bf16"):
        compiled = ov.Core().compile_model(path, "CPU", {"PERFORMANCE_HINT": "LATENCY",
                                                         "INFERENCE_PRECISION_HINT": precision})
        used[precision] = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        request = compiled.create_infer_request()
        calls[f"ov_{precision}"] = lambda r=request: list(r.infer(feeds).values())[0]
    outs = {k: np.asarray(f()) for k, f in calls.items()}
    for f in calls.values():  # (warm)
        f()
        f()
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for k, f in calls.items():
            t = time.perf_counter()
            for _ in range(runs):
                f()
            times[k].append((time.perf_counter() - t) / runs)
    ref = outs["ort"].astype(np.float64)
    scale = float(np.abs(ref).max()) or 1.0
    return {"model": Path(path).stem, "ms": {k: 1e3 * float(np.median(v)) for k, v in times.items()},
            "used": used,
            "rel": {k: float(np.abs(outs[k] - ref).max()) / scale for k in ("ov_f32", "ov_bf16")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", metavar="MODEL.onnx")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=5, help="runs a round, each runner")
    args = ap.parse_args(argv)
    print(f"{'model':<14} {'ort ms':>8} {'ov f32 ms':>10} {'ov bf16 ms':>11} {'bf16 used':>10} "
          f"{'x ort':>6} {'x ov f32':>9} {'f32 rel':>8} {'bf16 rel':>9}", flush=True)
    for path in args.models:
        r = bench(path, args.rounds, args.runs)
        ms = r["ms"]
        print(f"{r['model']:<14} {ms['ort']:>8.2f} {ms['ov_f32']:>10.2f} {ms['ov_bf16']:>11.2f} "
              f"{r['used']['bf16']:>10} {ms['ort'] / ms['ov_bf16']:>6.2f} {ms['ov_f32'] / ms['ov_bf16']:>9.2f} "
              f"{r['rel']['ov_f32']:>8.1e} {r['rel']['ov_bf16']:>9.1e}", flush=True)
    print("x ort, x ov f32: their latency over OpenVINO's in bf16 (above 1: bf16 is faster); rel: the first "
          "output's largest difference from onnxruntime's over its largest value")
    return 0


if __name__ == "__main__":
    sys.exit(main())
