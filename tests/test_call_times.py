"""The least call time of a path segment (solve/call_times.py), against enumeration.

The enumeration tries every node set C that meets the path exactly in the segment and
holds the segment's hull (every node on a path between its ends, as a convex call must),
and times it as the latency model does (each tensor entering or leaving C once, plus C's
accelerator time); it never imports onnxsplit.solve.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit.solve.latency import call_times
from onnxsplit.solve.latency import bounds as latency_bounds
from onnxsplit.workload import Workload


def _call_time(g, members: set) -> float:
    t = sum(g.acc[v] for v in members)
    for u in g.ids:
        group = [u, *g.succs[u]]
        if len(group) > 1 and any(m in members for m in group) and not all(m in members for m in group):
            t += g.cost[u]
    return t


def _reach(step, v) -> set:
    """v and every node reachable from it along ``step`` (successors or predecessors)."""
    seen, todo = {v}, [v]
    while todo:
        for u in step[todo.pop()]:
            if u not in seen:
                seen.add(u)
                todo.append(u)
    return seen


def _is_convex(g, c: set) -> bool:
    """No path leaves c and comes back."""
    return not any(v not in c and _reach(g.preds, v) & c and _reach(g.succs, v) & c for v in g.ids)


def _least_call(data, path_ids, i, e, mem, one_call, convex=False):
    """min time(C) over C with C ∩ path = path[i:e], holding the hull of path[i:e],
    supported, within mem, (with one_call) holding whole colour classes and (with convex)
    convex; None when no C qualifies."""
    g = bf.view(data)
    seg = set(path_ids[i:e])
    hull = _reach(g.succs, path_ids[i]) & _reach(g.preds, path_ids[e - 1])
    off = [v for v in g.ids if v not in path_ids]
    best = None
    for bits in itertools.product((0, 1), repeat=len(off)):
        c = seg | {v for v, b in zip(off, bits) if b}
        if not hull <= c or not all(g.sup[v] for v in c) or sum(g.size[v] for v in c) > mem:
            continue
        if convex and not _is_convex(g, c):
            continue
        if one_call and any(g.cls[u] == g.cls[v] and (u in c) != (v in c) for u in g.ids for v in g.ids):
            continue
        t = _call_time(g, c)
        best = t if best is None or t < best else best
    return best


def _case(seed):
    data = bf.random_workload(seed, n_range=(3, 8), k_range=(1, 2), l_range=(1, 1), class_p=0.4)
    w = Workload.from_paper_json(data)
    rng = random.Random(seed)
    path = latency_bounds.heaviest_path(w, np.array([rng.random() for _ in range(w.n)]))
    return data, w, path


@pytest.mark.parametrize("seed", range(60))
def test_exact_when_memory_is_ample(seed):
    # without a binding memory limit the Lagrangian is not needed: the cut is the least
    data, w, path = _case(seed)
    data = {**data, "maxSizePerFPGA": 1e9}
    w = Workload.from_paper_json(data)
    ids = [int(w.ids[v]) for v in path]
    for pieces in (1, 2):
        times = call_times.segment_call_times(w, path, pieces)
        for i in range(len(path)):
            for e in range(i + 1, len(path) + 1):
                want = _least_call(data, ids, i, e, 1e9, pieces == 1)
                if want is None:
                    assert times[i, e] == np.inf
                else:
                    assert times[i, e] == pytest.approx(want, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("seed", range(60))
def test_below_the_least_call_within_memory(seed):
    data, w, path = _case(seed)
    mem = float(data["maxSizePerFPGA"])
    ids = [int(w.ids[v]) for v in path]
    times = call_times.segment_call_times(w, path, 1)
    ample = call_times.segment_call_times(Workload.from_paper_json({**data, "maxSizePerFPGA": 1e9}), path, 1)
    for i in range(len(path)):
        for e in range(i + 1, len(path) + 1):
            want = _least_call(data, ids, i, e, mem, True)
            if want is None:
                continue  # the Lagrangian may still give a finite value: no call, no claim
            assert times[i, e] <= want * (1 + 1e-9) + 1e-9
            assert times[i, e] >= ample[i, e] - 1e-9  # memory only adds


def _projection_branch(mem, branch_acc=1.0):
    # 0 -> 1 -> 2 -> 3 (the path) and a branch 0 -> 4 -> 3
    from workloads import edge, node, workload

    nodes = [node(i, cpu=10, acc=1, size=1) for i in range(4)] + [node(4, cpu=10, acc=branch_acc, size=5)]
    edges = [edge(0, 1, 2.0), edge(1, 2, 2.0), edge(2, 3, 2.0), edge(0, 4, 2.0), edge(4, 3, 3.0)]
    return Workload.from_paper_json(workload(nodes, edges, k=2, l=1, mem=mem))


def test_a_projection_branch_by_hand():
    # a call running {1, 2} must also send 0's tensor to 4 and receive 4's, or take 4
    # in, which memory forbids
    w = _projection_branch(mem=4)
    times = call_times.segment_call_times(w, [0, 1, 2, 3], 1)
    assert times[1, 3] == pytest.approx(2.0 + 2 + 2.0)  # 0's tensor in, compute, 2's tensor out
    assert times[0, 2] == pytest.approx(2 + 2.0 + 2.0)  # 0's tensor once (to 1 inside, 4 outside), 1's out
    assert times[0, 3] == pytest.approx(3 + 2.0 + 2.0)  # 4 does not fit: 0's tensor out, 2's out
    # a call holding 0 and 3 holds 4 too (calls are convex), which does not fit
    assert times[0, 4] == np.inf
    assert call_times.segment_call_times(_projection_branch(mem=9), [0, 1, 2, 3], 1)[0, 4] == pytest.approx(5)
    # even where leaving 4 out would be cheaper (its tensors 2 + 3 against its compute 10)
    slow = call_times.segment_call_times(_projection_branch(mem=9, branch_acc=10.0), [0, 1, 2, 3], 1)
    assert slow[0, 4] == pytest.approx(4 + 10.0)
    assert slow[0, 3] == pytest.approx(3 + 2.0 + 2.0)  # 0's tensor out to 4, 2's out to 3


def test_past_its_deadline_it_claims_nothing():
    w = _projection_branch(mem=4)
    assert not call_times.segment_call_times(w, [0, 1, 2, 3], 1, deadline=0.0).any()
    # the bound without the cuts sees only the path: less than with them
    assert latency_bounds.latency_lower_bound(w, 1, seconds=0.0) < latency_bounds.latency_lower_bound(w, 1)
