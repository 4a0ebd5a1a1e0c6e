"""The IP's warm starts (solve/warm_starts.py): each quick method's time."""

from __future__ import annotations

from onnxsplit.plan import Plan
from onnxsplit.solve import warm_starts
from onnxsplit.workload import Workload
from workloads import edge, node, workload


def _given_limits(ip_limit):
    w = Workload.from_paper_json(workload([node(0), node(1)], [edge(0, 1)], k=1, l=1))
    given = {}

    def solve(_w, objective, method, time_limit):
        given[method] = time_limit
        return Plan(objective, method, "feasible", None, {})

    candidates = [("dp_linear", "throughput"), ("local_search", "throughput")]
    warm_starts.best_quick_plan(w, candidates, "throughput", 36.0, solve, ip_limit)
    return given


def test_local_search_gets_its_share_of_the_ip_limit_at_most():
    # on op-level BERT-48 it took 16.3 s of the 36 s for a plan 66% above the ring split's
    given = _given_limits(120.0)
    assert given["local_search"] <= warm_starts.MOST_SHARE["local_search"] * 120.0 + 1e-9
    assert given["dp_linear"] > 30.0
    assert _given_limits(None)["local_search"] > 30.0
