#!/usr/bin/env python3
"""How the methods scale and how far from proven they stop: for graphs of about 1k, 3k,
10k and 30k nodes, of several structures and seeds, time to the first plan, the final
value, the proven bound, the gap, the seconds and the peak memory; then, per objective and
method, the distribution of the gaps (so that no method or bound is judged on one
generator's graph).

Synthetic workloads come from tools/make_large_workload.py: ``--structures`` encoder
(transformer layers) and varied (blocks the seed draws: fan-outs, shape arithmetic the
accelerators do not take, skip connections, heavy and light blocks), each for every seed
of ``--seeds``, every accelerator count of ``--k`` and every memory regime of
``--memory-share`` (each accelerator's memory as a share of the weights; 0: no limit); a
real export's workload can be added with ``--workload FILE``.  Each solve runs as its own
``onnxsplit solve --json`` process, so its peak memory (max RSS) is its own.

    python tools/bench_scale.py [--sizes 1000,3000,10000,30000] [--time-limit 60]
        [--structures encoder,varied] [--seeds 0] [--k 4] [--l 2] [--memory-share 0.3]
        [--methods dp_linear,lp_round,ip] [--latency-methods ip] [--workload FILE ...]
        [--shared-mask]
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
    ap.add_argument("--structures", default="encoder", help="encoder, varied or both (comma-separated)")
    ap.add_argument("--seeds", default="0", help="seeds of the synthetic workloads (comma-separated)")
    ap.add_argument("--k", default="4", help="accelerator counts (comma-separated)")
    ap.add_argument("--l", type=int, default=2)
    ap.add_argument("--memory-share", default="0.3", help="memory regimes (comma-separated; 0: no limit)")
    ap.add_argument("--methods", default="dp_linear,lp_round,ip")
    ap.add_argument("--latency-methods", default="ip")
    ap.add_argument("--workload", action="append", default=[], help="a workload JSON to add (e.g. a real export's)")
    ap.add_argument("--shared-mask", action="store_true",
                    help="synthetic encoders with one attention mask read by every layer, as exports have")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="onnxsplit-scale-"))
    cases = []
    for n in _list(args.sizes, int):
        for structure in _list(args.structures, str):
            for seed in _list(args.seeds, int):
                for k in _list(args.k, int):
                    for share in _list(args.memory_share, float):
                        label = f"{structure[:3]} s{seed} k{k} m{share:g}"
                        path = tmp / f"{structure}-{n}-{seed}-{k}-{share:g}.json"
                        subprocess.run([sys.executable, str(ROOT / "tools" / "make_large_workload.py"), str(path),
                                        "--nodes", str(n), "--k", str(k), "--l", str(args.l),
                                        "--memory-share", str(share), "--seed", str(seed),
                                        "--structure", structure] + ["--shared-mask"] * args.shared_mask,
                                       check=True, stdout=subprocess.DEVNULL)
                        cases.append((label, path))
    cases += [(Path(w).name, Path(w)) for w in args.workload]
    runs = [("throughput", m) for m in args.methods.split(",") if m] + \
        [("latency", m) for m in args.latency_methods.split(",") if m]
    print(f"time limit {args.time_limit:g} s; l={args.l}{'; one attention mask read by every layer' if args.shared_mask else ''}; "
          "workload = structure, seed, accelerators, memory share; peak = max RSS of the solve's process", flush=True)
    print(f"{'workload':<22} {'nodes':>6} {'objective':<10} {'method':<10} {'first s':>8} {'value':>11} "
          f"{'bound':>11} {'gap':>7} {'seconds':>8} {'peak MB':>8}  status", flush=True)
    results: dict[tuple[str, str], list[dict]] = {}
    for label, path in cases:
        nodes = len(json.loads(path.read_text())["nodes"])
        for objective, method in runs:
            r = solve(path, objective, method, args.time_limit)
            results.setdefault((objective, method), []).append(r)
            peak = f"{r['peak_mb']:.0f}" if r["peak_mb"] else "-"
            if "error" in r:
                print(f"{label:<22} {nodes:>6} {objective:<10} {method:<10} {'-':>8} {'-':>11} {'-':>11} {'-':>7} "
                      f"{r['wall_s']:>8.1f} {peak:>8}  {r['error'][:60]}", flush=True)
                continue
            p = r["plan"]
            first = (p.get("details") or {}).get("first_plan_s")
            val = f"{p['value']:.6g}" if p.get("value") is not None else "-"
            lb = f"{p['lower_bound']:.6g}" if p.get("lower_bound") is not None else "-"
            gap = f"{p['gap']:.2%}" if p.get("gap") is not None else "-"
            print(f"{label:<22} {nodes:>6} {objective:<10} {method:<10} "
                  f"{(f'{first:.1f}' if first is not None else '-'):>8} {val:>11} {lb:>11} {gap:>7} "
                  f"{r['wall_s']:>8.1f} {peak:>8}  {p['status']}", flush=True)
    _distribution(results, args.time_limit)
    return 0


def _list(text: str, kind):
    return [kind(x) for x in text.split(",") if x]


def _distribution(results: dict[tuple[str, str], list[dict]], time_limit: float) -> None:
    """Per objective and method: how many runs, the gaps' spread (no gap counts as
    unproven), how many within 1% and 5%, the longest wall time and the largest peak."""
    print(f"\n{'objective':<10} {'method':<10} {'runs':>4} {'min gap':>8} {'median':>8} {'max gap':>8} "
          f"{'<=1%':>5} {'<=5%':>5} {'no gap':>6} {'max s':>7} {'over':>5} {'max MB':>7}")
    for (objective, method), rs in results.items():
        gaps = sorted(r["plan"]["gap"] for r in rs if "plan" in r and r["plan"].get("gap") is not None)
        unproven = len(rs) - len(gaps)
        walls = [r["wall_s"] for r in rs]
        over = sum(w > 1.1 * time_limit for w in walls)
        peaks = [r["peak_mb"] for r in rs if r["peak_mb"]]
        pct = (lambda g: f"{g:.2%}") if gaps else (lambda g: "-")
        print(f"{objective:<10} {method:<10} {len(rs):>4} {pct(gaps[0] if gaps else 0):>8} "
              f"{pct(gaps[len(gaps) // 2] if gaps else 0):>8} {pct(gaps[-1] if gaps else 0):>8} "
              f"{sum(g <= 0.01 for g in gaps):>5} {sum(g <= 0.05 for g in gaps):>5} {unproven:>6} "
              f"{max(walls):>7.1f} {over:>5} {max(peaks, default=0):>7.0f}")


if __name__ == "__main__":
    sys.exit(main())
