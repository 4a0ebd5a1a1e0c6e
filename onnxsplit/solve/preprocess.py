"""Preprocessing passes that turn a Workload into the instance the max-load DP runs on.

The DP places forward supernodes along a chain of ideals and carries each one's backward
partner along.  Matching the paper's optima needs the reference's passes, in its order:
:func:`contract_color_classes`, :func:`add_orphan_standins` (zero-cost forward stand-ins
for backward-only classes), :func:`fuse_forward_sccs` (classes on a forward cycle) and
:func:`merge_zero_latency`.  Each pass is a pure function ``Contracted -> Contracted``
and changes no cost: the DP still charges every original tensor by its original edges
(``throughput/dp.py``).

Write-up: docs/throughput.md (dp: Preprocessing).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from ..errors import SolveError
from ..workload import Workload, csr

ZERO = 1e-6  # the reference's threshold for "zero latency"


@dataclass(frozen=True)
class Contracted:
    """Original nodes grouped into supernodes, plus order-only (artificial) edges."""

    workload: Workload
    group: np.ndarray  # original node index -> supernode index
    backward: np.ndarray  # per supernode
    label: np.ndarray  # colour-class label per supernode
    artificial: frozenset = frozenset()  # (a, b) supernode edges that carry no tensor

    @property
    def size(self) -> int:
        return len(self.backward)

    def total(self, values) -> np.ndarray:
        """A per-node array summed per supernode."""
        return np.bincount(self.group, weights=values, minlength=self.size)

    @cached_property
    def acc_latency(self) -> np.ndarray:
        return self.total(self.workload.acc_latency)

    @cached_property
    def cpu_latency(self) -> np.ndarray:
        return self.total(self.workload.cpu_latency)

    @cached_property
    def mem_size(self) -> np.ndarray:
        return self.total(self.workload.size)

    @cached_property
    def unsupported(self) -> np.ndarray:
        """Number of members that cannot run on an accelerator."""
        return self.total((~self.workload.supported).astype(np.float64)).round().astype(np.int64)

    @cached_property
    def true_edges(self) -> frozenset:
        w = self.workload
        a, b = self.group[w.edge_src], self.group[w.edge_dst]
        keep = a != b
        return frozenset(zip(a[keep].tolist(), b[keep].tolist()))

    @cached_property
    def members(self) -> list[np.ndarray]:
        order = np.argsort(self.group, kind="stable")
        cuts = np.searchsorted(self.group[order], np.arange(self.size + 1))
        return [order[cuts[i]:cuts[i + 1]] for i in range(self.size)]


def initial(workload: Workload) -> Contracted:
    return Contracted(
        workload=workload,
        group=np.arange(workload.n),
        backward=workload.backward.copy(),
        label=workload.color_class.copy(),
    )


def contract_color_classes(c: Contracted) -> Contracted:
    """Merge supernodes with equal (colour class, forward/backward)."""
    keys = c.label * 2 + c.backward.astype(np.int64)
    uniq, new_of_old = np.unique(keys, return_inverse=True)
    artificial = frozenset((int(new_of_old[a]), int(new_of_old[b])) for a, b in c.artificial
                           if new_of_old[a] != new_of_old[b])
    return Contracted(
        workload=c.workload,
        group=new_of_old[c.group],
        backward=(uniq % 2).astype(bool),
        label=uniq // 2,
        artificial=artificial,
    )


def add_orphan_standins(c: Contracted) -> Contracted:
    """Give each forward-less backward class a zero-cost forward stand-in (mirrored edges).

    Runs on a contracted instance (at most one forward and one backward supernode per class).
    """
    forward_of = {int(c.label[i]): i for i in range(c.size) if not c.backward[i]}
    orphans = [i for i in range(c.size) if c.backward[i] and int(c.label[i]) not in forward_of]
    if not orphans:
        return c
    backward = list(c.backward)
    label = list(c.label)
    for i in orphans:
        forward_of[int(c.label[i])] = len(backward)
        backward.append(False)
        label.append(int(c.label[i]))
    orphan = set(orphans)
    artificial = set(c.artificial)
    for u, v in c.true_edges | c.artificial:
        if c.backward[u] and c.backward[v] and (u in orphan or v in orphan):
            artificial.add((forward_of[int(c.label[v])], forward_of[int(c.label[u])]))
    return Contracted(c.workload, c.group, np.array(backward, dtype=bool), np.array(label, dtype=np.int64),
                      frozenset(artificial))


def fuse_forward_sccs(c: Contracted) -> Contracted:
    """Fuse the colour classes of every strongly connected forward component, then contract."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(i for i in range(c.size) if not c.backward[i])
    g.add_edges_from((a, b) for a, b in c.true_edges | c.artificial if not c.backward[a] and not c.backward[b])
    relabel = {}
    for comp in nx.strongly_connected_components(g):
        if len(comp) > 1:
            target = min(int(c.label[i]) for i in comp)
            for i in comp:
                relabel[int(c.label[i])] = target
    if not relabel:
        return contract_color_classes(c)
    label = np.array([_find(relabel, int(x)) for x in c.label], dtype=np.int64)
    return contract_color_classes(replace(c, label=label))


