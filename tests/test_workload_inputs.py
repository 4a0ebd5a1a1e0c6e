"""Inputs beyond what the solvers' arithmetic holds, and malformed split files and options:
each ends in one line ``onnxsplit: error: ...`` naming the problem (exit code 2), never a
traceback; values at the limits still solve."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import mip
import pytest

from test_reliability import one_line_error
from onnxsplit import api
from onnxsplit.cli import main
from onnxsplit.cluster import Cluster
from onnxsplit.errors import ClusterError
from onnxsplit.plan import Plan
from onnxsplit.solve import anytime, milp
from onnxsplit.workload import MOST_TIME, Workload

DEMO = Path(__file__).resolve().parent.parent / "models" / "demo_workload.json"


@pytest.fixture(scope="module")
def demo() -> dict:
    return json.loads(DEMO.read_text())


def _write(tmp_path, data, name="w.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _with_node(demo: dict, field: str, value, index: int = 5) -> dict:
    data = copy.deepcopy(demo)
    data["nodes"][index][field] = value
    return data


# ---- 1. node ids ---------------------------------------------------------------------------

@pytest.mark.parametrize("new_id", [10 ** 30, 2 ** 63, -2 ** 63 - 1, 1e30])
def test_a_node_id_beyond_int64_is_one_line_naming_the_node(capsys, tmp_path, demo, new_id):
    data = copy.deepcopy(demo)
    old = data["nodes"][5]["id"]
    data["nodes"][5]["id"] = new_id
    for e in data["edges"]:
        for end in ("sourceId", "destId"):
            if e[end] == old:
                e[end] = new_id
    line = one_line_error(capsys, ["solve", _write(tmp_path, data)], f"node {int(new_id)}", "64 bits")
    assert "does not fit" in line


def test_the_largest_int64_id_still_solves(capsys, tmp_path, demo):
    data = copy.deepcopy(demo)
    old, new = data["nodes"][5]["id"], 2 ** 63 - 1
    data["nodes"][5]["id"] = new
    for e in data["edges"]:
        e["sourceId"] = new if e["sourceId"] == old else e["sourceId"]
        e["destId"] = new if e["destId"] == old else e["destId"]
    assert main(["solve", str(_write(tmp_path, data)), "--json"]) == 0
    assert str(new) in json.loads(capsys.readouterr().out)["assignment"]


# ---- 2. --seed -----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", ["-1", "2147483648", str(10 ** 30), "abc"])
def test_a_bad_seed_is_one_line(capsys, seed):
    one_line_error(capsys, ["solve", DEMO, "--method", "local_search", "--seed", seed], "--seed")


# ---- 3. magnitudes beyond float sums, 6. subnormal values ----------------------------------

@pytest.mark.parametrize("field,value,argv,limit", [
    ("cpuLatency", 1e16, ["--objective", "latency"], "1e+12"),  # was mip.InterfacingError
    ("cpuLatency", 1e20, [], "1e+12"),  # was "internal error: DP value 0.12 but the evaluator scores 143"
    ("fpgaLatency", 1e300, [], "1e+12"),
    ("size", 1e308, [], "1e+18"),  # was "internal error: DP plan is invalid: memory ..."
    ("cpuLatency", 10 ** 400, [], "1e+12"),  # an int beyond float's range: was OverflowError
    ("cpuLatency", 5e-324, [], "1e-30"),  # was numpy's RuntimeWarning: overflow encountered in divide
    ("size", 1e-300, [], "1e-30"),
])
def test_a_node_number_out_of_range_is_one_line_naming_node_field_and_limit(capsys, tmp_path, demo, field,
                                                                           value, argv, limit):
    data = _with_node(demo, field, value)
    one_line_error(capsys, ["solve", _write(tmp_path, data), *argv], f"node {data['nodes'][5]['id']}: {field}",
                    limit)


def test_an_edge_cost_and_link_out_of_range_are_one_line(capsys, tmp_path, demo):
    data = copy.deepcopy(demo)
    data["edges"][3]["cost"] = 1e300
    e = data["edges"][3]
    one_line_error(capsys, ["solve", _write(tmp_path, data)], f"edge {e['sourceId']}->{e['destId']}: cost",
                    "1e+12")
    data = copy.deepcopy(demo)
    data["links"] = [{"between": ["acc", "cpu"], "scale": 1e300, "latency": 1e300}]
    one_line_error(capsys, ["solve", _write(tmp_path, data)], "link acc-cpu: scale", "1e+12")
    data["links"] = [{"between": ["acc", "cpu"], "scale": 1.0, "latency": 1e-300}]
    one_line_error(capsys, ["solve", _write(tmp_path, data)], "link acc-cpu: latency", "1e-30")


def test_memory_beyond_the_spelling_of_unlimited_is_one_line(capsys, tmp_path, demo):
    data = copy.deepcopy(demo)
    data["maxSizePerFPGA"] = 1e300
    one_line_error(capsys, ["solve", _write(tmp_path, data)], "maxSizePerFPGA", "1e+18")


def test_times_at_the_limit_solve_for_throughput(capsys, tmp_path, demo):
    """One accelerator latency of MOST_TIME early in the graph leaves the prefix sums the DP
    takes differences of off by ~1e-4 (ulps of 1e12): the DP's self-check allows for it."""
    data = _with_node(demo, "fpgaLatency", MOST_TIME, index=1)  # was "internal error: DP value ..."
    assert main(["solve", str(_write(tmp_path, data)), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["status"] == "optimal" and plan["value"] < 10


def test_times_at_the_limit_solve_for_latency(capsys, tmp_path, demo):
    """A CPU latency of MOST_TIME: the series warm start's blocks pin their ends with a
    time above it (the series method stands aside rather than build an invalid workload),
    and HiGHS, which can fail on such ranges, leaves the warm start standing."""
    data = _with_node(demo, "cpuLatency", MOST_TIME)
    assert main(["solve", str(_write(tmp_path, data)), "--objective", "latency", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["value"] < 10 and "Traceback" not in err


def test_a_highs_failure_is_no_solution_rather_than_a_traceback():
    class Failing:
        def optimize(self, max_seconds):
            raise mip.InterfacingError("Unknown error in call to HiGHS.")

    assert milp.optimize(Failing(), 1.0) == mip.OptimizationStatus.ERROR


def test_an_absurd_cluster_link_is_one_line_naming_the_field(capsys, tmp_path):
    spec = {"devices": [{"name": "cpu", "class": "cpu", "count": 2},
                        {"name": "gpu", "class": "gpu", "memory": "16GiB", "peak_flops": 1e13,
                         "memory_bandwidth": "300GB/s"}],
            "links": [{"between": ["cpu", "gpu"], "bandwidth": 1e-300, "latency": "10us"}]}
    with pytest.raises(ClusterError, match=r"links\[0\]\.bandwidth must be from 1kB/s to 1PB/s"):
        Cluster.from_file(_write(tmp_path, spec, "c.json"))
    spec["links"][0].update(bandwidth="12GB/s", latency=1e300)
    with pytest.raises(ClusterError, match=r"links\[0\]\.latency must be 0 or from 1ps"):
        Cluster.from_file(_write(tmp_path, spec, "c.json"))
    tiny_bert = Path(__file__).resolve().parent / "data" / "tiny_bert.onnx"
    one_line_error(capsys, ["workload", tiny_bert, "--devices", _write(tmp_path, spec, "c.json")],
                    "links[0].latency")


# ---- 4. split files ------------------------------------------------------------------------

@pytest.mark.parametrize("split,words", [
    ({"fpgas": [{"nodes": "abc"}], "cpus": []}, ["fpgas[0].nodes must be a list of node ids", '"abc"']),
    ({"fpgas": [[1, 2]], "cpus": []}, ["fpgas[0] must be an object", "[1, 2]"]),
    ({"fpgas": None, "cpus": []}, ["'fpgas' must be a list", "null"]),
    ({"fpgas": [], "cpus": {"nodes": [1]}}, ["'cpus' must be a list"]),
    ({"fpgas": [{"nodes": [1, "x"]}], "cpus": []}, ["fpgas[0].nodes: a node id is an integer", '"x"']),
    ({"fpgas": [{"nodes": [1, 2.5]}], "cpus": []}, ["fpgas[0].nodes: a node id is an integer", "2.5"]),
])
def test_a_malformed_split_file_is_one_line_naming_what_is_wrong(capsys, tmp_path, split, words):
    path = _write(tmp_path, split, "split.json")
    one_line_error(capsys, ["evaluate", DEMO, path], str(path), *words)
    one_line_error(capsys, ["solve", DEMO, "--method", "given", "--split", path], *words)


def test_a_split_with_float_ids_and_empty_entries_still_reads(capsys, tmp_path, demo):
    w = Workload.from_paper_json(demo)
    split = {"fpgas": [{"nodes": [float(i) for i in w.ids[1:]]}, {}], "cpus": [{"nodes": [int(w.ids[0])]}]}
    assignment = api.read_split_file(_write(tmp_path, split, "split.json"), w)
    assert set(assignment.values()) == {"acc0", "cpu0"} and len(assignment) == w.n


# ---- 5. the progress line's gap --------------------------------------------------------------

def test_a_bound_proven_apart_does_not_reach_the_watch(demo):
    w = Workload.from_paper_json(demo)
    seen = {}

    def method():
        anytime.prove(1.0)
        with anytime.apart():
            anytime.prove(1e6)  # a block's own bound: not the method's
            anytime.offer({int(i): "cpu0" for i in w.ids}, "a plan of another workload")
        anytime.offer({int(i): "cpu0" for i in w.ids}, "all on cpu0")
        seen["offers"] = anytime._local.offers
        return Plan("throughput", "probe", "feasible", None, {})

    plan = anytime.within(30.0, w, "throughput", "probe", method)
    offers = seen["offers"]
    assert offers.bound == 1.0 and offers.best[2] == "all on cpu0"
    assert [bound for _, _, bound in plan.details["trace"]] == [1.0, 1.0]


def test_the_latency_progress_line_never_shows_a_bound_above_the_best_plan(monkeypatch, demo):
    """The series warm start's block solves (a block with an end pinned in a call, a memory
    room of its own) proved their own bounds into the whole's watch: 12.52 beside a plan of
    4.10, a progress line "gap -205.40%"."""
    reports = []
    monkeypatch.setattr(anytime, "PROGRESS_S", 0.1)
    monkeypatch.setattr(anytime, "report", lambda method, s, best, bound: reports.append((best, bound)))
    plan = api.solve(Workload.from_paper_json(demo), objective="latency", method="ip")
    both = [(best, bound) for best, bound in reports if best is not None and bound is not None]
    assert both, reports
    assert all(bound <= best * (1 + 1e-9) for best, bound in both), both
    assert all(bound <= plan.value * (1 + 1e-9) for _, _, bound in plan.details.get("trace", []) if bound), plan.details
