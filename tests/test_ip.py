"""The throughput IP against brute force on tiny workloads, and its plan's bookkeeping."""

from __future__ import annotations

import math

import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit.solve import evaluate
from onnxsplit.solve.throughput import dp
from onnxsplit.solve.throughput import ip
from onnxsplit.solve.latency import bounds as latency_bounds
from onnxsplit.solve.latency import ip as latency_ip
from onnxsplit.workload import Workload

SEEDS = range(40)


def _brute(data, predicate=None):
    best = None
    for a in bf.class_assignments(data):
        if predicate is not None and not predicate(data, a):
            continue
        val = bf.max_load(data, a)
        best = val if best is None else min(best, val)
    return best


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("training", [False, True])
def test_noncontiguous_ip_matches_bruteforce(seed, training):
    data = bf.random_workload(seed, training=training, n_range=(2, 5) if training else (2, 6))
    w = Workload.from_paper_json(data)
    plan = ip.solve_throughput(w, time_limit=30, gap=0.0)
    best = _brute(data)
    if best is None:
        assert plan.status == "infeasible" and plan.value is None
        return
    assert plan.status == "optimal", plan
    assert math.isclose(plan.value, best, rel_tol=1e-6, abs_tol=1e-9)
    assert math.isclose(evaluate.max_load(w, plan.assignment).value, plan.value, rel_tol=1e-12)
    assert evaluate.check(w, plan.assignment) == []
    assert plan.lower_bound <= plan.value + 1e-9 and plan.gap <= 1e-6


@pytest.mark.parametrize("seed", SEEDS)
def test_contiguous_ip_matches_bruteforce(seed):
    data = bf.random_workload(seed, training=seed % 2 == 1, n_range=(2, 5))
    w = Workload.from_paper_json(data)
    plan = ip.solve_throughput(w, contiguous=True, time_limit=30, gap=0.0)
    best = _brute(data, bf.is_convex)
    if best is None:
        assert plan.status == "infeasible"
        return
    assert math.isclose(plan.value, best, rel_tol=1e-6, abs_tol=1e-9)
    assert evaluate.check(w, plan.assignment, contiguity="convex") == []
    # a chain of ideals is one kind of convex split: the DP can only be worse or equal
    chain = dp.solve(w)
    if chain.value is not None:
        assert plan.value <= chain.value * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(1000, 1015))
def test_split_passes_objective(seed):
    """max forward load + max backward load: the IP's value is that objective, and optimal."""
    data = bf.random_workload(seed, training=True, n_range=(2, 4))
    w = Workload.from_paper_json(data)
    plan = ip.solve_throughput(w, split_passes=True, time_limit=30, gap=0.0)
    g = bf.view(data)
    fwd = {v for v in g.ids if not g.bwd[v]}

    def split_value(a):
        def part(nodes):
            # the pass's nodes and the tensors they produce
            loads = {}
            for d in g.devices:
                mine = {v for v in nodes if a[v] == d}
                lat = sum((g.acc if bf.is_acc(d) else g.cpu)[v] for v in mine)
                comm = 0.0
                if bf.is_acc(d):
                    for u in nodes:
                        outs = g.succs[u]
                        if not outs:
                            continue
                        here = a[u] == d
                        if (here and any(a[x] != d for x in outs)) or (not here and any(a[x] == d for x in outs)):
                            comm += g.cost[u]
                loads[d] = lat + comm
            return max(loads.values())
        return part(fwd) + part(set(g.ids) - fwd)

    vals = [split_value(a) for a in bf.class_assignments(data)]
    if not vals:
        assert plan.status == "infeasible"
        return
    assert math.isclose(plan.value, min(vals), rel_tol=1e-6, abs_tol=1e-9)


def test_warm_start_and_time_limit_return_a_plan():
    data = bf.random_workload(7, n_range=(6, 7))
    w = Workload.from_paper_json(data)
    seed = dp.solve(w)
    plan = ip.solve_throughput(w, warm_start=seed.assignment, time_limit=5)
    assert plan.value is not None and plan.value <= seed.value * (1 + 1e-9)


