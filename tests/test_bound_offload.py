"""The bound on what the CPUs can take with its transfers (solve/throughput/bound_offload.py),
against brute force and by hand.

The brute force (tests/bruteforce.py) enumerates every class -> device map and scores it
with its own max-load model; it never imports onnxsplit.solve.
"""

from __future__ import annotations

import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit.solve import classes
from onnxsplit.solve.throughput import bound_offload
from onnxsplit.solve.throughput.bounds import max_load_lower_bound
from onnxsplit.workload import Workload
from workloads import edge, node, workload


def _bound(w: Workload, upper: float):
    cl = classes.build_classes(w)
    return bound_offload.offload_bound(cl, w.num_accelerators, w.num_cpus, w.accelerator_memory, upper, seconds=30)


@pytest.mark.parametrize("scale", [1, 4])
@pytest.mark.parametrize("seed", range(80))
def test_never_above_what_a_plan_reaches(seed, scale):
    """Inference and training, unsupported and colour classes, memory, tensors up to 4
    times dearer: never above the brute-force optimum, given it or more as the best plan."""
    data = bf.random_workload(seed, training=seed % 2 == 1, n_range=(3, 7), k_range=(1, 3), l_range=(1, 2))
    for e in data["edges"]:
        e["cost"] *= scale
    best = bf.brute_min_max_load(data, chain=False)[0]
    if best is None:
        return
    w = Workload.from_paper_json(data)
    for upper in (best, best * 1.3):
        got = _bound(w, upper)
        assert got is None or got <= best * (1 + 1e-9) + 1e-9, (seed, scale, upper, got, best)


def test_a_chain_whose_cpu_share_costs_its_tensor():
    """A -> B -> C, each 10 on the accelerator and 12 on the CPU, tensors of 3, one of each.
    The best plan puts C on the CPU and pays its tensor: 23.  The CPU gains at most one
    class (10), 7 net of its tensor; the accelerator holds at least 20 of work, and every
    set of it pays at least one tensor: 30 - min(7, 10 - 3) = 23, where the bounds that
    see no transfer say 20 (the CPU takes one class at most, the accelerator two)."""
    w = Workload.from_paper_json(workload([node(i, cpu=12, acc=10) for i in range(3)],
                                          [edge(0, 1, 3), edge(1, 2, 3)], k=1, l=1))
    assert bf.brute_min_max_load(workload([node(i, cpu=12, acc=10) for i in range(3)],
                                          [edge(0, 1, 3), edge(1, 2, 3)], k=1, l=1), chain=False)[0] == 23
    assert max_load_lower_bound(w) == pytest.approx(20.0)
    assert _bound(w, 23.0) == pytest.approx(23.0)


def test_the_parts_inside_a_chain_pay_two_boundaries():
    """Six classes in a chain, 10 each on an accelerator (the CPU is too slow to take one),
    tensors of 1, three accelerators: the best plan holds two classes each and pays 22 on
    the middle one.  Each part holds at least 16 of work (60 less the others' 22 each); a
    prefix or a suffix pays one tensor, but only two parts can hold a pinned class near an
    end (B, E), and a set avoiding both pays two: (60 + 1 + 1 + 2) / 3, where counting one
    tensor a part said (60 + 3) / 3."""
    data = workload([node(i, cpu=1000, acc=10) for i in range(6)], [edge(i, i + 1, 1) for i in range(5)],
                    k=3, l=1)
    assert bf.brute_min_max_load(data, chain=False)[0] == 22
    assert _bound(Workload.from_paper_json(data), 22.0) == pytest.approx(64 / 3)


def test_says_nothing_without_cpus_or_accelerators():
    data = workload([node(i, cpu=12, acc=10) for i in range(3)], [edge(0, 1, 3), edge(1, 2, 3)], k=1, l=0)
    assert _bound(Workload.from_paper_json(data), 30.0) is None
    data = workload([node(i, cpu=12, acc=10) for i in range(3)], [edge(0, 1, 3), edge(1, 2, 3)], k=0, l=1)
    assert _bound(Workload.from_paper_json(data), 36.0) is None
