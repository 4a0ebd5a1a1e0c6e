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
