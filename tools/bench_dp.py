#!/usr/bin/env python3
"""Benchmark the max-load DP on the paper's throughput workloads.

One table: workload, DP value, the reference value, ideals, ideal pairs, pairs our DP
actually evaluated, seconds, peak MB, and the C++ reference's seconds (expected.json).
Each workload runs in its own process so that peak memory is its own; the JIT is
compiled (and cached) once before timing.

    python tools/bench_dp.py [--data DIR] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def default_data() -> Path:
    return Path(os.environ.get("ONNXSPLIT_PAPER_DATA", HERE.parent.parent / "shared" / "paper-workloads"))


def child(path: str, repeat: int) -> None:
    import time

    from onnxsplit.solve.throughput import dp
    from onnxsplit.workload import Workload

    w = Workload.from_paper_json(path)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        plan = dp.solve(w)
        times.append(time.perf_counter() - t)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"value": plan.value, "seconds": statistics.median(times), "peak_mb": peak_mb,
                      "ideals": plan.details["ideals"], "pairs": plan.details["pairs_evaluated"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=default_data())
    ap.add_argument("--repeat", type=int, default=3, help="runs per workload; the median is shown")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.repeat)
    expected = json.loads((args.data / "expected.json").read_text())["throughput"]
    files = sorted((args.data / "throughput").glob("*.json"), key=lambda p: p.stat().st_size)
    # compile the JIT kernels once (numba caches them on disk)
    subprocess.run([sys.executable, __file__, "--child", str(files[0]), "--repeat", "1"],
                   check=True, capture_output=True)
    head = (f"{'workload':36} {'value':>12} {'reference':>12} {'ideals':>7} {'pairs':>11} {'evaluated':>11} "
            f"{'seconds':>8} {'peak MB':>8} {'C++ s':>7}")
    print(head)
    print("-" * len(head))
    ours_total = ref_total = 0.0
    for f in files:
        out = subprocess.run([sys.executable, __file__, "--child", str(f), "--repeat", str(args.repeat)],
                             check=True, capture_output=True, text=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        e = expected.get(f.name, {})
        ref = e.get("dp") if e.get("dp") is not None else e.get("linearize_ub")
        ref_label = f"{ref:.6f}" + ("" if e.get("dp") is not None else "*") if ref is not None else "-"
        cpp = e.get("dp_seconds")
        if cpp is not None:
            ours_total += r["seconds"]
            ref_total += cpp
        print(f"{f.name:36} {r['value']:>12.6f} {ref_label:>12} {r['ideals']:>7} {e.get('ideal_pairs', 0):>11} "
              f"{r['pairs']:>11} {r['seconds']:>8.2f} {r['peak_mb']:>8.0f} "
              f"{cpp if cpp is not None else 'DNF':>7}")
    print(f"\non the workloads the C++ DP finishes: ours {ours_total:.2f} s in total, C++ {ref_total:.2f} s "
          f"({ref_total / max(ours_total, 1e-9):.1f}x)")
    print("* reference gives only linearize_ub (its DP does not finish in 600 s); ours must be <= it")


if __name__ == "__main__":
    main()
