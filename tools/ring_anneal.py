#!/usr/bin/env python3
"""An independent search to hold the throughput IP's plan against, on graphs that are a
ring of layers (training graphs whose tied weights close the chain).

It shares nothing with the IP's pairs and shift: it anneals one order of the colour
classes (the spectral line and the angular ring of ``orders.spectral_ranks``) cut into
segments, each on a device, moving cuts, moving a segment to another device, cutting a
patch out of a segment for another device, and joining segments.  A device's load is its
segments' work plus, for each run of its consecutive segments, the tensors crossing that
run's boundary (``dp_ring``'s table: where a tensor crosses two runs of one device it is
counted twice, so this is never below the evaluator's load).  Each seed's best is then
scored by the evaluator.  Where seeds end at the IP's value and none below it, the plan
is at least locally hard to beat in a space the IP did not search.

    python tools/ring_anneal.py W.json [--moves 10000000] [--seeds 4] [--plan PLAN.json]

``--plan``: the output of ``onnxsplit solve ... --json``, printed beside.  Each row: the
order, the seed, the annealed load, the evaluator's max load, the segments, the seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onnxsplit.solve import evaluate  # noqa: E402
from onnxsplit.solve.classes import build_classes  # noqa: E402
from onnxsplit.solve.orders import spectral_ranks  # noqa: E402
from onnxsplit.solve.throughput import dp_ring  # noqa: E402
from onnxsplit.workload import Workload  # noqa: E402

MOST_SEGMENTS = 40


@njit(cache=True)
def _loads(cuts, dev, m, acc_pre, cpu_pre, mem_pre, uns_pre, comm, k, memory, out) -> bool:
    """Each device's load (into ``out``) of segments cuts[s]..cuts[s+1] (the last wraps)
    on dev[s]; False where an accelerator holds an unsupported class or is over memory."""
    n = len(acc_pre) - 1
    out[:] = 0.0
    mem = np.zeros(len(out))
    ok = True
    for s in range(m):
        a, b, d = cuts[s], (cuts[s + 1] if s + 1 < m else cuts[0] + n), dev[s]
        if b <= n:
            acc, cpu, size, uns = (acc_pre[b] - acc_pre[a], cpu_pre[b] - cpu_pre[a], mem_pre[b] - mem_pre[a],
                                   uns_pre[b] - uns_pre[a])
        else:
            acc = acc_pre[n] - acc_pre[a] + acc_pre[b - n]
            cpu = cpu_pre[n] - cpu_pre[a] + cpu_pre[b - n]
            size = mem_pre[n] - mem_pre[a] + mem_pre[b - n]
            uns = uns_pre[n] - uns_pre[a] + uns_pre[b - n]
        if d < k:
            out[d] += acc
            mem[d] += size
            ok = ok and uns == 0
        else:
            out[d] += cpu
    for s in range(m):  # each accelerator run of consecutive segments pays its boundary
        d = dev[s]
        if d >= k or m == 1 or dev[s - 1 if s > 0 else m - 1] == d:
            continue
        e = s
        while dev[e + 1 if e + 1 < m else 0] == d and (e + 1 if e + 1 < m else 0) != s:
            e = e + 1 if e + 1 < m else 0
        a, b = cuts[s], cuts[e + 1] if e + 1 < m else cuts[0]
        out[d] += comm[a, b] if a < b else comm[b, a]  # (a set's boundary is its complement's)
    for d in range(k):
        ok = ok and mem[d] <= memory
    return ok


@njit(cache=True)
def _score(loads) -> float:
    """The max load, plus a smooth count of the devices near it (so moves off a tie pay)."""
    top = loads.max()
    return top + 0.5 * np.exp((loads - top) / 2.0).sum()


@njit(cache=True)
def _anneal(cuts, dev, m, acc_pre, cpu_pre, mem_pre, uns_pre, comm, k, devices, memory, moves, seed):
    np.random.seed(seed)
    n = len(acc_pre) - 1
    loads = np.zeros(devices)
    _loads(cuts, dev, m, acc_pre, cpu_pre, mem_pre, uns_pre, comm, k, memory, loads)
    current, best = _score(loads), loads.max()
    best_cuts, best_dev, best_m = cuts.copy(), dev.copy(), m
    nc, nd = cuts.copy(), dev.copy()
    for it in range(moves):
        temperature = 20.0 * (0.05 / 20.0) ** (it / moves)
        nc[:] = cuts
        nd[:] = dev
        nm = m
        r = np.random.random()
        if r < 0.5:  # a cut moves, not past its neighbours
            s = np.random.randint(m)
            step = int(np.random.standard_normal() * 6)
            if step == 0:
                step = 1 if np.random.random() < 0.5 else -1
            lo = cuts[s - 1] + 1 if s > 0 else cuts[m - 1] - n + 1
            hi = cuts[s + 1] - 1 if s + 1 < m else cuts[0] + n - 1
            if m == 1 or cuts[s] + step < lo or cuts[s] + step > hi:
                continue
            nc[s] = (cuts[s] + step) % n
        elif r < 0.7:  # a segment to another device
            nd[np.random.randint(m)] = np.random.randint(devices)
        elif r < 0.85:  # a patch of a segment to another device
            s = np.random.randint(m)
            a, b = cuts[s], (cuts[s + 1] if s + 1 < m else cuts[0] + n)
            if m + 2 > MOST_SEGMENTS or b - a < 3:
                continue
            length = 1 + np.random.randint(min(60, b - a - 2))
            p = a + 1 + np.random.randint(b - a - 1 - length)
            nc[m] = p % n
            nd[m] = np.random.randint(devices)
            nc[m + 1] = (p + length) % n
            nd[m + 1] = dev[s]
            nm = m + 2
        else:  # a cut goes: its segment joins the one before
            if m <= 2:
                continue
            s = np.random.randint(m)
            nc[s:m - 1] = cuts[s + 1:m]
            nd[s:m - 1] = dev[s + 1:m]
            nm = m - 1
        order = np.argsort(nc[:nm])
        sorted_cuts, sorted_dev = nc[:nm][order], nd[:nm][order]
        nc[:nm] = sorted_cuts
        nd[:nm] = sorted_dev
        if nm > 1 and (np.diff(nc[:nm]) == 0).any():
            continue
        if not _loads(nc, nd, nm, acc_pre, cpu_pre, mem_pre, uns_pre, comm, k, memory, loads):
            continue
        new = _score(loads)
        if new <= current or np.random.random() < np.exp((current - new) / temperature):
            cuts[:] = nc
            dev[:] = nd
            m, current = nm, new
            if loads.max() < best:
                best, best_m = loads.max(), m
                best_cuts[:] = cuts
                best_dev[:] = dev
    return best, best_cuts, best_dev, best_m


def anneal(w: Workload, moves: int, seeds: int):
    """Rows (order, seed, annealed load, evaluator's max load, segments, seconds)."""
    cl = build_classes(w)
    n, k, devices = cl.n, w.num_accelerators, w.num_accelerators + w.num_cpus
    rows = []
    for name, rank in spectral_ranks(n, *cl.hyper_arrays()).items():
        ordered, tables = dp_ring.order_tables(cl, rank)
        for seed in range(seeds):  # from even shares of the work, one segment a device
            began = time.perf_counter()
            cuts = np.zeros(MOST_SEGMENTS + 2, dtype=np.int64)
            dev = np.zeros(MOST_SEGMENTS + 2, dtype=np.int64)
            cuts[:devices] = np.sort(np.searchsorted(tables[0], tables[0][-1] * np.arange(devices) / devices))
            cuts[:devices] = np.maximum.accumulate(cuts[:devices] + np.arange(devices)) - np.arange(devices)
            dev[:devices] = np.arange(devices)
            value, cuts, dev, m = _anneal(cuts, dev, devices, *tables, k, devices,
                                          float(w.accelerator_memory) * (1 + 1e-12), moves, seed)
            placed = np.zeros(n, dtype=np.int64)
            for s in range(m):
                end = cuts[s + 1] if s + 1 < m else cuts[0] + n
                placed[np.arange(cuts[s], end) % n] = dev[s]
            exact = evaluate.max_load(w, ordered.assignment(w, placed)).value if np.isfinite(value) else np.inf
            rows.append((name, seed, float(value), float(exact), int(m), time.perf_counter() - began))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", type=Path)
    ap.add_argument("--moves", type=int, default=10_000_000)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--plan", type=Path, help="a plan from `onnxsplit solve ... --json`, printed beside")
    args = ap.parse_args()
    w = Workload.from_paper_json(json.loads(args.workload.read_text()))
    if build_classes(w).n > dp_ring.MOST_CLASSES:
        print(f"onnxsplit: error: more than {dp_ring.MOST_CLASSES} colour classes", file=sys.stderr)
        return 2
    if args.plan:
        plan = json.loads(args.plan.read_text())
        assignment = {int(node): device for node, device in plan["assignment"].items()}
        print(f"the plan: {evaluate.max_load(w, assignment).value:.2f} (bound {plan.get('lower_bound')})")
    print(f"{'order':<10} {'seed':>4} {'annealed':>10} {'evaluator':>10} {'segments':>8} {'seconds':>8}")
    for name, seed, value, exact, m, seconds in anneal(w, args.moves, args.seeds):
        print(f"{name:<10} {seed:>4} {value:>10.2f} {exact:>10.2f} {m:>8} {seconds:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
