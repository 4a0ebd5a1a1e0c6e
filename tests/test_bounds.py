"""The solver-free max-load bounds, checked against brute force and a packing by hand."""

from __future__ import annotations

import pytest

import bruteforce as bf
from onnxsplit.solve.throughput import bounds
from onnxsplit.solve import classes
from onnxsplit.solve.throughput import ip
from onnxsplit.workload import Workload
from workloads import edge, node, workload


def W(data) -> Workload:
    return Workload.from_paper_json(data)


def seven_equal(k=3, l=1):
    """Seven unit classes in a chain, one accelerator unit each, ten on a CPU: three
    accelerators hold them 3 + 2 + 2 at best (the average, 7/3, is no plan's load)."""
    nodes = [node(i, cpu=10.0, acc=1.0) for i in range(7)]
    edges = [edge(i, i + 1, cost=0.0) for i in range(6)]
    return workload(nodes, edges, k=k, l=l)


@pytest.mark.parametrize("seed", range(200))
def test_bound_never_exceeds_brute_force_optimum(seed):
    data = bf.random_workload(seed, training=seed % 3 == 2, n_range=(2, 7), k_range=(1, 3),
                              l_range=(0, 2))
    best, _ = bf.brute_min_max_load(bf.view(data), chain=False)
    w = W(data)
    lb = bounds.max_load_lower_bound(w)
    work = bounds.work_bound(*classes.build_classes(w).device_costs(), w.num_accelerators, w.num_cpus)
    assert lb >= work - 1e-12
    if best is not None:
        assert lb <= best * (1 + 1e-9) + 1e-12, (lb, best)


def test_packing_lifts_the_bound_where_the_average_is_no_plan():
    for l in (0, 1):
        w = W(seven_equal(l=l))
        assert bounds.max_load_lower_bound(w) == pytest.approx(3.0, rel=1e-8)  # (a hair under: the safe side)
        best, _ = bf.brute_min_max_load(bf.view(seven_equal(l=l)), chain=False)
        assert best == pytest.approx(3.0)
    # a CPU fast enough to take two units lowers it: 3 + 2 + 1 on accelerators would need
    # the CPU to run one unit in <= 2, and it runs one in 1.5
    data = seven_equal(l=1)
    for n in data["nodes"]:
        n["cpuLatency"] = 1.5
    assert bounds.max_load_lower_bound(W(data)) <= 2.0 + 1e-9


def test_random_bounds_often_beat_the_average():
    lifted = 0
    for seed in range(200):
        data = bf.random_workload(seed, n_range=(5, 7), k_range=(2, 3), l_range=(0, 1))
        w = W(data)
        work = bounds.work_bound(*classes.build_classes(w).device_costs(), w.num_accelerators, w.num_cpus)
        lifted += bounds.max_load_lower_bound(w) > work * (1 + 1e-6)
    assert lifted >= 10  # the packing argument does fire, not just restate the average


def test_ip_proves_the_packing_optimum():
    plan = ip.solve_throughput(W(seven_equal()), time_limit=30)
    assert plan.value == pytest.approx(3.0) and plan.lower_bound == pytest.approx(3.0)
    assert plan.gap == pytest.approx(0.0, abs=1e-8)


def test_split_bound_does_not_count_a_core_as_an_accelerator():
    """Eight units of 1 on an accelerator, 40 on a core; two of each: the average says 2,
    but the cores take only 1/20 of an accelerator's work each: 8 / (2 + 2/40)."""
    data = workload([node(i, cpu=40.0, acc=1.0) for i in range(8)], [], k=2, l=2)
    w = W(data)
    acc, cpu = classes.build_classes(w).device_costs()
    assert bounds.work_bound(acc, cpu, 2, 2) == pytest.approx(2.0)
    assert bounds.split_bound(acc, cpu, w.size, 2, 2, w.accelerator_memory) == pytest.approx(8 / 2.05)
    best, _ = bf.brute_min_max_load(bf.view(data), chain=False)
    assert bounds.max_load_lower_bound(w) <= best  # 4: two units on each accelerator
    # memory for four units in all: the other four on the cores
    sized = workload([node(i, cpu=40.0, acc=1.0, size=1.0) for i in range(8)], [], k=2, l=2, mem=2.0)
    w = W(sized)
    assert bounds.split_bound(acc, cpu, w.size, 2, 2, 2.0) == pytest.approx(80.0)
    assert bounds.max_load_lower_bound(w) <= bf.brute_min_max_load(bf.view(sized), chain=False)[0]


@pytest.mark.parametrize("seed", range(120))
def test_lp_round_is_a_valid_plan_and_its_bound_holds(seed):
    from onnxsplit.solve import evaluate
    from onnxsplit.solve.throughput.lp_round import lp_round

    data = bf.random_workload(seed, training=seed % 3 == 2, n_range=(2, 7), k_range=(1, 3), l_range=(0, 2))
    best, _ = bf.brute_min_max_load(bf.view(data), chain=False)
    w = W(data)
    plan = lp_round(w)
    if plan.value is None:
        return
    assert plan.status == "feasible" and evaluate.check(w, plan.assignment) == []
    assert plan.value == pytest.approx(bf.max_load(bf.view(data), plan.assignment))
    assert best is not None and plan.value >= best * (1 - 1e-9) - 1e-12
    if plan.lower_bound is not None:
        assert plan.lower_bound <= best * (1 + 1e-9) + 1e-12
