"""The graph cut at its cut vertices: nodes every input-to-output path passes through
(sources set aside where there are several: weights and constants), and the blocks
between them (an Inception module, a residual block), each as a workload of its own with
its ends pinned.  The latency_series method and the series bound both work on these.

Write-up: docs/latency.md (latency_series, Series bound).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ...workload import MOST_TIME, Workload


BLOCK_NODES = 64  # larger blocks get no IP of their own (all on the CPUs, or inside a call)


def cut_vertices(w: Workload) -> list[int]:
    """Nodes (indices, in topological order) that every input-to-output path passes
    through; with several sources, counted on the graph without them."""
    sources = [v for v in range(w.n) if not w.predecessors[v]]
    core = np.ones(w.n, dtype=bool)
    if len(sources) > 1:
        core[sources] = False
    order = [v for v in w.topological_order if core[v]]
    into = [0] * w.n
    out_of = [0] * w.n
    for v in order:
        preds = [u for u in w.predecessors[v] if core[u]]
        into[v] = sum(into[u] for u in preds) if preds else 1
    for v in reversed(order):
        succs = [s for s in w.successors[v] if core[s]]
        out_of[v] = sum(out_of[s] for s in succs) if succs else 1
    total = sum(into[v] for v in order if not any(core[s] for s in w.successors[v]))
    return [v for v in order if into[v] * out_of[v] == total]


@dataclasses.dataclass
class Block:
    """The nodes between two consecutive cut vertices (``first`` None: before the first
    one; ``last`` None: after the last one)."""

    first: int | None
    inside: list[int]
    last: int | None


def blocks(w: Workload, cuts: list[int]) -> list[Block]:
    """The blocks around ``cuts``, prefix and suffix included; a source set aside joins
    the block where its first consumer is."""
    pos = np.empty(w.n, dtype=np.int64)
    pos[list(w.topological_order)] = np.arange(w.n)
    cut_pos = np.array([pos[c] for c in cuts], dtype=np.int64)
    is_cut = np.zeros(w.n, dtype=bool)
    is_cut[cuts] = True
    out = [Block(None, [], cuts[0])] + [Block(a, [], b) for a, b in zip(cuts, cuts[1:])] + [Block(cuts[-1], [], None)]
    for v in w.topological_order:
        if is_cut[v]:
            continue
        at = pos[v] if w.predecessors[v] else min((pos[s] for s in w.successors[v]), default=pos[v])
        out[int(np.searchsorted(cut_pos, at, side="right"))].inside.append(v)
    return out


def block_workload(w: Workload, block: Block, accelerators: int, first_room: float | None = None,
                   last_room: float | None = None) -> Workload:
    """The block alone.  An end cut vertex is pinned to the CPUs at no cost (its room None),
    or to an accelerator call at no compute (a CPU time above any plan's) that holds at
    most its room of the block's memory.  The block's latency is then the time from the
    first end's finish to the last end's inputs (or through the last end's call)."""
    ends = [v for v in (block.first, block.last) if v is not None]
    worst = pinned_cost(w, block, accelerators)
    pinned = {int(w.ids[v]): room for v, room in ((block.first, first_room), (block.last, last_room))
              if v is not None}
    keep = np.zeros(w.n, dtype=bool)
    keep[block.inside] = True
    keep[ends] = True
    memory = float(w.accelerator_memory)
    if sum(room is not None for room in pinned.values()) <= 1:
        # with one end in a call, memory no call of the block can fill stands for any more
        # (the pinned end's size is memory less its room: with an unlimited 1e18, rows out
        # of HiGHS's range).  Two ends in calls share one only where their rooms add up to
        # more than the memory: that needs the memory itself
        free = float(w.size[[v for v in np.flatnonzero(keep) if pinned.get(int(w.ids[v])) is None]].sum())
        memory = min(memory, 2.0 * free + 1.0)

    def pin(n):
        room = pinned[n.id]
        if room is not None:
            return dataclasses.replace(n, supported=True, cpu_latency=worst, acc_latency=0.0, color_class=None,
                                       size=max(0.0, memory - room))
        return dataclasses.replace(n, supported=False, cpu_latency=0.0, acc_latency=0.0, size=0.0, color_class=None)

    sub = w.restricted(keep)
    return sub.replace(nodes=tuple(pin(n) if n.id in pinned else n for n in sub.nodes),
                       num_accelerators=accelerators, accelerator_memory=memory)


def pinnable(w: Workload) -> bool:
    """Whether every block's pinned cost (:func:`pinned_cost`, with the most calls the
    series method and bound give a block: two more than the accelerators) is a time a
    workload may hold (MOST_TIME); where it is not (times near that limit), the blocks'
    workloads cannot be built and neither applies."""
    calls = w.num_accelerators + 2
    return float(w.cpu_latency.sum() + w.acc_latency.sum() + 2 * (calls + 1) * w.out_cost.sum()) + 1.0 <= MOST_TIME


def pinned_cost(w: Workload, block: Block, accelerators: int) -> float:
    """A latency above every plan of :func:`block_workload`'s that keeps its pinned ends
    where they are pinned (a path meets each of the calls once, and a call receives and
    sends each tensor at most once): a value at or above it means no such plan."""
    nodes = block.inside + [v for v in (block.first, block.last) if v is not None]
    return float(w.cpu_latency[block.inside].sum() + w.acc_latency[block.inside].sum()
                 + 2 * (accelerators + 1) * w.out_cost[nodes].sum()) + 1.0
