"""How long profiling takes, and how well per-node times add up to the whole model.

For each model and each profiling method (``in_graph``: nodes timed inside whole-model
runs by onnxruntime's profiler; ``alone``: each node in a model of its own, the baseline;
``auto`` picks between them), profile every node on the CPU (one thread, no cache), and
time the whole model in the same run the same way (one thread, graph optimisations off);
also time the whole model with every onnxruntime optimisation on (fusions), for
reference.  Prints one row per model and method:

    model  method  nodes  distinct  profile s  node sum ms  whole ms  ratio  whole opt ms  roofline r

``ratio`` = per-node sum / whole model (target: within 15% of 1).  ``roofline r`` is the
correlation of the calibrated CPU roofline's per-node estimates with the measurements
(the cost model used for absent devices; its total equals the measured total by
construction).

    python tools/bench_profile.py [MODEL.onnx ...] [--seq N] [--repeats N] [--no-group]
                                  [--methods in_graph,alone]

Models default to /tmp/models/{bert_base,gpt2,vit}.onnx (tools/build_test_models.py builds
them); text models are bound to input_ids=1x128 (and attention_mask=1x128), ViT to
pixel_values=1x3x224x224, or give --input-shape NAME=DIMS.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT = [Path("/tmp/models") / f"{m}.onnx" for m in ("bert_base", "gpt2", "vit")]


def shapes_for(path: Path, seq: int, given: dict) -> dict:
    import onnx

    if given:
        return given
    names = [i.name for i in onnx.load(str(path), load_external_data=False).graph.input]
    out = {}
    for n in names:
        if n == "pixel_values":
            out[n] = (1, 3, 224, 224)
        elif n in ("input_ids", "attention_mask", "token_type_ids", "position_ids"):
            out[n] = (1, seq)
    return out


def whole_optimised_ms(path: Path, feeds: dict, repeats: int) -> float:
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 4
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    b = sess.io_binding()
    for k, v in feeds.items():
        b.bind_cpu_input(k, v)
    for o in sess.get_outputs():
        b.bind_output(o.name)
    for _ in range(2):
        sess.run_with_iobinding(b)
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        sess.run_with_iobinding(b)
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def bench(path: Path, shapes: dict, repeats: int, group: bool, method: str) -> dict:
    import numpy as np

    from onnxsplit.graph import OpGraph
    from onnxsplit.profile import costmodel as cm
    from onnxsplit.profile import measure, profile

    t = time.perf_counter()
    prof = profile(path, shapes, cache=False, repeats=repeats, group=group, quiet=True,
                   providers=["CPUExecutionProvider"], method=method)
    seconds = time.perf_counter() - t
    (entry,) = prof.entries
    graph = OpGraph.from_onnx(path, shapes, check_runtime=False)
    works = cm.works(graph)
    names = [n for n, tm in entry.nodes.items() if tm.measured and works[n].covered]
    meas = np.array([entry.nodes[n].median_ms for n in names]) / 1e3
    roof = cm.calibrate([works[n] for n in names], meas)
    est = np.array([roof.seconds(works[n]) for n in names])
    r = float(np.corrcoef(est, meas)[0, 1]) if len(names) > 1 else float("nan")
    feeds = measure.input_feeds(graph)
    opt = whole_optimised_ms(path, feeds, repeats)
    whole = entry.whole_model_ms["median"]
    return {"model": path.stem, "method": entry.settings.get("method", method), "nodes": len(entry.nodes),
            "distinct": entry.model.get("distinct_node_models", len(entry.nodes)),
            "seconds": seconds, "sum": entry.node_sum_ms(), "whole": whole,
            "ratio": entry.node_sum_ms() / whole, "opt": opt, "r": r,
            "p10": entry.whole_model_ms["p10"], "p90": entry.whole_model_ms["p90"],
            "gflops": roof.flops_per_s / 1e9, "gbs": roof.bytes_per_s / 1e9}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--seq", type=int, default=128, help="sequence length of text models")
    ap.add_argument("--no-group", action="store_true", help="time every node, not each distinct one")
    ap.add_argument("--input-shape", action="append", default=[], metavar="NAME=DIMS")
    ap.add_argument("--methods", default="in_graph,alone",
                    help="profiling methods to compare, comma-separated (auto, in_graph, alone)")
    args = ap.parse_args(argv)
    from onnxsplit.api import parse_input_shapes

    given = parse_input_shapes(args.input_shape)
    models = args.models or [p for p in DEFAULT if p.exists()]
    if not models:
        print("no models: build them with tools/build_test_models.py /tmp/models", file=sys.stderr)
        return 2
    import onnxruntime  # noqa: F401  (loaded outside the timings)

    from onnxsplit.profile.devices import cpu_name

    print(f"CPU: {cpu_name()}, one thread per node; repeats {args.repeats}, "
          f"{'every node timed' if args.no_group else 'identical nodes timed once'}")
    head = (f"{'model':<12} {'seq':>4} {'method':<14} {'nodes':>6} {'distinct':>8} {'profile s':>9} "
            f"{'node sum ms':>11} {'whole ms':>9} {'(p10-p90)':>15} {'ratio':>6} {'whole opt ms':>12} {'roofline r':>10}"
            f" {'CPU GFLOP/s':>11} {'GB/s':>6}")
    print(head)
    print("-" * len(head))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for path in models:
        for method in methods:
            row = bench(path, shapes_for(path, args.seq, given), args.repeats, not args.no_group,
                        method)
            _print(row, args.seq if not given else "-", method)
    return 0


def _print(row: dict, seq, method: str) -> None:
    spread = f"({row['p10']:.1f}-{row['p90']:.1f})"
    label = method if method != "auto" else f"auto:{row['method']}"
    print(f"{row['model']:<12} {seq!s:>4} {label:<14} {row['nodes']:>6} {row['distinct']:>8} "
          f"{row['seconds']:>9.1f} {row['sum']:>11.2f} {row['whole']:>9.2f} {spread:>15} {row['ratio']:>6.3f} "
          f"{row['opt']:>12.2f} {row['r']:>10.4f} {row['gflops']:>11.1f} {row['gbs']:>6.1f}",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
