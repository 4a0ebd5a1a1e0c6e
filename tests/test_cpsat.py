"""The latency model on CP-SAT against brute force on tiny workloads, and its worker
processes (CP-SAT cannot share a process with python-mip's HiGHS: see cpsat.py)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import bruteforce as bf  # noqa: E402  (tests/ is on sys.path via conftest)
from onnxsplit.errors import OnnxsplitError, SolveError
from onnxsplit.solve import evaluate
from onnxsplit.solve.latency import cpsat
from onnxsplit.workload import Workload
from test_latency_dp import _brute_min
from test_series import _modules


@pytest.mark.parametrize("seed", range(40))
def test_cp_sat_matches_bruteforce(seed):
    # colour classes, unsupported nodes, memory, no CPUs: its plan is the optimum over
    # plans with one convex call per accelerator, and its bound proves it (rounding to
    # integer times loses under 1e-6)
    data = bf.random_workload(seed, n_range=(2, 6), k_range=(1, 2), l_range=(0, 1))
    w = Workload.from_paper_json(data)
    plan = cpsat.solve_latency_cp(w, time_limit=30, gap=0.0)
    best = _brute_min(data, 1)
    if best is None:
        assert plan.value is None
        return
    assert plan.value == pytest.approx(best, rel=1e-6, abs=1e-9)
    assert evaluate.check(w, plan.assignment) == []
    assert evaluate.latency(w, plan.assignment).value == pytest.approx(plan.value, rel=1e-12)
    assert best * (1 - 1e-6) - 1e-9 <= plan.lower_bound <= best * (1 + 1e-9) + 1e-9


@pytest.mark.parametrize("seed", range(6))
def test_a_bound_cut_short_stays_below_the_optimum(seed):
    # modules of parallel branches, stopped after 10 ms: whatever it has proven is a bound
    data = _modules(seed)
    plan = cpsat.solve_latency_cp(Workload.from_paper_json(data), time_limit=0.01)
    assert plan.lower_bound <= _brute_min(data, 1) * (1 + 1e-9) + 1e-9


def test_threads_share_the_workers_beside_highs():
    # HiGHS is loaded in this process first; several threads solve at once, each its own
    import mip

    model = mip.Model(solver_name="highs")
    model.verbose = 0
    x = model.add_var(var_type=mip.BINARY)
    model.objective = mip.maximize(x)
    model.optimize()
    assert x.x == pytest.approx(1.0)
    datas = [bf.random_workload(seed, n_range=(4, 6), k_range=(2, 2), l_range=(1, 1)) for seed in range(6)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        plans = list(pool.map(lambda d: cpsat.solve_latency_cp(Workload.from_paper_json(d), time_limit=30, gap=0.0),
                              datas))
    for data, plan in zip(datas, plans):
        assert plan.value == pytest.approx(_brute_min(data, 1), rel=1e-6, abs=1e-9)


def test_an_error_in_the_worker_is_raised_here_and_the_worker_lives_on():
    data = bf.random_workload(3, n_range=(4, 4), k_range=(1, 1), l_range=(1, 1))
    w = Workload.from_paper_json(data)
    best = _brute_min(data, 1)
    assert cpsat.solve_latency_cp(w, gap=0.0).value == pytest.approx(best, rel=1e-6)
    started = len(cpsat._Worker._all)
    with pytest.raises(OnnxsplitError):  # a warm start naming a device the workload lacks
        cpsat.solve_latency_cp(w, warm_start={int(i): "gpu9" for i in w.ids})
    assert cpsat.solve_latency_cp(w, gap=0.0).value == pytest.approx(best, rel=1e-6)
    assert len(cpsat._Worker._all) == started  # the same worker served all three


def test_a_silent_worker_is_given_up():
    worker = cpsat._Worker.take()
    w = Workload.from_paper_json(_modules(0))
    began = time.perf_counter()
    with pytest.raises(SolveError, match="gave no answer"):
        worker.call((w, dict(time_limit=5.0, gap=0.0, warm_start=None, workers=1)), 0.0)
    assert time.perf_counter() - began < 2.0
    assert worker.proc.poll() is not None  # killed, and never handed out again


class _Noisy:
    """A request that, unpickled in the worker, writes 1 MB to its standard error."""

    def __reduce__(self):
        return os.write, (2, b"x" * 1_000_000)


def test_a_worker_that_writes_much_to_standard_error_still_answers():
    # (through a pipe nobody reads, the write would stop at the pipe's 64 KB and the call
    # would time out)
    worker = cpsat._Worker.take()
    try:
        with pytest.raises(TypeError):  # not a (workload, options) pair: raised back here
            worker.call(_Noisy(), 20.0)
    finally:
        cpsat._Worker.give_back(worker)


def test_a_worker_that_died_is_an_error_not_a_hang():
    worker = cpsat._Worker.take()
    worker.proc.kill()
    worker.proc.wait()
    with pytest.raises(SolveError, match="gave no answer"):
        worker.call((Workload.from_paper_json(_modules(0)), {}), 5.0)
