"""python-mip helpers shared by the integer programs (throughput, latency, improve_pairs).

A model on HiGHS (CBC selectable) that stops at Ctrl-C or its caller's time limit, both
while it is built and while HiGHS runs.  Imported only by the integer programs, which the
method registry imports when one runs (so ``onnxsplit --help`` does not load python-mip);
never by the CP-SAT worker (OR-Tools and HiGHS cannot share a process).

Write-up: docs/throughput.md (ip), docs/latency.md (ip, CP-SAT).
"""

from __future__ import annotations

import mip
import numpy as np

from .. import interrupt
from ..errors import OnnxsplitError
from ..workload import Workload


SOLVERS = ("highs", "cbc")


def crossing(model, src: int, members, on):
    """A variable that is 1 when a tensor crosses a device's boundary: at least
    |on(member) - on(source)| for every member (``on(g)``: class g's 0/1 or variable for
    being on that device)."""
    y = model.add_var(lb=0.0, ub=1.0)
    for m in members:
        if m != src:
            model += y >= on(m) - on(src)
            model += y >= on(src) - on(m)
    return y


class Model(mip.Model):
    """A python-mip model whose building (minutes for 10,000-node graphs) stops once
    the command is interrupted or its caller has stopped waiting (solve/anytime.py)."""

    _added = 0

    def _tick(self) -> None:
        self._added += 1
        if not self._added & 0x3FF:
            interrupt.check()

    def add_var(self, *args, **kwargs):
        self._tick()
        return super().add_var(*args, **kwargs)

    def add_constr(self, *args, **kwargs):
        self._tick()
        return super().add_constr(*args, **kwargs)


def new_model(solver: str, gap: float, verbose: bool):
    """An empty minimisation model on the chosen backend, stopping at relative gap ``gap``."""
    if solver not in SOLVERS:
        raise OnnxsplitError(f"unknown solver '{solver}' (choose from {', '.join(SOLVERS)})")
    model = Model(sense=mip.MINIMIZE, solver_name="CBC" if solver == "cbc" else "highs")
    model.verbose = int(verbose)
    model.max_mip_gap = gap
    if solver == "highs":
        _stop_when_interrupted(model)
    return model


def optimize(model, seconds: float):
    """``model.optimize`` for at most ``seconds``; Interrupted where it was stopped (see
    :func:`_stop_when_interrupted`).  Where HiGHS gives up on the program (its numbers
    span too wide a range: a node of 1e11 ms beside ones of 1e-5 ms), the status is ERROR
    and the model holds no solution, as if the time had run out: the caller's warm start
    and bounds stand."""
    try:
        status = model.optimize(max_seconds=seconds)
    except KeyError:  # python-mip has no name for HiGHS's "interrupted" status
        interrupt.check()
        raise
    except mip.InterfacingError:  # "Unknown error in call to HiGHS"
        interrupt.check()
        return mip.OptimizationStatus.ERROR
    interrupt.check()
    return status


HIGHS_INTERRUPTS = (1, 2, 6)  # HiGHS's kCallback{Simplex,Ipm,Mip}Interrupt


def _stop_when_interrupted(model) -> None:
    """HiGHS stops at its next interrupt callback once the command is interrupted or the
    solve's caller has stopped waiting (onnxsplit.interrupt); without this, Ctrl-C or a
    time limit waits for the native call to return."""
    try:  # HiGHS's C interface through python-mip's own binding, where it has one
        from mip.highs import ffi

        solver = model.solver
        stop = interrupt.stop_event()

        def on_callback(kind, message, data_out, data_in, user):
            if data_in != ffi.NULL and interrupt.stopped(stop):
                data_in.user_interrupt = 1

        callback = ffi.callback("HighsCCallbackType", on_callback)
        solver._lib.Highs_setCallback(solver._model, callback, ffi.NULL)
        for kind in HIGHS_INTERRUPTS:
            solver._lib.Highs_startCallback(solver._model, kind)
        model._onnxsplit_interrupt = callback  # kept alive as long as the model
    except Exception:  # another python-mip or HiGHS: run without it
        pass


def finite(v):
    return float(v) if v is not None and np.isfinite(v) else None


def add_contiguity(model, w: Workload, of_node: np.ndarray, x, ndev: int) -> None:
    """Every device's part is convex within each pass (the paper's z formulation).

    ``x[g, d]``: unit g (``of_node`` maps nodes to units) on device d.
    z[v, d] = 1 on v and on everything reachable from d's nodes; a node reached through a
    path that left d may not be on d.  The reference constrains the forward pass only; a
    training pipeline needs its backward parts convex too, so both passes are constrained.
    """
    for backward in ((False, True) if w.is_training else (False,)):
        nodes = np.flatnonzero(w.backward == backward)
        for d in range(ndev):
            z = {v: model.add_var(lb=0.0, ub=1.0) for v in nodes}
            xd = {v: x.get((int(of_node[v]), d), 0) for v in nodes}
            for v in nodes:
                model += z[v] >= xd[v]
            for s, t in zip(w.edge_src, w.edge_dst):
                if w.backward[s] == backward and w.backward[t] == backward:
                    model += z[t] <= z[s]
                    # same class: x - x would be 0, but python-mip 2.0 builds "x - x" as -x
                    # (duplicate terms overwrite), so the trivial constraint is left out
                    if of_node[s] != of_node[t]:
                        model += z[t] <= xd[t] - xd[s] + 1
