"""The latency problem with one call per accelerator, as a CP-SAT model (OR-Tools).

The latency IP's program (:func:`.ip.solve_latency`, one piece per accelerator) for a
constraint solver: each time link holds only where its literal does, which CP-SAT
propagates exactly, where the MIP's big-M rows relax to nothing; so it closes the block
programs of the series bound (:mod:`.bound_series`).  Times and sizes are rounded down to
integers, so its proven bound holds here too; its plans are re-scored by the evaluator.
It runs in worker processes (:func:`solve_latency_cp`), each a plain
``python -m onnxsplit.solve.latency.cpsat``: OR-Tools and python-mip's HiGHS cannot share
a process.

Write-up: docs/latency.md (CP-SAT).
"""

from __future__ import annotations

import atexit
import math
import os
import pickle
import struct
import sys
import tempfile
import threading
import time

import numpy as np

from ...errors import SolveError
from ...plan import Plan, gap_of
from ...workload import Workload
from .. import evaluate, isolated
from ..finish import status_label
from .bounds import latency_lower_bound, latency_upper_bound, longest_paths, runs_nowhere

UNITS = 2 ** 30  # integer steps in the best known latency (and in one accelerator's memory)
WORKERS = 2  # CP-SAT's search workers (its portfolio: with one, some blocks took 10x longer)
REPLY_MARGIN = 30.0  # seconds past its time limit after which a silent worker is given up


def solve_latency_cp(w: Workload, *, time_limit: float = 10.0, gap: float = 1e-4,
                     warm_start: dict[int, str] | None = None, workers: int = WORKERS) -> Plan:
    """Min single-stream latency with one call per accelerator, by CP-SAT in a worker
    process; the best plan found (the evaluator's value) with the solver's proven lower
    bound.  Threads may call it at once: each gets a worker of its own."""
    options = dict(time_limit=time_limit, gap=gap, warm_start=warm_start, workers=workers)
    worker = _Worker.take()
    try:
        return worker.call((w, options), time_limit + REPLY_MARGIN)
    finally:
        _Worker.give_back(worker)  # (one that was given up is never taken again)


def available() -> bool:
    """Whether OR-Tools is installed (a machine with only the core packages may lack it:
    the latency IP then goes without the bound this module gives)."""
    import importlib.util

    return importlib.util.find_spec("ortools") is not None


