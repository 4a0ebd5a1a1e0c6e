"""The latency bound composed along cut vertices: below every plan, and exact on chains of
modules where every block's IP is proven (checked against brute force over all plans)."""

from __future__ import annotations

import time

import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit.solve.latency import bound_series
from onnxsplit.workload import Workload
from test_latency_dp import _brute_min, _chain
from test_series import _modules
from workloads import edge, node, workload


def _bound(w: Workload, seconds: float = 60.0):
    return bound_series.series_lower_bound(w, time.perf_counter() + seconds)


@pytest.mark.parametrize("seed", range(30))
def test_bound_is_the_optimum_on_chains_of_modules(seed):
    # one source, every block's IP proven: the DP over cut vertices holds every plan, each
    # at its latency, so its least value is the optimum (brute force: every assignment)
    data = _modules(seed)
    bound = _bound(Workload.from_paper_json(data))
    assert bound == pytest.approx(_brute_min(data, 1), rel=1e-6)


@pytest.mark.parametrize("seed", range(10))
def test_bound_is_the_optimum_on_a_chain(seed):
    data = _chain(seed, n=6, chords=False)
    assert _bound(Workload.from_paper_json(data)) == pytest.approx(_brute_min(data, 1), rel=1e-6)


@pytest.mark.parametrize("seed", range(80))
def test_bound_is_below_every_plan(seed):
    data = bf.random_workload(seed, n_range=(3, 7), k_range=(1, 2), l_range=(1, 1), class_p=0.2)
    bound = _bound(Workload.from_paper_json(data), 30.0)
    best = _brute_min(data, 1)
    if bound is None or best is None:
        return
    assert bound <= best * (1 + 1e-9) + 1e-9


def test_no_bound_where_an_edge_leaves_its_block():
    # 0 -> 1 -> 2 is the spine (all three cut vertices); source 3 feeds nodes 1 and 2, so
    # the edge 3 -> 2 jumps over cut vertex 1: the composition would not see it
    nodes = [node(i) for i in range(4)]
    edges = [edge(0, 1), edge(1, 2), edge(3, 1), edge(3, 2)]
    w = Workload.from_paper_json(workload(nodes, edges, k=1, l=1))
    assert bound_series.block_parts(w) is None
    assert _bound(w) is None


def test_a_deadline_in_the_past_gives_no_claim():
    w = Workload.from_paper_json(_modules(0))
    assert bound_series.series_lower_bound(w, time.perf_counter() - 1.0) is None


def _decoder(seed: int) -> dict:
    """An input (0), a mask made from it (1) that every layer reads, and three layers of
    two nodes in a row (2-3, 4-5, 6-7): the mask's edges pass the layers' ends, so these
    are no cut vertices until the edges are relaxed away.  The mask costs
    nothing (no time, no transfer): the relaxation then loses nothing."""
    import random

    rng = random.Random(seed)
    nodes = [node(0, cpu=1.0, acc=0.5, size=1.0), node(1, cpu=0.0, acc=0.0, size=0.0)]
    nodes += [node(i, cpu=round(rng.uniform(2, 20), 3), acc=round(rng.uniform(0.5, 3), 3),
                   size=round(rng.uniform(1, 4), 3)) for i in range(2, 8)]
    chain = [(0, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7)]
    edges = [edge(s, t, round(rng.uniform(0.1, 3), 3)) for s, t in chain]
    edges[0] = edge(0, 2, edges[0]["cost"])
    edges += [edge(0, 1, edges[0]["cost"])] + [edge(1, t, 0.0) for t in (2, 4, 6)]
    memory = rng.choice([1e9, 9.0])
    return workload(nodes, edges, k=2, l=1, mem=memory)


@pytest.mark.parametrize("seed", range(8))
def test_a_decoder_is_bounded_through_its_relaxation(seed, monkeypatch):
    # the layers between the graph's own cut vertices are one block, too large (blocks of
    # at most 3 nodes here); relaxed (the mask's far edges dropped) it is a chain of small
    # blocks, and with a free mask the composed bound is the optimum itself
    from onnxsplit.solve.latency import blocks as series

    monkeypatch.setattr(series, "BLOCK_NODES", 3)
    data = _decoder(seed)
    w = Workload.from_paper_json(data)
    assert bound_series.block_parts(w) is None
    r, blocks = bound_series.series_parts(w)
    assert r is not w and r.n == w.n and len(r.edges) < len(w.edges) and len(blocks) >= 3
    bound = bound_series.series_lower_bound(r, time.perf_counter() + 60.0, blocks=blocks)
    assert bound == pytest.approx(_brute_min(data, 1), rel=1e-6)


@pytest.mark.parametrize("seed", range(60))
def test_a_relaxation_is_below_the_original(seed):
    # every plan of the graph, restricted, is one of its relaxation with no larger latency:
    # so the relaxation's optimum (brute force, one call and two per accelerator) is below
    data = bf.random_workload(seed, n_range=(3, 7), k_range=(1, 2), l_range=(1, 1), class_p=0.2)
    w = Workload.from_paper_json(data)
    for span in (0, 1):
        r, lost = bound_series.relaxed(w, span)
        assert lost == pytest.approx(w.cpu_latency.sum() + w.acc_latency.sum()
                                     - r.cpu_latency.sum() - r.acc_latency.sum())
        for calls in (1, 2):
            best, relaxed_best = _brute_min(data, calls), _brute_min(r.to_paper_json(), calls)
            if best is not None:
                assert relaxed_best is not None and relaxed_best <= best * (1 + 1e-9) + 1e-9


def test_a_relaxation_prunes_what_feeds_nothing():
    # 0 -> 1 -> ... -> 6 is the spine; 7 (made from 0) feeds 3 and 6 from afar (2 and 5
    # levels ahead): at span 1 its edges go, and it feeds nothing, so it goes too
    nodes = [node(i) for i in range(8)]
    edges = [edge(i, i + 1) for i in range(6)] + [edge(0, 7), edge(7, 3), edge(7, 6)]
    w = Workload.from_paper_json(workload(nodes, edges, k=1, l=1))
    r, lost = bound_series.relaxed(w, 1)
    assert sorted(int(i) for i in r.ids) == list(range(7)) and lost == pytest.approx(10.0 + 1.0)
    assert len(r.edges) == 6
    r, lost = bound_series.relaxed(w, 5)
    assert r.n == 8 and lost == 0.0 and len(r.edges) == 9
