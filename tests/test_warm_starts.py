"""The IP's warm starts (solve/warm_starts.py): each quick method's time; and the descent
that polishes the start of the throughput IP's pairs (local_search.descend_from), against
the brute force's loads."""

from __future__ import annotations

import itertools
import random

import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit.plan import Plan
from onnxsplit.solve import methods, warm_starts
from onnxsplit.solve.baselines.local_search import descend_from
from onnxsplit.workload import Workload
from workloads import edge, node, workload


def _given_limits(ip_limit):
    w = Workload.from_paper_json(workload([node(0), node(1)], [edge(0, 1)], k=1, l=1))
    given = {}

    def solve(_w, objective, method, time_limit):
        given[method] = time_limit
        return Plan(objective, method, "feasible", None, {})

    warm_starts.best_quick_plan(w, methods.quick("throughput"), "throughput", 36.0, solve, ip_limit)
    return given


def test_local_search_gets_its_share_of_the_ip_limit_at_most():
    # on op-level BERT-48 it took 16.3 s of the 36 s for a plan 66% above the ring split's
    share = methods.get("local_search").warm_share
    assert share is not None and 0 < share < warm_starts.WARM_START_SHARE
    given = _given_limits(120.0)
    assert given["local_search"] <= share * 120.0 + 1e-9
    assert given["dp_linear"] > 30.0
    assert _given_limits(None)["local_search"] > 30.0


def _class_moves(data, assignment):
    """Every plan one colour class away from ``assignment`` that meets memory and support."""
    g = bf.view(data)
    for members in g.classes.values():
        for d in g.devices:
            if d != assignment[members[0]]:
                moved = {**assignment, **{v: d for v in members}}
                if bf.respects_constraints(data, moved):
                    yield moved


@pytest.mark.parametrize("seed", range(24))
def test_the_throughput_polish_ends_where_no_class_move_lowers_the_max_load(seed):
    # the polish of the pairs' start (descend_from): a valid plan, never worse, at a local optimum
    # of single colour-class moves, each scored by the brute force's own loads
    data = bf.random_workload(seed, training=seed % 3 == 0, n_range=(4, 7), k_range=(1, 3), l_range=(0, 2))
    w = Workload.from_paper_json(data)
    rng = random.Random(seed)
    plans = list(itertools.islice(bf.class_assignments(data), 200))
    if not plans:
        pytest.skip("no plan meets memory and support")
    start = {int(k): v for k, v in rng.choice(plans).items()}
    polished = descend_from(w, start, float("inf"))
    assert bf.respects_constraints(data, polished)
    value = bf.max_load(data, polished)
    assert value <= bf.max_load(data, start) * (1 + 1e-9) + 1e-12
    assert all(bf.max_load(data, moved) >= value * (1 - 1e-9) - 1e-12 for moved in _class_moves(data, polished))


def test_the_polish_moves_something_somewhere():
    # (the test above would pass on a polish that returned its start unchanged)
    lowered = 0
    for seed in range(24):
        data = bf.random_workload(seed, n_range=(4, 7), k_range=(2, 3), l_range=(1, 1))
        w = Workload.from_paper_json(data)
        plans = list(itertools.islice(bf.class_assignments(data), 200))
        if not plans:
            continue
        start = {int(k): v for k, v in random.Random(seed).choice(plans).items()}
        lowered += bf.max_load(data, descend_from(w, start, float("inf"))) < bf.max_load(data, start) * (1 - 1e-9)
    assert lowered >= 6