@pytest.mark.parametrize("seed", [3, 5, 8])
def test_cbc_backend_agrees(seed):
    data = bf.random_workload(seed, n_range=(4, 5))
    w = Workload.from_paper_json(data)
    a = ip.solve_throughput(w, solver="highs", gap=0.0, time_limit=30)
    b = ip.solve_throughput(w, solver="cbc", gap=0.0, time_limit=30)
    assert a.status == b.status
    if a.value is not None:
        assert a.value == pytest.approx(b.value, rel=1e-6)


# ---- latency ------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(30))
def test_latency_ip_matches_bruteforce(seed):
    data = bf.random_workload(seed, n_range=(2, 6), k_range=(1, 2), l_range=(0, 1))
    w = Workload.from_paper_json(data)
    plan = latency_ip.solve_latency(w, pieces=1, time_limit=30, gap=0.0)
    best = bf.brute_latency_one_call(data)
    if best is None:
        assert plan.value is None
        return
    assert plan.value == pytest.approx(best, rel=1e-6, abs=1e-9)
    assert evaluate.latency(w, plan.assignment, plan.pieces).value == pytest.approx(plan.value, rel=1e-12)
    assert evaluate.check(w, plan.assignment) == []
    assert plan.lower_bound <= plan.value * (1 + 1e-9)
    more = latency_ip.solve_latency(w, pieces=2, time_limit=30, gap=0.0)
    assert more.value <= plan.value * (1 + 1e-6) + 1e-9  # more calls per accelerator can only help