def _solve_here(w: Workload, *, time_limit: float, gap: float, warm_start: dict[int, str] | None,
                workers: int) -> Plan:
    """The model, built and solved in this process (a worker's: see the module docstring)."""
    from ortools.sat.python import cp_model


    began = time.perf_counter()
    k, l, n = w.num_accelerators, w.num_cpus, w.n
    if (why := runs_nowhere(w)) is not None:
        return Plan("latency", "cp_sat", "infeasible", None, {}, seconds=time.perf_counter() - began,
                    details={"why": why})
    ub, start_plan = latency_upper_bound(w, warm_start, 1)
    unit = ub / UNITS

    def ticks(seconds) -> int:  # rounded down; all beyond the best known alike (inf too)
        return int(math.floor(min(float(seconds), 2 * ub) / unit))

    horizon = ticks(ub) + 1
    edges = list(zip(w.edge_src.tolist(), w.edge_dst.tolist()))
    senders = sorted({u for u, _ in edges})
    pos = np.empty(n, dtype=np.int64)
    pos[list(w.topological_order)] = np.arange(n)
    m = cp_model.CpModel()

    # where: cpu[v] (the CPUs, one pool), x[v, d] (accelerator d's call)
    cpu = {v: m.new_bool_var(f"cpu{v}") for v in range(n) if l > 0 and ticks(w.cpu_latency[v]) < horizon}
    x = {(v, d): m.new_bool_var(f"x{v}_{d}") for v in range(n) if w.supported[v] for d in range(k)}
    for v in range(n):
        m.add_exactly_one(([cpu[v]] if v in cpu else []) + [x[v, d] for d in range(k) if (v, d) in x])
    members: dict[int, list[int]] = {}
    for v in range(n):
        members.setdefault(int(w.color_class[v]), []).append(v)
    for group in members.values():  # a colour class shares a device
        for v in group[1:]:
            u = group[0]
            for a, b in [(cpu.get(v), cpu.get(u))] + [(x.get((v, d)), x.get((u, d))) for d in range(k)]:
                if a is not None and b is not None:
                    m.add(a == b)
                elif a is not None or b is not None:
                    m.add((a if a is not None else b) == 0)
    steps = np.floor(w.size / float(w.accelerator_memory) * UNITS * (1 - 1e-12)).astype(np.int64)
    for d in range(k):
        m.add(sum(int(steps[v]) * x[v, d] for v in range(n) if (v, d) in x) <= UNITS)

    cheapest = np.minimum(w.cpu_latency if l > 0 else np.inf, np.where(w.supported, w.acc_latency, np.inf))
    head = longest_paths(w, cheapest)[0]  # v cannot finish before its longest path in
    lat = [m.new_int_var(min(ticks(head[v]), horizon), horizon, f"lat{v}") for v in range(n)]
    for d in range(k):
        start = m.new_int_var(0, horizon, f"start{d}")
        finish = m.new_int_var(0, horizon, f"finish{d}")
        ideal = [m.new_bool_var("") for _ in range(n)]  # ancestors of the call, none after it leaves
        receives = {u: m.new_bool_var("") for u in senders}
        sends = {u: m.new_bool_var("") for u in senders}
        for v in range(n):
            if (v, d) in x:
                m.add_implication(x[v, d], ideal[v])
        for u, t in edges:
            m.add_implication(ideal[t], ideal[u])
            xu, xt = x.get((u, d)), x.get((t, d))
            if xu is not None:  # u in the call and t not: t is after the call, so none of it is
                m.add_bool_or([xu.Not(), ideal[t].Not()] + ([xt] if xt is not None else []))
                m.add_bool_or([xu.Not(), sends[u]] + ([xt] if xt is not None else []))
            if xt is not None:
                m.add_bool_or([xt.Not(), receives[u]] + ([xu] if xu is not None else []))
        for u in senders:
            m.add(start >= lat[u]).only_enforce_if(receives[u])
        work = sum(ticks(w.acc_latency[v]) * x[v, d] for v in range(n) if (v, d) in x)
        moves = sum(ticks(w.out_cost[u]) * (receives[u] + sends[u]) for u in senders if ticks(w.out_cost[u]) > 0)
        m.add(finish == start + work + moves)
        for v in range(n):
            if (v, d) in x:
                m.add(lat[v] >= finish).only_enforce_if(x[v, d])
        if d >= 1:  # identical accelerators: ordered by the first node of their calls
            for v in range(n):
                if (v, d) in x:
                    m.add_bool_or([x[u, d - 1] for u in range(n) if pos[u] < pos[v] and (u, d - 1) in x]
                                  + [x[v, d].Not()])
    for v, on_cpu in cpu.items():
        m.add(lat[v] >= ticks(w.cpu_latency[v])).only_enforce_if(on_cpu)
    for u, t in edges:
        m.add(lat[t] >= lat[u])
        if t in cpu:
            m.add(lat[t] >= lat[u] + ticks(w.cpu_latency[t])).only_enforce_if(cpu[t])
    floor = max(float(head.max(initial=0.0)), latency_lower_bound(w, 1, seconds=min(1.0, 0.1 * time_limit)))
    objective = m.new_int_var(min(ticks(floor), horizon), horizon, "latency")
    m.add_max_equality(objective, lat)
    m.minimize(objective)
    if start_plan is not None:  # (in the symmetry order already)
        a = start_plan[0]
        for v in range(n):
            d = w.device_index[a[int(w.ids[v])]]
            if v in cpu:
                m.add_hint(cpu[v], d >= k)
            for e in range(k):
                if (v, e) in x:
                    m.add_hint(x[v, e], d == e)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, time_limit - (time.perf_counter() - began))
    solver.parameters.num_workers = workers
    solver.parameters.relative_gap_limit = gap
    status = solver.solve(m)
    details = {"solver": "cp-sat", "pieces_per_accelerator": 1, "path_bound": floor, "big_m": ub}
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    if status == cp_model.INFEASIBLE:  # no plan below the best known (the warm start, or all on the CPUs)
        bound = ub
    elif status == cp_model.MODEL_INVALID:
        raise SolveError(f"internal error: CP-SAT refused the latency model: {m.validate()}")
    else:
        bound = max(floor, solver.best_objective_bound * unit)
    names = [dv.name for dv in w.devices]
    assignment: dict[int, str] = {}
    if found:
        for v in range(n):
            on = [d for d in range(k) if (v, d) in x and solver.boolean_value(x[v, d])]
            assignment[int(w.ids[v])] = names[on[0]] if on else names[k]
    if not assignment or evaluate.check(w, assignment):
        assignment = dict(start_plan[0]) if start_plan is not None else {}
    seconds = time.perf_counter() - began
    if not assignment:
        label = "infeasible" if status == cp_model.INFEASIBLE else "time_limit"
        return Plan("latency", "cp_sat", label, None, {}, lower_bound=min(bound, ub), seconds=seconds,
                    details=details)
    value = evaluate.latency(w, assignment).value
    lb = min(bound, value)
    g = gap_of(value, lb)
    return Plan("latency", "cp_sat", status_label(status == cp_model.OPTIMAL, g), value, assignment,
                lower_bound=lb, gap=g, seconds=seconds, details=details)


