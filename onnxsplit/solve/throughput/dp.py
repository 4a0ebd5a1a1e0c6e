"""Exact max-load DP over ideals (Tarnawski et al., Section 4) for contiguous pipelines:
the ``dp`` and ``dp_linear`` methods.

dp[c][f][I] = the best max load of covering ideal I with c CPU cores and f accelerators,
each taking one difference J..I of a chain of ideals (plus the backward partners of those
forward nodes); the answer is dp[l][k][V].  ``dp_linear`` runs it on the chains of a few
topological orders.  It is fast without changing the optimum: a part's cost is kept up
to date as a hypergraph cut while a walk grows the part, pairs are pruned by the
linearized upper bound, and only ideals whose latency fits the devices around them are
kept.  Every plan is re-scored by :mod:`onnxsplit.solve.evaluate`.

Write-up: docs/throughput.md (dp, dp_linear).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass

import numpy as np
from numba import njit, objmode
from numba.core.errors import NumbaWarning

from ... import interrupt, limits
from ...errors import SolveError, TooManyIdeals
from ...plan import Plan, gap_of
from ...workload import Workload
from .. import anytime, evaluate, preprocess
from ..classes import tensor_hyperedges
from . import dp_classes, lattice
from .bounds import max_load_lower_bound

# the kernel runs without the GIL (the main thread keeps watching for Ctrl-C) and takes it
# back to read the clock: numba warns that such code cannot run in parallel, which it never does
warnings.filterwarnings("ignore", message="Code running in object mode won't allow parallel",
                        category=NumbaWarning)

# back-link kinds
_NONE, _ACC, _CPU, _SKIP_ACC, _SKIP_CPU = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class DPInstance:
    """The preprocessed workload as the DP sees it: items (forward supernodes) and hyperedges."""

    items: preprocess.Items
    acc: np.ndarray  # extended (forward + backward partner) accelerator latency
    cpu: np.ndarray
    mem: np.ndarray
    unsupported: np.ndarray
    h_ptr: np.ndarray  # item -> hyperedges containing it (CSR)
    h_idx: np.ndarray
    h_size: np.ndarray
    h_weight: np.ndarray

    @property
    def n(self) -> int:
        return self.items.n

    @property
    def contracted(self) -> preprocess.Contracted:
        return self.items.contracted

    @property
    def preds(self) -> list[list[int]]:
        return self.items.preds

    @property
    def succs(self) -> list[list[int]]:
        return self.items.succs


def build_instance(workload: Workload, like_reference: bool = False) -> DPInstance:
    c = preprocess.for_dp(workload, like_reference=like_reference)
    items = preprocess.dp_items(c)
    # hyperedges: each original tensor u touches the items of u and of its consumers
    hyper = tensor_hyperedges(workload, items.of_super[c.group])
    h_ptr, h_idx = items.incidence(hyper)
    return DPInstance(
        items=items,
        acc=items.per_item(c.acc_latency),
        cpu=items.per_item(c.cpu_latency),
        mem=items.per_item(c.mem_size),
        unsupported=items.per_item(c.unsupported.astype(np.float64)),
        h_ptr=h_ptr,
        h_idx=h_idx,
        h_size=np.array([len(labels) for labels, _ in hyper], dtype=np.int64),
        h_weight=np.array([wt for _, wt in hyper], dtype=np.float64),
    )


@dataclass
class DPResult:
    value: float
    parts: list[tuple[str, list[int]]]  # (kind "acc"/"cpu", items) in pipeline order
    ideals: int
    pairs: int  # ideal pairs whose cost was evaluated


def run(inst: DPInstance, lat: lattice.Lattice, k: int, l: int, memory: float,
        upper_bound: float = np.inf, deadline: float = np.inf) -> DPResult | None:
    """The DP on one lattice (all ideals, or one chain), pruned by ``upper_bound``.

    None when ``deadline`` (a time.perf_counter() value) passes first.  More devices than
    items are never used: ``k`` and ``l`` are clamped to the items (exact), and the tables
    must fit the memory limit."""
    k, l = min(k, inst.n), min(l, inst.n)
    limits.need(table_bytes(k, l, lat.size), f"the DP's table ({lat.size:,} ideals, {k + l} devices)")
    pre_acc = lat.prefix_sums(inst.acc)
    pre_cpu = lat.prefix_sums(inst.cpu)
    pre_mem = lat.prefix_sums(inst.mem)
    pre_uns = lat.prefix_sums(inst.unsupported)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(inst.cpu > 0, inst.acc / np.where(inst.cpu > 0, inst.cpu, 1.0),
                         np.where(inst.acc > 0, np.inf, 0.0))
    rho = float(ratio.max(initial=0.0))
    dp, back, kind, pairs = _dp_kernel(pre_acc, pre_cpu, pre_mem, pre_uns, lat.down_ptr, lat.down_ideal,
                                       lat.down_item, inst.h_ptr, inst.h_idx, inst.h_size, inst.h_weight,
                                       k, l, float(memory), float(upper_bound), rho, inst.n, float(deadline))
    if pairs < 0:
        return None
    top = l * (k + 1) + k
    value = float(dp[top, lat.full])
    if not np.isfinite(value):
        return DPResult(np.inf, [], lat.size, int(pairs))
    parts: list[tuple[str, list[int]]] = []
    c, f, ideal = l, k, lat.full
    while ideal != 0:
        layer = c * (k + 1) + f
        kd, prev = int(kind[layer, ideal]), int(back[layer, ideal])
        if kd in (_ACC, _CPU):
            diff = lat.masks[ideal] & ~lat.masks[prev]
            parts.append(("acc" if kd == _ACC else "cpu", _bits(diff)))
            ideal = prev
        if kd in (_ACC, _SKIP_ACC):
            f -= 1
        elif kd in (_CPU, _SKIP_CPU):
            c -= 1
        else:
            raise SolveError("internal error: broken DP back-link")
    parts.reverse()
    return DPResult(value, parts, lat.size, int(pairs))


def _bits(mask: int) -> list[int]:
    out, i = [], 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return out


def _clock() -> float:
    interrupt.check()
    return time.perf_counter()


@njit(cache=True, inline="always", nogil=True)
def _capacity(n_acc, n_cpu, ub_eff, cpu_cap):
    """Most accelerator latency that n_acc accelerators and n_cpu cores can hold at <= UB."""
    total = 0.0
    if n_acc > 0:
        total += n_acc * ub_eff
    if n_cpu > 0:
        total += n_cpu * cpu_cap
    return total


@njit(cache=True, nogil=True)
def _dp_kernel(pre_acc, pre_cpu, pre_mem, pre_uns, down_ptr, down_ideal, down_item,
               h_ptr, h_idx, h_size, h_weight, k, l, memory, ub, rho, n_items, deadline):
    N = pre_acc.shape[0]
    K1 = k + 1
    L = K1 * (l + 1)
    INF = np.inf
    dp = np.full((L, N), INF)
    back = np.full((L, N), -1, np.int32)
    kind = np.zeros((L, N), np.int8)
    for layer in range(L):
        dp[layer, 0] = 0.0
    slack = 1.0 + 1e-9
    ub_eff = ub * slack + 1e-12
    cpu_cap = rho * ub_eff if rho > 0 else 0.0
    total = pre_acc[N - 1]
    mem_eff = memory * (1.0 + 1e-12)
    stamp = np.full(N, -1, np.int64)
    cnt = np.zeros(h_size.shape[0], np.int64)
    st_ideal = np.empty(n_items + 2, np.int64)
    st_ptr = np.empty(n_items + 2, np.int64)
    st_item = np.empty(n_items + 2, np.int64)
    useful = np.zeros(L, np.bool_)
    active = np.empty(L, np.int64)  # the useful layers of the current ideal, in order
    pairs = 0
    steps = 0  # of the walk, pruned ones included: the clock is read every 2**22
    for I in range(1, N):
        a_i = pre_acc[I]
        any_useful = False
        lo_j = INF  # smallest accelerator latency a useful sub-ideal can have
        for c in range(l + 1):
            for f in range(K1):
                ok = a_i <= _capacity(f, c, ub_eff, cpu_cap) * slack and \
                    total - a_i <= _capacity(k - f, l - c, ub_eff, cpu_cap) * slack
                useful[c * K1 + f] = ok
                if ok:
                    any_useful = True
                    if f >= 1:
                        lo_j = min(lo_j, total - _capacity(k - f + 1, l - c, ub_eff, cpu_cap) * slack)
                    if c >= 1:
                        lo_j = min(lo_j, total - _capacity(k - f, l - c + 1, ub_eff, cpu_cap) * slack)
        if not any_useful:
            continue
        n_active = 0
        for layer in range(L):
            if useful[layer]:
                active[n_active] = layer
                n_active += 1
        # depth-first walk over the sub-ideals J of I, growing S = I \ J
        stamp[I] = I
        comm = 0.0
        depth = 0
        st_ideal[0] = I
        st_ptr[0] = down_ptr[I]
        st_item[0] = -1
        while depth >= 0:
            steps += 1
            if (steps & 0x3FFFFF) == 0:  # the clock, and Ctrl-C (raises Interrupted)
                with objmode(now="float64"):
                    now = _clock()
                if now > deadline:
                    return dp, back, kind, -1
            J = st_ideal[depth]
            p = st_ptr[depth]
            if p < down_ptr[J + 1]:
                st_ptr[depth] = p + 1
                J2 = down_ideal[p]
                if stamp[J2] == I:
                    continue
                stamp[J2] = I
                a_s = a_i - pre_acc[J2]
                c_s = pre_cpu[I] - pre_cpu[J2]
                acc_ok = k > 0 and a_s <= ub_eff and pre_uns[I] - pre_uns[J2] < 0.5 and \
                    pre_mem[I] - pre_mem[J2] <= mem_eff
                cpu_ok = l > 0 and c_s <= ub_eff
                if not (acc_ok or cpu_ok):
                    continue
                if pre_acc[J2] < lo_j:
                    continue
                v = down_item[p]
                for q in range(h_ptr[v], h_ptr[v + 1]):
                    h = h_idx[q]
                    cnt[h] += 1
                    if cnt[h] == 1:
                        comm += h_weight[h]
                    elif cnt[h] == h_size[h]:
                        comm -= h_weight[h]
                pairs += 1
                acc_cost = a_s + comm if acc_ok else INF
                if acc_cost > ub_eff:
                    acc_cost = INF
                cpu_cost = c_s if cpu_ok else INF
                for a in range(n_active):
                    layer = active[a]
                    c = layer // K1
                    f = layer - c * K1
                    if f >= 1 and acc_cost < INF:
                        cand = max(dp[layer - 1, J2], acc_cost)
                        if cand < dp[layer, I]:
                            dp[layer, I] = cand
                            back[layer, I] = J2
                            kind[layer, I] = 1
                    if c >= 1 and cpu_cost < INF:
                        cand = max(dp[layer - K1, J2], cpu_cost)
                        if cand < dp[layer, I]:
                            dp[layer, I] = cand
                            back[layer, I] = J2
                            kind[layer, I] = 2
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
                        elif cnt[h] == 1:
                            comm -= h_weight[h]
                        cnt[h] -= 1
                depth -= 1
        # leaving a device empty
        for c in range(l + 1):
            for f in range(K1):
                layer = c * K1 + f
                if not useful[layer]:
                    continue
                if f >= 1 and dp[layer - 1, I] < dp[layer, I]:
                    dp[layer, I] = dp[layer - 1, I]
                    back[layer, I] = I
                    kind[layer, I] = 3
                if c >= 1 and dp[layer - K1, I] < dp[layer, I]:
                    dp[layer, I] = dp[layer - K1, I]
                    back[layer, I] = I
                    kind[layer, I] = 4
    return dp, back, kind, pairs


# ---- from DP result to Plan -----------------------------------------------------------------

COARSE_ABOVE = 4_000  # items: beyond, a first plan comes from the order cut into blocks
COARSE_BLOCKS = 1_500


def coarse_plan(workload: Workload, inst: DPInstance, order: list[int], deadline: float) -> dict[int, str] | None:
    """A first plan in a second where one order's DP takes a minute (30,000 nodes): the
    order cut into COARSE_BLOCKS runs of equal accelerator time, each run one colour
    class (a run of a topological order is convex), the linearized DP on those; offered to
    the time limit's watch.  None where it breaks a constraint of the original (a shared
    weight's readers in two runs)."""
    total = float(inst.acc.sum())
    step = total / COARSE_BLOCKS if total > 0 else 1.0
    block_of_node = np.zeros(workload.n, dtype=np.int64)
    acc_sum, block = 0.0, 0
    for it in order:
        if acc_sum >= step * (block + 1) and block < COARSE_BLOCKS - 1:
            block += 1
        acc_sum += float(inst.acc[it])
        for nodes in inst.items.nodes(it):
            block_of_node[nodes] = block
    nodes = tuple(dataclasses.replace(nd, color_class=int(b)) for nd, b in zip(workload.nodes, block_of_node))
    left = deadline - time.perf_counter()
    plan = solve(workload.replace(nodes=nodes), linear_only=True, time_limit=max(1.0, min(left, 30.0)))
    if plan.value is None or evaluate.check(workload, plan.assignment, contiguity="ideal_chain"):
        return None
    anytime.offer(plan.assignment, f"one order in {COARSE_BLOCKS} blocks")
    return plan.assignment


