"""Topological orders of inseparable blocks that the sequence methods cut (latency_dp,
dp_ring): the reference's, earliest- and latest-first, seeded random ones, and each with
its sources (weights, constants) moved just before their first consumer.

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
