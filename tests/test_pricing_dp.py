"""The certificate's exact pricing DP (solve/throughput/pricing_dp.py) against every subset.

Each subset of classes is scored by tests/bruteforce.py's own max-load model: the set on
one accelerator, every other class on another device, its load read off that accelerator.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit.solve import classes
from onnxsplit.solve.throughput import bound_setcover, pricing_dp
from onnxsplit.workload import Workload


def _subsets(data, w: Workload, cl):
    """(members, load by brute force, fits memory) for every subset of supported classes."""
    g = bf.view(data)
    accelerator = next(d for d in g.devices if bf.is_acc(d))
    elsewhere = next(d for d in g.devices if d != accelerator)
    out = []
    for mask in range(1 << cl.n):
        members = np.array([c for c in range(cl.n) if mask >> c & 1], dtype=np.int64)
        if not cl.supported[members].all():
            continue
        inside = {int(w.ids[v]) for v in range(w.n) if mask >> int(cl.of_node[v]) & 1}
        assignment = {v: accelerator if v in inside else elsewhere for v in g.ids}
        load = bf.device_loads(data, assignment)[accelerator]
        size = sum(g.size[v] for v in inside)
        out.append((members, load, size <= g.M))
    return out


@pytest.mark.parametrize("seed", range(60))
def test_the_best_set_against_every_subset(seed):
    """At random prices and a random load T: no set is worth more than the DP's bound (its
    NONE just above the best holds), it finds the best set where memory does not bind, and
    every set it names fits and is worth at least the threshold."""
    data = bf.random_workload(seed, training=seed % 2 == 1, n_range=(3, 8), k_range=(2, 3), l_range=(0, 2))
    w = Workload.from_paper_json(data)
    cl = classes.build_classes(w)
    if cl.n > 10:
        pytest.skip("too many classes to enumerate")
    sets = bound_setcover._Sets(cl, w.accelerator_memory)
    subsets = _subsets(data, w, cl)
    rng = np.random.default_rng(seed)
    pi = rng.uniform(0, 1, cl.n) * (rng.random(cl.n) > 0.3)
    loads = sorted(load for _, load, _ in subsets)
    T = float(rng.uniform(loads[0], loads[-1] + 1e-9))
    best_any = max(pi[m].sum() for m, load, _ in subsets if load <= T + 1e-9)
    best_fit = max((pi[m].sum() for m, load, fits in subsets if load <= T + 1e-9 and fits), default=0.0)
    dp = sets.frontier()
    stop = threading.Event()
    assert dp.find(pi, T, best_any + 1e-6, 30, stop)[0] == pricing_dp.NONE
    if best_fit <= 0:
        return
    outcome, found = dp.find(pi, T, best_fit - 1e-9, 30, stop)
    assert outcome != pricing_dp.NONE
    if best_any <= best_fit + 1e-12:
        assert outcome == pricing_dp.FOUND and pi[found[0]].sum() == pytest.approx(best_fit)
    by_members = {tuple(m.tolist()): (load, fits) for m, load, fits in subsets}
    for S in found:
        load, fits = by_members[tuple(S.tolist())]
        assert load <= T + 1e-9 and fits and pi[S].sum() >= best_fit - 1e-9


def test_open_tensors_beyond_the_slots_are_left_out_and_still_bound(monkeypatch):
    """With one slot, the tensors that find none go unpaid: the DP then bounds more sets
    than exist, so NONE above the true best still holds, and what it names still fits."""
    data = bf.random_workload(7, training=True, n_range=(7, 8), k_range=(2, 2), l_range=(1, 1))
    w = Workload.from_paper_json(data)
    cl = classes.build_classes(w)
    sets = bound_setcover._Sets(cl, w.accelerator_memory)
    monkeypatch.setattr(pricing_dp, "SLOTS", 1)
    dp = pricing_dp.FrontierPricing(sets)
    assert dp.width == 1
    subsets = _subsets(data, w, cl)
    pi = np.linspace(0.1, 1.0, cl.n)
    T = float(np.median([load for _, load, _ in subsets]))
    best = max(pi[m].sum() for m, load, fits in subsets if load <= T + 1e-9 and fits)
    assert dp.find(pi, T, pi.sum() + 1, 30, threading.Event())[0] == pricing_dp.NONE
    outcome, found = dp.find(pi, T, best - 1e-9, 30, threading.Event())
    assert outcome != pricing_dp.NONE
    for S in found:
        assert sets.fits(S, T)
