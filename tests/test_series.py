"""Latency plans composed along cut vertices (solve/latency/series.py), against brute force.

Cut vertices are checked against an enumeration of every input-to-output path
(networkx); plans against tests/bruteforce.py's own latency model and exhaustive optimum.
"""

from __future__ import annotations

import random

import networkx as nx
import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from conftest import PAPER, needs_paper  # noqa: E402
from onnxsplit import api
from onnxsplit.errors import SolveError
from onnxsplit.solve import evaluate
from onnxsplit.solve.latency import blocks
from onnxsplit.solve.latency import dp as latency_dp
from onnxsplit.solve.latency import series
from onnxsplit.workload import Workload
from test_latency_dp import _brute_min, _chain
from workloads import edge, node, workload


def _cut_vertices_by_paths(w: Workload) -> set[int]:
    g = nx.DiGraph()
    g.add_nodes_from(range(w.n))
    g.add_edges_from(zip(w.edge_src.tolist(), w.edge_dst.tolist()))
    sources = [v for v in g if g.in_degree(v) == 0]
    if len(sources) > 1:
        g.remove_nodes_from(sources)
    paths = [p for s in g if g.in_degree(s) == 0 for t in g if g.out_degree(t) == 0
             for p in (nx.all_simple_paths(g, s, t) if s != t else [[s]])]
    return set.intersection(*(set(p) for p in paths)) if paths else set()


@pytest.mark.parametrize("seed", range(60))
def test_cut_vertices_are_on_every_path(seed):
    w = Workload.from_paper_json(bf.random_workload(seed, n_range=(2, 9), k_range=(1, 2), l_range=(1, 1)))
    assert set(blocks.cut_vertices(w)) == _cut_vertices_by_paths(w)


def _modules(seed: int) -> dict:
    """A chain of fork-join modules (2 or 3 branches of 1 or 2 nodes, 9 nodes at most), Inception-like:
    CPU 10x slower, tensors worth moving or not, memory that sometimes binds."""
    rng = random.Random(seed)
    nodes, edges, cost = [node(0, cpu=rng.uniform(2, 20), acc=rng.uniform(0.2, 2), size=rng.uniform(0.5, 2))], [], {}
    fork = 0
    for _ in range(rng.choice((1, 2))):
        ends = []
        for _ in range(rng.choice((2, 3)) if len(nodes) < 4 else 2):
            prev = fork
            for _ in range(rng.choice((1, 2)) if len(nodes) < 4 else 1):
                v = len(nodes)
                acc = rng.uniform(0.2, 2)
                nodes.append(node(v, cpu=round(10 * acc, 3), acc=round(acc, 3), size=round(rng.uniform(0.5, 2), 3)))
                edges.append((prev, v))
                prev = v
            ends.append(prev)
        join = len(nodes)
        nodes.append(node(join, cpu=0.0, acc=0.0, size=round(rng.uniform(0.2, 1), 3)))
        edges += [(e, join) for e in ends]
        fork = join
    cost = {v: round(rng.uniform(0.1, 6), 3) for v in range(len(nodes))}
    assert len(nodes) <= 9  # brute force: (k + 1) ** n assignments
    return workload(nodes, [edge(s, t, cost[s]) for s, t in edges], k=rng.choice((2, 3)) if len(nodes) <= 7 else 2, l=1,
                    mem=round(rng.uniform(2, 6), 3))


@pytest.mark.parametrize("seed", range(30))
def test_series_plan_is_valid_and_its_composed_latency_is_exact(seed):
    data = _modules(seed)
    w = Workload.from_paper_json(data)
    plan = series.series_split(w, 30)
    assert plan is not None and plan.status == "feasible"
    assert evaluate.check(w, plan.assignment) == []
    # one source: every edge stays inside a block, so the DP's value is the plan's latency
    assert plan.details["composed_latency"] == pytest.approx(plan.value, rel=1e-9)
    assert plan.value == pytest.approx(bf.latency(data, plan.assignment), rel=1e-9)
    assert plan.value >= _brute_min(data, 1) * (1 - 1e-9) - 1e-9


def test_some_calls_reach_into_a_block():
    # the exactness test above also covers calls that hold part of a block: here is one
    reaching = 0
    for seed in range(30):
        w = Workload.from_paper_json(_modules(seed))
        plan = series.series_split(w, 30)
        dev = evaluate.device_array(w, plan.assignment)
        for block in blocks.blocks(w, blocks.cut_vertices(w)):
            for end in (block.first, block.last):
                if end is not None and dev[end] < w.num_accelerators:
                    share = sum(dev[v] == dev[end] for v in block.inside)
                    reaching += 0 < share < len(block.inside)
    assert reaching > 0