@pytest.mark.parametrize("seed", range(20))
def test_latency_warm_start_is_renamed_into_the_symmetry_order(seed):
    """A start whose accelerators are named against the IP's symmetry breaking (first
    pieces beginning in topological order) is one HiGHS rejects; renamed, it keeps its
    latency (the brute force's) and satisfies the rule."""
    import random

    data = bf.random_workload(seed, n_range=(5, 7), k_range=(3, 3), l_range=(1, 1), unsupported_p=0.0,
                              class_p=0.0)
    w = Workload.from_paper_json(data)
    rng = random.Random(seed)
    order = list(w.topological_order)
    names = [d.name for d in w.devices[:3]]
    # calls along the topological order, on accelerators named last-first
    a = {}
    for j, v in enumerate(order):
        a[int(w.ids[v])] = names[2 - min(2, j * 3 // len(order))] if rng.random() < 0.8 else w.devices[3].name
    dev = evaluate.device_array(w, a)
    pieces = evaluate.accelerator_pieces(w, dev)
    pc = {int(w.ids[j]): int(pieces[j]) for j in range(w.n) if dev[j] < 3}
    renamed = latency_bounds.in_symmetry_order(w, a, pc)
    assert bf._latency(data, renamed, bf.pieces(data, renamed)) == pytest.approx(
        bf._latency(data, a, bf.pieces(data, a)), rel=1e-12)
    pos = {int(w.ids[v]): i for i, v in enumerate(order)}
    first = {}
    for nid, d in renamed.items():
        if d in names and pc[nid] == 1:
            first[d] = min(first.get(d, len(order)), pos[nid])
    used = [d for d in names if d in first]
    assert used == names[:len(used)]  # accelerators used from the first on
    assert all(first[x] < first[y] for x, y in zip(used, used[1:]))


@pytest.mark.parametrize("seed", range(25))
def test_transfer_free_phase_bounds_the_optimum(seed):
    """The first phase's bound is the transfer-free optimum (brute force with every tensor
    free), which is at or below the true optimum."""
    data = bf.random_workload(seed, n_range=(3, 6))
    w = Workload.from_paper_json(data)
    plan = ip.solve_throughput(w, time_limit=30, gap=0.0)
    best = _brute(data)
    free = dict(data, edges=[dict(e, cost=0.0) for e in data["edges"]])
    best_free = _brute(free)
    bound = plan.details["transfer_free_bound"]
    if best is None or bound is None:
        return
    assert bound <= best_free * (1 + 1e-6) + 1e-9
    assert bound >= best_free * (1 - 2e-4) - 1e-9  # solved to its 1e-4 gap
    assert plan.lower_bound <= best * (1 + 1e-6) + 1e-9
    assert plan.value == pytest.approx(best, rel=1e-6)


def test_transfer_free_phase_is_skipped_only_where_it_cannot_prove_one_percent():
    from workloads import edge, node, workload

    def chain(cost):
        nodes = [node(i, cpu=100, acc=1.0) for i in range(4)]
        return Workload.from_paper_json(workload(nodes, [edge(i, i + 1, cost) for i in range(3)], k=2, l=1))

    split = {0: "acc0", 1: "acc0", 2: "acc1", 3: "acc1"}
    heavy, light = chain(1.0), chain(0.001)
    # loads: compute 2 on each accelerator, plus the one crossing tensor
    assert not ip._transfer_free_can_prove(heavy, split, 3.0, 0.001, False)  # 2 < 3 * 0.99
    assert ip._transfer_free_can_prove(light, split, 2.001, 0.001, False)  # 2 >= 2.001 * 0.99
    assert ip._transfer_free_can_prove(heavy, None, 3.0, 0.001, False)  # no start: no claim
    plan = ip.solve_throughput(heavy, time_limit=20, warm_start=split)
    assert plan.details["transfer_free_bound"] is None  # skipped
    assert plan.lower_bound <= plan.value and evaluate.check(heavy, plan.assignment) == []


@pytest.mark.parametrize("seed", range(6))
def test_pairs_start_from_the_best_balanced_ring_split_within_the_span(seed, monkeypatch):
    """Of the best start and the ring splits within PAIRS_START_SPAN of its max load, pairs
    start from the one whose accelerators' mean load is least; a split beyond the span is
    never taken, however low its mean; without transfers that weigh, the best start."""
    import numpy as np

    from onnxsplit.solve.throughput import dp_ring

    data = bf.random_workload(300 + seed, training=False, n_range=(5, 7), k_range=(2, 3), l_range=(1, 1))
    w = Workload.from_paper_json(data)
    rng = np.random.default_rng(seed)
    names = [d.name for d in w.devices]
    plans = []
    for _ in range(400):  # random valid plans, scored by the brute force
        a = {int(i): names[rng.integers(len(names))] for i in w.ids}
        if not evaluate.check(w, a):
            loads = bf.device_loads(data, a)
            plans.append((max(loads.values()), float(np.mean([loads[n] for n in names[:w.num_accelerators]])), a))
    plans.sort(key=lambda p: p[0])
    start_value, _, start = plans[len(plans) // 2]
    search = ip._Search(w, 10.0, 0.001, start, dict(contiguous=False, split_passes=False, solver="highs",
                                                    threads=None, verbose=False))
    assert search.best_value == pytest.approx(start_value, rel=1e-9)
    others = [p for p in plans if p[2] is not start]
    monkeypatch.setattr(dp_ring, "ring_splits", lambda _: [(v, "order", 0, 0, a) for v, _, a in others])
    within = [(m, id(a)) for v, m, a in plans if v <= start_value * (1 + ip.PAIRS_START_SPAN)]
    expected = min(within, key=lambda x: x[0])
    search.transfer_heavy = True
    chosen, value = search.balanced_start()
    chosen_mean = [m for v, m, a in plans if a is chosen][0]
    assert chosen_mean == pytest.approx(expected[0], rel=1e-12)
    assert value == pytest.approx(max(bf.device_loads(data, chosen).values()), rel=1e-9)
    assert value <= start_value * (1 + ip.PAIRS_START_SPAN) * (1 + 1e-12)
    search.transfer_heavy = False
    assert search.balanced_start() == (start, search.best_value)
