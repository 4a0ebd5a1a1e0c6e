"""The paper's latency integer program: min single-stream latency with up to ``pieces``
contiguous calls per accelerator (python-mip, HiGHS by default).

Its phases: the bound composed along cut vertices (:mod:`.bound_series`); the path
bound (:mod:`.bounds`); the program built and solved from the warm start; the plan read
back and re-scored by the evaluator.  Write-up: docs/latency.md.
"""

from __future__ import annotations

import time

import mip
import numpy as np

from ...errors import OnnxsplitError
from ...plan import Plan, gap_of
from ...workload import Workload
from .. import anytime, evaluate
from ..finish import status_label
from ..milp import finite, new_model, optimize
from .bound_series import series_lower_bound, series_parts
from .bounds import cheapest_latency, latency_lower_bound, latency_upper_bound, longest_paths, runs_nowhere
from .cpsat import available as cp_sat_available


PATH_BOUND_SHARE = 0.25  # of the latency IP's time left, at most, for the path bound's cuts

HULL_BOUND_SHARE = 0.05  # of it, at most, for the path bound without its call cuts (first: quick)


SERIES_BOUND_SHARE = 0.6  # of the latency IP's time left, for the composed bound (before the path bound)


def solve_latency(w: Workload, *, pieces: int = 1, time_limit: float = 60.0, solver: str = "highs",
                  warm_start: dict[int, str] | None = None, gap: float = 0.01,
                  verbose: bool = False, series_bound: bool = True) -> Plan:
    """Min single-stream latency with up to ``pieces`` contiguous calls per accelerator,
    in phases that share ``time_limit``:

    1. the known plans: all on the CPUs, or the warm start (its latency is the big-M);
    2. the bounds that take a moment on any graph: the critical path (each node at its
       cheapest device), then the path bound's hull cuts (each call holds what lies
       between its ends on a path: HULL_BOUND_SHARE of the time left at most);
    3. with one call per accelerator (and ``series_bound``), the bound composed along the
       cut vertices (:mod:`.bound_series`, SERIES_BOUND_SHARE of the time left);
    4. the path bound with its call cuts (:func:`.bounds.latency_lower_bound`, at most
       PATH_BOUND_SHARE of the time left): it sees the memory limit forcing layers apart,
       which the LP relaxation does not;
    5. the program (:func:`_program`), solved for the time left and read back
       (:func:`_read_plan`).

    Each bound is offered to the anytime watch as it is proven (a plan stopped at the
    limit carries the best of them), and a warm start they prove within ``gap`` is
    returned as it is.
    """
    if pieces < 1:
        raise OnnxsplitError("--pieces must be at least 1")
    start_time = time.perf_counter()

    if (why := runs_nowhere(w)) is not None:
        return Plan("latency", "ip", "infeasible", None, {}, seconds=time.perf_counter() - start_time,
                    details={"why": why})
    ub, start_plan = latency_upper_bound(w, warm_start, pieces)
    cheapest = cheapest_latency(w)
    # head[v]: longest path into v (inclusive), each node at its cheapest latency.  v cannot
    # finish before it (a call's finish includes all its work, and its inputs come first);
    # it bounds lat[v] below and shrinks the big-M of "v finishes with its call".  (No
    # tail bound: lat[v] is its call's finish, which may already include v's successors.)
    head = longest_paths(w, cheapest)[0]
    longest = float(head.max(initial=0.0))  # the critical path at each node's cheapest latency
    floor = longest
    details = {"solver": solver, "pieces_per_accelerator": pieces, "big_m": ub}

    def proven_start():
        """The warm start, where the bounds so far prove it within the gap; else None."""
        if start_plan is None or gap_of(ub, floor) is None or gap_of(ub, floor) > gap:
            return None
        a, pc = start_plan
        value = evaluate.latency(w, a, pc).value
        lb = min(floor, value)
        g = gap_of(value, lb)
        return Plan("latency", "ip", status_label(True, g), value, a, lower_bound=lb, gap=g,
                    seconds=time.perf_counter() - start_time, pieces=pc, details=details)

    anytime.prove(floor)
    if (plan := proven_start()) is not None:
        return plan
    path = longest
    if not w.multi_class:  # (the path bound's cuts read one accelerator class)
        left = time_limit - (time.perf_counter() - start_time)
        path = max(path, latency_lower_bound(w, pieces, seconds=HULL_BOUND_SHARE * left, call_cuts=False))
        details["path_bound"] = path
        floor = max(floor, path)
        anytime.prove(floor)
        if (plan := proven_start()) is not None:
            return plan
    # the bound composed along cut vertices sees parallel branches competing for the
    # accelerators, which neither the path bound nor the program's relaxation does: where
    # it applies it goes first, with SERIES_BOUND_SHARE of the time left (after the path
    # bound, whose cuts overran their share on 10,000 nodes, it was starved: 28% gap at
    # 60 s where it alone proves 1.9% in 20 s)
    found = series_parts(w) if series_bound and pieces == 1 and cp_sat_available() and not w.multi_class else None
    if found:
        left = time_limit - (time.perf_counter() - start_time)
        composed = series_lower_bound(found[0], time.perf_counter() + SERIES_BOUND_SHARE * left, ub * (1 - gap),
                                      found[1])
        details["series_bound"] = float(composed) if composed is not None else None
        floor = max(floor, composed or 0.0)
        anytime.prove(floor)
        if (plan := proven_start()) is not None:
            return plan
    # the LP relaxation does not see the memory limit forcing layers apart; the best cut
    # of a few heavy paths does (bounds.py), and bounds the objective from below
    path_seconds = PATH_BOUND_SHARE * max(0.0, time_limit - (time.perf_counter() - start_time))
    if not w.multi_class:
        path = max(path, latency_lower_bound(w, pieces, seconds=path_seconds))
    details["path_bound"] = path
    floor = max(floor, path)
    anytime.prove(floor)
    if (plan := proven_start()) is not None:
        return plan
    model, x = _program(w, pieces, ub, floor, head, start_plan, solver, gap, verbose)
    status = optimize(model, max(min(1.0, time_limit), time_limit - (time.perf_counter() - start_time)))
    return _read_plan(w, model, x, status, floor, start_plan, details, time.perf_counter() - start_time)


