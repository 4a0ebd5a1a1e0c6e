"""Large graphs: the first plan from an order cut into blocks, and the split bound, on a
synthetic transformer export of 4,500 nodes (tools/make_large_workload.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from onnxsplit.solve import evaluate
from onnxsplit.solve.throughput import bounds, dp, lattice
from onnxsplit.workload import Workload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    path = tmp_path_factory.mktemp("scale") / "w.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_large_workload.py"), str(path), "--nodes",
                    "4500", "--k", "3", "--l", "2", "--memory-share", "0.4"], check=True, stdout=subprocess.DEVNULL)
    return Workload.from_paper_json(path)


def test_the_blocks_plan_is_a_valid_pipeline_no_better_than_its_order(large):
    w = large
    inst = dp.build_instance(w)
    assert inst.n > dp.COARSE_ABOVE
    order = next(lattice.topological_orders(inst.preds, inst.succs, inst.acc))
    coarse = dp.coarse_plan(w, inst, order, np.inf)
    assert coarse is not None and evaluate.check(w, coarse, contiguity="ideal_chain") == []
    fine = dp.run(inst, lattice.chain(order), w.num_accelerators, w.num_cpus, w.accelerator_memory)
    value = evaluate.max_load(w, coarse).value
    # cut points only at the blocks' borders: never better than the same order's DP, and close
    assert fine.value <= value * (1 + 1e-9) and value <= fine.value * 1.05
    assert bounds.max_load_lower_bound(w) <= fine.value * (1 + 1e-9)


def test_a_dp_out_of_time_in_its_first_order_returns_the_blocks_plan(large):
    plan = dp.solve(large, linear_only=True, time_limit=0.5)
    assert plan.status == "time_limit" and plan.value is not None
    assert evaluate.check(large, plan.assignment, contiguity="ideal_chain") == []
    assert plan.lower_bound is not None and plan.lower_bound <= plan.value


@pytest.mark.parametrize("structure", ["encoder", "varied"])
def test_the_generator_makes_valid_workloads_of_each_structure(tmp_path, structure):
    """What tools/bench_scale.py measures on: a DAG of the requested size, the varied
    blocks with nodes the accelerators do not take; the training graph with each node's
    gradient in its colour class, after every forward node."""
    for training in (False, True):
        path = tmp_path / f"{structure}-{training}.json"
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_large_workload.py"), str(path),
                        "--nodes", "300", "--structure", structure, "--seed", "3"] + ["--training"] * training,
                       check=True, stdout=subprocess.DEVNULL)
        w = Workload.from_paper_json(path)
        forward = int((~w.backward).sum())
        assert 300 <= forward < 300 + 80
        if structure == "varied":
            assert (~w.supported).sum() > 3
        if not training:
            assert not w.is_training
            continue
        assert w.is_training and int(w.backward.sum()) == forward
        pos = np.empty(w.n, dtype=np.int64)
        pos[list(w.topological_order)] = np.arange(w.n)
        last_forward = pos[~w.backward].max()
        assert (pos[w.backward] > last_forward).all()  # the backward pass waits on the loss
        for c in np.unique(w.color_class):
            members = np.flatnonzero(w.color_class == c)
            assert len(members) == 2 and w.backward[members].sum() == 1
