"""The set-covering certificate (solve/bound_setcover.py), against brute force and by hand.

The brute force (tests/bruteforce.py) enumerates every class -> device map and scores it
with its own max-load model; it never imports onnxsplit.solve.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit.solve.throughput import bound_setcover
from onnxsplit.solve import classes
from onnxsplit.workload import Workload
from workloads import edge, node, workload


def _case(seed: int, scale: float):
    """A small random workload (tensors ``scale`` times dearer) and its brute-force optimum."""
    data = bf.random_workload(seed, training=seed % 2 == 1, n_range=(3, 6), k_range=(1, 3), l_range=(0, 2))
    for e in data["edges"]:
        e["cost"] *= scale
    return Workload.from_paper_json(data), bf.brute_min_max_load(data, chain=False)[0]


def _infeasible(w: Workload, T: float) -> bool:
    cl = classes.build_classes(w)
    return bound_setcover.infeasible(cl, w.num_accelerators, w.num_cpus, w.accelerator_memory, T, None, seconds=30)


@pytest.mark.parametrize("scale", [1, 4])
@pytest.mark.parametrize("seed", range(60))
def test_never_refutes_a_load_some_plan_reaches(seed, scale):
    """Inference and training, with and without CPUs, unsupported and colour classes,
    tensors up to 4 times dearer: at the brute-force optimum, or above it, a plan exists,
    so no certificate may come; well below it one must (where the optimum is not on the
    CPUs alone, whose sets the LP bounds only by a knapsack)."""
    w, best = _case(seed, scale)
    if best is None or best <= 0:
        return
    for T in (best, best * 1.2):
        assert not _infeasible(w, T), (seed, T, best)
    cl = classes.build_classes(w)
    work = float(np.where(cl.supported, cl.acc_fwd + cl.acc_bwd, 0).sum())
    if w.num_cpus == 0 and work > 0:
        # without CPUs all work is on k accelerators: some set holds at least work / k
        assert _infeasible(w, 0.9 * work / w.num_accelerators)


def _chain_of_three(cost: float):
    """0 -> 1 -> 2, each 10 of work, on 2 accelerators and no CPU: the best plan puts two
    classes together and pays the tensor between the sets on both sides."""
    nodes = [node(i, cpu=100, acc=10, size=1) for i in range(3)]
    edges = [edge(0, 1, cost), edge(1, 2, cost)]
    return Workload.from_paper_json(workload(nodes, edges, k=2, l=0, mem=100))


def test_sees_the_transfers_every_split_pays():
    # best plan: {0, 1} and {2} (or {0} and {1, 2}): max load 20 + 3 = 23; without
    # transfers 20 would be possible, so a bound that ignores them stops at 20
    w = _chain_of_three(cost=3.0)
    assert not _infeasible(w, 23.0)
    assert _infeasible(w, 22.5)
    # and a bound blind to transfers could not refute even 20.5
    assert _infeasible(w, 20.5)


def test_memory_forces_the_sets_apart():
    # each class fills an accelerator: three sets on two accelerators cannot be
    nodes = [node(i, cpu=100, acc=10, size=5) for i in range(3)]
    w = Workload.from_paper_json(workload(nodes, [edge(0, 1, 1.0), edge(1, 2, 1.0)], k=2, l=0, mem=5))
    assert _infeasible(w, 1000.0)


def test_no_claim_without_accelerators_or_time():
    w = _chain_of_three(cost=3.0)
    cl = classes.build_classes(w)
    assert not bound_setcover.infeasible(cl, 0, 1, w.accelerator_memory, 1.0, None, seconds=30)
    assert not bound_setcover.infeasible(cl, 2, 0, w.accelerator_memory, 22.5, None, seconds=0.0)


def test_certifies_most_small_cases_just_below_the_optimum():
    """Its strength, measured: 1% below the brute-force optimum the certificate comes on
    86 of the 94 cases of the first test (60 seeds, both scales) -- each set paying its
    own transfers leaves little room; here 30 seeds must reach 80%."""
    proven = cases = 0
    for seed in range(30):
        for scale in (1, 4):
            w, best = _case(seed, scale)
            if best is None or best <= 0:
                continue
            cases += 1
            proven += _infeasible(w, 0.99 * best)
    assert cases >= 40 and proven >= 0.8 * cases, (proven, cases)


def test_on_a_thread_of_its_own_it_bounds_from_below_the_optimum():
    """bound_setcover.Background (the throughput IP runs it beside its other phases): at 22.5,
    below the chain's optimum 23, it certifies the target itself; at the optimum no
    certificate can come, so it tries lower loads and ends below 23 (a plan reaches it)
    but within RETRY_SPAN of it: on this chain every load below 23 is refuted."""
    w = _chain_of_three(cost=3.0)
    cl = classes.build_classes(w)
    search = bound_setcover.Background(cl, w.num_accelerators, w.num_cpus, w.accelerator_memory, 22.5, 20.0, None, 30)
    assert search.finish() == 22.5 == search.bound()
    assert 0 <= search.seconds < 30
    search = bound_setcover.Background(cl, w.num_accelerators, w.num_cpus, w.accelerator_memory, 23.0, 20.0, None, 30)
    bound = search.finish()
    assert bound is not None and 22.5 <= bound < 23.0
    assert bound >= 23.0 / (1 + bound_setcover.RETRY_SPAN)  # every load below 23 here is refuted (22.99 too)


def test_a_stopped_search_claims_nothing():
    """Stopped before its first round, no certificate comes even where one exists; an
    error in the thread reaches the caller."""
    w = _chain_of_three(cost=3.0)
    cl = classes.build_classes(w)
    stop = threading.Event()
    stop.set()
    assert not bound_setcover.infeasible(cl, 2, 0, w.accelerator_memory, 22.5, None, seconds=30, stop=stop)
    broken = bound_setcover.Background(None, 2, 0, w.accelerator_memory, 22.5, 0.0, None, 30)
    with pytest.raises(AttributeError):
        broken.finish()
    assert broken.bound() is None


def test_lower_loads_stay_below_every_load_found_hopeless(monkeypatch):
    """The retries bisect between the highest load proven impossible and the lowest where
    no certificate can come: against an oracle that proves below 22 and gives up at 22 or
    above, no load is tried on one LP at or above one it gave up at, and the search ends
    within RETRY_SPAN of 22.  The middle classes of a chain of eight alike are copies, so
    their prices are tied first; the free LP then starts from the target again."""
    tried: dict[object, list[float]] = {}  # by LP (each kept alive here)

    def oracle(sets, master, k, l, T, plan_devices, seconds, stop):
        tried.setdefault(master, []).append(T)
        return bound_setcover.PROVEN if T < 22.0 else bound_setcover.EXHAUSTED

    monkeypatch.setattr(bound_setcover, "_search", oracle)
    nodes = [node(i, cpu=100, acc=10, size=1) for i in range(8)]
    w = Workload.from_paper_json(workload(nodes, [edge(i, i + 1, 3.0) for i in range(7)], k=2, l=0, mem=100))
    bound = bound_setcover.Background(classes.build_classes(w), 2, 0, w.accelerator_memory, 30.0, 10.0, None, 30).finish()
    tied, free = tried.values()
    assert tied[0] == free[0] == 30.0 and len(tied) > 3
    assert min(free) > max(T for T in tied if T < 22.0)  # the free LP starts above what the tied one proved
    for loads in (tied, free):
        for i, T in enumerate(loads):
            assert all(T < earlier for earlier in loads[:i] if earlier >= 22.0), loads
    assert 22.0 / (1 + bound_setcover.RETRY_SPAN) <= bound < 22.0


def test_a_better_plan_found_meanwhile_is_sought_next(monkeypatch):
    """The IP lowers the target when it finds a better plan (Background.aim): against the
    oracle above, the lowered target is the very next load tried after the first refusal,
    and the search still ends within RETRY_SPAN of 22."""
    tried: list[float] = []
    ready, box = threading.Event(), {}

    def oracle(sets, master, k, l, T, plan_devices, seconds, stop):
        assert ready.wait(10)
        if not tried:
            box["search"].aim(21.0)
            box["search"].aim(25.0)  # (a higher one changes nothing)
        tried.append(T)
        return bound_setcover.PROVEN if T < 22.0 else bound_setcover.EXHAUSTED

    monkeypatch.setattr(bound_setcover, "_search", oracle)
    w = _chain_of_three(cost=3.0)
    box["search"] = search = bound_setcover.Background(classes.build_classes(w), 2, 0, w.accelerator_memory, 30.0,
                                                       10.0, None, 30)
    ready.set()
    bound = search.finish()
    assert tried[:2] == [30.0, 21.0], tried
    assert 22.0 / (1 + bound_setcover.RETRY_SPAN) <= bound < 22.0


def test_where_the_target_is_proven_higher_loads_up_to_the_plan_are_tried(monkeypatch):
    """The target (the plan less 0.99%) can be far below what the certificate proves:
    against an oracle that proves below 22, a search aimed at 21 with a plan at 23 ends
    within RETRY_SPAN below 22, never trying the plan's load or above; without a plan it
    stops at the target."""
    tried: list[float] = []

    def oracle(sets, master, k, l, T, plan_devices, seconds, stop):
        tried.append(T)
        return bound_setcover.PROVEN if T < 22.0 else bound_setcover.EXHAUSTED

    monkeypatch.setattr(bound_setcover, "_search", oracle)
    w = _chain_of_three(cost=3.0)
    cl = classes.build_classes(w)
    bound = bound_setcover.Background(cl, 2, 0, w.accelerator_memory, 21.0, 10.0, None, 30, plan=23.0).finish()
    assert tried[0] == 21.0 and max(tried) < 23.0 and len(tried) > 2, tried
    assert 22.0 / (1 + bound_setcover.RETRY_SPAN) <= bound < 22.0
    tried.clear()
    assert bound_setcover.Background(cl, 2, 0, w.accelerator_memory, 21.0, 10.0, None, 30).finish() == 21.0
    assert tried == [21.0]


def test_a_plan_below_the_load_under_way_abandons_it(monkeypatch):
    """A search under way at a load above a plan found meanwhile can only fail: aim() with
    that plan stops it (it would run to the deadline here), and the lowered target is the
    next load tried; a plan above the load under way leaves it running."""
    tried: list[float] = []
    stopped: list[bool] = []
    ready, box = threading.Event(), {}

    def oracle(sets, master, k, l, T, plan_devices, seconds, stop):
        assert ready.wait(10)
        tried.append(T)
        if len(tried) == 1:
            box["search"].aim(29.0, 31.0)  # above the load under way: it goes on
            time.sleep(0.2)
            stopped.append(stop.is_set())
            box["search"].aim(20.3, 20.5)
            deadline = time.perf_counter() + seconds
            while not stop.is_set() and time.perf_counter() < deadline:
                time.sleep(0.01)
            stopped.append(stop.is_set())
            return bound_setcover.STOPPED
        return bound_setcover.PROVEN if T < 20.0 else bound_setcover.EXHAUSTED

    monkeypatch.setattr(bound_setcover, "_search", oracle)
    w = _chain_of_three(cost=3.0)
    began = time.perf_counter()
    box["search"] = search = bound_setcover.Background(classes.build_classes(w), 2, 0, w.accelerator_memory, 30.0,
                                                       10.0, None, 30)
    ready.set()
    bound = search.finish()
    assert time.perf_counter() - began < 10
    assert stopped == [False, True] and tried[:2] == [30.0, 20.3], (stopped, tried)
    assert 20.0 / (1 + bound_setcover.RETRY_SPAN) <= bound < 20.0


@pytest.mark.parametrize("seed", range(40))
def test_the_exact_cpu_set_against_every_subset(seed):
    """The certificate's threshold takes the best CPU set's worth from a knapsack: at most
    the fractional bound, at least what any subset within T is worth (every subset of 10
    classes tried), and the set it names fits and is worth what it says."""
    rng = np.random.default_rng(seed)
    n = 10
    cpu = rng.uniform(0.5, 5.0, n) * (rng.random(n) > 0.1)  # some classes take no CPU time
    pi = rng.uniform(0, 1, n) * (rng.random(n) > 0.2)
    T = float(rng.uniform(2, 15))
    best = max(float(pi[[g for g in range(n) if m >> g & 1]].sum())
               for m in range(1 << n) if sum(cpu[g] for g in range(n) if m >> g & 1) <= T)
    S, value, upper = bound_setcover._cpu_best(cpu, pi, T, 10.0, threading.Event())
    fractional = bound_setcover._cpu_set(cpu, pi, T, 1)[2]
    assert cpu[S].sum() <= T + 1e-9 and value == pytest.approx(pi[S].sum())
    assert value == pytest.approx(best, rel=1e-6, abs=1e-9)
    assert best - 1e-9 <= upper <= fractional + 1e-9
