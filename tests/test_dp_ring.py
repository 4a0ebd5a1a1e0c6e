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
from onnxsplit.solve.orders import spectral_ranks
from onnxsplit.workload import Workload
from workloads import edge, node, workload


def _every_ring_split(w: Workload):
    """Max load of the best ring split, by enumeration: accelerator 0 holds a prefix and a
    suffix of one of the classes' orders (the topological, the two spectral), the middle is cut
    into segments each on its own device (the other accelerators, the CPU cores), scored by
    the evaluator."""
    cl = build_classes(w)
    ranks = [dp_ring._late_source_rank(w, cl), *spectral_ranks(cl.n, *cl.hyper_arrays()).values()]
    return min(_every_ring_split_of(w, cl, np.argsort(rank)) for rank in ranks)


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
    rank = spectral_ranks(n, np.array(source), ptr, np.concatenate(members), np.array(weight))["spectral"]
    along = rank[label]
    assert sorted(along) == list(range(n))
    assert list(along) in (list(range(n)), list(range(n))[::-1])
    assert spectral_ranks(1, np.array([0]), np.array([0, 1]), np.array([0]), np.array([1.0])) == {}


def _ring_with_leaves(rng, n: int):
    """Classes numbered at random round a ring of tensors of 1, each with a leaf class hung
    on it by a tensor of 1e-7 (a shape, a scalar): (ring position -> class, the arrays of
    ``Classes.hyper_arrays``)."""
    label = rng.permutation(2 * n)  # ring position -> class; n + position -> its leaf
    source, members, weight = [], [], []
    for i in range(n):
        source.append(label[i]), members.append([label[i], label[(i + 1) % n]]), weight.append(1.0)
        source.append(label[i]), members.append([label[i], label[n + i]]), weight.append(1e-7)
    ptr = np.concatenate([[0], np.cumsum([len(m) for m in members])])
    return label, (np.array(source), ptr, np.concatenate(members), np.array(weight))


def test_the_angular_order_goes_round_a_ring_the_line_folds_it():
    """Round a ring, the angular order is the ring (from some class on, either way), its
    leaves wherever they fall; the spectral line lays it folded, so no rotation of the
    ring is a run of it.  Leaves on tensors of 1e-7 do not move either: on the plain
    Laplacian they had eigenvalues of their own below the ring's."""
    n = 24
    label, arrays = _ring_with_leaves(np.random.default_rng(1), n)
    ranks = spectral_ranks(2 * n, *arrays)
    along = ranks["angular"][label[:n]]  # the ring's classes, in ring order
    steps = np.diff(np.argsort(np.argsort(along)))  # their order among themselves
    steps = np.concatenate([steps, [np.argsort(np.argsort(along))[0] - np.argsort(np.argsort(along))[-1]]]) % n
    assert set(steps.tolist()) in ({1}, {n - 1})
    line = np.argsort(np.argsort(ranks["spectral"][label[:n]]))
    line_steps = set((np.diff(np.concatenate([line, line[:1]])) % n).tolist())
    assert line_steps not in ({1}, {n - 1})


def test_ring_split_of_two_branches_pays_two_cuts_a_device():
    """Two branches of 5 layers from A that join at Z: a ring of 12 classes of 10 each, a
    tensor of 1 between neighbours.  Every topological order either interleaves the
    branches or runs one after the other (B5 beside C1); the spectral line folds the ring.
    Around the ring, on 3 accelerators, the best split is 3 arcs of 4 layers each paying
    its two neighbours: 42."""
    a, z, b, c = 0, 11, [1, 2, 3, 4, 5], [6, 7, 8, 9, 10]
    nodes = [node(i, cpu=1000, acc=10) for i in range(12)]
    edges = [edge(a, b[0], 1.0), edge(a, c[0], 1.0), edge(b[-1], z, 1.0), edge(c[-1], z, 1.0)]
    edges += [edge(x, y, 1.0) for chain in (b, c) for x, y in zip(chain, chain[1:])]
    w = Workload.from_paper_json(workload(nodes, edges, k=3, l=0))
    plan = dp_ring.ring_split(w)
    assert evaluate.check(w, plan.assignment) == []
    assert plan.value == pytest.approx(42.0, rel=1e-12)
    assert bf.max_load(workload(nodes, edges, k=3, l=0), plan.assignment) == pytest.approx(42.0, rel=1e-12)


@pytest.mark.parametrize("seed", range(12))
def test_ring_splits_give_each_orders_best_split_least_first(seed):
    """One split per order, each the best ring split of that order (by enumeration), each
    valid and scored by the brute force, the least max load first (ring_split's)."""
    data = bf.random_workload(100 + seed, training=seed % 3 == 0, n_range=(2, 5), k_range=(1, 3), l_range=(0, 1))
    w = Workload.from_paper_json(data)
    splits = dp_ring.ring_splits(w)
    cl = build_classes(w)
    ranks = {"topological": dp_ring._late_source_rank(w, cl), **spectral_ranks(cl.n, *cl.hyper_arrays())}
    enumerated = {name: _every_ring_split_of(w, cl, np.argsort(rank)) for name, rank in ranks.items()}
    assert {name for _, name, _, _, _ in splits} == {name for name, v in enumerated.items() if np.isfinite(v)}
    values = [value for value, *_ in splits]
    assert values == sorted(values)
    for value, name, i, j, assignment in splits:
        assert 0 <= i <= j <= cl.n
        assert evaluate.check(w, assignment) == []
        assert value == pytest.approx(bf.max_load(data, assignment), rel=1e-9)
        assert value == pytest.approx(enumerated[name], rel=1e-9)
    plan = dp_ring.ring_split(w)
    assert (plan is None) == (not splits)
    if splits:
        assert plan.value == pytest.approx(values[0], rel=1e-9)


def test_ring_splits_of_the_last_workload_are_kept_and_the_callers_own():
    # the IP asks twice (warm start, then where pairs start): the second answer is the
    # first's, a copy the caller may change; another workload is split anew
    data = bf.random_workload(3, training=True, n_range=(5, 6), k_range=(2, 2), l_range=(1, 1))
    w = Workload.from_paper_json(data)
    first = dp_ring.ring_splits(w)
    assert first
    first[0][4].clear()
    again = dp_ring.ring_splits(w)
    assert [s[:4] for s in again] == [s[:4] for s in first] and again[0][4]
    assert again == dp_ring._ring_splits(w)
    other = Workload.from_paper_json(bf.random_workload(4, training=True, n_range=(5, 6), k_range=(2, 2),
                                                        l_range=(1, 1)))
    assert dp_ring.ring_splits(other) == dp_ring._ring_splits(other) != again