CPU_SLOT = (-1, 0)  # the slot of a node on the CPUs (the latency model's CPUs are one pool)


def _program(w: Workload, pieces: int, ub: float, floor: float, head: np.ndarray, start_plan, solver: str,
             gap: float, verbose: bool):
    """(the latency program, its x[v, slot] variables): x[v, s] puts node v in slot s (the
    CPUs, or piece p of accelerator d); each piece convex; a piece starts once every tensor
    it receives is ready, then computes, receives and sends; pieces of one accelerator run
    one after another; identical accelerators (one class) ordered by their first piece's
    first node.  The big-M is ``ub``, the best latency known; T starts at ``floor``;
    warm-started from ``start_plan``.  Transfers are priced by :func:`_transfer_terms`."""
    k, l, n = w.accelerators_total, w.num_cpus, w.n
    edges = list(zip(w.edge_src.tolist(), w.edge_dst.tolist()))
    model = new_model(solver, gap, verbose)
    slots = [(d, p) for d in range(k) for p in range(pieces)]
    CPU = CPU_SLOT
    dclass = w.device_class
    x: dict[tuple[int, tuple[int, int]], mip.Var] = {}
    for v in range(n):
        if l > 0:
            x[v, CPU] = model.add_var(var_type=mip.BINARY)
        for s in slots:
            if w.class_supported[dclass[s[0]], v]:
                x[v, s] = model.add_var(var_type=mip.BINARY)
    for v in range(n):
        model += mip.xsum(x[v, s] for s in [CPU] + slots if (v, s) in x) == 1
    # colour classes: one device for the whole class (its pieces may differ)
    first_of: dict[int, int] = {}
    for v in range(n):
        c = int(w.color_class[v])
        if c not in first_of:
            first_of[c] = v
            continue
        u = first_of[c]
        if l > 0:
            model += x[v, CPU] == x[u, CPU]
        for d in range(k):
            on_v = [x[v, (d, p)] for p in range(pieces) if (v, (d, p)) in x]
            on_u = [x[u, (d, p)] for p in range(pieces) if (u, (d, p)) in x]
            model += mip.xsum(on_v) == mip.xsum(on_u)
    for d in range(k):
        model += mip.xsum(w.size[v] * x[v, (d, p)] for v in range(n) for p in range(pieces)
                          if (v, (d, p)) in x) <= float(w.class_memory[dclass[d]])

    def xs(v, s):
        return x.get((v, s), 0)

    lat = [model.add_var(lb=float(head[v]), ub=max(float(head[v]), ub)) for v in range(n)]
    st = {s: model.add_var(lb=0.0, ub=ub) for s in slots}
    fin = {s: model.add_var(lb=0.0, ub=ub) for s in slots}
    senders = sorted({u for u, _ in edges})
    on_device = {}  # (v, d) -> v is on accelerator d (any piece), for the peer links
    if w.peer_links:
        on_device = {(v, d): mip.xsum(x[v, (d, p)] for p in range(pieces) if (v, (d, p)) in x)
                     for v in range(n) for d in range(k)}
    for s in slots:
        on_slot = [v for v in range(n) if (v, s) in x]
        z = {v: model.add_var(lb=0.0, ub=1.0) for v in range(n)}
        for v in on_slot:
            model += z[v] >= x[v, s]
        cin = {u: model.add_var(lb=0.0, ub=1.0) for u in senders}
        cout = {u: model.add_var(lb=0.0, ub=1.0) for u in senders}
        for u, t in edges:
            model += z[t] <= z[u]
            if (t, s) in x:
                model += z[t] <= xs(t, s) - xs(u, s) + 1
            if (t, s) in x:
                model += cin[u] >= xs(t, s) - xs(u, s)
            if (u, s) in x:
                model += cout[u] >= xs(u, s) - xs(t, s)
        for u in senders:
            model += st[s] >= lat[u] - (1 - cin[u]) * ub
        work = mip.xsum(float(w.class_latency[dclass[s[0]], v]) * x[v, s] for v in on_slot)
        comm = _transfer_terms(w, model, s, senders, cin, cout, x, on_device)
        model += fin[s] == st[s] + work + comm
        for v in on_slot:
            model += lat[v] >= fin[s] - (1 - x[v, s]) * max(0.0, ub - float(head[v]))
    for v in range(n):
        if l > 0:
            model += lat[v] >= w.cpu_latency[v] * x[v, CPU]
    for u, t in edges:
        model += lat[t] >= lat[u] + (w.cpu_latency[t] * x[t, CPU] if l > 0 else 0)
    # (each sum over the nodes is one variable, and "the nodes before v" a running sum along
    # the topological order: a constraint per node with a term per node was n^2 terms, most
    # of the program's building time on 10,000 nodes)
    for d in range(k):
        for p in range(1, pieces):
            model += st[d, p] >= fin[d, p - 1]
            before = model.add_var(lb=0.0, ub=n)  # nodes in the previous piece
            model += before == mip.xsum(x[u, (d, p - 1)] for u in range(n) if (u, (d, p - 1)) in x)
            for v in range(n):
                if (v, (d, p)) in x:
                    model += x[v, (d, p)] <= before
        if d >= 1 and dclass[d] == dclass[d - 1]:
            earlier = 0  # the previous accelerator's first-piece nodes before v in the order
            for v in w.topological_order:
                if (v, (d, 0)) in x:
                    model += x[v, (d, 0)] <= earlier
                if (v, (d - 1, 0)) in x:
                    running = model.add_var(lb=0.0, ub=n)
                    model += running == earlier + x[v, (d - 1, 0)]
                    earlier = running
    T = model.add_var(lb=min(floor, ub), ub=ub)
    for v in range(n):
        model += T >= lat[v]
    model.objective = T
    if start_plan is not None:
        a, pc = start_plan
        model.start = [(var, 1.0 if _slot_of(w, a, pc, v) == s else 0.0) for (v, s), var in x.items()]
    return model, x


