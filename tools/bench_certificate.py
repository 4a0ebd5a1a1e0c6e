#!/usr/bin/env python3
"""Benchmark the throughput IP's set-covering certificate alone: its pricing by the exact
DP along the frontier (solve/throughput/pricing_dp.py) beside the pricing MIP it replaces.

One row per workload and load T: the number of classes, then for each pricing how the
search ended (proven: no plan has max load <= T; exhausted: the LP fell to k, no
certificate can come; stopped: out of time) and its seconds.  Give T a little below the
best plan known (the IP's bench proves within 1% this way), e.g. the plan less 1%.
Each search runs alone in this process; run nothing else beside it.

    python tools/bench_certificate.py W.json=T [W.json=T ...] [--seconds 100]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onnxsplit.solve.classes import build_classes  # noqa: E402
from onnxsplit.solve.throughput import bound_setcover  # noqa: E402
from onnxsplit.workload import Workload  # noqa: E402


def _search(w: Workload, T: float, seconds: float, exact: bool) -> tuple[str, float]:
    sets = bound_setcover._Sets(build_classes(w), w.accelerator_memory)
    if exact:
        sets.frontier()  # built before the clock starts, as the IP builds it once for every load
    else:
        sets.frontier = lambda: None  # the MIP alone, as before the DP
    began = time.perf_counter()
    outcome = bound_setcover._search(sets, w.num_accelerators, w.num_cpus, T, None, seconds, None)
    return outcome, time.perf_counter() - began


def _compile(w: Workload, T: float) -> None:
    """One small call of the DP, so that neither column pays numba's first compilation."""
    sets = bound_setcover._Sets(build_classes(w), w.accelerator_memory)
    if sets.frontier() is not None:
        sets.frontier().find(np.ones(sets.n), T, float(sets.n), 5.0, threading.Event())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="+", help="WORKLOAD.json=T")
    ap.add_argument("--seconds", type=float, default=100.0, help="each search's time limit")
    args = ap.parse_args()
    cases = []
    for case in args.cases:
        path, _, load = case.rpartition("=")
        if not path or not Path(path).is_file():
            sys.exit(f"bench_certificate: error: {case!r} is not WORKLOAD.json=T with an existing file")
        cases.append((Path(path), float(load)))
    _compile(Workload.from_paper_json(str(cases[0][0])), cases[0][1])
    print(f"{'workload':32} {'classes':>7} {'T':>10}  {'MIP pricing':>18}  {'exact DP':>18}  {'speed-up':>8}")
    print("-" * 100)
    for path, T in cases:
        w = Workload.from_paper_json(str(path))
        n = build_classes(w).n
        mip, mip_s = _search(w, T, args.seconds, exact=False)
        dp, dp_s = _search(w, T, args.seconds, exact=True)
        faster = f"{mip_s / dp_s:.1f}x" if mip == dp == bound_setcover.PROVEN else "-"
        print(f"{path.name:32} {n:7d} {T:10.3f}  {mip:>9} {mip_s:7.1f} s  {dp:>9} {dp_s:7.1f} s  {faster:>8}", flush=True)


if __name__ == "__main__":
    main()
