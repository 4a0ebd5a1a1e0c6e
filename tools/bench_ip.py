#!/usr/bin/env python3
"""Benchmark the integer programs on the paper's workloads.

One table: workload, objective, method, value, proven lower bound, gap, seconds, and the
best value of the paper's methods in expected.json (throughput: dp, local_search10,
scotch, linearize_ub; latency: the smallest memory-feasible value of its row -- keys
ending in "_over_memory" break the memory limit and do not count; none where the data
folder has no expected.json, and then OK means the gap alone).  Lower is better.
The throughput IP is warm-started from the linearized DP, the ring split and local search,
the latency IP from the best quick plan (latency_dp, the greedies, the DP and PipeDream
splits) or the series plan, polished; seconds include the warm start.  ``--data`` takes any
folder with throughput/ and latency/ subfolders of workloads in the paper's format.

    python tools/bench_ip.py [--time-limit 120] [--solver highs|cbc] [--contiguous] [--pieces Q]
                             [--objective throughput|latency|both] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAPER_KEYS = ("dp", "local_search10", "scotch", "linearize_ub")


def default_data() -> Path:
    return Path(os.environ.get("ONNXSPLIT_PAPER_DATA", HERE.parent.parent / "shared" / "paper-workloads"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=default_data())
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--solver", default="highs", choices=["highs", "cbc"])
    ap.add_argument("--contiguous", action="store_true")
    ap.add_argument("--pieces", type=int, default=1, help="latency: calls per accelerator")
    ap.add_argument("--objective", default="both", choices=["throughput", "latency", "both"])
    ap.add_argument("--only", action="append", help="workload file name (repeatable)")
    args = ap.parse_args()

    from onnxsplit import api

    # a folder without expected.json (other workloads in the paper's format) gets no paper column
    known = args.data / "expected.json"
    expected = json.loads(known.read_text()) if known.exists() else {}
    runs = []
    for objective in (["throughput", "latency"] if args.objective == "both" else [args.objective]):
        files = sorted((args.data / objective).glob("*.json"), key=lambda p: p.stat().st_size)
        runs += [(objective, f) for f in files if not args.only or f.name in args.only]
    head = (f"{'workload':34} {'objective':10} {'method':14} {'value':>11} {'bound':>11} {'gap':>7} "
            f"{'seconds':>8} {'best paper':>11} {'vs paper':>9}")
    print(head)
    print("-" * len(head))
    met = 0
    for objective, f in runs:
        w = api.load_workload(f)
        plan = api.solve(w, objective, "ip", contiguous=args.contiguous, pieces=args.pieces,
                         time_limit=args.time_limit, solver=args.solver)
        e = expected.get(objective, {}).get(f.name, {})
        keys = PAPER_KEYS if objective == "throughput" else [k for k in e if not k.endswith("over_memory")]
        best_key = min((k for k in keys if isinstance(e.get(k), (int, float))), key=lambda k: e[k], default=None)
        best = e[best_key] if best_key else None
        gap = f"{plan.gap:.2%}" if plan.gap is not None else "-"
        bound = f"{plan.lower_bound:.4f}" if plan.lower_bound is not None else "-"
        ok = (plan.value is not None and (best is None or plan.value <= best * (1 + 1e-9))
              and plan.gap is not None and plan.gap <= 0.01)
        met += ok
        value = f"{plan.value:>11.4f}" if plan.value is not None else f"{'-':>11}"
        versus = f"{plan.value / best - 1:>+9.2%}" if plan.value is not None and best else f"{'-':>9}"
        paper = f"{best:>11.4f}" if best is not None else f"{'-':>11}"
        print(f"{f.name:34} {objective:10} {plan.method:14} {value} {bound:>11} {gap:>7} "
              f"{plan.seconds:>8.1f} {paper} {versus}  {best_key or ''}{'  OK' if ok else ''}", flush=True)
    files = runs
    print(f"\n{met}/{len(files)} at or below the best paper value (where known) with a proven gap <= 1% "
          f"within {args.time_limit:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
