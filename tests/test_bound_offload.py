"""The bound on what the CPUs can take with its transfers (solve/throughput/bound_offload.py),
against brute force and by hand.

The brute force (tests/bruteforce.py) enumerates every class -> device map and scores it
with its own max-load model; it never imports onnxsplit.solve.
"""

from __future__ import annotations

import itertools

import numpy as np
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


def _least_boundary_by_enumeration(data: dict, least: float, most: float) -> float:
    """The least boundary of a set of whole colour classes that an accelerator could hold
    (every node supported, memory) with accelerator work in [least, most], by trying every
    set: a tensor (its source's output) is paid when the set holds some but not all of its
    source and consumers."""
    nodes = {nd["id"]: nd for nd in data["nodes"]}
    label = {v: nd.get("colorClass", ("alone", v)) for v, nd in nodes.items()}
    labels = sorted(set(label.values()), key=str)
    readers: dict = {}
    for e in data["edges"]:
        readers.setdefault(e["sourceId"], (e["cost"], set()))[1].add(e["destId"])
    best = float("inf")
    for chosen in itertools.product((False, True), repeat=len(labels)):
        held = {c for c, x in zip(labels, chosen) if x}
        inside = [v for v in nodes if label[v] in held]
        work = sum(nodes[v]["fpgaLatency"] for v in inside)
        if not inside or not least <= work <= most or not all(nodes[v]["supportedOnFpga"] for v in inside):
            continue
        if sum(nodes[v].get("size", 0.0) for v in inside) > data["maxSizePerFPGA"]:
            continue
        paid = 0.0
        for u, (cost, dests) in readers.items():
            touched = {label[u]} | {label[d] for d in dests}
            if len(touched) > 1 and touched & held and touched - held:
                paid += cost
        best = min(best, paid)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_the_pinned_cases_make_the_least_boundary(seed):
    """c*, the least of three pinned MIPs (neither pin, the first, the second and not the
    first), is the least boundary of any set of work in the window, by enumeration; c',
    the first of them, is never below it (36 of the 40 windows hold a set, 26 at a
    boundary above 0)."""
    data = bf.random_workload(seed, training=seed % 2 == 1, n_range=(4, 8), k_range=(2, 3), l_range=(1, 1))
    w = Workload.from_paper_json(data)
    cl = classes.build_classes(w)
    work = np.where(cl.supported, cl.acc_fwd + cl.acc_bwd, 0.0)
    W = float(work.sum())
    least, most = 0.25 * W, 0.75 * W
    expected = _least_boundary_by_enumeration(data, least, most)
    got = bound_offload._least_boundaries(cl.hyper_arrays(), work, np.asarray(cl.supported, dtype=bool),
                                         np.asarray(cl.size, dtype=np.float64), w.accelerator_memory,
                                         least, most, w.num_accelerators, lambda case: 30.0, None)
    assert got is not None
    assert got[0] == pytest.approx(expected, abs=1e-6)
    assert got[1] >= got[0]