EXACT_IDEAL_BUDGET = 150_000  # beyond this, retry with the reference's (smaller) lattice


def solve(workload: Workload, linear_only: bool = False,
          ideal_limit: int = lattice.DEFAULT_IDEAL_LIMIT, time_limit: float | None = None) -> Plan:
    """Max-load DP over ideals (or over one topological order, ``linear_only``).

    The exact preprocessing keeps zero-latency nodes that hold memory apart (merging them
    could cost the optimum).  Where that leaves more than EXACT_IDEAL_BUDGET ideals (memory
    binds and such nodes abound), the DP runs on the reference's preprocessing instead:
    the plan is the optimum under that restriction, reported as "feasible", not "optimal".
    With ``time_limit`` (seconds), a DP that runs out of time returns the linearized plan
    with status "time_limit".
    """
    if workload.multi_class:
        return dp_classes.solve(workload, linear_only, ideal_limit, time_limit)
    start = time.perf_counter()
    deadline = start + time_limit if time_limit else np.inf
    inst = build_instance(workload)
    k, l = min(workload.num_accelerators, inst.n), min(workload.num_cpus, inst.n)  # as run() does
    mem = workload.accelerator_memory
    method = "dp_linear" if linear_only else "dp"
    best: DPResult | None = None
    timed_out = False
    coarse = None
    for order in lattice.topological_orders(inst.preds, inst.succs, inst.acc):
        if coarse is None and inst.n > COARSE_ABOVE and not workload.is_training:
            coarse = coarse_plan(workload, inst, order, deadline) or {}
        res = run(inst, lattice.chain(order), k, l, mem, deadline=deadline)
        if res is None:  # out of time: the best order so far stands
            timed_out = True
            break
        if best is None or res.value < best.value:
            best = res
            if np.isfinite(res.value):  # in hand should the method be stopped (anytime.py)
                anytime.offer(plan_assignment(workload, inst, res.parts)[0], "a linearized DP order")
    details: dict = {}
    if best is None and coarse:  # the fine orders ran out of time: the blocks' plan stands
        value = evaluate.max_load(workload, coarse).value
        bound = min(value, max_load_lower_bound(workload, packing=False))
        return Plan("throughput", method, "time_limit", value, coarse, lower_bound=bound or None,
                    gap=gap_of(value, bound or None), seconds=time.perf_counter() - start,
                    details={"stopped": f"ran out of time ({time_limit:g} s) in the first order; this is "
                                        f"the order cut into {COARSE_BLOCKS} blocks", "contiguous": True})
    if best is None:
        details["stopped"] = f"ran out of time ({time_limit:g} s) before the first plan"
        return Plan("throughput", method, "time_limit", None, {}, seconds=time.perf_counter() - start,
                    details=details)
    ub = best.value
    details["linearized_value"] = ub if np.isfinite(ub) else None
    like_reference = False
    lat = None
    best_inst = inst  # the instance whose items best.parts lists
    if not linear_only and not timed_out:
        lat, inst, like_reference, why = _lattice(workload, inst, k, l, ideal_limit, deadline)
        if lat is None:
            like_reference = False
            timed_out = why is None
            details["stopped"] = (f"the exact DP ran out of time ({time_limit:g} s)" if timed_out
                                  else why) + "; this is the linearized plan"
    if lat is not None:
        full = run(inst, lat, k, l, mem, upper_bound=ub, deadline=deadline)
        details["ideals"] = lat.size
        if full is None:
            timed_out = True
            details["stopped"] = f"the exact DP ran out of time ({time_limit:g} s); this is the linearized plan"
        else:
            if full.value <= ub or not np.isfinite(ub):
                best, best_inst = full, inst
            details["pairs_evaluated"] = full.pairs
    if like_reference:
        details["preprocessing"] = ("reference: zero-latency nodes holding memory merged into their neighbour "
                                    "(the exact lattice has too many ideals); optimal under that restriction only")
    proven = lat is not None and not like_reference and not timed_out
    if not np.isfinite(best.value):
        # no plan: infeasible when the search was complete (dp_linear: along its orders)
        status = "infeasible" if (proven or linear_only) and not timed_out else "time_limit"
        return Plan("throughput", method, status, None, {}, seconds=time.perf_counter() - start, details=details)
    assignment, stages = plan_assignment(workload, best_inst, best.parts)
    scored = evaluate.max_load(workload, assignment).value
    if lattice.disagrees(best.value, scored, best_inst.n, best_inst.acc, best_inst.cpu, best_inst.h_weight):
        raise SolveError(f"internal error: DP value {best.value} but the evaluator scores the plan {scored}")
    problems = evaluate.check(workload, assignment, contiguity="ideal_chain")
    if problems:
        raise SolveError("internal error: DP plan is invalid: " + problems[0])
    status = "optimal" if proven else ("time_limit" if timed_out else "feasible")
    # the packing search takes seconds on 30,000 nodes: once the time is up, the split bound alone
    bound = scored if proven else min(scored, max_load_lower_bound(workload, packing=not timed_out))
    return Plan("throughput", method, status, scored, assignment,
                lower_bound=bound, gap=gap_of(scored, bound),
                seconds=time.perf_counter() - start, stages=stages,
                details={**details, "contiguous": True, "dp_value": best.value})


