"""Limits are kept: solves return by their time limit with their best plan, Ctrl-C ends a
command within 2 s, memory is estimated before it is allocated, files are written whole."""

from __future__ import annotations

import importlib.util
import json
import re
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ray_processes import descendants, sigint_as_in_a_terminal
from onnxsplit import api, interrupt, limits
from onnxsplit.errors import OnnxsplitError, SolveError
from onnxsplit.export import FORMAT
from onnxsplit.files import write_atomic
from onnxsplit.plan import Plan
from onnxsplit.solve import anytime, evaluate
from onnxsplit.solve.throughput import dp
from onnxsplit.workload import Workload
from workloads import diamond, edge, node, workload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("make_large_workload",
                                               os.path.join(ROOT, "tools", "make_large_workload.py"))
large = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(large)


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    """About 6,000 transformer-like nodes: the linearized DP alone takes seconds."""
    path = tmp_path_factory.mktemp("big") / "w.json"
    path.write_text(json.dumps(large.build(6000, 4, 2, 0.3, seed=1)))
    return path


def _started(argv, wait_for: float, **env):
    env = dict(os.environ, PYTHONPATH=ROOT, **env)
    p = subprocess.Popen([sys.executable, "-m", "onnxsplit", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                         preexec_fn=sigint_as_in_a_terminal)
    time.sleep(wait_for)
    assert p.poll() is None, p.communicate()
    return p


@pytest.mark.parametrize("method", ["dp_linear", "ip", "local_search"])
def test_ctrl_c_ends_a_long_solve_within_two_seconds(big_file, method):
    p = _started(["solve", str(big_file), "--method", method, "--time-limit", "120"], wait_for=4.0)
    t0 = time.perf_counter()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert time.perf_counter() - t0 <= 2.0
    assert p.returncode == 130
    assert err.strip().splitlines() == ["onnxsplit: interrupted"], err
    assert out == ""


def test_an_interrupted_write_leaves_no_plan_file(big_file, tmp_path):
    plan = tmp_path / "plan.json"  # (a plan an earlier solve wrote: one a user made is refused at once)
    before = '{"objective": "throughput", "method": "dp", "assignment": {}}\n'
    plan.write_text(before)
    p = _started(["solve", str(big_file), "--method", "ip", "--time-limit", "120", "-o", str(plan)],
                 wait_for=4.0)
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=30)
    assert plan.read_text() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["plan.json"]


@pytest.mark.parametrize("method,objective", [("ip", "throughput"), ("ip", "latency"),
                                              ("local_search", "throughput"), ("dp", "throughput"),
                                              ("scotch", "throughput")])
def test_a_solve_returns_by_its_time_limit_with_a_valid_plan(big_file, method, objective):
    w = Workload.from_paper_json(big_file)
    limit = 4.0
    t0 = time.perf_counter()
    try:
        plan = api.solve(w, objective, method, time_limit=limit)
    except OnnxsplitError as e:  # a missing partitioner
        pytest.skip(str(e))
    took = time.perf_counter() - t0
    assert took <= limit + anytime.grace(limit) + anytime.STOP_WAIT_S + 0.5, took
    assert plan.assignment and not evaluate.check(w, plan.assignment)
    assert plan.value == pytest.approx(evaluate.score(w, plan.assignment, objective).value)


def test_a_method_that_overruns_returns_the_best_plan_it_offered():
    w = Workload.from_paper_json(diamond())
    good = {1: "acc0", 2: "acc0", 3: "acc0", 4: "acc0"}
    worse = {1: "cpu0", 2: "cpu0", 3: "cpu0", 4: "cpu0"}
    ended = threading.Event()

    def stuck() -> Plan:
        anytime.offer(worse, "first")
        anytime.offer({1: "nowhere"}, "an invalid one")  # not a plan: never returned
        anytime.offer(good, "second")
        try:
            while True:
                interrupt.check()
                time.sleep(0.01)
        finally:
            ended.set()

    t0 = time.perf_counter()
    plan = anytime.within(1.0, w, "throughput", "stuck", stuck)
    assert time.perf_counter() - t0 <= 1.0 + anytime.grace(1.0) + anytime.STOP_WAIT_S + 0.2
    assert plan.status == "time_limit" and plan.assignment == good
    assert plan.value == evaluate.max_load(w, good).value
    assert "second" in plan.details["stopped"]
    assert ended.wait(1.0)  # and the method's thread was told to stop


