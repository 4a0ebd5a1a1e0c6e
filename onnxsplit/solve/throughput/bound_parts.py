"""Lower bounds from part of the graph (the throughput IP's bound).

Restricted to a subset of the nodes, every plan stays a plan of the sub-workload and no
device's load grows, so the sub-workload's proven optimum (or any bound on it) bounds the
whole; a part can be far easier to solve and still hold what makes the whole hard.
:func:`grown_part_bounds` solves prefixes and suffixes of a topological order, growing
each while the solver still proves its part optimal within the time given.

Write-up: docs/throughput.md (ip, phase 6: Parts of the graph).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ...workload import Workload

FRACTIONS = (0.5, 0.6, 0.7, 0.8, 0.9)  # of the nodes, prefixes and suffixes grown in turn


def grown_part_bounds(w: Workload, start: dict[int, str], seconds: float, enough: float,
                      solve: Callable[[Workload, dict[int, str], float], tuple[float | None, bool]]) -> float | None:
    """The best lower bound proven on prefixes and suffixes of a topological order.

    ``solve(sub, sub_start, seconds)`` returns (a proven lower bound or None, whether to
    grow on: it proved the part optimal, or did not need to try); ``start`` restricted to
    the part is its warm start.  A side stops growing when its part was not proven
    optimal; everything stops at ``enough`` or after ``seconds``."""
    deadline = time.perf_counter() + seconds
    order = np.array(w.topological_order, dtype=np.int64)
    best = None
    for side in ("prefix", "suffix"):
        for fraction in FRACTIONS:
            left = deadline - time.perf_counter()
            if left <= 0.5:
                return best
            m = int(round(fraction * w.n))
            if m < 2 or m >= w.n:
                continue
            keep = np.zeros(w.n, dtype=bool)
            keep[order[:m] if side == "prefix" else order[w.n - m:]] = True
            sub = w.restricted(keep)
            ids = set(int(i) for i in sub.ids)
            bound, solved = solve(sub, {i: d for i, d in start.items() if i in ids}, left / 2)
            if bound is not None:
                best = bound if best is None else max(best, bound)
                if best >= enough:
                    return best
            if not solved:
                break
    return best