def _find(parent: dict, x: int) -> int:
    while parent.get(x, x) != x:
        x = parent[x]
    return x


def merge_zero_latency(c: Contracted) -> Contracted:
    """Repeatedly merge a zero-latency forward supernode into its only forward neighbour.

    The reference's conditions: both latencies below 1e-6, no edge to or from a backward
    supernode, exactly one edge (true or order-only) to or from forward supernodes, and no
    backward work in its class.  Moving such a node (with its zero-work backward partner)
    next to its neighbour never raises a load and keeps a chain of ideals a chain --
    provided it may go wherever the neighbour goes.  The reference merges regardless, and
    so can force a node that is accelerator-unsupported or holds memory, and with it the
    neighbour, off the accelerators.  Here a merge also needs: the backward partner touches
    nothing outside the two classes, and the merged nodes run on accelerators and hold no
    memory -- or memory can never bind (all sizes together fit one accelerator), or the
    neighbour's class is CPU-only anyway.
    """
    return _merge_zero_latency(c, allow_memory=False)


def merge_zero_latency_like_reference(c: Contracted) -> Contracted:
    """The merge with the reference's tolerance for memory: a zero-latency node that holds
    memory joins its neighbour too.  Not exact (memory may then bind where it need not),
    but it keeps the lattice as small as the reference's; the DP uses it only when the
    exact merge leaves too many ideals, and then does not claim optimality."""
    return _merge_zero_latency(c, allow_memory=True)


def _merge_zero_latency(c: Contracted, allow_memory: bool) -> Contracted:
    never_binds = allow_memory or float(c.workload.size.sum()) <= c.workload.accelerator_memory
    while True:
        target = _zero_latency_candidate(c, never_binds)
        if target is None:
            return c
        node, neighbour = target
        label = c.label.copy()
        label[label == label[node]] = label[neighbour]
        c = contract_color_classes(replace(c, label=label))


def _zero_latency_candidate(c: Contracted, never_binds: bool) -> tuple[int, int] | None:
    fwd_nbrs: list[list[int]] = [[] for _ in range(c.size)]
    all_nbrs: list[set[int]] = [set() for _ in range(c.size)]
    has_bwd_nbr = np.zeros(c.size, dtype=bool)
    for edges in (c.true_edges, c.artificial):
        for a, b in edges:
            for x, y in ((a, b), (b, a)):
                all_nbrs[x].add(y)
                if c.backward[y]:
                    has_bwd_nbr[x] = True
                else:
                    fwd_nbrs[x].append(y)
    partner = {int(c.label[i]): i for i in np.flatnonzero(c.backward)}
    for i in range(c.size):
        if c.backward[i] or c.cpu_latency[i] >= ZERO or c.acc_latency[i] >= ZERO:
            continue
        if has_bwd_nbr[i] or len(fwd_nbrs[i]) != 1:
            continue
        m = fwd_nbrs[i][0]
        group = [i]
        b = partner.get(int(c.label[i]))
        if b is not None:
            if c.cpu_latency[b] + c.acc_latency[b] >= ZERO:
                continue
            if not all_nbrs[b] <= {i, m, partner.get(int(c.label[m]), -1)}:
                continue
            group.append(b)
        m_group = [m] + ([partner[int(c.label[m])]] if int(c.label[m]) in partner else [])
        cpu_only = any(c.unsupported[x] > 0 for x in m_group)
        if not cpu_only:
            if any(c.unsupported[x] > 0 for x in group):
                continue
            if not never_binds and any(c.mem_size[x] > 0 for x in group):
                continue
        return i, m
    return None