def test_a_method_that_overruns_before_any_plan_falls_back_to_the_model_whole():
    w = Workload.from_paper_json(diamond())
    plan = anytime.within(0.2, w, "latency", "stuck", lambda: time.sleep(3) or None)
    assert plan.status == "time_limit" and plan.assignment == {i: "cpu0" for i in (1, 2, 3, 4)}
    assert plan.value == evaluate.latency(w, plan.assignment).value
    assert "fallback" in plan.details["stopped"]
    # no CPU, and a node no accelerator runs: no plan at all, and it says so
    w = Workload.from_paper_json(workload([node(1), node(2, supported=False)], [edge(1, 2)], k=1, l=0))
    plan = anytime.within(0.2, w, "throughput", "stuck", lambda: time.sleep(3) or None)
    assert plan.status == "time_limit" and plan.value is None and not plan.assignment
    assert "before it had a plan" in plan.details["stopped"]


def test_errors_inside_the_limit_reach_the_caller():
    w = Workload.from_paper_json(diamond())

    def fails():
        raise SolveError("no plan here")

    with pytest.raises(SolveError, match="no plan here"):
        anytime.within(5.0, w, "throughput", "fails", fails)


def test_more_devices_than_nodes_are_clamped_exactly():
    """A cluster of 100,000 accelerators and cores: the DP's table is sized by the nodes,
    and the value is that of as many devices as nodes."""
    huge = Workload.from_paper_json(diamond(k=100_000, l=100_000))
    enough = Workload.from_paper_json(diamond(k=4, l=4))
    t0 = time.perf_counter()
    a, b = dp.solve(huge), dp.solve(enough)
    assert time.perf_counter() - t0 < 10
    assert a.value == pytest.approx(b.value) and a.status == b.status == "optimal"


def test_the_dp_table_is_measured_against_the_memory_limit():
    w = Workload.from_paper_json(diamond())
    try:
        limits.set_limit(1e-9)  # 1 byte
        with pytest.raises(OnnxsplitError, match="memory limit"):
            dp.solve(w, linear_only=True)
    finally:
        limits.set_limit(None)


def test_an_exact_dp_over_the_memory_limit_falls_back_to_the_linearized_plan():
    # a wide graph: 12 independent nodes have 4096 ideals; the chain has 13 prefixes
    nodes = [node(i, cpu=10 + i, acc=1 + i) for i in range(1, 13)]
    w = Workload.from_paper_json(workload(nodes, [], k=2, l=1))
    chain_bytes = dp.table_bytes(2, 1, 13)
    try:
        limits.set_limit(3 * chain_bytes / 1e9)
        plan = dp.solve(w)
    finally:
        limits.set_limit(None)
    assert plan.status == "feasible" and plan.value is not None
    assert "memory limit" in plan.details["stopped"]
    assert plan.value == pytest.approx(dp.solve(w, linear_only=True).value)


