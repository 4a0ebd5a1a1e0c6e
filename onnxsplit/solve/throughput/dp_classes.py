"""The max-load DP over ideals with a stage's device class in its state: ``dp`` and
``dp_linear`` on a workload with several accelerator classes or priced links.

dp[f_0, .., f_C, c][I] = the best max load of covering ideal I with f_i devices of
accelerator class i and c CPU cores, each taking one difference J..I of a chain of ideals.
A stage on class i pays its own latencies and, for every tensor crossing its border, its
host link (``latency + scale * c(u)``): exact where transfers stage through host memory.
A peer link makes a transfer cheaper by who is on the other end, which a stage does not
know: the plan is then made with host prices and re-scored, and says so.

Write-up: docs/throughput.md (Several accelerator classes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numba import njit, objmode

from ... import interrupt, limits
from ...errors import SolveError, TooManyIdeals
from ...plan import Plan, gap_of
from ...workload import Workload
from .. import anytime, evaluate, preprocess
from ..classes import tensor_hyperedges
from . import lattice
from .bounds import classes_lower_bound, unit_times


@dataclass(frozen=True)
class ClassInstance:
    """Items (forward supernodes with their backward partners) as the DP sees them."""

    items: preprocess.Items
    lat: np.ndarray  # (class, item): accelerator classes, then the CPU last
    uns: np.ndarray  # (class, item): members that class cannot run
    mem: np.ndarray
    h_ptr: np.ndarray
    h_idx: np.ndarray
    h_size: np.ndarray
    h_weight: np.ndarray
    h_count: np.ndarray  # tensors per hyperedge (a link's latency is per tensor)

    @property
    def n(self) -> int:
        return self.items.n


def build_instance(w: Workload) -> ClassInstance:
    c = preprocess.for_dp(w)
    items = preprocess.dp_items(c)

    def ext(per_node: np.ndarray) -> np.ndarray:
        return items.per_item(c.total(per_node))

    hyper = tensor_hyperedges(w, items.of_super[c.group], counted=True)
    h_ptr, h_idx = items.incidence(hyper)
    classes = len(w.class_names)
    return ClassInstance(
        items=items,
        lat=np.array([ext(w.class_latency[i]) for i in range(classes)] + [ext(w.cpu_latency)]),
        uns=np.array([ext((~w.class_supported[i]).astype(np.float64)) for i in range(classes)]),
        mem=ext(w.size),
        h_ptr=h_ptr, h_idx=h_idx,
        h_size=np.array([len(labels) for labels, _, _ in hyper], dtype=np.int64),
        h_weight=np.array([wt for _, wt, _ in hyper], dtype=np.float64),
        h_count=np.array([cnt for _, _, cnt in hyper], dtype=np.float64),
    )


def _clock() -> float:
    interrupt.check()
    return time.perf_counter()


@njit(cache=True, nogil=True)
def _kernel(pre_lat, pre_uns, pre_mem, down_ptr, down_ideal, down_item, h_ptr, h_idx, h_size,
            h_weight, h_count, counts, host_scale, host_lat, memory, n_items, deadline):
    """dp[layer, ideal]; a layer is the device counts in mixed radix (classes, CPU last).
    kind: i + 1 = a stage on class i ends here, -(i + 1) = a device of class i left empty."""
    C1 = counts.shape[0]  # accelerator classes + the CPU
    stride = np.ones(C1 + 1, np.int64)
    for i in range(C1):
        stride[i + 1] = stride[i] * (counts[i] + 1)
    L = stride[C1]
    N = pre_mem.shape[0]
    INF = np.inf
    dp = np.full((L, N), INF)
    back = np.full((L, N), -1, np.int32)
    kind = np.zeros((L, N), np.int8)
    for layer in range(L):
        dp[layer, 0] = 0.0
    digit = np.zeros((L, C1), np.int64)
    for layer in range(L):
        for i in range(C1):
            digit[layer, i] = (layer // stride[i]) % (counts[i] + 1)
    cost = np.empty(C1)
    stamp = np.full(N, -1, np.int64)
    cnt = np.zeros(h_size.shape[0], np.int64)
    st_ideal = np.empty(n_items + 2, np.int64)
    st_ptr = np.empty(n_items + 2, np.int64)
    st_item = np.empty(n_items + 2, np.int64)
    steps = 0
    for I in range(1, N):
        stamp[I] = I
        comm = 0.0
        ncut = 0.0
        depth = 0
        st_ideal[0] = I
        st_ptr[0] = down_ptr[I]
        st_item[0] = -1
        while depth >= 0:
            steps += 1
            if (steps & 0xFFFF) == 0:
                with objmode(now="float64"):
                    now = _clock()
                if now > deadline:
                    return dp, back, kind, False
            J = st_ideal[depth]
            p = st_ptr[depth]
            if p < down_ptr[J + 1]:
                st_ptr[depth] = p + 1
                J2 = down_ideal[p]
                if stamp[J2] == I:
                    continue
                stamp[J2] = I
                v = down_item[p]
                for q in range(h_ptr[v], h_ptr[v + 1]):
                    h = h_idx[q]
                    cnt[h] += 1
                    if cnt[h] == 1:
                        comm += h_weight[h]
                        ncut += h_count[h]
                    elif cnt[h] == h_size[h]:
                        comm -= h_weight[h]
                        ncut -= h_count[h]
                for i in range(C1):
                    cost[i] = INF
                    if counts[i] == 0:
                        continue
                    work = pre_lat[i, I] - pre_lat[i, J2]
                    if i == C1 - 1:
                        cost[i] = work
                    elif pre_uns[i, I] - pre_uns[i, J2] < 0.5 and pre_mem[I] - pre_mem[J2] <= memory[i]:
                        cost[i] = work + host_lat[i] * ncut + host_scale[i] * comm
                for layer in range(L):
                    for i in range(C1):
                        if digit[layer, i] >= 1 and cost[i] < INF:
                            cand = max(dp[layer - stride[i], J2], cost[i])
                            if cand < dp[layer, I]:
                                dp[layer, I] = cand
                                back[layer, I] = J2
                                kind[layer, I] = i + 1
                depth += 1
                st_ideal[depth] = J2
                st_ptr[depth] = down_ptr[J2]
                st_item[depth] = v
            else:
                v = st_item[depth]
                if v >= 0:
                    for q in range(h_ptr[v], h_ptr[v + 1]):
                        h = h_idx[q]
                        if cnt[h] == h_size[h]:
                            comm += h_weight[h]
                            ncut += h_count[h]
                        elif cnt[h] == 1:
                            comm -= h_weight[h]
                            ncut -= h_count[h]
                        cnt[h] -= 1
                depth -= 1
        for layer in range(L):
            for i in range(C1):
                if digit[layer, i] >= 1 and dp[layer - stride[i], I] < dp[layer, I]:
                    dp[layer, I] = dp[layer - stride[i], I]
                    back[layer, I] = I
                    kind[layer, I] = -(i + 1)
    return dp, back, kind, True


def run(w: Workload, inst: ClassInstance, lat: lattice.Lattice, deadline: float = np.inf):
    """(value, parts as (class index or -1 for the CPU, items) in pipeline order), or None
    when ``deadline`` passes first."""
    counts = np.array([min(c, inst.n) for c in w.class_counts] + [min(w.num_cpus, inst.n)], dtype=np.int64)
    layers = int(np.prod(counts + 1))
    limits.need(13.0 * layers * lat.size, f"the DP's table ({lat.size:,} ideals, {layers:,} device mixes)")
    pre_lat = np.array([lat.prefix_sums(row) for row in inst.lat])
    pre_uns = np.array([lat.prefix_sums(row) for row in inst.uns]).reshape(len(inst.uns), lat.size)
    dp, back, kind, done = _kernel(pre_lat, pre_uns, lat.prefix_sums(inst.mem), lat.down_ptr, lat.down_ideal,
                                   lat.down_item, inst.h_ptr, inst.h_idx, inst.h_size, inst.h_weight,
                                   inst.h_count, counts, w.host_links[:, 0].copy(), w.host_links[:, 1].copy(),
                                   w.class_memory * (1 + 1e-12), inst.n, float(deadline))
    if not done:
        return None
    top = layers - 1
    value = float(dp[top, lat.full])
    if not np.isfinite(value):
        return value, []
    stride = np.cumprod(np.concatenate([[1], counts + 1]))
    parts, layer, ideal = [], top, lat.full
    while ideal != 0:
        kd, prev = int(kind[layer, ideal]), int(back[layer, ideal])
        if kd == 0:
            raise SolveError("internal error: broken DP back-link")
        i = abs(kd) - 1
        if kd > 0:
            diff = lat.masks[ideal] & ~lat.masks[prev]
            parts.append((i if i < len(counts) - 1 else -1, [b for b in range(inst.n) if diff >> b & 1]))
            ideal = prev
        layer -= int(stride[i])
    parts.reverse()
    return value, parts


def assignment_of(w: Workload, inst: ClassInstance, parts) -> tuple[dict[int, str], list[str]]:
    """node id -> device for the DP's parts, devices of each class taken in order."""
    first = np.concatenate([[0], np.cumsum(w.class_counts)])
    used = [0] * (len(w.class_names) + 1)
    assignment, stages = {}, []
    for cls, items in parts:
        slot = cls if cls >= 0 else len(w.class_names)
        index = (int(first[cls]) if cls >= 0 else w.accelerators_total) + used[slot]
        used[slot] += 1
        name = w.devices[index].name
        stages.append(name)
        for it in items:
            for nodes in inst.items.nodes(it):
                assignment.update((int(i), name) for i in w.ids[nodes])
    return assignment, stages


