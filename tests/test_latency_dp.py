"""The latency path bound and the latency DP over topological orders, against brute force.

The brute force (tests/bruteforce.py) enumerates every node -> device map of a tiny
workload and scores it with its own latency model; it never imports onnxsplit.solve.
"""

from __future__ import annotations

import itertools
import random
import time

import numpy as np
import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit import api
from onnxsplit.errors import OnnxsplitError
from onnxsplit.solve import evaluate
from onnxsplit.solve.latency import bounds as latency_bounds
from onnxsplit.solve.latency.bound_series import series_lower_bound
from onnxsplit.solve.latency import dp as latency_dp
from onnxsplit.solve.latency import ip as latency_ip
from onnxsplit.solve import orders
from onnxsplit.workload import Workload
from workloads import edge, node, workload


def _brute_latencies(data):
    """(latency, the most calls any accelerator makes) of every valid assignment (the
    CPUs are one pool: the latency model's CPUs run in parallel)."""
    g = bf.view(data)
    devices = [f"acc{i}" for i in range(g.k)] + (["cpu0"] if g.l else [])
    for combo in itertools.product(devices, repeat=len(g.ids)):
        a = dict(zip(g.ids, combo))
        if not bf.respects_constraints(data, a):
            continue
        block = bf.pieces(data, a)
        try:
            value = bf._latency(data, a, block)
        except bf.PieceCycle:
            block = bf.switch_pieces(data, a)
            value = bf._latency(data, a, block)
        calls = {}
        for v in g.ids:
            if block[v][0] != "cpu":
                calls.setdefault(block[v][0], set()).add(block[v])
        yield value, max((len(c) for c in calls.values()), default=0)


def _brute_min(data, max_calls):
    values = [v for v, calls in _brute_latencies(data) if calls <= max_calls]
    return min(values) if values else None


@pytest.mark.parametrize("seed", range(120))
def test_path_bound_is_below_every_plan(seed):
    data = bf.random_workload(seed, n_range=(2, 6), k_range=(1, 2), l_range=(0, 1), class_p=0.2)
    w = Workload.from_paper_json(data)
    for pieces in (1, 2):
        best = _brute_min(data, pieces)
        bound = latency_bounds.latency_lower_bound(w, pieces)
        if best is None:
            continue
        assert bound <= best * (1 + 1e-9) + 1e-9, f"pieces={pieces}: bound {bound} above optimum {best}"


@pytest.mark.parametrize("seed", range(60))
def test_the_cut_of_any_path_with_its_hulls_is_below_every_plan(seed):
    data = bf.random_workload(seed, n_range=(2, 7), k_range=(1, 2), l_range=(0, 1), class_p=0.2)
    w = Workload.from_paper_json(data)
    best = _brute_min(data, 1)
    if best is None:
        return
    rng = random.Random(seed)
    for _ in range(4):  # paths the heaviest-path rule would not pick
        path = latency_bounds.heaviest_path(w, np.array([rng.random() for _ in range(w.n)]))
        value = latency_dp.cut_sequence(w, path, w.num_accelerators, hull=True)[0]
        assert value <= best * (1 + 1e-9) + 1e-9, f"path {path}: {value} above the optimum {best}"
    assert latency_bounds.latency_lower_bound(w, 1, call_cuts=False) <= best * (1 + 1e-9) + 1e-9


def test_a_call_holding_a_fork_and_its_join_holds_the_branch_beside_the_path():
    # x -> a -> y and x -> b -> y; on the accelerator x, a, y take 1 each, b takes 5; on
    # the CPU everything takes 100: the best plan is all in one call, 8
    data = workload([node(0, cpu=100, acc=1), node(1, cpu=100, acc=1), node(2, cpu=100, acc=5),
                     node(3, cpu=100, acc=1)], [edge(0, 1, 0.0), edge(0, 2, 0.0), edge(1, 3, 0.0), edge(2, 3, 0.0)],
                    k=1, l=1)
    w = Workload.from_paper_json(data)
    assert _brute_min(data, 1) == pytest.approx(8.0)
    assert latency_dp.cut_sequence(w, [0, 1, 3], 1)[0] == pytest.approx(3.0)  # the path alone
    assert latency_dp.cut_sequence(w, [0, 1, 3], 1, hull=True)[0] == pytest.approx(8.0)
    assert latency_bounds.latency_lower_bound(w, 1, call_cuts=False) == pytest.approx(8.0)


def _chain(seed, n=6, k=2, chords=True):
    """A chain 0 -> 1 -> ... (plus random chords i -> j) with positive latencies and sizes
    that make memory bind: the path bound sees the whole graph, so it is exact."""
    rng = random.Random(seed)
    nodes = [node(i, cpu=round(rng.uniform(2, 20), 3), acc=round(rng.uniform(0.5, 3), 3),
                  size=round(rng.uniform(1, 4), 3)) for i in range(n)]
    cost = {i: round(rng.uniform(0.1, 3), 3) for i in range(n)}
    pairs = [(i, i + 1) for i in range(n - 1)]
    if chords:
        pairs += [(i, j) for i in range(n) for j in range(i + 2, n) if rng.random() < 0.25]
    return workload(nodes, [edge(s, t, cost[s]) for s, t in pairs], k=k, l=1, mem=round(rng.uniform(3, 8), 3))


