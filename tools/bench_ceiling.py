"""How much faster than onnxruntime's default session any plan could run a model on this
machine's CPU: the compute ceiling, measured beside the sessions users run.

A plan on the CPU only moves the model's operators between cores; it does not change the
arithmetic or the kernels that do it.  A core does a model's FLOPs at most about as fast
as onnxruntime's own matrix product at its best on one thread (MLAS: square products of
the ``--gemm`` sizes, weights prepacked, the best of each's repeats and the best size),
so ``cores x that rate / FLOPs per sample`` bounds every plan's throughput, short of
kernels faster than MLAS's.  This measures,
in one run: that rate, onnxruntime's default session and copies of the whole model side
by side (one single-thread session per core, measured together in rounds as ``onnxsplit
run`` measures them), and prints per model the FLOPs (the cost model's count: matrix
products, convolutions, attention), the rate the copies reach per core, and the ceiling
over the default session -- the most any placement could gain against it.

    python tools/bench_ceiling.py MODEL.onnx:SHAPES [...] [--samples N] [--gemm 256,512,1024,1536]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxsplit.api import parse_input_shapes  # noqa: E402
from onnxsplit.graph import OpGraph  # noqa: E402
from onnxsplit.profile import costmodel  # noqa: E402
from onnxsplit.profile.devices import CPU_EP  # noqa: E402
from onnxsplit.profile.measure import input_feeds  # noqa: E402
from onnxsplit.running.compare import baselines, copies_name, default_session_name  # noqa: E402


def gemm_rate(n: int, repeats: int = 10) -> float:
    """FLOP/s of onnxruntime's n x n by n x n MatMul (constant weights) on one thread, best
    of ``repeats``: the most one core does for a model's arithmetic."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.random((n, n), dtype=np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(m.SerializeToString(), so, providers=[CPU_EP])
    x = {"x": rng.random((n, n), dtype=np.float32)}
    s.run(None, x)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        s.run(None, x)
        best = min(best, time.perf_counter() - t)
    return 2.0 * n ** 3 / best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", metavar="MODEL.onnx:SHAPES")
    ap.add_argument("--samples", type=int, default=45)
    ap.add_argument("--gemm", default="256,512,1024,1536",
                    help="the square matrix products timed (sizes, comma-separated): the best rate counts")
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    default, copies = default_session_name(CPU_EP), copies_name(cores)
    rates = {int(n): gemm_rate(int(n)) for n in args.gemm.split(",")}
    rate = max(rates.values())
    print(f"{cores} cores; onnxruntime's MatMul on one thread, GFLOP/s: "
          + ", ".join(f"{n}^3 {r / 1e9:.1f}" for n, r in rates.items())
          + f" (ceiling: {cores} x the best)", flush=True)
    print(f"{'model':<14} {'GFLOP':>7} {'default/s':>10} {'copies/s':>9} {'copies GFLOP/s/core':>20} "
          f"{'ceiling/s':>10} {'ceiling x default':>18} {'copies x default':>17}", flush=True)
    for spec in args.models:
        model, _, shapes = spec.partition(":")
        graph = OpGraph.from_onnx(model, parse_input_shapes([shapes] if shapes else []))
        flops = sum(w.flops for w in costmodel.works(graph).values())
        got = baselines(model, input_feeds(graph), samples=args.samples, warmup=2)
        d = got.get(default, {}).get("throughput_per_s")
        c = got.get(copies, {}).get("throughput_per_s")
        ceiling = cores * rate / flops if flops else None

        def f(x, fmt):
            return "-" if x is None else format(x, fmt)

        print(f"{Path(model).stem:<14} {flops / 1e9:>7.2f} {f(d, '.1f'):>10} {f(c, '.1f'):>9} "
              f"{f(c and c * flops / cores / 1e9, '.1f'):>20} {f(ceiling, '.1f'):>10} "
              f"{f(ceiling and d and ceiling / d, '.2f'):>18} {f(c and d and c / d, '.2f'):>17}",
              flush=True)
    print("default: onnxruntime's default session (all optimisations, all cores); copies: one "
          "single-thread session per core side by side; ceiling: cores x the MatMul's rate over "
          "the model's FLOPs, above any plan's throughput on these cores (short of kernels faster than "
          "onnxruntime's own)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