def table_bytes(k: int, l: int, ideals: int) -> float:
    """The DP's tables: value (8 bytes), back-link (4) and kind (1) per layer and ideal."""
    return 13.0 * (k + 1) * (l + 1) * ideals


def _lattice(workload: Workload, inst: DPInstance, k: int, l: int, ideal_limit: int, deadline: float):
    """(lattice, instance, like_reference, why not) for the exact DP: the exact
    preprocessing's lattice, else the reference's, within ``ideal_limit`` ideals, the
    memory limit (the lattice and the DP's tables) and ``deadline``.  Without a lattice,
    ``why not`` says why (None: out of time)."""
    # the DP's tables come after the lattice: each ideal's share is held back for them
    budget = limits.limit_bytes()
    fit = int(budget // table_bytes(k, l, 1))
    for like_reference, most in ((False, EXACT_IDEAL_BUDGET), (True, ideal_limit)):
        if like_reference:
            inst = build_instance(workload, like_reference=True)
        most = min(ideal_limit, most)
        try:
            lat = lattice.enumerate_ideals(inst.preds, inst.succs, limit=min(most, fit), deadline=deadline,
                                           max_bytes=budget - table_bytes(k, l, min(most, fit)))
        except TooManyIdeals as e:
            why = str(e).split(": too many")[0]
            if fit < most:
                why += f" (the DP's tables for more would not fit the memory limit, {budget / 1e9:.1f} GB)"
            continue
        if lat is None:
            return None, inst, like_reference, None
        return lat, inst, like_reference, ""
    return None, inst, True, why


def plan_assignment(workload: Workload, inst: DPInstance, parts) -> tuple[dict[int, str], list[str]]:
    counters = {"acc": 0, "cpu": 0}
    assignment: dict[int, str] = {}
    stages = []
    for kind_name, items in parts:
        name = f"{kind_name}{counters[kind_name]}"
        counters[kind_name] += 1
        stages.append(name)
        for it in items:
            for nodes in inst.items.nodes(it):
                assignment.update((int(i), name) for i in workload.ids[nodes])
    return assignment, stages