class _Worker:
    """One worker process and its pipes; idle ones wait for the next call."""

    _idle: list["_Worker"] = []
    _all: list["_Worker"] = []
    _lock = threading.Lock()

    def __init__(self):
        # its messages go to a file, not a pipe: nothing reads them until it fails, and a
        # full pipe would stop the worker mid-solve
        self.log = tempfile.TemporaryFile()
        self.proc = isolated.start(__spec__.name, self.log)

    @classmethod
    def take(cls) -> "_Worker":
        with cls._lock:
            while cls._idle:
                worker = cls._idle.pop()
                if worker.proc.poll() is None:
                    return worker
            worker = cls()
            cls._all.append(worker)
            return worker

    @classmethod
    def give_back(cls, worker: "_Worker") -> None:
        with cls._lock:
            cls._idle.append(worker)

    def call(self, request, timeout: float):
        try:
            _send(self.proc.stdin, request)
        except OSError:  # it has ended (BrokenPipeError): said below, with its last words
            reply = None
        else:
            try:
                reply = _receive(self.proc.stdout, time.perf_counter() + timeout)
            except BaseException:  # interrupted mid-solve: it must not answer the next call
                self.close()
                raise
        if reply is None:
            self.close()
            self.log.seek(0)
            lines = self.log.read().decode(errors="replace").strip().splitlines()
            raise SolveError("internal error: the CP-SAT worker gave no answer" + (f": {lines[-1]}" if lines else ""))
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def close(self) -> None:
        isolated.end(self.proc)

    @classmethod
    def close_all(cls) -> None:
        for worker in cls._all:
            worker.close()


atexit.register(_Worker.close_all)


def _send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream, deadline: float | None = None):
    """The next object on ``stream``; None at its end or once ``deadline`` passes."""
    fd = stream.fileno()
    data = b""
    size = None
    while size is None or len(data) < size + 8:
        if not isolated.wait_readable(stream, deadline):
            return None
        chunk = os.read(fd, (8 if size is None else size + 8) - len(data))
        if not chunk:
            return None
        data += chunk
        if size is None and len(data) == 8:
            size = struct.unpack("<Q", data)[0]
    return pickle.loads(data[8:])


def _serve() -> None:
    """A worker: answer requests on standard input until it closes.  Standard output
    carries the replies alone: what a library prints there goes to standard error."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    while (request := _receive(sys.stdin.buffer)) is not None:
        try:
            w, options = request
            reply = _solve_here(w, **options)
        except Exception as e:  # sent back, raised in the caller
            reply = e
        _send(replies, reply)


if __name__ == "__main__":
    _serve()
