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