def _transfer_terms(w: Workload, model, s, senders, cin, cout, x, on_device):
    """A slot's transfer time: c(u) for every tensor it receives (``cin``) or sends
    (``cout``) in the paper's model.  With links: received tensors at this class's host
    price, sent ones once at it; where a peer link joins the two devices, a direct copy
    instead (its indicator at least "u sent from there and needed here"), sent to each
    peer device that needs it (lower bounds: every price is >= 0 and the objective only
    grows with them)."""
    cost = w.out_cost
    if not w.multi_class:
        return mip.xsum(cost[u] * (cin[u] + cout[u]) for u in senders if cost[u] > 0)
    d, cls = s[0], w.device_class
    mine = int(cls[d])
    peers = [b for b in range(w.accelerators_total) if b != d and (mine, int(cls[b])) in w.peer_links]
    if not peers:
        return mip.xsum(float(w.staged_cost(mine, u)) * (cin[u] + cout[u]) for u in senders)
    terms = []
    for u in senders:
        staged_in = model.add_var(lb=0.0, ub=1.0)
        model += staged_in >= cin[u] - mip.xsum(on_device[u, b] for b in peers)
        terms.append(float(w.staged_cost(mine, u)) * staged_in)
        staged_out = model.add_var(lb=0.0, ub=1.0)
        terms.append(float(w.staged_cost(mine, u)) * staged_out)
        for b in peers:
            price = float(w.peer_cost(mine, int(cls[b]), u))
            came = model.add_var(lb=0.0, ub=1.0)
            model += came >= cin[u] + on_device[u, b] - 1
            went = model.add_var(lb=0.0, ub=1.0)
            terms += [price * came, price * went]
            for t in w.successors[u]:
                model += went >= x.get((u, s), 0) + on_device[t, b] - 1
        if (u, s) in x:
            for t in w.successors[u]:
                model += staged_out >= x[u, s] - x.get((t, s), 0) - mip.xsum(on_device[t, b] for b in peers)
    return mip.xsum(terms)


