"""Colour classes as units: the integer programs' classes, the greedy's inseparable blocks,
local search's class graph.

A colour class must share a device (nodes that share a weight), so every method places
classes, not nodes; each view here is built once from a Workload.

Write-up: docs/README.md (The model the solvers optimise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SolveError
from ..workload import Workload, topological_sort
from . import evaluate, preprocess


@dataclass(frozen=True)
class Classes:
    """Colour classes as the IP's units, in topological order of their first node."""

    of_node: np.ndarray  # node index -> class index
    acc_fwd: np.ndarray
    acc_bwd: np.ndarray
    cpu_fwd: np.ndarray
    cpu_bwd: np.ndarray
    size: np.ndarray
    supported: np.ndarray
    hyper: list[tuple[int, tuple[int, ...], float, bool]]  # (source class, members, weight, backward)

    @property
    def n(self) -> int:
        return len(self.size)

    def devices_of(self, w: Workload, assignment: dict[int, str]) -> np.ndarray:
        """class index -> device index of a plan (colour classes share a device)."""
        out = np.full(self.n, -1, dtype=np.int64)
        out[self.of_node] = evaluate.device_array(w, assignment)
        return out

    def assignment(self, w: Workload, devices: np.ndarray) -> dict[int, str]:
        """node id -> device name, each node on its class's device."""
        names = [d.name for d in w.devices]
        return {int(w.ids[v]): names[devices[self.of_node[v]]] for v in range(w.n)}

    def hyper_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The hyperedges as arrays: (source class, CSR pointer into members, members, weight)."""
        sizes = [len(m) for _, m, _, _ in self.hyper]
        ptr = np.zeros(len(self.hyper) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum(sizes)
        return (np.array([s for s, _, _, _ in self.hyper], dtype=np.int64), ptr,
                np.array([g for _, m, _, _ in self.hyper for g in m], dtype=np.int64),
                np.array([wt for _, _, wt, _ in self.hyper], dtype=np.float64))

    def device_costs(self) -> tuple[np.ndarray, np.ndarray]:
        """(each class's forward + backward time on an accelerator, inf where unsupported;
        the same on a CPU)."""
        return (np.where(self.supported, self.acc_fwd + self.acc_bwd, np.inf),
                self.cpu_fwd + self.cpu_bwd)


def build_classes(w: Workload) -> Classes:
    order_pos = np.empty(w.n, dtype=np.int64)
    order_pos[list(w.topological_order)] = np.arange(w.n)
    first: dict[int, int] = {}
    for v in w.topological_order:
        first.setdefault(int(w.color_class[v]), len(first))
    of_node = np.array([first[int(c)] for c in w.color_class], dtype=np.int64)
    n = len(first)
    bwd = w.backward

    def total(values, mask):
        return np.bincount(of_node[mask], weights=values[mask], minlength=n)

    merged: dict[tuple, float] = {}
    consumers: dict[int, set[int]] = {}
    for s, d in zip(w.edge_src, w.edge_dst):
        consumers.setdefault(int(s), set()).add(int(of_node[d]))
    for u, cls in consumers.items():
        src = int(of_node[u])
        members = tuple(sorted(cls | {src}))
        if len(members) > 1 and w.out_cost[u] > 0:
            key = (src, members, bool(bwd[u]))
            merged[key] = merged.get(key, 0.0) + float(w.out_cost[u])
    return Classes(
        of_node=of_node,
        acc_fwd=total(w.acc_latency, ~bwd), acc_bwd=total(w.acc_latency, bwd),
        cpu_fwd=total(w.cpu_latency, ~bwd), cpu_bwd=total(w.cpu_latency, bwd),
        size=np.bincount(of_node, weights=w.size, minlength=n),
        supported=np.bincount(of_node, weights=(~w.supported).astype(float), minlength=n) == 0,
        hyper=[(s, m, wt, b) for (s, m, b), wt in merged.items()],
    )


def class_members(workload: Workload) -> list[np.ndarray]:
    """The nodes of each colour class, by class label."""
    label = workload.color_class
    order = np.argsort(label, kind="stable")
    cuts = np.searchsorted(label[order], np.arange(int(label.max(initial=-1)) + 2))
    return [order[cuts[i]:cuts[i + 1]] for i in range(len(cuts) - 1)]


@dataclass(frozen=True)
class Blocks:
    """Inseparable blocks in topological order: forward supernodes after contracting colour
    classes and fusing forward cycles, each with its backward partner (training)."""

    members: list[np.ndarray]  # block -> original node indices (forward and backward)
    size: np.ndarray
    unsupported: np.ndarray  # bool per block
    order: list[int]  # a topological order of the blocks
    succ: list[list[int]]  # successor blocks (forward edges, then order-only edges)


def inseparable_blocks(workload: Workload) -> Blocks:
    c = preprocess.contract_color_classes(preprocess.initial(workload))
    c = preprocess.add_orphan_standins(c)
    c = preprocess.fuse_forward_sccs(c)
    fwd = [s for s in range(c.size) if not c.backward[s]]
    block_of_label = {int(c.label[s]): b for b, s in enumerate(fwd)}
    block_of_super = np.array([block_of_label[int(c.label[s])] for s in range(c.size)], dtype=np.int64)
    nb = len(fwd)
    members: list[list[int]] = [[] for _ in range(nb)]
    for v in range(workload.n):
        members[block_of_super[c.group[v]]].append(v)
    # successors in the order the file lists edges (forward edges only), then order-only edges
    succ: list[dict[int, None]] = [{} for _ in range(nb)]
    back = c.backward
    for s, d in zip(c.group[workload.edge_src], c.group[workload.edge_dst]):
        if s != d and not back[s] and not back[d]:
            succ[block_of_super[s]][int(block_of_super[d])] = None
    for s, d in sorted(c.artificial):
        if not back[s] and not back[d] and block_of_super[s] != block_of_super[d]:
            succ[block_of_super[s]][int(block_of_super[d])] = None
    order = topological_sort(nb, succ)  # depth-first-ish, as the reference does
    if order is None:
        raise SolveError("internal error: the blocks of the greedy form a cycle")
    arr = [np.array(m, dtype=np.int64) for m in members]
    return Blocks(
        members=arr,
        size=np.array([workload.size[m].sum() for m in arr]),
        unsupported=np.array([bool((~workload.supported[m]).any()) for m in arr], dtype=bool),
        order=order,
        succ=[list(x) for x in succ],
    )


@dataclass(frozen=True)
class ClassGraph:
    """Colour classes as units, and each tensor as a hyperedge over the classes it touches.

    An accelerator pays hyperedge h's weight iff it holds some but not all of h's classes
    (0 < cnt[h, d] < size[h]): the producer's device pays when a consumer is elsewhere, a
    consumer's device pays when the producer is elsewhere.  That is the evaluator's
    once-per-device rule, so loads can be updated one move at a time.
    """

    label: np.ndarray  # node index -> class
    acc: np.ndarray
    cpu: np.ndarray
    size: np.ndarray
    unsupported: np.ndarray  # bool
    h_ptr: np.ndarray  # class -> hyperedges (CSR)
    h_idx: np.ndarray
    m_ptr: np.ndarray  # hyperedge -> member classes (CSR)
    m_idx: np.ndarray
    h_weight: np.ndarray

    @property
    def n(self) -> int:
        return len(self.acc)


def tensor_hyperedges(w: Workload, label: np.ndarray, counted: bool = False) -> list[tuple]:
    """Each tensor as a hyperedge over the labels (classes, DP items) of its producer and
    consumers, with its transfer cost: tensors over the same labels merged (first seen
    first), those within one label or costing nothing left out.  ``counted``: tensors that
    cost nothing kept too, each hyperedge as (labels, cost, number of tensors) -- a link's
    latency is paid per tensor."""
    members: dict[int, set[int]] = {}
    for s, d in zip(w.edge_src, w.edge_dst):
        members.setdefault(int(s), {int(label[s])}).add(int(label[d]))
    weight_of: dict[tuple[int, ...], list] = {}
    for u, labels in members.items():
        if len(labels) > 1 and (counted or w.out_cost[u] > 0):
            entry = weight_of.setdefault(tuple(sorted(labels)), [0.0, 0])
            entry[0] += float(w.out_cost[u])
            entry[1] += 1
    if counted:
        return [(key, wt, cnt) for key, (wt, cnt) in weight_of.items()]
    return [(key, wt) for key, (wt, _) in weight_of.items()]


def class_graph(workload: Workload) -> ClassGraph:
    w = workload
    label = w.color_class
    nc = int(label.max(initial=-1)) + 1

    def per_class(values: np.ndarray) -> np.ndarray:
        return np.bincount(label, weights=values, minlength=nc)

    hyper = tensor_hyperedges(w, label)
    incid: list[list[int]] = [[] for _ in range(nc)]
    for h, (cls, _) in enumerate(hyper):
        for c in cls:
            incid[c].append(h)
    return ClassGraph(
        label=label,
        acc=per_class(w.acc_latency),
        cpu=per_class(w.cpu_latency),
        size=per_class(w.size),
        unsupported=per_class((~w.supported).astype(np.float64)) > 0.5,
        h_ptr=np.concatenate([[0], np.cumsum([len(x) for x in incid])]).astype(np.int64),
        h_idx=np.array([h for x in incid for h in x], dtype=np.int64),
        m_ptr=np.concatenate([[0], np.cumsum([len(c) for c, _ in hyper])]).astype(np.int64),
        m_idx=np.array([c for cls, _ in hyper for c in cls], dtype=np.int64),
        h_weight=np.array([wt for _, wt in hyper], dtype=np.float64),
    )
