"""Brute-force cross-checks of the evaluator and the max-load DP on tiny random workloads.

The reference implementations live in ``tests/bruteforce.py`` and never import
``onnxsplit.solve``.  Every random workload is reproducible from its seed:
``bruteforce.random_workload(seed, training=...)``.
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bruteforce as bf  # noqa: E402
from onnxsplit.solve import evaluate  # noqa: E402
from onnxsplit.solve.throughput import dp  # noqa: E402
from onnxsplit.workload import Workload  # noqa: E402

REL = 1e-9

INFERENCE_SEEDS = range(0, 500)
TRAINING_SEEDS = range(1000, 1400)
TRAINING_NO_ORPHAN_SEEDS = range(2000, 2150)
K0_SEEDS = range(3000, 3030)  # extra: no accelerators at all


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)


def inference(seed: int) -> dict:
    return bf.random_workload(seed, training=False, n_range=(2, 7))


def training(seed: int, orphans=None) -> dict:
    return bf.random_workload(seed, training=True, orphans=orphans, n_range=(2, 5))


def no_accelerators(seed: int) -> dict:
    return bf.random_workload(seed, training=seed % 2 == 1, n_range=(2, 5), k_range=(0, 0), l_range=(1, 3))


def all_cases():
    for s in INFERENCE_SEEDS:
        yield pytest.param(inference, s, id=f"inf-{s}")
    for s in TRAINING_SEEDS:
        yield pytest.param(training, s, id=f"train-{s}")
    for s in TRAINING_NO_ORPHAN_SEEDS:
        yield pytest.param(lambda x: training(x, orphans=0), s, id=f"train-noorphan-{s}")
    for s in K0_SEEDS:
        yield pytest.param(no_accelerators, s, id=f"k0-{s}")


CASES = list(all_cases())


def dump(data: dict) -> str:
    return json.dumps(data, sort_keys=True)


# ---- evaluator ---------------------------------------------------------------------------------

@pytest.mark.parametrize("make, seed", CASES)
def test_evaluator_matches_bruteforce(make, seed):
    data = make(seed)
    w = Workload.from_paper_json(data)
    g = bf.view(data)
    rng = random.Random(seed * 7919 + 1)
    for _ in range(25):
        a = bf.random_assignment(g, rng)
        ml, bml = evaluate.max_load(w, a).value, bf.max_load(g, a)
        assert close(ml, bml), f"max_load {ml} != brute {bml}\nassignment={a}\n{dump(data)}"
        blat = bf.latency(g, a)
        lat = evaluate.latency(w, a).value
        assert close(lat, blat), f"latency {lat} != brute {blat}\nassignment={a}\n{dump(data)}"


@pytest.mark.parametrize("make, seed", CASES)
def test_check_matches_bruteforce(make, seed):
    """check() agrees with the independent predicates on random assignments."""
    data = make(seed)
    w = Workload.from_paper_json(data)
    g = bf.view(data)
    has_orphans = bool(bf.orphan_classes(g))
    rng = random.Random(seed * 104729 + 3)
    assignments = [bf.random_assignment(g, rng) for _ in range(15)]
    assignments += [a for a, _ in zip(bf.class_assignments(g), range(15))]
    for a in assignments:
        ok = bf.respects_constraints(g, a)
        none = evaluate.check(w, a, contiguity="none")
        assert (not none) == ok, f"check(none)={none} but brute constraints ok={ok}\n{a}\n{dump(data)}"
        convex = evaluate.check(w, a, contiguity="convex")
        assert (not convex) == (ok and bf.is_convex(g, a)), f"check(convex)={convex}\n{a}\n{dump(data)}"
        chain = evaluate.check(w, a, contiguity="ideal_chain")
        # check() judges the forward parts only (no stand-ins for orphan backward classes)
        expect = ok and bf.is_chain_of_ideals(g, a, with_standins=False)
        assert (not chain) == expect, f"check(ideal_chain)={chain}, brute {expect}\n{a}\n{dump(data)}"
        if not has_orphans:
            assert bf.is_chain_of_ideals(g, a, with_standins=True) == \
                bf.is_chain_of_ideals(g, a, with_standins=False)


# ---- DP ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, seed", CASES)
def test_dp_matches_bruteforce(make, seed):
    data = make(seed)
    w = Workload.from_paper_json(data)
    g = bf.view(data)
    best, best_a = bf.brute_min_max_load(g, chain=True)
    plan = dp.solve(w)
    if best is None:
        assert plan.status == "infeasible", \
            f"brute force finds no valid chain-of-ideals split, DP says {plan.status} {plan.value}\n{dump(data)}"
        # then no linearized plan can exist either
        assert dp.solve(w, linear_only=True).status == "infeasible"
        return
    assert plan.status == "optimal", f"DP status {plan.status}, brute optimum {best} by {best_a}\n{dump(data)}"
    assert close(plan.value, best), \
        f"DP value {plan.value} != brute-force optimum {best} (by {best_a}; DP plan {plan.assignment})\n{dump(data)}"

    # the DP's plan is a valid chain-of-ideals split and scores its value
    assert evaluate.check(w, plan.assignment, contiguity="ideal_chain") == []
    assert close(evaluate.max_load(w, plan.assignment).value, plan.value)
    assert close(bf.max_load(g, plan.assignment), plan.value)
    assert bf.respects_constraints(g, plan.assignment), dump(data)
    assert bf.is_chain_of_ideals(g, plan.assignment, with_standins=True), \
        f"DP plan {plan.assignment} is not a chain of ideals (with orphan stand-ins)\n{dump(data)}"

    # linearized DP: an upper bound
    lin = dp.solve(w, linear_only=True)
    assert lin.status in ("feasible", "infeasible")
    if lin.status == "feasible":
        assert lin.value >= plan.value * (1 - REL) - 1e-12
        assert evaluate.check(w, lin.assignment, contiguity="ideal_chain") == []
        assert close(evaluate.max_load(w, lin.assignment).value, lin.value)

    # unrestricted (non-contiguous) optimum is a lower bound
    free, _ = bf.brute_min_max_load(g, chain=False)
    assert free is not None and free <= plan.value * (1 + REL) + 1e-12


def test_all_assignments_agrees_with_class_enumeration():
    """The symmetry-reduced class enumeration finds the same optimum as a plain product."""
    for seed in range(40):
        data = bf.random_workload(seed, n_range=(2, 4), k_range=(1, 2), l_range=(0, 2))
        g = bf.view(data)
        plain = [bf.max_load(g, a) for a in bf.all_assignments(g) if bf.respects_constraints(g, a)
                 and bf.is_chain_of_ideals(g, a)]
        best, _ = bf.brute_min_max_load(g, chain=True)
        if not plain:
            assert best is None
        else:
            assert close(min(plain), best)


# ---- check(): hand-built cases -------------------------------------------------------------------

def _tiny(nodes, edges, k=2, l=1, M=10.0):
    data = {"maxSizePerFPGA": M, "maxFPGAs": k, "maxCPUs": l, "nodes": [], "edges": []}
    for nid, extra in nodes:
        nd = {"id": nid, "supportedOnFpga": 1, "cpuLatency": 4.0, "fpgaLatency": 1.0, "isBackwardNode": 0}
        nd.update(extra)
        data["nodes"].append(nd)
    data["edges"] = [{"sourceId": s, "destId": d, "cost": 1.0} for s, d in edges]
    return data


def test_check_flags_memory_overflow():
    data = _tiny([(0, {"size": 6}), (1, {"size": 5})], [(0, 1)], M=10.0)
    w = Workload.from_paper_json(data)
    bad = evaluate.check(w, {0: "acc0", 1: "acc0"})
    assert any("memory" in p for p in bad), bad
    assert evaluate.check(w, {0: "acc0", 1: "acc1"}) == []
    assert evaluate.check(w, {0: "acc0", 1: "cpu0"}) == []


def test_check_flags_unsupported_on_accelerator():
    data = _tiny([(0, {}), (1, {"supportedOnFpga": 0})], [(0, 1)])
    w = Workload.from_paper_json(data)
    bad = evaluate.check(w, {0: "acc0", 1: "acc1"})
    assert any("support" in p for p in bad), bad
    assert evaluate.check(w, {0: "acc0", 1: "cpu0"}) == []


def test_check_flags_split_colour_class():
    data = _tiny([(0, {"colorClass": 7}), (1, {}), (2, {"colorClass": 7})], [(0, 1), (1, 2)])
    w = Workload.from_paper_json(data)
    bad = evaluate.check(w, {0: "acc0", 1: "acc0", 2: "acc1"})
    assert any("colour" in p for p in bad), bad
    assert evaluate.check(w, {0: "acc0", 1: "acc0", 2: "acc0"}) == []


def test_check_flags_non_convex_part():
    data = _tiny([(0, {}), (1, {}), (2, {})], [(0, 1), (1, 2)])
    w = Workload.from_paper_json(data)
    a = {0: "acc0", 1: "acc1", 2: "acc0"}  # acc0 -> acc1 -> acc0
    assert evaluate.check(w, a) == []  # no contiguity asked
    assert any("convex" in p for p in evaluate.check(w, a, contiguity="convex"))
    assert evaluate.check(w, a, contiguity="ideal_chain") != []
    assert evaluate.check(w, a, acyclic=True) != []
    assert not bf.is_convex(data, a) and not bf.is_chain_of_ideals(data, a)
    good = {0: "acc0", 1: "acc1", 2: "acc1"}
    assert evaluate.check(w, good, contiguity="convex") == []
    assert evaluate.check(w, good, contiguity="ideal_chain") == []


def test_check_convex_but_not_a_chain():
    """Two convex parts with edges both ways (diamond sides) are not a chain of ideals."""
    data = _tiny([(0, {}), (1, {}), (2, {}), (3, {})], [(0, 3), (2, 1)])
    w = Workload.from_paper_json(data)
    a = {0: "acc0", 1: "acc0", 2: "acc1", 3: "acc1"}  # acc0 -> acc1 (0->3), acc1 -> acc0 (2->1)
    assert evaluate.check(w, a, contiguity="convex") == []
    assert evaluate.check(w, a, contiguity="ideal_chain") != []
    assert bf.is_convex(data, a) and not bf.is_chain_of_ideals(data, a)


# ---- JSON round trip -------------------------------------------------------------------------------

@pytest.mark.parametrize("make, seed", CASES[::5])
def test_json_round_trip(make, seed):
    data = make(seed)
    w = Workload.from_paper_json(data)
    out = w.to_paper_json()
    assert Workload.from_paper_json(out).to_paper_json() == out
    assert Workload.from_paper_json(json.loads(json.dumps(out))).to_paper_json() == out
    assert out == data  # the generator's dicts use the paper's exact spelling


def test_json_round_trip_bool_flags_and_extras():
    data = {"maxSizePerFPGA": 3.5, "maxFPGAs": 1, "maxCPUs": 0, "comment": "x",
            "nodes": [{"id": 5, "supportedOnFpga": True, "cpuLatency": 1, "fpgaLatency": 0.5,
                       "isBackwardNode": False, "name": "op", "foo": [1, 2]},
                      {"id": 2, "supportedOnFpga": False, "cpuLatency": 2.0, "fpgaLatency": 0.0,
                       "isBackwardNode": False, "size": 3, "colorClass": 1}],
            "edges": [{"sourceId": 5, "destId": 2, "cost": 0.25, "tensor": "t"}]}
    w = Workload.from_paper_json(data)
    out = w.to_paper_json()
    assert Workload.from_paper_json(out).to_paper_json() == out
    assert out["comment"] == "x" and out["edges"][0]["tensor"] == "t" and out["nodes"][0]["foo"] == [1, 2]
    assert out["nodes"][0]["supportedOnFpga"] is True


# ---- hand-built DP cases: zero-latency nodes that carry memory or are unsupported -------------------

def _n(i, cpu, acc, sup=1, bwd=0, **kw):
    d = {"id": i, "supportedOnFpga": sup, "cpuLatency": cpu, "fpgaLatency": acc, "isBackwardNode": bwd}
    d.update(kw)
    return d


ZERO_LATENCY_CASES = {
    # an unsupported zero-latency sink must stay free to run on the CPU alone
    "unsupported-sink": {"maxSizePerFPGA": 100, "maxFPGAs": 1, "maxCPUs": 1,
                         "nodes": [_n(0, 10, 1), _n(1, 0, 0, sup=0)],
                         "edges": [{"sourceId": 0, "destId": 1, "cost": 1}]},
    # a zero-latency source whose memory does not fit next to its consumer
    "memory-source": {"maxSizePerFPGA": 5, "maxFPGAs": 1, "maxCPUs": 1,
                      "nodes": [_n(0, 0, 0, size=4), _n(1, 10, 1, size=4)],
                      "edges": [{"sourceId": 0, "destId": 1, "cost": 1}]},
    # same, with two accelerators and no CPU: feasible only when the two are apart
    "memory-source-no-cpu": {"maxSizePerFPGA": 5, "maxFPGAs": 2, "maxCPUs": 0,
                             "nodes": [_n(0, 0, 0, size=4), _n(1, 10, 1, size=4)],
                             "edges": [{"sourceId": 0, "destId": 1, "cost": 1}]},
    # an unsupported zero-latency orphan backward node (its stand-in has one neighbour)
    "unsupported-orphan": {"maxSizePerFPGA": 100, "maxFPGAs": 1, "maxCPUs": 1,
                           "nodes": [_n(0, 10, 1, colorClass=1), _n(1, 10, 1, bwd=1, colorClass=1),
                                     _n(2, 0, 0, sup=0, bwd=1)],
                           "edges": [{"sourceId": 0, "destId": 1, "cost": 1},
                                     {"sourceId": 1, "destId": 2, "cost": 1}]},
}


@pytest.mark.parametrize("name", sorted(ZERO_LATENCY_CASES))
def test_dp_zero_latency_nodes_with_constraints(name):
    data = ZERO_LATENCY_CASES[name]
    best, best_a = bf.brute_min_max_load(data, chain=True)
    assert best is not None
    plan = dp.solve(Workload.from_paper_json(data))
    assert plan.status == "optimal" and close(plan.value, best), \
        f"{name}: DP {plan.status} {plan.value} {plan.assignment}; brute force {best} by {best_a}"


# ---- latency: pieces on two accelerators that wait for each other ---------------------------------

def test_latency_piece_cycle():
    """acc0 = {0, 1}, acc1 = {2, 3}, edges 0->3 and 2->1: each device is one convex piece, but
    the two calls need each other's output.  The evaluator then starts a new piece at every
    device switch: each node becomes its own call, and both chains run in parallel."""
    data = _tiny([(0, {}), (1, {}), (2, {}), (3, {})], [(0, 3), (2, 1)])
    w = Workload.from_paper_json(data)
    a = {0: "acc0", 1: "acc0", 2: "acc1", 3: "acc1"}
    assert evaluate.check(w, a, contiguity="convex") == []
    with pytest.raises(bf.PieceCycle):
        bf._latency(data, a, bf.pieces(data, a))
    assert set(bf.switch_pieces(data, a).values()) == {("acc0", 1), ("acc0", 2), ("acc1", 1), ("acc1", 2)}
    # by hand: {0} and {2} finish at 1 + 1 (send); {1} and {3} at 2 + 1 (receive) + 1
    assert evaluate.latency(w, a).value == pytest.approx(4.0) == bf.latency(data, a)