@pytest.mark.parametrize("seed", range(40))
def test_bound_and_latency_dp_are_exact_on_a_chain(seed):
    data = _chain(seed)
    w = Workload.from_paper_json(data)
    best = _brute_min(data, 1)
    assert latency_bounds.latency_lower_bound(w, 1) == pytest.approx(best, rel=1e-9)
    plan = latency_dp.sequence_split(w)
    assert plan.status == "feasible"
    assert plan.value == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("seed", range(80))
def test_latency_dp_plan_is_valid_and_its_estimate_holds(seed):
    data = bf.random_workload(seed, n_range=(2, 7), k_range=(1, 3), l_range=(1, 2), class_p=0.3)
    w = Workload.from_paper_json(data)
    plan = api.solve(w, "latency", "latency_dp")
    assert plan.status == "feasible", plan.details["violations"]
    assert evaluate.check(w, plan.assignment) == []
    # one call per accelerator, and running them one after another is one schedule
    dev = evaluate.device_array(w, plan.assignment)
    assert evaluate.accelerator_pieces(w, dev).max(initial=0) <= 1
    assert plan.value <= plan.details["sequential_latency"] * (1 + 1e-9) + 1e-9
    assert plan.value == pytest.approx(bf.latency(data, plan.assignment), rel=1e-9)


def test_latency_ip_is_proven_on_a_chain_by_either_bound():
    w = Workload.from_paper_json(_chain(3, n=8, k=3))
    plan = api.solve(w, "latency", "ip", time_limit=30)
    assert plan.gap is not None and plan.gap <= 0.01
    # the path bound's hull cuts go first (a moment on any graph) and prove it alone; so
    # does the bound composed along the chain's cut vertices
    assert plan.details["path_bound"] >= plan.value * (1 - 0.01) and "series_bound" not in plan.details
    assert series_lower_bound(w, time.perf_counter() + 30) >= plan.value * (1 - 0.01)
    assert plan.lower_bound <= plan.value
    assert plan.seconds >= plan.details["warm_start_seconds"] >= 0  # the warm start's time counts
    # without it, the path bound proves the same plan
    alone = latency_ip.solve_latency(w, time_limit=30, warm_start=plan.assignment, series_bound=False)
    assert alone.gap is not None and alone.gap <= 0.01 and "series_bound" not in alone.details
    assert alone.details["path_bound"] == pytest.approx(latency_bounds.latency_lower_bound(w, 1))
    assert alone.value == pytest.approx(plan.value)


def test_cut_sequence_needs_a_topological_order():
    w = Workload.from_paper_json(_chain(0, n=3, chords=False))
    with pytest.raises(ValueError, match="topological"):
        latency_dp.cut_sequence(w, [2, 1, 0], 1)


def test_cut_sequence_by_hand():
    # 0 -> 1 -> 2; accelerator times 1 each, CPU 10 each, tensors cost 0.5; memory holds two
    data = workload([node(i, cpu=10, acc=1, size=1) for i in range(3)],
                    [edge(0, 1, 0.5), edge(1, 2, 0.5)], k=2, l=1, mem=2)
    w = Workload.from_paper_json(data)
    value, segs = latency_dp.cut_sequence(w, [0, 1, 2], 2)
    # two calls: {0,1} then {2}: (2 + 0.5 out) + (0.5 in + 1) = 4
    assert value == pytest.approx(4.0)
    assert [s[2] for s in segs] == [True, True]
    value, _ = latency_dp.cut_sequence(w, [0, 1, 2], 1)  # one call {0,1}, node 2 on the CPU
    assert value == pytest.approx(2.5 + 10)


def test_latency_dp_refuses_training_graphs():
    data = bf.random_workload(1, training=True, n_range=(2, 4))
    with pytest.raises(OnnxsplitError, match="inference"):
        api.solve(Workload.from_paper_json(data), "latency", "latency_dp")


def test_latency_ip_plan_never_worse_than_latency_dp():
    data = bf.random_workload(7, n_range=(5, 7), k_range=(2, 2), l_range=(1, 1))
    w = Workload.from_paper_json(data)
    quick = api.solve(w, "latency", "latency_dp")
    plan = latency_ip.solve_latency(w, time_limit=20, warm_start=quick.assignment)
    assert plan.value <= quick.value * (1 + 1e-9)


def test_sources_move_to_just_before_their_first_consumer():
    # blocks 0, 1 are sources (weights); 2 -> 3; 0 feeds 3, 1 feeds 2
    succ = [[3], [2], [3], []]
    indegree = np.array([0, 0, 1, 2])
    assert orders.sources_late([0, 1, 2, 3], succ, indegree) == [1, 2, 0, 3]
    assert orders.sources_late([1, 0, 2, 3], succ, indegree) == [1, 2, 0, 3]
