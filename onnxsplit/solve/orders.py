"""Orders that the sequence methods cut (latency_dp, dp_ring): topological orders of
inseparable blocks (the reference's, earliest- and latest-first, seeded random ones, each
also with its sources -- weights, constants -- moved just before their first consumer),
and the colour classes' spectral order, which is not topological but keeps heavy
tensors short (a training graph's layers each in one stretch, gradients and all).

Write-up: docs/latency.md (latency_dp), docs/throughput.md (dp_ring).
"""

from __future__ import annotations

import random

import numpy as np


RANDOM_ORDERS = 64  # seeded: the same orders on every run


def block_orders(blocks, order_pos: np.ndarray):
    """Distinct topological orders of the blocks, whose cuts differ: the reference's
    (depth-first-ish), ready blocks taken earliest-first and latest-first, and
    RANDOM_ORDERS random ones (each step continues the newest ready block with probability
    0, 1/2 or 9/10, or takes any ready one); each also with its source blocks moved late
    (:func:`sources_late`).  On Inception-v3 the random ones cut 1312 to 1279: which of a
    module's branches ends up next to the following module decides what one call holds.
    Made one at a time (the caller may stop at its deadline), each distinct order once."""
    nb, succ = len(blocks.members), blocks.succ
    first = [int(order_pos[m].min()) for m in blocks.members]
    indegree = np.zeros(nb, dtype=np.int64)
    for b in range(nb):
        for t in succ[b]:
            indegree[t] += 1
    seen: set[tuple[int, ...]] = set()

    def fresh(order):
        key = tuple(order)
        if len(key) == nb and key not in seen:
            seen.add(key)
            return True
        return False

    def base():
        yield list(blocks.order)
        for sign in (1, -1):
            yield kahn(succ, indegree, lambda ready, sign=sign: min(
                range(len(ready)), key=lambda j: (sign * first[ready[j]], ready[j])))
        rng = random.Random(0)
        for i in range(RANDOM_ORDERS if nb > 1 else 0):
            newest = (0.0, 0.5, 0.9)[i % 3]
            yield kahn(succ, indegree, lambda ready, newest=newest: (
                len(ready) - 1 if rng.random() < newest else rng.randrange(len(ready))))

    made = []
    for order in base():
        made.append(order)
        if fresh(order):
            yield list(order)
    for order in made:
        late = sources_late(order, succ, indegree)
        if fresh(late):
            yield list(late)


def kahn(succ, indegree: np.ndarray, choose) -> list[int]:
    """A topological order of the blocks: ``choose(ready)`` picks the index of the next one
    among those whose predecessors are all placed."""
    indeg = indegree.copy()
    ready = [b for b in range(len(indeg)) if indeg[b] == 0]
    out = []
    while ready:
        b = ready.pop(choose(ready))
        out.append(b)
        for t in succ[b]:
            indeg[t] -= 1
            if indeg[t] == 0:
                ready.append(t)
    return out


def sources_late(order: list[int], succ, indegree: np.ndarray) -> list[int]:
    """``order`` with every source (a weight, a constant: indegree 0) moved to just before
    its first consumer: an interval of the order then holds a layer with its weights (on a
    ResNet-50 whose weights are ConstantOfShape nodes, latency_dp 8.46 -> 8.31 ms).  Used
    on blocks by latency_dp and on classes by dp_ring."""
    at = {b: i for i, b in enumerate(order)}
    before: dict[int, list[int]] = {}
    for b in order:
        if indegree[b] == 0:
            first = min((at[t] for t in succ[b]), default=len(order))
            before.setdefault(first, []).append(b)
    out = []
    for i, b in enumerate(order):
        out += before.get(i, [])
        if indegree[b] != 0:
            out.append(b)
    return out + before.get(len(order), [])


SPECTRAL_MOST = 1500  # classes, at most, for the spectral order (a dense eigensolve: 0.5 s at 1500)


def spectral_rank(n: int, source: np.ndarray, ptr: np.ndarray, members: np.ndarray,
                  weight: np.ndarray) -> np.ndarray | None:
    """class -> its place along the Fiedler vector of the class graph (each tensor a
    clique of the classes it touches, weighted by its transfer time shared among them;
    the arrays of :meth:`..classes.Classes.hyper_arrays`, whose members hold the source);
    None beyond SPECTRAL_MOST classes, without two, or where the eigensolver fails.
    Sorting by the Fiedler vector minimises, relaxed, the weighted sum of squared
    distances in the order, so a segment of it is a set with few and light tensors across
    its boundary.  A topological order of a training graph is no such thing: the classes
    hold a forward operator and its gradients, and the order puts the weights, the
    optimizer and the gradient-only classes far from the layer they belong to (op-level
    BERT-24 training, 6 accelerators: a ring split of the topological order 1866, of the
    spectral order 687.7)."""
    if n < 2 or n > SPECTRAL_MOST:
        return None
    laplacian = np.zeros((n, n))  # the adjacency first, negated into the Laplacian in place
    for h in range(len(weight)):
        touched = members[ptr[h]:ptr[h + 1]]
        if len(touched) > 1:
            laplacian[np.ix_(touched, touched)] += weight[h] / (len(touched) - 1)
    np.fill_diagonal(laplacian, 0.0)
    degree = laplacian.sum(axis=1)
    np.subtract(0.0, laplacian, out=laplacian)  # 0 - x, not -x: a -0.0 moved eigh's vectors (BERT-12)
    laplacian[np.diag_indices(n)] = degree
    try:
        _, vectors = np.linalg.eigh(laplacian)
    except np.linalg.LinAlgError:  # no convergence: the topological orders serve alone
        return None
    if not np.isfinite(vectors[:, 1]).all():
        return None
    order = np.argsort(vectors[:, 1], kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    return rank
