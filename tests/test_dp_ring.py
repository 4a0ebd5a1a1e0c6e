"""Ring splits: the DP against an enumeration of every ring split, and the tied-weights case."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit import api
from onnxsplit.solve import evaluate
from onnxsplit.solve.throughput import dp_ring
from onnxsplit.solve.classes import build_classes
from onnxsplit.solve.orders import spectral_rank
from onnxsplit.workload import Workload
from workloads import edge, node, workload


def _every_ring_split(w: Workload):
    """Max load of the best ring split, by enumeration: accelerator 0 holds a prefix and a
    suffix of one of the classes' orders (the topological, the spectral), the middle is cut
    into segments each on its own device (the other accelerators, the CPU cores), scored by
    the evaluator."""
    cl = build_classes(w)
    ranks = [dp_ring._late_source_rank(w, cl), spectral_rank(cl.n, *cl.hyper_arrays())]
    return min(_every_ring_split_of(w, cl, np.argsort(rank)) for rank in ranks if rank is not None)


def _every_ring_split_of(w: Workload, cl, order: np.ndarray) -> float:
    """:func:`_every_ring_split` along one order (position -> class)."""
    n, k, l = cl.n, w.num_accelerators, w.num_cpus
    names = [d.name for d in w.devices]
    best = np.inf
    for i in range(n + 1):
        for j in range(i, n + 1):
            splits = [[]] if j == i else [[i, *inner, j] for cuts in range(j - i)
                                           for inner in itertools.combinations(range(i + 1, j), cuts)]
            for bounds in splits:
                segments = list(zip(bounds, bounds[1:]))
                for kinds in itertools.product((True, False), repeat=len(segments)):
                    if sum(kinds) > k - 1 or len(kinds) - sum(kinds) > l:
                        continue
                    device = np.zeros(n, dtype=np.int64)
                    a_next, c_next = 1, k
                    for (a, b), on_acc in zip(segments, kinds):
                        device[order[a:b]] = a_next if on_acc else c_next
                        a_next, c_next = a_next + on_acc, c_next + (not on_acc)
                    plan = {int(w.ids[v]): names[device[cl.of_node[v]]] for v in range(w.n)}
                    if not evaluate.check(w, plan):
                        best = min(best, evaluate.max_load(w, plan).value)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_ring_split_is_the_best_ring_split(seed):
    data = bf.random_workload(seed, training=seed % 4 == 0, n_range=(2, 5), k_range=(1, 3), l_range=(0, 1))
    w = Workload.from_paper_json(data)
    plan = dp_ring.ring_split(w)
    best = _every_ring_split(w)
    if plan is None:
        assert best == np.inf
        return
    assert plan.status == "feasible" and evaluate.check(w, plan.assignment) == []
    assert plan.value == pytest.approx(bf.max_load(data, plan.assignment), rel=1e-9)  # the brute force's loads
    assert plan.details["ring_value"] == pytest.approx(plan.value, rel=1e-9)
    assert plan.value == pytest.approx(best, rel=1e-9)


def test_ring_split_keeps_tied_weights_with_the_tail():
    """A chain with tied weights: class 7 holds the table W, its Gather at the front and the
    Transpose the last node reads.  A segment split makes the first device send the
    transposed table to the last; the ring gives the first accelerator the tail too."""
    big, small = 50.0, 1.0
    nodes = [node(0, cpu=100, acc=0, cc=7), node(1, cpu=100, acc=1, cc=7), node(2, cpu=100, acc=1, cc=7)]
    nodes += [node(10 + i, cpu=100, acc=10) for i in range(6)] + [node(20, cpu=100, acc=8)]
    edges = [edge(0, 1, big), edge(0, 2, big), edge(1, 10, small), edge(2, 20, big)]
    edges += [edge(10 + i, 11 + i, small) for i in range(5)] + [edge(15, 20, small)]
    w = Workload.from_paper_json(workload(nodes, edges, k=3, l=1))
    plan = dp_ring.ring_split(w)
    linear = api.solve(w, "throughput", "dp_linear")
    assert plan.assignment[0] == plan.assignment[20]  # the output layer sits with the tied class
    assert plan.value == pytest.approx(_every_ring_split(w), rel=1e-9)
    assert plan.value < linear.value - big / 2


def test_the_spectral_order_keeps_a_shuffled_chain_in_its_order():
    """Classes numbered at random along a chain of heavy tensors, with light ones reaching
    far: the spectral order is the chain (or the chain reversed)."""
    rng = np.random.default_rng(0)
    n = 40
    label = rng.permutation(n)  # chain position -> class
    source, members, weight = [], [], []
    for i in range(n - 1):
        source.append(label[i]), members.append([label[i], label[i + 1]]), weight.append(1.0)
    for i in range(0, n - 10, 7):
        source.append(label[i]), members.append([label[i], label[i + 10]]), weight.append(0.01)
    ptr = np.concatenate([[0], np.cumsum([len(m) for m in members])])
    rank = spectral_rank(n, np.array(source), ptr, np.concatenate(members), np.array(weight))
    along = rank[label]
    assert sorted(along) == list(range(n))
    assert list(along) in (list(range(n)), list(range(n))[::-1])
    assert spectral_rank(1, np.array([0]), np.array([0, 1]), np.array([0]), np.array([1.0])) is None
