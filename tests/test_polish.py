"""The latency local search: its compiled schedule against the brute force's, and its plans."""

from __future__ import annotations

import random

import numpy as np
import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit.solve import evaluate
from onnxsplit.solve.latency import polish
from onnxsplit.workload import Workload

from workloads import edge, node, workload


def _random_plan(data, w: Workload, rng: random.Random) -> dict:
    names = [d.name for d in w.devices]
    k = w.num_accelerators
    return {int(i): (rng.choice(names[:k]) if w.supported[j] and rng.random() < 0.7 else names[k])
            for j, i in enumerate(w.ids)}


@pytest.mark.parametrize("seed", range(40))
def test_compiled_schedule_matches_the_brute_force(seed):
    data = bf.random_workload(seed, n_range=(3, 8), k_range=(1, 3), l_range=(1, 1), class_p=0.0)
    w = Workload.from_paper_json(data)
    graph = polish._Graph(w)
    rng = random.Random(seed)
    k = w.num_accelerators
    for _ in range(10):
        a = _random_plan(data, w, rng)
        dev = np.minimum(evaluate.device_array(w, a), k)
        convex = bf.accelerators_convex(data, a)
        assert graph.convex(dev, k) == convex
        if not convex:
            continue
        try:
            expected = bf._latency(data, a, bf.pieces(data, a))
        except bf.PieceCycle:  # convex calls that wait on each other: no schedule
            expected = np.inf
        assert graph.latency(dev, k) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("seed", range(40))
def test_polish_never_worsens_and_stays_valid(seed):
    cpus = seed % 4 != 0  # every fourth: no CPU, everything starts on the first accelerator
    data = bf.random_workload(seed, n_range=(3, 6), k_range=(1, 2), l_range=(1, 1) if cpus else (0, 0),
                              unsupported_p=0.15 if cpus else 0.0)
    if not cpus:
        data["maxSizePerFPGA"] = 1e9  # room for the start
    w = Workload.from_paper_json(data)
    start = {int(i): w.devices[w.num_accelerators if cpus else 0].name for i in w.ids}
    assert evaluate.check(w, start) == []
    before = evaluate.latency(w, start).value
    plan, value = polish.polish_latency(w, start, 5.0)
    assert value <= before * (1 + 1e-12)
    assert evaluate.check(w, plan) == []
    assert bf.accelerators_convex(data, plan)
    assert value == pytest.approx(bf.latency(data, plan), rel=1e-9)
    best = bf.brute_latency_one_call(data)
    assert value >= best * (1 - 1e-9)


def test_polish_moves_a_tied_embedding_off_the_first_call():
    """Op-level BERT in small: the embedding table W, its Gather and the Transpose the
    output layer reads form one colour class.  In the first call it costs that call the
    big transposed table as an outgoing tensor; on the CPUs it runs beside the calls and
    the first call waits only for the small Gather output.  The polished plan is the
    brute-force optimum."""
    big, small = 40.0, 2.0
    nodes = [node(0, cpu=0, acc=0, size=1, cc=7), node(1, cpu=3, acc=0.1, size=1, cc=7),  # W, Gather
             node(2, cpu=60, acc=2, size=1, cc=7),  # Transpose of W
             node(3, cpu=200, acc=50, size=5), node(4, cpu=200, acc=50, size=5), node(5, cpu=100, acc=10, size=1)]
    edges = [edge(0, 1, big), edge(0, 2, big), edge(1, 3, small), edge(3, 4, small), edge(4, 5, small),
             edge(2, 5, big)]
    data = workload(nodes, edges, k=2, l=1, mem=8)
    w = Workload.from_paper_json(data)
    start = {0: "acc0", 1: "acc0", 2: "acc0", 3: "acc0", 4: "acc1", 5: "acc1"}
    assert evaluate.check(w, start) == []
    plan, value = polish.polish_latency(w, start, 5.0)
    assert plan[0] == plan[1] == plan[2] == w.devices[2].name  # the class went to the CPUs
    assert value == pytest.approx(bf.brute_latency_one_call(data), rel=1e-9)
    assert value < evaluate.latency(w, start).value - 30