def _read_plan(w: Workload, model, x, status, floor: float, start_plan, details: dict, seconds: float) -> Plan:
    """The solver's plan, re-scored by the evaluator, with the proven bound; the warm start
    where the solver kept nothing better (or nothing valid)."""
    k = w.accelerators_total
    CPU = CPU_SLOT
    method = "ip"
    bound = finite(model.objective_bound)
    bound = max(bound, floor) if bound is not None else floor
    assignment: dict[int, str] = {}
    piece_of: dict[int, int] = {}
    if model.num_solutions:
        names = [dv.name for dv in w.devices]
        for (v, s), var in x.items():
            if var.x is not None and var.x > 0.5:
                nid = int(w.ids[v])
                if s == CPU:
                    assignment[nid] = names[k]  # the latency model's CPUs are one pool
                else:
                    assignment[nid] = names[s[0]]
                    piece_of[nid] = s[1] + 1
    # none found, or one the solver's tolerances let over a memory limit by a few bytes
    if not assignment or evaluate.check(w, assignment):
        if start_plan is not None:  # the solver kept nothing better than the warm start
            a, pc = start_plan
            value = evaluate.latency(w, a, pc).value
            lb = min(bound, value) if bound is not None else None
            return Plan("latency", method, "time_limit", value, a, lower_bound=lb, gap=gap_of(value, lb),
                        seconds=seconds, pieces=pc, details=details)
        st_label = "infeasible" if status == mip.OptimizationStatus.INFEASIBLE else "time_limit"
        return Plan("latency", method, st_label, None, {}, lower_bound=bound, seconds=seconds, details=details)
    value = evaluate.latency(w, assignment, piece_of).value
    lb = min(bound, value) if bound is not None else None
    g = gap_of(value, lb)
    return Plan("latency", method, status_label(status == mip.OptimizationStatus.OPTIMAL, g), value, assignment,
                lower_bound=lb, gap=g, seconds=seconds,
                pieces=piece_of, details={**details, "ip_objective": model.objective_value})


def _slot_of(w: Workload, assignment: dict[int, str], pieces: dict[int, int], v: int):
    nid = int(w.ids[v])
    dev = w.device_index[assignment[nid]]
    if dev >= w.accelerators_total:
        return (-1, 0)
    return (dev, pieces[nid] - 1)


