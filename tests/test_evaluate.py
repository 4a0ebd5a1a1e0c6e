"""The evaluator on cases small enough to work out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from onnxsplit.errors import SplitError
from onnxsplit.solve import evaluate
from onnxsplit.workload import Workload
from workloads import diamond, edge, node, workload

# diamond: a(1) -> b(2), a -> c(3), b -> d(4), c -> d;  c(a)=0.5, c(b)=0.25, c(c)=0.125
# latencies cpu/acc: a 10/1, b 20/2, c 30/3, d 40/4


def split(**devices):
    return {int(k[1:]): v for k, v in devices.items()}


def test_max_load_by_hand():
    w = Workload.from_paper_json(diamond())
    s = evaluate.max_load(w, split(n1="acc0", n2="acc0", n3="acc1", n4="acc1"))
    # acc0: 1 + 2 + sends a (0.5) + sends b (0.25); acc1: 3 + 4 + receives a (0.5) + receives b (0.25)
    assert s.loads == {"acc0": 3.75, "acc1": 7.75, "cpu0": 0.0}
    assert s.value == 7.75


def test_tensor_charged_once_per_device_not_per_edge():
    w = Workload.from_paper_json(diamond())
    s = evaluate.max_load(w, split(n1="acc0", n2="acc1", n3="acc1", n4="acc1"))
    # a feeds b and c, both on acc1: acc1 receives it once, acc0 sends it once
    assert s.loads["acc1"] == 2 + 3 + 4 + 0.5
    assert s.loads["acc0"] == 1 + 0.5


def test_cpu_pays_no_communication():
    w = Workload.from_paper_json(diamond())
    s = evaluate.max_load(w, split(n1="acc0", n2="acc0", n3="acc1", n4="cpu0"))
    assert s.loads == {"acc0": 1 + 2 + 0.5 + 0.25, "acc1": 3 + 0.5 + 0.125, "cpu0": 40.0}


def test_latency_by_hand():
    w = Workload.from_paper_json(diamond())
    # acc0 runs a, then (after b and c on the CPU) d: two pieces, two calls
    s = evaluate.latency(w, split(n1="acc0", n2="cpu0", n3="cpu0", n4="acc0"))
    # piece {a}: 1 + sends a 0.5 = 1.5; b: 21.5; c: 31.5; piece {d}: 31.5 + receives b, c (0.375) + 4
    assert s.value == pytest.approx(35.875)
    assert evaluate.latency(w, {i: "acc0" for i in (1, 2, 3, 4)}).value == 10.0
    assert evaluate.latency(w, {i: "cpu0" for i in (1, 2, 3, 4)}).value == 10 + 30 + 40


def test_pieces_follow_paths_that_leave_the_device():
    w = Workload.from_paper_json(diamond())
    dev = evaluate.device_array(w, split(n1="acc0", n2="acc1", n3="acc0", n4="acc0"))
    # d is reached from a via b (on acc1): it starts a second piece; c stays in the first
    assert evaluate.accelerator_pieces(w, dev).tolist() == [1, 1, 1, 2]


def test_check_memory_support_colour_and_contiguity():
    data = diamond(mem=2.5)
    for n, size in zip(data["nodes"], (2, 2, 1, 1)):
        n["size"] = size
    data["nodes"][2]["supportedOnFpga"] = 0
    data["nodes"][1]["colorClass"] = data["nodes"][3]["colorClass"] = 7
    w = Workload.from_paper_json(data)
    problems = evaluate.check(w, split(n1="acc0", n2="acc0", n3="acc1", n4="cpu0"))
    assert any(p.startswith("memory: acc0 holds 4") for p in problems)
    assert any("support: node 3" in p for p in problems)
    assert any("colour class: nodes 2 and 4" in p for p in problems)
    assert len(problems) == 3


def test_check_non_convex_part_and_cycle():
    w = Workload.from_paper_json(diamond())
    a = split(n1="acc0", n2="acc1", n3="acc1", n4="acc0")
    assert evaluate.check(w, a) == []
    assert any("not convex" in p for p in evaluate.check(w, a, contiguity="convex"))
    assert any("chain of ideals" in p for p in evaluate.check(w, a, contiguity="ideal_chain"))
    assert any("cycle between parts" in p for p in evaluate.check(w, a, acyclic=True))
    ok = split(n1="acc0", n2="acc0", n3="acc1", n4="acc1")
    assert evaluate.check(w, ok, contiguity="ideal_chain", acyclic=True) == []


def test_training_parts_are_judged_per_pass():
    # forward a -> b, backward b' -> a'; a, a' on acc0 and b, b' on acc1 is a valid pipeline
    w = Workload.from_paper_json(workload(
        [node(1, cc=1), node(2, cc=2), node(3, backward=True, cc=2), node(4, backward=True, cc=1)],
        [edge(1, 2), edge(2, 3), edge(3, 4), edge(1, 4)]))
    a = {1: "acc0", 4: "acc0", 2: "acc1", 3: "acc1"}
    assert evaluate.check(w, a, contiguity="ideal_chain", acyclic=True) == []
    assert evaluate.check(w, a, contiguity="convex") == []


def test_unknown_device_and_unplaced_node():
    w = Workload.from_paper_json(diamond())
    assert "unknown device 'gpu0'" in evaluate.check(w, {1: "gpu0", 2: "acc0", 3: "acc0", 4: "acc0"})[0]
    assert "has no device" in evaluate.check(w, {1: "acc0"})[0]


def test_runner_pieces_split_a_cpu_core_around_accelerator_calls():
    """A latency plan gives only its accelerator pieces; a serial CPU core that runs nodes
    before and after an accelerator call needs two calls, or they wait on each other."""
    data = workload([node(i, cpu=10, acc=1) for i in range(3)],
                    [edge(0, 1, 0.5), edge(1, 2, 0.25)], k=1, l=1)
    w = Workload.from_paper_json(data)
    a = {0: "cpu0", 1: "acc0", 2: "cpu0"}
    with pytest.raises(SplitError, match="cycle"):
        evaluate.latency(w, a, {1: 1}, serial_cpus=True)  # one call for both CPU nodes
    dev = evaluate.device_array(w, a)
    given = np.array([0, 1, 0])
    piece = evaluate.runner_pieces(w, dev, given)
    assert piece[1] == 1 and piece[0] != piece[2]
    pieces = {int(w.ids[v]): int(piece[v]) for v in range(w.n)}
    # cpu 10, then the call: 0.5 in + 1 + 0.25 out, then cpu 10
    assert evaluate.latency(w, a, pieces, serial_cpus=True).value == pytest.approx(21.75)