def test_memory_limit_option_is_read_and_checked(tmp_path, capsys):
    from onnxsplit.cli import main

    f = tmp_path / "w.json"
    f.write_text(json.dumps(diamond()))
    assert main(["solve", str(f), "--method", "dp_linear", "--memory-limit", "0.000000001"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "memory limit" in err[0] and err[0].startswith("onnxsplit: error: ")
    with pytest.raises(SystemExit) as e:
        main(["solve", str(f), "--method", "dp_linear", "--memory-limit", "-1"])
    assert e.value.code == 2 and "positive" in capsys.readouterr().err


def test_write_atomic_leaves_the_previous_file_when_the_write_fails(tmp_path, monkeypatch):
    f = tmp_path / "plan.json"
    f.write_text("before\n")

    def broken(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        write_atomic(f, "after\n")
    assert f.read_text() == "before\n" and [x.name for x in tmp_path.iterdir()] == ["plan.json"]
    monkeypatch.undo()
    write_atomic(f, "after\n")
    assert f.read_text() == "after\n"


def test_local_search_descends_to_the_same_plan_in_chunks():
    """The clock is read between chunks of moves: without a deadline the plan is the one
    a single descent gives."""
    from onnxsplit.solve.baselines import local_search
    from onnxsplit.solve.classes import class_graph

    nodes = [node(i, cpu=5 + (i * 7) % 11, acc=1 + i % 3, size=1.0) for i in range(1, 40)]
    edges = [edge(i, i + 1) for i in range(1, 39)] + [edge(i, i + 5) for i in range(1, 34, 3)]
    w = Workload.from_paper_json(workload(nodes, edges, k=3, l=2, mem=9.0))
    g = class_graph(w)
    import numpy as np

    start = local_search._random_start(g, w, np.random.default_rng(3))
    one, chunked = local_search.ClassState(g, w, start.copy()), local_search.ClassState(g, w, start.copy())
    one.repair(), chunked.repair()
    moves = int(local_search._descend(*one._args(), 1_000_000))
    assert moves > local_search.DESCEND_CHUNK or moves == chunked.descend()
    assert (one.dev == chunked.dev).all()


@pytest.mark.parametrize("phase", ["profiling", "calibrating", "exporting", "verifying"])
def test_an_interrupted_main_command_leaves_the_previous_output(tmp_path, shared_cache, phase):
    """Ctrl-C while profiling, calibrating, writing or verifying the parts: within 2 s,
    the previous parts folder as it was, nothing half-written beside it (or, where the
    command had just finished, the new one whole).  (Writing and verifying: with the
    run's shared profile cache, where the model is calibrated once for both.)"""
    from onnx_models import mlp

    model = mlp(tmp_path / "m.onnx", layers=12, batch=64, width=512)
    out = tmp_path / "parts"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"format": FORMAT}))  # as onnxsplit wrote it
    p = _started([str(model), "--out", str(out), "--force"], wait_for=0.0,
                 ONNXSPLIT_CACHE_DIR=str(shared_cache if phase in ("exporting", "verifying")
                                         else tmp_path / "cache"))
    said = []
    for line in p.stderr:  # its progress lines
        said.append(line)
        if line.startswith(phase):
            break
    assert said and said[-1].startswith(phase), said
    t0 = time.perf_counter()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert time.perf_counter() - t0 <= 2.0
    err = "".join(said) + err
    assert "Traceback" not in err
    assert sorted(x.name for x in tmp_path.iterdir() if x.name.startswith(".")) == []
    if p.returncode in (0, -signal.SIGINT):  # it had finished: the new parts, whole
        assert phase == "verifying", err
        assert "parts" in json.loads((out / "manifest.json").read_text())
        return
    assert p.returncode == 130 and err.strip().splitlines()[-1] == "onnxsplit: interrupted", err
    assert [x.name for x in out.iterdir()] == ["manifest.json"]


def test_a_wide_graph_is_known_too_large_for_the_exact_dp_at_once():
    """30 independent nodes: 2**30 ideals, said before any is enumerated; the plan is the
    linearized DP's."""
    nodes = [node(i, cpu=10 + i, acc=1 + i) for i in range(1, 31)]
    w = Workload.from_paper_json(workload(nodes, [], k=2, l=1))
    t0 = time.perf_counter()
    plan = dp.solve(w)
    assert time.perf_counter() - t0 < 5
    assert plan.status == "feasible" and "side by side" in plan.details["stopped"]
    assert plan.value == pytest.approx(dp.solve(w, linear_only=True).value)


def test_ctrl_c_while_the_arguments_are_read_is_one_line(capsys, monkeypatch):
    """Ctrl-C in the first moments (the parser imports the solvers' registry) ends as any
    other: 'onnxsplit: interrupted', exit 130, no KeyboardInterrupt traceback."""
    from onnxsplit import cli

    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "_parser", interrupted)
    with pytest.raises(SystemExit) as e:
        cli.entry()
    assert e.value.code == 130
    assert capsys.readouterr().err.strip().splitlines() == ["onnxsplit: interrupted"]


