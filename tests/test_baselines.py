"""Baselines: hand-built cases with known answers, validity of every plan, and the paper's
values (expected.json) where the shared data exists."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bruteforce as bf  # noqa: E402
from conftest import PAPER, needs_paper  # noqa: E402
from onnxsplit import api  # noqa: E402
from onnxsplit.cli import main  # noqa: E402
from onnxsplit.errors import SolveError  # noqa: E402
from onnxsplit.plan import read_split  # noqa: E402
from onnxsplit.solve import evaluate, methods  # noqa: E402
from onnxsplit.solve import classes  # noqa: E402
from onnxsplit.solve.baselines import greedy  # noqa: E402
from onnxsplit.solve.baselines import local_search  # noqa: E402
from onnxsplit.solve.baselines import partition  # noqa: E402
from onnxsplit.solve.baselines import pipedream  # noqa: E402
from onnxsplit.workload import Workload  # noqa: E402
from workloads import diamond, edge, node, workload  # noqa: E402

BASELINES = {m.name: m.objectives for m in methods.REGISTRY if m.kind == "baseline"}
METHODS = sorted(m for m in BASELINES if m != "given")
HAS_SCOTCH = __import__("importlib").util.find_spec("pyscotch") is not None
HAS_METIS = __import__("importlib").util.find_spec("pymetis") is not None


def W(data: dict) -> Workload:
    return Workload.from_paper_json(data)


def devices_of(plan, *ids):
    return [plan.assignment[i] for i in ids]


def assert_valid_plan(w: Workload, plan, objective: str):
    """The plan scores its value, and is called feasible exactly when check() finds nothing."""
    problems = evaluate.check(w, plan.assignment)
    assert plan.value == pytest.approx(evaluate.score(w, plan.assignment, objective).value, rel=1e-9, abs=1e-12)
    assert plan.status == ("infeasible" if problems else "feasible"), (plan.status, problems)
    assert plan.details["violations"] == problems
    assert set(plan.assignment) == set(int(i) for i in w.ids)


# ---- registry ---------------------------------------------------------------------------------------

def test_registry_is_what_the_cli_offers_and_the_readme_lists():
    """One list: the CLI's --method choices and the README's table come from the registry."""
    import subprocess
    import sys

    from onnxsplit.cli import _parser

    for name in methods.METHODS:
        assert _parser().parse_args(["solve", "w.json", "--method", name]).method == name
    with pytest.raises(SystemExit):
        _parser().parse_args(["solve", "w.json", "--method", "no_such_method"])
    root = Path(__file__).resolve().parent.parent
    check = subprocess.run([sys.executable, str(root / "tools" / "readme_methods.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    for m in methods.REGISTRY:
        assert f"| `{m.name}` |" in (root / "README.md").read_text()


def solve_baseline(w, method, objective="throughput", **options):
    """A baseline through the registry, with only the options it takes."""
    return api.solve(w, objective, method, options=methods.options_for(method, others="ignore", **options))


# ---- the paper's latency greedy -------------------------------------------------------------------

def chain4(sizes, k=2, l=1, mem=6.0, supported=(1, 1, 1, 1)):
    return workload([node(i + 1, cpu=10.0, acc=1.0, size=s, supported=bool(sup))
                     for i, (s, sup) in enumerate(zip(sizes, supported))],
                    [edge(1, 2, 0.5), edge(2, 3, 0.5), edge(3, 4, 0.5)], k=k, l=l, mem=mem)


def test_greedy_fills_accelerators_in_order():
    w = W(chain4([3, 3, 3, 3]))
    plan = greedy.greedy(w, "latency")
    assert devices_of(plan, 1, 2, 3, 4) == ["acc0", "acc0", "acc1", "acc1"]
    # acc0: 1 + 1 + send 0.5 = 2.5; acc1: receive 0.5 + 1 + 1 = 2.5 later
    assert plan.value == pytest.approx(5.0)
    assert plan.stages == ["acc0", "acc1"]
    assert_valid_plan(w, plan, "latency")


def test_greedy_overflows_to_cpu_and_reopens_after_a_too_large_block():
    w = W(chain4([3, 3, 3, 3], k=1))
    plan = greedy.greedy(w, "latency")
    assert devices_of(plan, 1, 2, 3, 4) == ["acc0", "acc0", "cpu0", "cpu0"]
    assert plan.value == pytest.approx(1 + 1 + 0.5 + 10 + 10)
    # a block larger than an accelerator goes to the CPU; the next one opens a new accelerator
    plan = greedy.greedy(W(chain4([3, 9, 3, 3], k=2)), "latency")
    assert devices_of(plan, 1, 2, 3, 4) == ["acc0", "cpu0", "acc1", "acc1"]
    # an unsupported block likewise (the reference ignores support)
    plan = greedy.greedy(W(chain4([1, 1, 1, 1], supported=(1, 0, 1, 1))), "latency")
    assert devices_of(plan, 1, 2, 3, 4) == ["acc0", "cpu0", "acc1", "acc1"]
    assert plan.status == "feasible"


def test_greedy_fuses_colour_classes_on_a_cycle():
    # 1 -> 2 -> 3 with 1 and 3 in one class: classes {1,3} and {2} form a cycle, one block
    data = workload([node(1, size=3, cc=7), node(2, size=3), node(3, size=3, cc=7), node(4, size=3)],
                    [edge(1, 2), edge(2, 3), edge(3, 4)], k=2, mem=9)
    plan = greedy.greedy(W(data), "latency")
    assert devices_of(plan, 1, 2, 3, 4) == ["acc0", "acc0", "acc0", "acc1"]
    assert classes.inseparable_blocks(W(data)).order == [0, 1]


def test_greedy_without_cpu_raises_when_a_block_needs_one():
    with pytest.raises(SolveError):
        greedy.greedy(W(chain4([9, 1, 1, 1], l=0)))


# ---- OpenVINO HETERO-style and ONNX Runtime default ---------------------------------------------------

def test_hetero_greedy_walks_topological_order_and_falls_back_per_node():
    # unsupported node 2 goes to the CPU without closing acc0; memory then moves on to acc1
    w = W(chain4([3, 3, 3, 3], supported=(1, 0, 1, 1)))
    plan = greedy.hetero_greedy(w)
    assert devices_of(plan, 1, 2, 3, 4) == ["acc0", "cpu0", "acc0", "acc1"]
    assert_valid_plan(w, plan, "throughput")
    # nothing after the last accelerator is full comes back to an earlier one
    plan = greedy.hetero_greedy(W(chain4([5, 5, 1, 1], k=1)))
    assert devices_of(plan, 1, 2, 3, 4) == ["acc0", "cpu0", "cpu0", "cpu0"]


def test_ort_default_puts_supported_classes_on_one_accelerator():
    data = workload([node(1), node(2, supported=False), node(3, cc=5), node(4, cc=5, supported=False), node(5)],
                    [edge(1, 2), edge(2, 3), edge(3, 4), edge(4, 5)], k=3, mem=100)
    plan = solve_baseline(W(data), "ort_default")
    assert devices_of(plan, 1, 2, 3, 4, 5) == ["acc0", "cpu0", "cpu0", "cpu0", "acc0"]
    assert plan.status == "feasible"
    # too big for one accelerator: ORT does not split, the plan is infeasible (and says why)
    plan = solve_baseline(W(chain4([3, 3, 3, 3])), "ort_default")
    assert plan.status == "infeasible" and plan.details["violations"][0].startswith("memory: acc0")


def test_fixed_placements():
    w = W(diamond(k=2, l=1, mem=1e9))
    one = solve_baseline(w, "one_accelerator")
    assert one.value == pytest.approx(1 + 2 + 3 + 4) and one.status == "feasible"
    cpu = solve_baseline(w, "all_cpu", "latency")
    assert cpu.value == pytest.approx(10 + 30 + 40)  # CPU nodes run in parallel: critical path
    assert solve_baseline(w, "all_cpu").value == pytest.approx(100)
    with pytest.raises(SolveError):
        solve_baseline(W(diamond(l=0)), "all_cpu")
    with pytest.raises(SolveError):
        solve_baseline(w, "given")
    # one_accelerator ignores support like the reference, and says so
    data = diamond()
    data["nodes"][1]["supportedOnFpga"] = 0
    plan = solve_baseline(W(data), "one_accelerator")
    assert plan.status == "infeasible" and plan.details["violations"][0].startswith("support:")


def test_given_split_over_the_device_count_is_scored_and_infeasible(tmp_path):
    w = W(diamond(k=1))
    split = {1: "acc0", 2: "acc0", 3: "acc1", 4: "cpu0"}
    plan = solve_baseline(w, "given", split=split)
    assert plan.status == "infeasible"
    assert plan.details["violations"][0] == "devices: the split uses 2 accelerators, the workload has 1"
    assert plan.value == pytest.approx(api.evaluate_split(w, split)["value"])
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"fpgas": [{"nodes": [1, 2, 3]}], "cpus": [{"nodes": [4]}]}))
    plan = solve_baseline(w, "given", "latency", split=p)
    assert plan.status == "feasible" and plan.assignment == {1: "acc0", 2: "acc0", 3: "acc0", 4: "cpu0"}


# ---- local search ------------------------------------------------------------------------------------

def test_local_search_respects_memory():
    # without memory the best is {a, b} | {c} at 5; a and b cannot share an accelerator
    data = workload([node(1, acc=1, size=10), node(2, acc=1, size=10), node(3, acc=5, size=0)], [],
                    k=2, l=0, mem=10)
    plan = local_search.local_search(W(data))
    assert plan.status == "feasible" and plan.value == pytest.approx(6.0)
    assert plan.assignment[1] != plan.assignment[2]


def test_local_search_is_seeded_and_reproducible():
    w = W(bf.random_workload(7, n_range=(6, 7)))
    a = local_search.local_search(w, seed=3, restarts=4)
    b = local_search.local_search(w, seed=3, restarts=4)
    assert a.assignment == b.assignment and a.details["runs"] == b.details["runs"]
    assert len(a.details["runs"]) == 4


@pytest.mark.parametrize("seed", range(40))
def test_local_search_against_bruteforce(seed):
    data = bf.random_workload(seed, training=seed % 2 == 1, n_range=(2, 5))
    w = W(data)
    best, _ = bf.brute_min_max_load(bf.view(data), chain=False)
    plan = local_search.local_search(w, seed=seed, restarts=5)
    assert_valid_plan(w, plan, "throughput")
    if best is None:
        assert plan.status == "infeasible"
    else:
        assert plan.status == "feasible"
        assert plan.value >= best * (1 - 1e-9) - 1e-12


def test_incremental_loads_match_the_evaluator():
    for seed in range(30):
        data = bf.random_workload(seed, training=seed % 2 == 0, n_range=(4, 7))
        w = W(data)
        g = classes.class_graph(w)
        rng = np.random.default_rng(seed)
        st = local_search.ClassState(g, w, rng.integers(0, len(w.devices), g.n))
        st.repair()
        st.descend()
        loads = evaluate.max_load(w, st.assignment(w)).loads
        assert np.allclose(st.load, [loads[d.name] for d in w.devices], rtol=1e-9, atol=1e-12)


def test_repair_moves_classes_off_an_overfull_accelerator():
    data = workload([node(i, acc=1, size=4) for i in range(1, 5)], [edge(1, 2), edge(2, 3), edge(3, 4)],
                    k=2, l=1, mem=8)
    w = W(data)
    g = classes.class_graph(w)
    st = local_search.ClassState(g, w, np.zeros(4, dtype=np.int64))  # all on acc0: 16 > 8
    assert not st.feasible
    assert st.repair() == 2 and st.feasible
    assert evaluate.check(w, st.assignment(w)) == []


# ---- PipeDream -------------------------------------------------------------------------------------

def test_pipedream_collapses_branches():
    # a -> b, a -> c, b -> d, c -> d, d -> e: the diamond's tails a, b, c fuse
    data = workload([node(i) for i in range(1, 6)],
                    [edge(1, 2), edge(1, 3), edge(2, 4), edge(3, 4), edge(4, 5)], k=3)
    w = W(data)
    labels = pipedream.pipedream_labels(w)
    assert labels[0] == labels[1] == labels[2] and len({labels[0], labels[3], labels[4]}) == 3
    plan = pipedream.pipedream(w)
    assert len(set(devices_of(plan, 1, 2, 3))) == 1
    assert evaluate.check(w, plan.assignment, contiguity="ideal_chain") == []


def test_pipedream_ignores_inputs_and_broadcasts():
    # a zero-latency input feeding every layer (like bert's attention mask) ties nothing
    nodes = [node(1, cpu=0, acc=0)] + [node(i) for i in range(2, 6)]
    edges = [edge(i, i + 1) for i in range(2, 5)] + [edge(1, i, 0.0) for i in range(2, 6)]
    w = W(workload(nodes, edges, k=4))
    assert len(set(pipedream.pipedream_labels(w).tolist())) == 5
    plan = pipedream.pipedream(w)
    assert plan.value == pytest.approx(1 + 0.5 + 0.5)  # one layer per accelerator
    # without the rule the input would fuse every layer into one stage
    nodes[0] = node(1, cpu=1, acc=1)
    assert len(set(pipedream.pipedream_labels(W(workload(nodes, edges, k=4))).tolist())) == 2


def test_pipedream_infeasible_when_memory_cannot_hold_a_layer():
    plan = pipedream.pipedream(W(chain4([9, 1, 1, 1], l=0)))
    assert plan.status == "infeasible" and plan.value is None and plan.details["violations"]


# ---- Scotch and METIS --------------------------------------------------------------------------------

TOOLS = [pytest.param("scotch", marks=pytest.mark.skipif(not HAS_SCOTCH, reason="pyscotch not installed")),
         pytest.param("metis", marks=pytest.mark.skipif(not HAS_METIS, reason="pymetis not installed"))]


@pytest.mark.parametrize("tool", TOOLS)
def test_partitioner_splits_two_cliques(tool):
    # two 3-cliques joined by one cheap edge: the cut goes between them
    nodes = [node(i, acc=1.0) for i in range(1, 7)]
    edges = [edge(1, 2, 5), edge(1, 3, 5), edge(2, 3, 5), edge(3, 4, 0.1), edge(4, 5, 5), edge(4, 6, 5),
             edge(5, 6, 5)]
    w = W(workload(nodes, edges, k=2))
    plan = partition.graph_partition(w, tool, restarts=3)
    assert len(set(devices_of(plan, 1, 2, 3))) == 1 and len(set(devices_of(plan, 4, 5, 6))) == 1
    assert plan.assignment[1] != plan.assignment[4]
    assert plan.value == pytest.approx(3 + 0.1)
    assert_valid_plan(w, plan, "throughput")


def test_partition_graph_weights_follow_the_reference():
    # class {1,2} -> class {3}: nodes 1 and 2 both send to 3; 3 sends back to 4 in class {1,2}? no: DAG
    data = workload([node(1, acc=1, cc=9), node(2, acc=2, cc=9), node(3, acc=4), node(4, acc=8)],
                    [edge(1, 3, 0.5), edge(2, 3, 0.25), edge(2, 4, 0.25), edge(3, 4, 1.0)], k=2)
    w = W(data)
    g = classes.class_graph(w)
    xadj, adj, vw, ew = partition.partition_graph(w, g, np.arange(g.n))
    assert vw.tolist() == [3_000_000, 4_000_000, 8_000_000]
    weights = {(u, int(adj[j])): int(ew[j]) for u in range(g.n) for j in range(xadj[u], xadj[u + 1])}
    assert weights == {(0, 1): 750_000, (1, 0): 750_000, (0, 2): 250_000, (2, 0): 250_000,
                       (1, 2): 1_000_000, (2, 1): 1_000_000}


# ---- every method, every small workload: valid plans ------------------------------------------------

@pytest.mark.parametrize("seed", range(12))
def test_every_method_returns_a_checked_plan(seed):
    data = bf.random_workload(seed, training=seed % 3 == 2, n_range=(3, 7))
    w = W(data)
    for method in METHODS:
        if method == "scotch" and not HAS_SCOTCH or method == "metis" and not HAS_METIS:
            continue
        for objective in BASELINES[method]:
            try:
                plan = solve_baseline(w, method, objective, restarts=3)
            except SolveError as e:  # only for a missing kind of device
                assert "CPU core" in str(e) or "accelerator" in str(e), (method, e)
                continue
            assert plan.method == method and plan.objective == objective
            if plan.value is None:
                assert plan.status == "infeasible" and plan.details["violations"]
                continue
            assert_valid_plan(w, plan, objective)
            if method in ("greedy", "hetero_greedy", "local_search", "pipedream", "scotch", "metis") \
                    and w.num_cpus > 0:
                # with a CPU core to fall back on, these never break memory or support
                assert plan.status == "feasible", (method, plan.details["violations"])


# ---- the command line --------------------------------------------------------------------------------

def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_baselines(capsys, tmp_path):
    p = tmp_path / "w.json"
    p.write_text(json.dumps(chain4([3, 3, 3, 3])))
    rc, out, _ = run(capsys, "solve", p, "--method", "local_search", "--seed", 2, "--restarts", 2, "--json")
    obj = json.loads(out)
    assert rc == 0 and obj["method"] == "local_search" and obj["status"] == "feasible"
    assert obj["details"]["seed"] == 2 and len(obj["details"]["runs"]) == 2
    rc, out, _ = run(capsys, "solve", p, "--method", "ort_default")
    assert rc == 1 and "infeasible" in out and "memory: acc0" in out
    rc, out, _ = run(capsys, "solve", p, "--objective", "latency", "--method", "greedy", "--json")
    assert rc == 0 and json.loads(out)["value"] == pytest.approx(5.0)
    s = tmp_path / "s.json"
    s.write_text(json.dumps({"fpgas": [{"nodes": [1, 2]}, {"nodes": [3, 4]}], "cpus": []}))
    rc, out, _ = run(capsys, "solve", p, "--method", "given", "--split", s, "--objective", "latency")
    assert rc == 0 and "latency 5" in out
    rc, _, err = run(capsys, "solve", p, "--method", "greedy", "--split", s)
    assert rc == 2 and "--split" in err
    rc, _, err = run(capsys, "solve", p, "--method", "local_search", "--objective", "latency")
    assert rc == 2 and "does not optimise latency" in err


# ---- the paper's workloads ---------------------------------------------------------------------------

def _names(kind: str) -> list[str]:
    if PAPER is None:
        return []
    return sorted(p.name for p in (PAPER / kind).glob("*.json"))


def _paper(kind: str, name: str) -> Workload:
    return Workload.from_paper_json(PAPER / kind / name)


@needs_paper
@pytest.mark.parametrize("name", _names("latency"))
def test_greedy_reproduces_the_reference(name, expected):
    w = _paper("latency", name)
    plan = solve_baseline(w, "greedy", "latency")
    assert plan.value == pytest.approx(expected["latency"][name]["greedy"], rel=1e-5)
    assert plan.status == "feasible"  # the greedy never breaks memory
    assert evaluate.check(w, plan.assignment, contiguity="convex") == []


@needs_paper
@pytest.mark.parametrize("name", _names("throughput"))
def test_throughput_baselines_against_the_reference(name, expected):
    exp = expected["throughput"][name]
    w = _paper("throughput", name)
    ls = local_search.local_search(w)
    assert ls.status == "feasible" and ls.value <= exp["local_search10"] * 1.05
    assert_valid_plan(w, ls, "throughput")
    assert local_search.local_search(w).assignment == ls.assignment  # seeded
    if exp.get("pipedream") is not None:
        pd = pipedream.pipedream(w)
        # expected.json rounds to 4 decimals
        assert pd.status == "feasible" and pd.value <= exp["pipedream"] + 5e-5
        assert evaluate.check(w, pd.assignment, contiguity="ideal_chain") == []
        if exp.get("dp") is not None:
            assert pd.value >= exp["dp"] * (1 - 1e-9)  # a chain of ideals cannot beat the DP
    one = solve_baseline(w, "one_accelerator")
    assert one.value == pytest.approx(exp["one_accelerator"], rel=1e-5)
    over = float(w.size.sum()) > w.accelerator_memory
    assert one.status == ("infeasible" if over else "feasible")
    for method in ("ort_default", "hetero_greedy", "greedy"):
        assert_valid_plan(w, solve_baseline(w, method), "throughput")


@needs_paper
@pytest.mark.skipif(not HAS_SCOTCH, reason="pyscotch not installed")
@pytest.mark.parametrize("name", _names("throughput"))
def test_scotch_within_five_percent_of_the_reference(name, expected):
    w = _paper("throughput", name)
    plan = partition.graph_partition(w, "scotch")
    assert plan.status == "feasible"
    assert plan.value <= expected["throughput"][name]["scotch"] * 1.05
    assert_valid_plan(w, plan, "throughput")


@needs_paper
@pytest.mark.skipif(not HAS_METIS, reason="pymetis not installed")
def test_metis_on_the_paper_workloads():
    for name in _names("throughput"):
        w = _paper("throughput", name)
        plan = partition.graph_partition(w, "metis")
        assert_valid_plan(w, plan, "throughput")
        assert plan.status == "feasible"
        assert plan.value < solve_baseline(w, "one_accelerator").value


EXPERT = {"bert24": "expert_split", "gnmt": "expert_split_over_memory",
          "inceptionv3": "expert_split_over_memory", "resnet50": "expert_split_over_memory"}


@needs_paper
@pytest.mark.parametrize("model", sorted(EXPERT))
def test_given_expert_split(model, expected):
    name = f"layer_{model}_inference.json"
    split = PAPER / "human-experts" / f"{model}_inference_expert.json"
    w = _paper("latency", name)
    plan = solve_baseline(w, "given", "latency", split=split)
    assert plan.value == pytest.approx(expected["latency"][name][EXPERT[model]], rel=1e-5)
    assert plan.status == "infeasible"  # over memory, or (bert24) one accelerator too many
    w = _paper("throughput", name)
    plan = solve_baseline(w, "given", split=read_split(split, w))
    assert plan.value == pytest.approx(expected["throughput"][name]["expert"], rel=1e-5)
    assert plan.status == "feasible"
    assert not math.isnan(plan.details["scores"]["latency"])
