"""The lattice of ideals (predecessor-closed sets) of a DAG, as arrays the DP walks.

Ideals are numbered in breadth-first order from the empty set, so every ideal's subsets
have smaller numbers.  ``down`` edges link an ideal to the ideals one element smaller
(remove one maximal element): following them from ``I`` reaches exactly the sub-ideals of
``I``.  A :func:`chain` lattice (the prefixes of one topological order) has the same shape,
so the DP runs unchanged on it to give the "linearized" upper bound.

Write-up: docs/throughput.md (dp, dp_linear).
"""

from __future__ import annotations

import collections
import heapq
import itertools
from dataclasses import dataclass

import numpy as np

from ... import interrupt
from ...errors import TooManyIdeals

DEFAULT_IDEAL_LIMIT = 1_000_000


@dataclass(frozen=True)
class Lattice:
    masks: list[int]  # ideal number -> bitset of its elements
    down_ptr: np.ndarray  # CSR over ideals
    down_ideal: np.ndarray  # the smaller ideal
    down_item: np.ndarray  # the element removed to get there

    @property
    def size(self) -> int:
        return len(self.masks)

    @property
    def full(self) -> int:
        return self.size - 1

    def prefix_sums(self, weights: np.ndarray) -> np.ndarray:
        """sum of ``weights`` over each ideal, built along the lattice (exact order-free)."""
        out = np.zeros(self.size)
        # every ideal > 0 has at least one down edge; the first one is its BFS parent
        first = self.down_ptr[:-1]
        for i in range(1, self.size):
            p = first[i]
            out[i] = out[self.down_ideal[p]] + weights[self.down_item[p]]
        return out


def disagrees(dp_value: float, scored: float, items: int, *summed) -> bool:
    """Whether a DP's value and the evaluator's score of its plan differ by more than
    rounding: 1e-6 (relative above 1), and what the DP's sums cost.  A part's load is the
    difference of two prefix sums over ``items`` items and its communication a running sum,
    each exact to some units in the last place of the totals of ``summed`` (the arrays
    added up), not of the part: beside one node of 1e12 ms the others' loads are off by
    about 1e-4."""
    total = sum(float(np.abs(np.asarray(a, dtype=np.float64)).sum()) for a in summed)
    rounding = 4.0 * (items + 1) * float(np.finfo(np.float64).eps) * total
    return abs(scored - dp_value) > 1e-6 * max(1.0, abs(scored)) + rounding


def ideal_bytes(n: int, additions: int) -> float:
    """What one ideal of an ``n``-item graph takes while enumerated: its mask (n bits),
    the dict entry finding it, its down-links, and its list of ``additions`` (the items
    that can join it: on a wide graph that list, not the mask, is most of it)."""
    return n / 8 + 8.0 * additions + 250.0


def enumerate_ideals(preds: list[list[int]], succs: list[list[int]], limit: int = DEFAULT_IDEAL_LIMIT,
                     deadline: float = float("inf"), max_bytes: float = float("inf")) -> Lattice | None:
    """Every ideal (down-closed item set) and its down-links; TooManyIdeals beyond
    ``limit`` ideals or ``max_bytes`` of them (counted as they are made, before the next
    is allocated), None once ``deadline`` (a time.perf_counter() value) passes."""
    n = len(preds)
    widest = _widest_level(preds, succs)
    if widest >= 63 or 2 ** widest > limit:
        raise TooManyIdeals(f"the graph has over {limit:,} ideals ({widest} items side by side "
                            f"alone make 2^{widest}): too many for the exact DP")
    pred_mask = [0] * n
    for v in range(n):
        for p in preds[v]:
            pred_mask[v] |= 1 << p
    masks = [0]
    id_of = {0: 0}
    addable: list[list[int] | None] = [[v for v in range(n) if pred_mask[v] == 0]]
    down: list[list[tuple[int, int]]] = [[]]
    i = 0
    used = ideal_bytes(n, len(addable[0]))
    work = 0  # additions tried: the clock is read every 2**16 (a wide graph's ideal has thousands)
    while i < len(masks):
        mask = masks[i]
        adds = addable[i]
        addable[i] = None
        used -= 8.0 * len(adds)
        work += len(adds)
        if work >= 0x10000:
            work = 0
            if interrupt.past(deadline):
                return None
        for v in adds:
            child = mask | (1 << v)
            j = id_of.get(child)
            if j is None:
                j = len(masks)
                if j >= limit:
                    raise TooManyIdeals(f"the graph has over {limit:,} ideals: too many for the exact DP "
                                     f"(use --method dp_linear or an integer program)")
                used += ideal_bytes(n, len(adds))
                if used > max_bytes:
                    raise TooManyIdeals(f"the graph's ideals would take over {max_bytes / 1e9:.1f} GB "
                                        f"(the memory limit; --memory-limit sets it): too many for "
                                        f"the exact DP")
                id_of[child] = j
                masks.append(child)
                nxt = [x for x in adds if x != v]
                nxt += [w for w in succs[v] if pred_mask[w] & ~child == 0]
                addable.append(nxt)
                down.append([])
            down[j].append((i, v))
        i += 1
    return _pack(masks, down)


def _widest_level(preds: list[list[int]], succs: list[list[int]]) -> int:
    """The most items at one depth (longest path from a source): no two of them are
    ordered, so the graph has at least 2**that many ideals."""
    depth = [0] * len(preds)
    indeg = [len(p) for p in preds]
    ready = [v for v in range(len(preds)) if indeg[v] == 0]
    while ready:
        v = ready.pop()
        for w in succs[v]:
            depth[w] = max(depth[w], depth[v] + 1)
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    counts: dict[int, int] = {}
    for d in depth:
        counts[d] = counts.get(d, 0) + 1
    return max(counts.values(), default=0)


def chain(order: list[int]) -> Lattice:
    """The prefixes of one topological order: a lattice whose pairs are contiguous ranges."""
    masks = [0]
    down: list[list[tuple[int, int]]] = [[]]
    for pos, v in enumerate(order):
        masks.append(masks[-1] | (1 << v))
        down.append([(pos, v)])
    return _pack(masks, down)


def _pack(masks: list[int], down: list[list[tuple[int, int]]]) -> Lattice:
    ptr = np.zeros(len(masks) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(d) for d in down])
    flat = [e for d in down for e in d]
    ideal = np.array([e[0] for e in flat], dtype=np.int64)
    item = np.array([e[1] for e in flat], dtype=np.int64)
    return Lattice(masks, ptr, ideal, item)


def topological_orders(preds: list[list[int]], succs: list[list[int]], weight: np.ndarray):
    """A few topological orders of the items, for linearized upper bounds, one at a time
    (the caller may stop at its deadline): depth-first, breadth-first, and heaviest
    ``weight`` (accelerator latency) first (ties: the one ready first)."""
    for strategy in ("dfs", "bfs", "heavy_first"):
        indeg = [len(p) for p in preds]
        seq = itertools.count()
        ready = [(-float(weight[v]), next(seq), v) for v in range(len(preds)) if indeg[v] == 0]
        if strategy == "heavy_first":
            heapq.heapify(ready)
        else:
            ready = collections.deque(ready)
        order = []
        while ready:
            if strategy == "dfs":
                v = ready.pop()[2]
            elif strategy == "bfs":
                v = ready.popleft()[2]
            else:
                v = heapq.heappop(ready)[2]
            order.append(v)
            for w in succs[v]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    item = (-float(weight[w]), next(seq), w)
                    if strategy == "heavy_first":
                        heapq.heappush(ready, item)
                    else:
                        ready.append(item)
        yield order
