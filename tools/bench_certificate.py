#!/usr/bin/env python3
"""Benchmark the throughput IP's set-covering certificate alone: with the prices of each
class's copies in repeated blocks tied first (solve/block_shift.py), as the IP seeks it,
beside free prices only, as before.  Both price by the exact DP along the frontier.

One row per workload and load T: the number of classes and of chains of copies (the tied
LP's rows), then for each form how the search ended (proven: no plan has max load <= T; exhausted: the LP fell to k, no
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


def _search(sets, w: Workload, T: float, seconds: float, tied: bool) -> tuple[str, float]:
    k, l = w.num_accelerators, w.num_cpus
    began = time.perf_counter()
    outcome = bound_setcover.EXHAUSTED
    if tied and sets.chains is not None:
        master = bound_setcover._Master(sets, k, l, sets.chains)
        outcome = bound_setcover._search(sets, master, k, l, T, None, seconds, None)
    if outcome == bound_setcover.EXHAUSTED:  # then free prices, as bound_setcover.infeasible does
        left = seconds - (time.perf_counter() - began)
        outcome = bound_setcover._search(sets, bound_setcover._Master(sets, k, l), k, l, T, None, left, None)
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
    print(f"{'workload':32} {'classes':>7} {'chains':>6} {'T':>10}  {'free prices':>18}  {'tied, then free':>18}"
          f"  {'speed-up':>8}")
    print("-" * 110)
    for path, T in cases:
        w = Workload.from_paper_json(str(path))
        # built before the clock starts, as the IP builds them once for every load
        sets = bound_setcover._Sets(build_classes(w), w.accelerator_memory)
        sets.frontier()
        chains = int(sets.chains.max()) + 1 if sets.chains is not None else sets.n
        free, free_s = _search(sets, w, T, args.seconds, tied=False)
        tied, tied_s = _search(sets, w, T, args.seconds, tied=True)
        faster = f"{free_s / tied_s:.1f}x" if free == tied == bound_setcover.PROVEN else "-"
        print(f"{path.name:32} {sets.n:7d} {chains:6d} {T:10.3f}  {free:>9} {free_s:7.1f} s  {tied:>9} {tied_s:7.1f} s"
              f"  {faster:>8}", flush=True)


if __name__ == "__main__":
    main()