@pytest.mark.parametrize("seed", range(20))
def test_series_plan_is_optimal_on_a_chain(seed):
    # on a chain every node is a cut vertex: the family holds every one-call-per-accelerator plan
    data = _chain(seed, n=6, chords=False)
    plan = series.series_split(Workload.from_paper_json(data), 30)
    assert plan.value == pytest.approx(_brute_min(data, 1), rel=1e-9)


def test_colour_classes_stay_inside_one_block():
    # a chain 0..5 with nodes 1 and 3 in one class: cut vertices 1..3 are dropped, so the
    # class lies inside the block between 0 and 4; the plan keeps it on one device
    nodes = [node(i, cpu=10.0, acc=1.0, cc=7 if i in (1, 3) else None) for i in range(6)]
    w = Workload.from_paper_json(workload(nodes, [edge(i, i + 1, 0.5) for i in range(5)], k=2, l=1))
    kept = series._classes_whole(w, blocks.cut_vertices(w))
    assert [int(w.ids[v]) for v in kept] == [0, 4, 5]
    plan = series.series_split(w, 30)
    assert plan.status == "feasible"
    assert plan.assignment[1] == plan.assignment[3]


def test_series_refuses_a_graph_without_cut_vertices():
    w = Workload.from_paper_json(workload([node(i) for i in range(4)], [edge(0, 1), edge(2, 3)]))
    assert blocks.cut_vertices(w) == []
    with pytest.raises(SolveError, match="cut vertices"):
        api.solve(w, "latency", "latency_series")


@needs_paper
def test_series_beats_the_sequence_split_on_inception():
    w = Workload.from_paper_json(PAPER / "latency" / "layer_inceptionv3_inference.json")
    composed = api.solve(w, "latency", "latency_series", time_limit=60)
    sequential = latency_dp.sequence_split(w)
    assert composed.status == "feasible"
    # the modules' branches run side by side: some in calls of their own, some on the CPUs
    assert composed.value < sequential.value * 0.97


@pytest.mark.parametrize("seed", range(5))
def test_latency_ip_starts_from_the_series_plan(seed):
    # the series plan is one of the latency IP's warm starts: the IP never returns worse
    w = Workload.from_paper_json(_modules(seed))
    composed = series.series_split(w, 30)
    plan = api.solve(w, "latency", "ip", time_limit=20)
    assert plan.value <= composed.value * (1 + 1e-9)
    assert plan.lower_bound <= plan.value * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_unlimited_memory_keeps_a_reaching_plan_in_range(seed):
    # memory 1e18 (no limit): a block end pinned in a call holds "memory less its room",
    # which put 1e18 into the program's rows (HiGHS refused them and the command failed);
    # the block's own sizes bound every number now, and the plan is the brute-force best
    from onnxsplit.solve.latency import blocks as series_blocks
    from onnxsplit.solve.latency.ip import solve_latency
    from test_latency_dp import _brute_min

    data = _modules(seed)
    data["maxSizePerFPGA"] = 1e18
    w = Workload.from_paper_json(data)
    cuts = series_blocks.cut_vertices(w)
    block = next(b for b in series_blocks.blocks(w, cuts) if b.first is not None and b.inside)
    room = 0.5 * float(w.size[block.inside].sum())
    sub = series_blocks.block_workload(w, block, 1, room, None)
    assert sub.size.max() < 1e6 and sub.accelerator_memory < 1e6
    plan = solve_latency(sub, time_limit=30, gap=1e-9, series_bound=False, warm_start=None)
    assert plan.value == pytest.approx(_brute_min(sub.to_paper_json(), 1), rel=1e-6)
    # the room still binds: the call through the pinned end holds at most it
    end = int(w.ids[block.first])
    call = plan.assignment[end]
    held = sum(float(w.size[w.index[i]]) for i, d in plan.assignment.items() if d == call and i != end)
    assert held <= room * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_blocks_highs_leaves_open_go_to_cp_sat(seed, monkeypatch):
    # HiGHS given no time closes no module: its programs go to CP-SAT (the block then
    # straight to it), whose plans compose to what HiGHS's alone compose to
    data = _modules(seed)
    w = Workload.from_paper_json(data)
    by_highs = series.series_split(w, 30)
    monkeypatch.setattr(series, "HIGHS_FIRST", 0.0)
    calls = []
    real = series.solve_latency_cp
    monkeypatch.setattr(series, "solve_latency_cp", lambda *a, **k: calls.append(1) or real(*a, **k))
    plan = series.series_split(w, 30)
    assert calls
    assert evaluate.check(w, plan.assignment) == []
    assert plan.value == pytest.approx(bf.latency(data, plan.assignment), rel=1e-9)
    assert plan.value == pytest.approx(by_highs.value, rel=1e-6)
