"""The shift between repeated blocks (solve/block_shift.py) and the certificate's tied
prices that it allows (solve/throughput/bound_setcover.py), against brute force.

The brute force (tests/bruteforce.py) enumerates every class -> device map and scores it
with its own max-load model; it never imports onnxsplit.solve.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit.solve import block_shift, classes
from onnxsplit.solve.throughput import bound_setcover
from onnxsplit.workload import Workload, transposed


def _blocks(seed: int, copies: int, size: int, k: int, l: int) -> dict:
    """``copies`` of one random block of ``size`` nodes in a chain (each block's last node
    feeds the next block's first, and sometimes a skip tensor jumps a block), between a
    head and a tail node of their own."""
    rng = random.Random(seed)
    block = [(rng.choice([0.0, 1.0, 2.5, 4.0]), rng.choice([0.5, 1.0, 3.0]), l == 0 or rng.random() > 0.1)
             for _ in range(size)]  # (unsupported nodes only where a CPU can take them)
    out = [rng.choice([0.25, 1.0, 2.0]) for _ in range(size - 1)]  # a node's tensor, whoever reads it
    between = rng.choice([0.25, 1.0])  # the block's last node's (and the head's)
    out.append(between)
    inner = [(a, b) for a in range(size) for b in range(a + 1, size) if b == a + 1 or rng.random() < 0.3]
    skip = rng.random() < 0.5
    nodes = [{"id": 0, "supportedOnFpga": 1, "cpuLatency": 2.0, "fpgaLatency": 1.5, "isBackwardNode": 0, "size": 1}]
    edges = []
    for c in range(copies):
        first = 1 + c * size
        for i, (cpu, acc, supported) in enumerate(block):
            nodes.append({"id": first + i, "supportedOnFpga": int(supported), "cpuLatency": cpu + 1.0,
                          "fpgaLatency": acc, "isBackwardNode": 0, "size": 1})
        edges += [{"sourceId": first + a, "destId": first + b, "cost": out[a]} for a, b in inner]
        edges.append({"sourceId": first - 1 if c else 0, "destId": first, "cost": between})
        if skip and c >= 1:
            edges.append({"sourceId": first - size, "destId": first + size - 1, "cost": out[0]})
    last = 1 + copies * size
    nodes.append({"id": last, "supportedOnFpga": 1, "cpuLatency": 1.0, "fpgaLatency": 0.5, "isBackwardNode": 0, "size": 1})
    edges.append({"sourceId": last - 1, "destId": last, "cost": between})
    return {"maxSizePerFPGA": 1e9, "maxFPGAs": k, "maxCPUs": l, "nodes": nodes, "edges": edges}


def _shift(w: Workload):
    cl = classes.build_classes(w)
    src, ptr, members, weight = cl.hyper_arrays()
    features = np.column_stack([cl.acc_fwd + cl.acc_bwd, cl.cpu_fwd + cl.cpu_bwd, cl.size, cl.supported])
    return cl, features, block_shift.block_shift(features, src, ptr, members, weight)


@pytest.mark.parametrize("seed", range(20))
def test_the_shift_sends_each_class_to_a_twin_of_the_next_block(seed):
    """On ten copies of a block the map covers the middle blocks, each class to the same
    place in a later block (a class's twin: same work, memory and support), one to one and
    never to itself; the chains it gives hold every class of a middle block with its copies."""
    size = 2 + seed % 3
    w = Workload.from_paper_json(_blocks(seed, copies=10, size=size, k=2, l=1))
    cl, features, shift = _shift(w)
    mapped = np.flatnonzero(shift >= 0)
    assert len(set(shift[mapped].tolist())) == len(mapped)  # one to one
    assert (shift[mapped] != mapped).all()
    assert (features[mapped] == features[shift[mapped]]).all()
    block_of = {g: (g - 1) // size for g in range(1, 1 + 10 * size)}  # class order is topological: head, blocks, tail
    place = {g: (g - 1) % size for g in block_of}
    assert all(g in block_of and shift[g] in block_of and place[g] == place[int(shift[g])]
               and block_of[int(shift[g])] > block_of[g] for g in mapped.tolist())
    label = block_shift.chains(shift)
    middle = [g for g, b in block_of.items() if 4 <= b <= 5]
    assert len(mapped) >= 4 * size
    for g in middle:  # its chain holds its copies in the middle blocks
        assert {label[h] for h in middle if place[h] == place[g]} == {label[g]}


@pytest.mark.parametrize("seed", range(30))
def test_the_map_is_one_to_one_between_twins_on_any_graph(seed):
    """On random workloads (most repeat nothing) the map is still one to one, without
    fixed points, between classes of equal features, and its chains partition the classes."""
    w = Workload.from_paper_json(bf.random_workload(seed, training=seed % 2 == 1, n_range=(4, 9)))
    cl, features, shift = _shift(w)
    mapped = np.flatnonzero(shift >= 0)
    assert len(set(shift[mapped].tolist())) == len(mapped)
    assert (shift[mapped] != mapped).all()
    assert (features[mapped] == features[shift[mapped]]).all()
    label = block_shift.chains(shift)
    assert (label >= 0).all() and set(label.tolist()) == set(range(label.max() + 1))
    assert all(label[g] == label[shift[g]] for g in mapped)


@pytest.mark.parametrize("seed", range(24))
def test_tied_prices_never_refute_a_load_some_plan_reaches(seed):
    """Three or four copies of a small block, 1-3 accelerators, 0-1 CPUs: at the brute-force
    optimum, or above it, no certificate comes, with tied prices or after them; well below
    it (no CPUs) the tied LP alone proves it."""
    k, l = 1 + seed % 3, seed % 2
    data = _blocks(seed, copies=3 + seed % 2, size=2, k=k, l=l)
    best = bf.brute_min_max_load(data, chain=False)[0]
    w = Workload.from_paper_json(data)
    cl = classes.build_classes(w)
    sets = bound_setcover._Sets(cl, w.accelerator_memory)
    assert sets.chains is not None
    for T in (best, best * 1.1):
        tied = bound_setcover._Master(sets, k, l, sets.chains)
        assert bound_setcover._search(sets, tied, k, l, T, None, 30, None) != bound_setcover.PROVEN, (seed, T, best)
        assert not bound_setcover.infeasible(cl, k, l, w.accelerator_memory, T, None, seconds=30), (seed, T, best)
    work = float(np.where(cl.supported, cl.acc_fwd + cl.acc_bwd, 0).sum())
    if l == 0 and cl.supported.all():
        tied = bound_setcover._Master(sets, k, l, sets.chains)
        T = 0.9 * work / k
        assert bound_setcover._search(sets, tied, k, l, T, None, 30, None) == bound_setcover.PROVEN


def test_columns_kept_from_a_higher_load_leave_when_they_no_longer_fit():
    """One LP serves every load the bisection tries: going down, the sets above the new load
    leave it (a certificate over sets that do not fit would be no certificate)."""
    data = _blocks(3, copies=4, size=2, k=2, l=0)
    w = Workload.from_paper_json(data)
    sets = bound_setcover._Sets(classes.build_classes(w), w.accelerator_memory)
    master = bound_setcover._Master(sets, 2, 0, sets.chains)
    best = bf.brute_min_max_load(data, chain=False)[0]
    bound_setcover._search(sets, master, 2, 0, best * 1.5, None, 30, None)
    assert max(master.loads) > best * 0.8
    master.restrict(best * 0.8)
    assert master.columns and max(master.loads) <= best * 0.8
    assert all(sets.load(S) == pytest.approx(load) for (S, on_cpu), load in zip(master.columns, master.loads) if not on_cpu)
    assert master.h.getNumCol() == master.m + len(master.columns)


@pytest.mark.parametrize("seed", range(10))
def test_each_class_gets_its_tensors_in_order(seed):
    """workload.transposed (class -> its tensors, as the certificate's local search and the
    shift read them) against the lists built by hand, tensors in their order."""
    w = Workload.from_paper_json(bf.random_workload(seed, training=seed % 2 == 1, n_range=(2, 9)))
    cl = classes.build_classes(w)
    _, ptr, members, _ = cl.hyper_arrays()
    by_hand = [[h for h in range(len(ptr) - 1) if g in members[ptr[h]:ptr[h + 1]]] for g in range(cl.n)]
    c_ptr, c_hyper = transposed(ptr, members, cl.n)
    assert [c_hyper[c_ptr[g]:c_ptr[g + 1]].tolist() for g in range(cl.n)] == by_hand
