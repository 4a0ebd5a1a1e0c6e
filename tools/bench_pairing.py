"""How far apart `onnxsplit run` measures two identical sessions: in turn, or in pairs.

`run` measures a plan beside each of onnxruntime's sessions (``compare.measure_rounds``
with ``pair_with``); before, every session ran in turn each round and a ratio paired
measurements up to a round apart.  This loads the whole model twice on ``--ep`` (one
stands for the plan, the other for onnxruntime's session; any ratio off 1.00 is the
measurement's own noise) and onnxruntime's default CPU session beside them, as `run` has
it, then measures alternately both ways and prints each ratio and their spread.

    python tools/bench_pairing.py MODEL.onnx:SHAPES [--ep CUDAExecutionProvider] [--reps 4]

``--apart``: the load-order bias instead.  Each rep loads the two identical sessions
afresh, the plan's first (as `run` loads them), and measures them in pairs, alternately in
one process and each in a process of its own (``running/apart.py``, as `run` measures
now); ``--hint THROUGHPUT`` (or LATENCY) makes both OpenVINO's runtime with that hint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxsplit.api import parse_input_shapes  # noqa: E402
from onnxsplit.graph import OpGraph  # noqa: E402
from onnxsplit.profile.devices import CPU_EP  # noqa: E402
from onnxsplit.profile.measure import input_feeds  # noqa: E402
from onnxsplit.running import apart  # noqa: E402
from onnxsplit.running.runner import Parts, build_configuration  # noqa: E402
from onnxsplit.running.compare import measure_rounds, paired_ratios  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", metavar="MODEL.onnx:SHAPES")
    ap.add_argument("--ep", default=CPU_EP, help="where the two identical sessions run")
    ap.add_argument("--reps", type=int, default=4, help="measurements each way")
    ap.add_argument("--samples", type=int, default=45)
    ap.add_argument("--apart", action="store_true", help="the load-order bias: in one process, and apart")
    ap.add_argument("--hint", choices=("LATENCY", "THROUGHPUT"), help="with --apart: OpenVINO's runtime, so hinted")
    args = ap.parse_args(argv)
    model, _, shapes = args.model.partition(":")
    graph = OpGraph.from_onnx(model, parse_input_shapes([shapes] if shapes else []))
    feeds = input_feeds(graph)
    if args.apart:
        return load_order(model, feeds, args)
    loaded = {"plan": Parts.whole(model, args.ep), "twin": Parts.whole(model, args.ep),
              "ort_default_cpu": Parts.whole(model, CPU_EP)}
    got: dict[str, list[float]] = {"in turn": [], "pairs": []}
    print(f"{'how':<8} {'throughput':>10} {'latency':>8}   identical sessions on {args.ep}: "
          "plan over twin (1.00: no noise)", flush=True)
    for rep in range(2 * args.reps):
        how = "pairs" if rep % 2 else "in turn"
        g = measure_rounds(loaded, feeds, args.samples, 5, pair_with="plan" if rep % 2 else None)
        r = paired_ratios(g["plan"], {"twin": g["twin"]})["twin"]
        got[how].append(r["throughput"])
        print(f"{how:<8} {r['throughput']:>10.3f} {r['latency']:>8.3f}", flush=True)
    for how, ratios in got.items():
        print(f"{how}: throughput ratios {min(ratios):.3f}-{max(ratios):.3f}, "
              f"median distance from 1 {np.median(np.abs(np.array(ratios) - 1)):.3f}")
    return 0


def load_order(model: str, feeds, args) -> int:
    """Plan over twin, the plan loaded first, in pairs: in one process and apart."""
    recipe = ("hinted", model, args.hint) if args.hint else ("whole", model, args.ep, {"threads": 0})
    what = f"OpenVINO {args.hint}" if args.hint else args.ep
    print(f"{'where':<12} {'throughput':>10} {'latency':>8}   identical sessions ({what}), the plan's "
          "loaded first: plan over twin", flush=True)
    got: dict[str, list[float]] = {"one process": [], "apart": []}
    for rep in range(2 * args.reps):
        where = "apart" if rep % 2 else "one process"
        make = apart.Apart if rep % 2 else (lambda r, f: build_configuration(r))
        loaded = {}
        try:
            for name in ("plan", "twin"):
                loaded[name] = make(recipe, feeds)
            g = measure_rounds(loaded, feeds, args.samples, 5, pair_with="plan")
        finally:
            for held in loaded.values():
                if isinstance(held, apart.Apart):
                    held.close()
            loaded.clear()
        r = paired_ratios(g["plan"], {"twin": g["twin"]})["twin"]
        got[where].append(r["throughput"])
        print(f"{where:<12} {r['throughput']:>10.3f} {r['latency']:>8.3f}", flush=True)
    for where, ratios in got.items():
        print(f"{where}: throughput ratios {min(ratios):.3f}-{max(ratios):.3f}, median {np.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