def test_bad_arguments_are_one_line(capsys):
    from onnxsplit.cli import main

    with pytest.raises(SystemExit) as e:
        main(["solve", "w.json", "--method", "nope"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("onnxsplit: error: ")
    assert "--method" in err[0] and "onnxsplit solve --help" in err[0]


def test_ctrl_c_ends_a_measuring_run_within_two_seconds(tmp_path):
    """``run`` streams samples through threads and onnxruntime sessions: Ctrl-C still ends
    it within 2 s, and the parts folder is as it was."""
    from onnx_models import mlp
    from onnxsplit.graph import OpGraph

    model = mlp(tmp_path / "m.onnx", layers=4, batch=16, width=128)
    g = OpGraph.from_onnx(model)
    half = len(g.nodes) // 2
    from onnxsplit.export import export

    e = export(g, {n.name: f"cpu{int(i >= half)}" for i, n in enumerate(g.nodes)}, tmp_path / "p",
               providers={"cpu0": "CPUExecutionProvider", "cpu1": "CPUExecutionProvider"})
    before = sorted((p.name, p.stat().st_size) for p in e.out.iterdir())
    # (a time limit far beyond the wait: the run fits its rounds to it, not to the samples asked)
    p = _started(["run", str(e.out), "--samples", "1000000", "--time-limit", "3600"], wait_for=5.0)
    held = descendants(p.pid)  # (the processes each configuration is measured in: apart.py)
    t0 = time.perf_counter()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert time.perf_counter() - t0 <= 2.0
    assert p.returncode == 130 and err.strip().splitlines()[-1] == "onnxsplit: interrupted", err
    assert sorted((p.name, p.stat().st_size) for p in e.out.iterdir()) == before
    assert held and not _alive(held, within=1.0), held


def _alive(pids, within: float) -> set[int]:
    """Those of ``pids`` still running (not a zombie) after ``within`` seconds at most."""
    deadline = time.monotonic() + within
    while True:
        left = set()
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                left.add(pid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_a_long_solve_shows_its_progress_and_the_json_carries_the_trace(tmp_path, capsys, monkeypatch):
    """Every PROGRESS_S of a solve, one line with the best plan, bound and gap (not with
    --quiet or --json); the plan's details carry the trace of improvements."""
    from onnxsplit.cli import main

    monkeypatch.setattr(anytime, "PROGRESS_S", 0.2)
    path = tmp_path / "w.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_large_workload.py"), str(path), "--nodes", "3000",
                    "--k", "2", "--l", "2", "--memory-share", "0.3"], check=True, stdout=subprocess.DEVNULL)
    assert main(["solve", str(path), "--method", "ip", "--time-limit", "4"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"  ip +\d+ s: best [\d.]+, bound [\d.]+, gap [\d.]+%", err), err
    assert main(["solve", str(path), "--method", "ip", "--time-limit", "4", "--quiet", "-o", str(tmp_path / "p.json")]) == 0
    assert capsys.readouterr().err == "" and anytime.report is None
    trace = json.loads((tmp_path / "p.json").read_text())["details"]["trace"]
    assert trace and all(len(t) == 3 for t in trace)
    values = [t[1] for t in trace if t[1] is not None]
    assert values == sorted(values, reverse=True)  # each point an improvement


def test_a_step_held_whole_ends_before_an_interrupt_ends_the_process():
    """export swaps the finished folder in and removes the one it replaced inside
    interrupt.held(): the main thread, ending the process on Ctrl-C, waits for such a step,
    and none starts once interrupted.  (Beside a CPU-bound process, Ctrl-C while exporting
    once left a folder under its staging name: a process ended between the swap and the
    removal leaves the replaced folder so.)"""
    from onnxsplit import interrupt

    inside, done = threading.Event(), []

    def step():
        with interrupt.held():
            inside.set()
            time.sleep(0.2)
            done.append(True)

    t = threading.Thread(target=step)
    t.start()
    assert inside.wait(5)
    assert interrupt._hold.acquire(timeout=interrupt.HOLD_S)  # (as the main thread does)
    try:
        assert done == [True]
    finally:
        interrupt._hold.release()
        t.join()
    interrupt.CANCEL.set()
    try:
        with pytest.raises(interrupt.Interrupted):
            with interrupt.held():
                done.append("started after the interrupt")
    finally:
        interrupt.CANCEL.clear()
    assert done == [True] and interrupt._hold.acquire(blocking=False)
    interrupt._hold.release()


def test_a_temporary_is_made_and_registered_in_one_step(tmp_path):
    """The main thread ends the process on Ctrl-C after removing what is registered; a
    worker still running must not make a staging folder or file it would not remove (the
    exporting case once left '.parts.*.tmp' beside a CPU-bound process: the folder had been
    made first and registered after).  A worker making temporaries as fast as it can while
    the interrupt comes: what is left once the main thread has removed what is registered
    is nothing, and the worker is refused any new one."""
    made, errors = [], []
    go = threading.Event()

    def worker():
        go.set()
        try:
            while True:
                made.append(interrupt.fresh_dir(prefix=".d.", dir=tmp_path))
                fd, name = interrupt.fresh_file(prefix=".f.", dir=tmp_path)
                os.close(fd)
                made.append(name)
        except interrupt.Interrupted:
            errors.append("refused")

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    go.wait()
    time.sleep(0.05)
    try:
        interrupt.CANCEL.set()
        interrupt._remove_registered()  # (as the main thread does before it ends the process)
        t.join(5)
        assert not t.is_alive() and errors == ["refused"]
        assert len(made) > 2  # (it did make some before the interrupt)
        assert sorted(p.name for p in tmp_path.iterdir()) == []
    finally:
        interrupt.CANCEL.clear()
