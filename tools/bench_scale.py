#!/usr/bin/env python3
"""How the methods scale: for graphs of about 1k, 3k, 10k and 30k nodes, time to the first
plan, the final value, the proven bound, the gap, the seconds and the peak memory.

Synthetic workloads come from tools/make_large_workload.py (transformer layers, ``--k``
accelerators, ``--l`` cores, each accelerator holding ``--memory-share`` of the weights);
a real export's workload can be added with ``--workload FILE``.  Each solve runs as its
own ``onnxsplit solve --json`` process, so its peak memory (max RSS) is its own.

    python tools/bench_scale.py [--sizes 1000,3000,10000,30000] [--time-limit 60]
        [--k 4] [--l 2] [--memory-share 0.3] [--methods dp_linear,lp_round,ip]
        [--latency-methods ip] [--workload FILE ...] [--shared-mask]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def solve(path: Path, objective: str, method: str, time_limit: float) -> dict:
    """One solve in its own process: its JSON plan, wall seconds and peak RSS (MB, the
    process's own, from wait4)."""
    cmd = [sys.executable, "-m", "onnxsplit", "solve", str(path), "--objective", objective,
           "--method", method, "--time-limit", str(time_limit), "--json"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - began
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, problem = out.read(), err.read().decode()
    peak = usage.ru_maxrss / 1024  # KB on Linux
    if proc.returncode != 0:
        lines = problem.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {proc.returncode}", "wall_s": wall, "peak_mb": peak}
    return {"plan": json.loads(text), "wall_s": wall, "peak_mb": peak}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,3000,10000,30000")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--l", type=int, default=2)
    ap.add_argument("--memory-share", type=float, default=0.3)
    ap.add_argument("--methods", default="dp_linear,lp_round,ip")
    ap.add_argument("--latency-methods", default="ip")
    ap.add_argument("--workload", action="append", default=[], help="a workload JSON to add (e.g. a real export's)")
    ap.add_argument("--shared-mask", action="store_true",
                    help="synthetic graphs with one attention mask read by every layer, as exports have")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="onnxsplit-scale-"))
    cases = []
    for n in [int(x) for x in args.sizes.split(",") if x]:
        path = tmp / f"t{n}.json"
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_large_workload.py"), str(path), "--nodes", str(n),
                        "--k", str(args.k), "--l", str(args.l), "--memory-share", str(args.memory_share)]
                       + ["--shared-mask"] * args.shared_mask,
                       check=True, stdout=subprocess.DEVNULL)
        cases.append((f"synthetic {n}", path))
    cases += [(Path(w).name, Path(w)) for w in args.workload]
    runs = [("throughput", m) for m in args.methods.split(",") if m] + \
        [("latency", m) for m in args.latency_methods.split(",") if m]
    print(f"time limit {args.time_limit:g} s; k={args.k}, l={args.l}, memory share {args.memory_share:g}"
          f"{'; one attention mask read by every layer' if args.shared_mask else ''}; "
          "peak = max RSS of the solve's process", flush=True)
    print(f"{'workload':<18} {'nodes':>6} {'objective':<10} {'method':<10} {'first s':>8} {'value':>11} "
          f"{'bound':>11} {'gap':>7} {'seconds':>8} {'peak MB':>8}  status", flush=True)
    for label, path in cases:
        nodes = len(json.loads(path.read_text())["nodes"])
        for objective, method in runs:
            r = solve(path, objective, method, args.time_limit)
            peak = f"{r['peak_mb']:.0f}" if r["peak_mb"] else "-"
            if "error" in r:
                print(f"{label:<18} {nodes:>6} {objective:<10} {method:<10} {'-':>8} {'-':>11} {'-':>11} {'-':>7} "
                      f"{r['wall_s']:>8.1f} {peak:>8}  {r['error'][:60]}", flush=True)
                continue
            p = r["plan"]
            first = (p.get("details") or {}).get("first_plan_s")
            val = f"{p['value']:.6g}" if p.get("value") is not None else "-"
            lb = f"{p['lower_bound']:.6g}" if p.get("lower_bound") is not None else "-"
            gap = f"{p['gap']:.2%}" if p.get("gap") is not None else "-"
            print(f"{label:<18} {nodes:>6} {objective:<10} {method:<10} "
                  f"{(f'{first:.1f}' if first is not None else '-'):>8} {val:>11} {lb:>11} {gap:>7} "
                  f"{r['wall_s']:>8.1f} {peak:>8}  {p['status']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
