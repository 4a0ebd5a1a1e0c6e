"""Workload validation: every malformed input names its problem."""

from __future__ import annotations

import math

import pytest

from onnxsplit.errors import WorkloadError
from onnxsplit.workload import Workload
from workloads import diamond, edge, node, workload


def _error(data) -> str:
    with pytest.raises(WorkloadError) as e:
        Workload.from_paper_json(data)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_reads_diamond():
    w = Workload.from_paper_json(diamond())
    assert w.n == 4 and len(w.edges) == 4
    assert [d.name for d in w.devices] == ["acc0", "acc1", "cpu0"]
    assert w.out_cost.tolist() == [0.5, 0.25, 0.125, 0.0]
    assert w.topological_order[0] == 0 and w.topological_order[-1] == 3


def test_cycle_is_named():
    msg = _error(workload([node(1), node(2), node(3)], [edge(1, 2), edge(2, 3), edge(3, 2)]))
    assert "cycle" in msg and "2" in msg and "3" in msg


def test_backward_to_forward_edge():
    msg = _error(workload([node(1), node(2, backward=True)], [edge(2, 1)]))
    assert "backward node 2 feeds forward node 1" in msg


def test_out_edges_with_different_costs():
    msg = _error(workload([node(1), node(2), node(3)], [edge(1, 2, 1.0), edge(1, 3, 2.0)]))
    assert "edge 1->3" in msg and "differs" in msg


def test_unknown_id():
    assert "unknown node id 9" in _error(workload([node(1)], [edge(1, 9)]))


def test_duplicate_id():
    assert "node 1: duplicate id" in _error(workload([node(1), node(1)], []))


@pytest.mark.parametrize("field,value", [("cpuLatency", -1.0), ("fpgaLatency", math.inf),
                                         ("size", math.nan), ("cpuLatency", "fast")])
def test_bad_numbers(field, value):
    n = node(1)
    n[field] = value
    msg = _error(workload([n], []))
    assert "node 1" in msg and field in msg


def test_negative_edge_cost():
    assert "edge 1->2: cost" in _error(workload([node(1), node(2)], [edge(1, 2, -3.0)]))


@pytest.mark.parametrize("missing", ["id", "cpuLatency", "fpgaLatency", "supportedOnFpga", "isBackwardNode"])
def test_missing_node_field(missing):
    n = node(1)
    del n[missing]
    assert f"missing field '{missing}'" in _error(workload([n], []))


def test_missing_edge_cost_and_top_fields():
    e = edge(1, 2)
    del e["cost"]
    assert "missing field 'cost'" in _error(workload([node(1), node(2)], [e]))
    data = diamond()
    del data["maxFPGAs"]
    assert "missing field 'maxFPGAs'" in _error(data)


def test_not_json(tmp_path):
    p = tmp_path / "w.json"
    p.write_text("{not json")
    msg = _error(p)
    assert "not valid JSON" in msg and str(p) in msg
    assert "cannot read" in _error(tmp_path / "absent.json")


def test_round_trip_keeps_unknown_keys_and_spelling():
    data = diamond()
    data["nodes"][0]["layerId"] = 7
    data["nodes"][1]["isBackwardNode"] = False
    data["edges"][0]["size"] = 123
    data["note"] = "kept"
    out = Workload.from_paper_json(data).to_paper_json()
    assert out == data
    assert out["nodes"][1]["isBackwardNode"] is False and out["nodes"][0]["isBackwardNode"] == 0


def test_write_and_read(tmp_path):
    w = Workload.from_paper_json(diamond())
    w.write(tmp_path / "w.json")
    assert Workload.from_paper_json(tmp_path / "w.json").to_paper_json() == w.to_paper_json()
