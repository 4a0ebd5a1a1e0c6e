"""The spreading-metric lower bound (solve/bound_spread.py), against brute force and by hand.

The brute force (tests/bruteforce.py) enumerates every class -> device map and scores it
with its own max-load model; it never imports onnxsplit.solve.
"""

from __future__ import annotations

import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit.solve.throughput import bound_spread
from onnxsplit.solve.throughput import bounds
from onnxsplit.solve import classes
from onnxsplit.workload import Workload
from workloads import edge, node, workload


def _bound(w: Workload, upper: float) -> float | None:
    cl = classes.build_classes(w)
    floor = bounds.packing_bound(*cl.device_costs(), w.num_accelerators, w.num_cpus)
    return bound_spread.spreading_bound(cl, w.num_accelerators, w.num_cpus, floor, upper, seconds=30)


@pytest.mark.parametrize("scale", [1, 4])
@pytest.mark.parametrize("seed", range(80))
def test_never_above_the_optimum(seed, scale):
    """Inference and training, with and without CPUs, unsupported classes and colour
    classes: the bound never exceeds the brute-force optimum, with the optimum itself as
    the best plan known (where the rows for classes that must run on an accelerator
    apply most).  Tensors 4 times dearer make transfers much of the load: there the bound
    rises above the work bound on about a third of the seeds."""
    data = bf.random_workload(seed, training=seed % 2 == 1, n_range=(3, 5), k_range=(1, 3), l_range=(0, 2))
    for e in data["edges"]:
        e["cost"] *= scale
    best, _ = bf.brute_min_max_load(data, chain=False)
    if best is None:
        return
    w = Workload.from_paper_json(data)
    for upper in (best, best * 1.5):
        value = _bound(w, upper)
        assert value is None or value <= best * (1 + 1e-6) + 1e-9, (value, best, upper)


def _chain(cost: float, k: int = 2, l: int = 0) -> Workload:
    """Four nodes in a row, 1 each on an accelerator, ``cost`` per tensor."""
    return Workload.from_paper_json(workload([node(i, acc=1.0, cpu=100.0) for i in range(4)],
                                             [edge(i, i + 1, cost) for i in range(3)], k=k, l=l))


def test_a_chain_that_must_pay_a_transfer_is_proven():
    """All on one accelerator: 4.  Split in two: the cut tensor is paid by both sides, so
    the heavier side has at least 2 + 1 = 3 (3 + 1 = 4 for a 1/3 split).  The optimum is 3;
    the work alone says 2, and so does the IP's LP relaxation."""
    w = _chain(1.0)
    value = _bound(w, upper=3.0)
    assert value == pytest.approx(3.0, rel=1e-5)
    assert bounds.packing_bound(*classes.build_classes(w).device_costs(), 2, 0) == pytest.approx(2.0)


def test_a_free_cut_adds_nothing():
    """With tensors that cost nothing the bound is the work bound: 2."""
    w = _chain(0.0)
    assert _bound(w, upper=2.0) is None  # no tensor with a cost: nothing to add
    w = _chain(1e-9)
    assert _bound(w, upper=2.0) == pytest.approx(2.0, rel=1e-5)


def test_no_accelerator_or_no_known_plan_gives_nothing():
    assert _bound(_chain(1.0, k=0, l=2), upper=10.0) is None
    assert _bound(_chain(1.0), upper=float("inf")) is None
