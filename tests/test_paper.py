"""The paper's workloads against the values its own C++ programs give (expected.json)."""

from __future__ import annotations

import json

import pytest

from conftest import PAPER, needs_paper
from onnxsplit.api import evaluate_split
from onnxsplit.plan import read_split
from onnxsplit.solve import evaluate
from onnxsplit.solve.throughput import dp
from onnxsplit.workload import Workload

pytestmark = needs_paper


def _names(kind: str) -> list[str]:
    if PAPER is None:
        return []
    return sorted(p.name for p in (PAPER / kind).glob("*.json"))


def _exact(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_exact(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_exact(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("kind", ["throughput", "latency"])
def test_every_file_round_trips_exactly(kind):
    for name in _names(kind):
        raw = json.loads((PAPER / kind / name).read_text())
        assert _exact(Workload.from_paper_json(raw).to_paper_json(), raw), name


@pytest.mark.parametrize("name", _names("throughput"))
def test_dp_matches_reference(name, expected):
    exp = expected["throughput"][name]
    w = Workload.from_paper_json(PAPER / "throughput" / name)
    plan = dp.solve(w)
    assert plan.status == "optimal"
    # re-scored independently of the DP's own arithmetic
    assert evaluate.max_load(w, plan.assignment).value == pytest.approx(plan.value, rel=1e-12)
    assert evaluate.check(w, plan.assignment, contiguity="ideal_chain") == []
    if exp.get("dp") is not None:
        assert plan.value == pytest.approx(exp["dp"], rel=1e-6)
        assert plan.details["ideals"] == exp["ideals"]
    else:  # the reference DP does not finish: only its linearized upper bound is known
        assert plan.value <= exp["linearize_ub"] * (1 + 1e-9)
        assert plan.details["ideals"] == exp["ideals"]
    assert plan.details["linearized_value"] >= plan.value * (1 - 1e-12)


EXPERT = {
    "layer_bert24_inference.json": ("bert24_inference_expert.json", "expert"),
    "layer_bert24_training.json": ("bert24_training_expert.json", "expert"),
    "layer_gnmt_inference.json": ("gnmt_inference_expert.json", "expert"),
    "layer_gnmt_training.json": ("gnmt_training_expert.json", "expert"),
    "layer_inceptionv3_inference.json": ("inceptionv3_inference_expert.json", "expert"),
    "layer_inceptionv3_training.json": ("inceptionv3_inference_expert.json", "expert_lifted_from_inference"),
    "layer_resnet50_inference.json": ("resnet50_inference_expert.json", "expert"),
    "layer_resnet50_training.json": ("resnet50_inference_expert.json", "expert_lifted_from_inference"),
}


@pytest.mark.parametrize("name", sorted(EXPERT))
def test_expert_split_max_load(name, expected):
    split, key = EXPERT[name]
    w = Workload.from_paper_json(PAPER / "throughput" / name)
    assignment = read_split(PAPER / "human-experts" / split, w)
    assert len(assignment) == w.n  # backward nodes taken along by colour class
    assert evaluate.max_load(w, assignment).value == pytest.approx(expected["throughput"][name][key], rel=1e-5)
    assert evaluate.check(w, assignment, contiguity="ideal_chain") == []


@pytest.mark.parametrize("model", ["bert24", "gnmt", "inceptionv3", "resnet50"])
def test_expert_split_latency(model, expected):
    name = f"layer_{model}_inference.json"
    row = expected["latency"][name]
    key = "expert_split" if "expert_split" in row else "expert_split_over_memory"
    w = Workload.from_paper_json(PAPER / "latency" / name)
    assignment = read_split(PAPER / "human-experts" / f"{model}_inference_expert.json", w)
    result = evaluate_split(w, assignment, "latency")
    assert result["value"] == pytest.approx(row[key], rel=1e-5)
    over_memory = any(v.startswith("memory:") for v in result["violations"])
    assert over_memory == key.endswith("over_memory")


@pytest.mark.parametrize("name", _names("throughput"))
def test_one_accelerator_baseline(name, expected):
    """Everything on one accelerator: the reference's -oneFpga value (memory ignored)."""
    w = Workload.from_paper_json(PAPER / "throughput" / name)
    value = evaluate.max_load(w, {nid: "acc0" for nid in w.index}).value
    assert value == pytest.approx(expected["throughput"][name]["one_accelerator"], rel=1e-5)
