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


SPECTRAL_MOST = 2500  # classes, at most, for the spectral orders (a dense eigensolve: 0.4 s at 1500, 1.7 s at 2500)


def spectral_ranks(n: int, source: np.ndarray, ptr: np.ndarray, members: np.ndarray,
                   weight: np.ndarray) -> dict[str, np.ndarray]:
    """Two orders of the classes from one eigensolve of the class graph (each tensor a
    clique of the classes it touches, weighted by its transfer time shared among them; the
    arrays of :meth:`..classes.Classes.hyper_arrays`, whose members hold the source), each
    as class -> place: ``"spectral"`` along the Fiedler vector, a line, and ``"angular"``
    around the circle of the next two vectors, a ring.  Empty beyond SPECTRAL_MOST classes,
    without two, or where the eigensolver fails.

    Sorting by the Fiedler vector minimises, relaxed, the weighted sum of squared distances
    in the order, so a segment of it is a set with few and light tensors across its
    boundary.  A topological order of a training graph is no such thing: the classes hold
    a forward operator and its gradients, and the order puts the weights, the optimizer and
    the gradient-only classes far from the layer they belong to (op-level BERT-24 training,
    6 accelerators: a ring split of the topological order 1866, of the plain Laplacian's
    line 687.7, of this line 679.6).  Tied weights close a chain of layers into a ring, whose Fiedler pair is
    (cos, sin) of the place around it: along one vector the ring lies folded, layer i
    beside layer L - i, so a segment holds two stretches and pays four cuts; the angle
    of the two gives the ring itself, whose arcs pay two (:func:`_embedding`).  On a chain
    the angle runs round the curve of the two vectors, in the chain's order."""
    if n < 2 or n > SPECTRAL_MOST:
        return {}
    vectors = _embedding(n, ptr, members, weight)
    if vectors is None:
        return {}
    keys = {"spectral": vectors[:, 1]}
    if n > 2:
        keys["angular"] = np.arctan2(vectors[:, 2], vectors[:, 1])
    out = {}
    for name, key in keys.items():
        rank = np.empty(n, dtype=np.int64)
        rank[np.argsort(key, kind="stable")] = np.arange(n)
        out[name] = rank
    return out


def _embedding(n: int, ptr: np.ndarray, members: np.ndarray, weight: np.ndarray) -> np.ndarray | None:
    """The eigenvectors of the class graph's normalised Laplacian I - D^-1/2 A D^-1/2,
    scaled back by D^-1/2 (the random walk's: Shi and Malik's normalised cut), smallest
    eigenvalue first; None where the eigensolver fails.  Not the plain Laplacian D - A: a
    class hung on a tensor of 1e-7 (a shape, a scalar) makes a near-zero eigenvalue of its
    own there, and the first vectors then say where the light classes are instead of how
    the graph runs (op-level BERT-24 training: the Fiedler vector's layer means all 0.001,
    against a clean cosine over the layers here).  A class with no tensor gets a degree
    of a billionth of the mean, so the scaling stays finite."""
    adjacency = np.zeros((n, n))
    for h in range(len(weight)):
        touched = members[ptr[h]:ptr[h + 1]]
        if len(touched) > 1:
            adjacency[np.ix_(touched, touched)] += weight[h] / (len(touched) - 1)
    np.fill_diagonal(adjacency, 0.0)
    degree = adjacency.sum(axis=1)
    if not degree.any():
        return None
    scale = 1.0 / np.sqrt(degree + 1e-9 * degree.mean())
    adjacency *= scale[:, None]
    adjacency *= scale[None, :]
    np.subtract(0.0, adjacency, out=adjacency)  # 0 - x, not -x: a -0.0 moved eigh's vectors (BERT-12)
    adjacency[np.diag_indices(n)] += 1.0
    try:
        _, vectors = np.linalg.eigh(adjacency)
    except np.linalg.LinAlgError:  # no convergence: the topological orders serve alone
        return None
    vectors *= scale[:, None]
    if not np.isfinite(vectors[:, :3]).all():
        return None
    return vectors
