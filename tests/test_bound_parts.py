"""Bounds from parts of the graph (solve/bound_parts.py), against brute force.

The brute force (tests/bruteforce.py) enumerates every class -> device map and scores
it with its own max-load model; it never imports onnxsplit.solve.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit.solve import evaluate
from onnxsplit.solve.throughput import bound_parts
from onnxsplit.solve.throughput import ip
from onnxsplit.workload import Workload


def _sub_data(data, keep_ids):
    return {**data, "nodes": [n for n in data["nodes"] if n["id"] in keep_ids],
            "edges": [e for e in data["edges"] if e["sourceId"] in keep_ids and e["destId"] in keep_ids]}


@pytest.mark.parametrize("seed", range(60))
def test_a_part_never_needs_more_than_the_whole(seed):
    data = bf.random_workload(seed, n_range=(3, 6), k_range=(1, 2), l_range=(0, 1), class_p=0.3)
    rng = random.Random(seed)
    ids = [n["id"] for n in data["nodes"]]
    keep = set(rng.sample(ids, rng.randint(1, len(ids) - 1)))
    whole, _ = bf.brute_min_max_load(data, chain=False)
    part, _ = bf.brute_min_max_load(_sub_data(data, keep), chain=False)
    if whole is None:
        return
    assert part is not None and part <= whole + 1e-9
    # and restricted() builds that same sub-workload
    w = Workload.from_paper_json(data)
    mask = np.array([int(i) in keep for i in w.ids])
    sub = w.restricted(mask)
    assert sorted(int(i) for i in sub.ids) == sorted(keep)
    assert sub.to_paper_json()["edges"] == _sub_data(data, keep)["edges"]


@pytest.mark.parametrize("seed", range(40))
def test_grown_part_bounds_stay_below_the_optimum(seed):
    data = bf.random_workload(seed, n_range=(4, 7), k_range=(1, 3), l_range=(0, 1), class_p=0.3)
    whole, best = bf.brute_min_max_load(data, chain=False)
    if whole is None:
        return
    w = Workload.from_paper_json(data)
    opts = dict(contiguous=False, split_passes=False, solver="highs", threads=None, verbose=False)
    seen = []

    def solve(sub, start, seconds):
        seen.append(sub.n)
        return ip._part_bound(sub, start, seconds, 1e-6, opts)

    bound = bound_parts.grown_part_bounds(w, best, 30, np.inf, solve)
    assert seen, "no part was tried"
    assert bound is not None and bound <= whole * (1 + 1e-6) + 1e-9


@pytest.mark.parametrize("seed", range(30))
def test_a_part_is_solved_only_where_it_could_raise_the_bound(seed):
    """A part whose (improved) plan scores at most the bound already proven cannot raise
    it and is skipped; below its brute-force optimum it is solved, never above that."""
    data = bf.random_workload(seed, n_range=(4, 7), k_range=(1, 3), l_range=(0, 1), class_p=0.3)
    whole, best = bf.brute_min_max_load(data, chain=False)
    if whole is None:
        return
    w = Workload.from_paper_json(data)
    keep = np.zeros(w.n, dtype=bool)
    keep[list(w.topological_order)[: max(2, w.n // 2)]] = True
    sub = w.restricted(keep)
    ids = set(int(i) for i in sub.ids)
    start = {i: d for i, d in best.items() if i in ids}
    part, _ = bf.brute_min_max_load(_sub_data(data, ids), chain=False)
    opts = dict(contiguous=False, split_passes=False, solver="highs", threads=None, verbose=False)
    plan_value = evaluate.max_load(sub, start).value
    assert ip._part_bound(sub, start, 10, 1e-6, opts, proven=plan_value) == (None, True)
    bound, solved = ip._part_bound(sub, start, 10, 1e-6, opts, proven=part * (1 - 1e-3) - 1e-9)
    assert solved and bound is not None
    assert part * (1 - 1e-5) - 1e-9 <= bound <= part * (1 + 1e-6) + 1e-9