def for_dp(workload: Workload, like_reference: bool = False) -> Contracted:
    """All passes, in the reference's order; checks what the DP relies on.

    ``like_reference``: merge memory-holding zero-latency nodes too (see
    :func:`merge_zero_latency_like_reference`)."""
    c = contract_color_classes(initial(workload))
    c = add_orphan_standins(c)
    c = fuse_forward_sccs(c)
    if not workload.multi_class:  # (its conditions read one accelerator class, links unpriced)
        c = merge_zero_latency_like_reference(c) if like_reference else merge_zero_latency(c)
    labels_fwd = {int(c.label[i]) for i in range(c.size) if not c.backward[i]}
    if any(int(c.label[i]) not in labels_fwd for i in range(c.size) if c.backward[i]):
        raise SolveError("a backward colour class still has no forward partner after preprocessing")
    return c


@dataclass(frozen=True)
class Items:
    """The DP's items: each forward supernode with its backward partner (the supernode of
    its class's backward nodes, or -1), and the forward edges between items.  Both DPs
    (``throughput/dp.py``, ``throughput/dp_classes.py``) build on these."""

    contracted: Contracted
    super: np.ndarray  # item -> forward supernode
    partner: np.ndarray  # item -> backward supernode (or -1)
    of_super: np.ndarray  # supernode -> item
    preds: list[list[int]]
    succs: list[list[int]]

    @property
    def n(self) -> int:
        return len(self.super)

    def per_item(self, per_super: np.ndarray) -> np.ndarray:
        """A per-supernode array summed over each item's supernode and its partner."""
        out = per_super[self.super].astype(np.float64)
        has = self.partner >= 0
        out[has] += per_super[self.partner[has]]
        return out

    def nodes(self, it: int) -> list[np.ndarray]:
        """The original nodes (indices) of item ``it``: its supernode's, its partner's."""
        return [self.contracted.members[s] for s in (self.super[it], self.partner[it]) if s >= 0]

    def incidence(self, hyper) -> tuple[np.ndarray, np.ndarray]:
        """item -> the hyperedges touching it (CSR), for ``hyper`` as
        :func:`..classes.tensor_hyperedges` gives it over the items."""
        incid: list[list[int]] = [[] for _ in range(self.n)]
        for h, edge in enumerate(hyper):
            for it in edge[0]:
                incid[it].append(h)
        return csr(incid)


def dp_items(c: Contracted) -> Items:
    fwd = np.flatnonzero(~c.backward)
    of_super = np.full(c.size, -1, dtype=np.int64)
    of_super[fwd] = np.arange(len(fwd))
    label_item = {int(c.label[s]): int(of_super[s]) for s in fwd}
    partner = np.full(len(fwd), -1, dtype=np.int64)
    for s in np.flatnonzero(c.backward):
        it = label_item[int(c.label[s])]
        partner[it] = s
        of_super[s] = it
    preds: list[set[int]] = [set() for _ in fwd]
    succs: list[set[int]] = [set() for _ in fwd]
    for a, b in c.true_edges | c.artificial:
        if not c.backward[a] and not c.backward[b]:
            ia, ib = int(of_super[a]), int(of_super[b])
            succs[ia].add(ib)
            preds[ib].add(ia)
    return Items(c, fwd, partner, of_super, [sorted(p) for p in preds], [sorted(x) for x in succs])