def solve(w: Workload, linear_only: bool = False, ideal_limit: int = lattice.DEFAULT_IDEAL_LIMIT,
          time_limit: float | None = None) -> Plan:
    """The DP on a few topological orders (``dp_linear``), then on every ideal (``dp``)."""
    start = time.perf_counter()
    deadline = start + time_limit if time_limit else np.inf
    method = "dp_linear" if linear_only else "dp"
    inst = build_instance(w)
    best = None
    timed_out = False
    for order in lattice.topological_orders(inst.items.preds, inst.items.succs, inst.lat[0]):
        res = run(w, inst, lattice.chain(order), deadline)
        if res is None:
            timed_out = True
            break
        if best is None or res[0] < best[0]:
            best = res
            if np.isfinite(res[0]):
                anytime.offer(assignment_of(w, inst, res[1])[0], "a linearized DP order")
    details: dict = {"device_classes": list(w.class_names)}
    proven = False
    if not linear_only and not timed_out:
        try:
            lat = lattice.enumerate_ideals(inst.items.preds, inst.items.succs, limit=ideal_limit, deadline=deadline)
        except TooManyIdeals as e:  # the linearized plan stands
            lat, details["stopped"] = None, str(e)
        full = run(w, inst, lat, deadline) if lat is not None else None
        if lat is not None:
            details["ideals"] = lat.size
        if full is None and lat is not None:
            timed_out = True
        elif full is not None:
            proven = True
            if best is None or full[0] <= best[0]:
                best = full
    if best is None or not np.isfinite(best[0]):
        status = "infeasible" if (proven or (linear_only and best is not None)) else "time_limit"
        return Plan("throughput", method, status, None, {}, seconds=time.perf_counter() - start, details=details)
    assignment, stages = assignment_of(w, inst, best[1])
    scored = evaluate.max_load(w, assignment).value
    problems = evaluate.check(w, assignment, contiguity="ideal_chain")
    if problems:
        raise SolveError("internal error: DP plan is invalid: " + problems[0])
    if w.peer_links:
        details["peer_links"] = ("planned with transfers staged through host memory (a stage does not "
                                 "know its neighbours' classes); re-scored with the peer links")
    elif lattice.disagrees(best[0], scored, inst.n, inst.lat, inst.h_weight * float(w.host_links[:, 0].max()),
                           inst.h_count * float(w.host_links[:, 1].max())):
        raise SolveError(f"internal error: DP value {best[0]} but the evaluator scores the plan {scored}")
    exact = proven and not w.peer_links
    status = "optimal" if exact else ("time_limit" if timed_out else "feasible")
    if exact:
        bound = scored
    else:  # (only what holds for every plan, contiguous or not)
        label = w.color_class
        bound = min(scored, classes_lower_bound(unit_times(w, label, int(label.max(initial=-1)) + 1))) or None
    return Plan("throughput", method, status, scored, assignment, lower_bound=bound, gap=gap_of(scored, bound),
                seconds=time.perf_counter() - start, stages=stages,
                details={**details, "contiguous": True, "dp_value": best[0]})
