"""A lower bound on the max load that charges what the CPUs take with its transfers (the
throughput IP's bound).

The split bound lets the CPUs take accelerator work as if it were divisible and free to
move.  In a plan, the accelerators together carry all the work the CPUs do not (W less
gross(C), for the classes C on the CPUs) plus each accelerator's boundary: every tensor
between C and an accelerator is paid at least once, and each accelerator, holding at least
a = W - gross* - (k - 1) T of work (the rest when the others hold T each), pays at least
c*, the least boundary of any set of work in [a, T] that fits one accelerator.  So

    k T >= W - min(net*, gross* - k c*)

with net* the most any C gains net of its tensors (gross(C) - cross(C)) and gross* the
most it gains at all, C of CPU time at most l T: each a small MIP (where one stops short,
its dual bound still holds).  On a chain of layers the parts inside pay two boundaries,
not one: k c* becomes 2 c* + (k - 2) c' (:func:`_parts_boundary`).  Memory and the CPUs'
split into l cores only remove plans.

Write-up: docs/throughput.md (ip, phase 4: The CPUs' share with its transfers).
"""

from __future__ import annotations

import threading
import time

import highspy
import numpy as np

from .bound_setcover import add_crossings

SHARE_OF_TIME = (0.15, 0.3, 0.3, 0.25)  # of the seconds given: gross*, net*, c*, the inner parts' c*


def offload_bound(cl, k: int, l: int, memory: float, upper: float, seconds: float,
                  stop: threading.Event | None = None) -> float | None:
    """The bound for every plan of max load at most ``upper`` (the best plan's: the
    optimum is no higher) of the classes ``cl`` (:class:`..classes.Classes`) on ``k``
    accelerators and ``l`` CPUs; None where it does not apply (no accelerator or no CPU,
    or a MIP gave no bound in time)."""
    if k == 0 or l == 0 or not np.isfinite(upper) or upper <= 0:
        return None
    deadline = time.perf_counter() + seconds
    acc = (cl.acc_fwd + cl.acc_bwd).astype(np.float64)
    cpu = (cl.cpu_fwd + cl.cpu_bwd).astype(np.float64)
    supported = np.asarray(cl.supported, dtype=bool)
    work = np.where(supported, acc, 0.0)
    W = float(work.sum())
    tensors = cl.hyper_arrays()  # (source, pointer, members, weight)
    # on the CPUs: every class the accelerators cannot run; none a core cannot run within upper
    must = (~supported).astype(np.float64)
    may = np.maximum(np.where(cpu <= upper, 1.0, 0.0), must)
    if float(cpu[must > 0].sum()) > l * upper:
        return None

    def left(phase: int) -> float:  # its share of the time left (what a phase leaves goes on)
        return max(0.0, (deadline - time.perf_counter()) * SHARE_OF_TIME[phase] / sum(SHARE_OF_TIME[phase:]))

    gross = _solved_bound(_offload(tensors, work, cpu, must, may, l * upper, transfers=False),
                          left(0), stop)
    if gross is None:
        return None
    net = _solved_bound(_offload(tensors, work, cpu, must, may, l * upper, transfers=True),
                        left(1), stop)
    gained = gross if net is None else min(gross, net)
    least = W - gross - (k - 1) * upper  # the least work an accelerator holds
    if least > 0:
        size = np.asarray(cl.size, dtype=np.float64)
        boundary = _solved_bound(_boundary(tensors, work, supported, size, memory, least, upper),
                                 left(2), stop)
        if boundary is not None:
            gained = min(gained, gross - _parts_boundary(tensors, work, supported, size, memory, least, upper,
                                                         k, boundary, left(3), stop))
    return (W - gained) / k


def _parts_boundary(tensors, work, supported, size, memory: float, least: float, most: float, k: int,
                    boundary: float, seconds: float, stop: threading.Event | None) -> float:
    """The least the k accelerators' boundaries sum to: at most two of them hold one of
    two pinned classes near the graph's ends, and the others pay at least the least
    boundary of a set of work in [least, most] that holds neither (two ends' worth on a
    chain of layers, where the pins leave only sets inside it), else ``boundary``."""
    if k <= 2:
        return k * boundary
    h = _boundary(tensors, work, supported, size, memory, least, most)
    pins = np.array(_ends(tensors, work, k), dtype=np.int32)
    h.changeColsBounds(len(pins), pins, np.zeros(len(pins)), np.zeros(len(pins)))
    inner = _solved_bound(h, seconds, stop)
    return 2 * boundary + (k - 2) * max(boundary, inner if inner is not None else boundary)


def _ends(tensors, work, k: int) -> tuple[int, int]:
    """Two classes near the ends of the topological order (half an accelerator's share of
    the work in from each), each the one in a window around that point with the most
    tensors around it: a set avoiding both cannot be a prefix or a suffix with the work
    of a part, nor cheaply step round one of them."""
    source, ptr, members, weight = tensors
    n, H = len(work), len(weight)
    # each (tensor, class) it touches once, its source among them
    of = np.concatenate([np.repeat(np.arange(H), np.diff(ptr)), np.arange(H)])
    touched = np.unique(of * n + np.concatenate([members, source]))
    of, held = touched // n, touched % n
    spread = np.bincount(of, minlength=H) > 1  # (a tensor within one class crosses nothing)
    around = np.bincount(held[spread[of]], weights=weight[of[spread[of]]], minlength=n)
    cum = np.cumsum(work)
    W = float(cum[-1])

    def pick(share: float) -> int:
        lo, hi = np.searchsorted(cum, W * (share - 0.02)), np.searchsorted(cum, W * (share + 0.02))
        window = np.arange(min(lo, len(work) - 1), min(hi, len(work) - 1) + 1)
        return int(window[np.argmax(around[window])])

    return pick(1 / (2 * k)), pick(1 - 1 / (2 * k))


def _highs(maximize: bool) -> highspy.Highs:
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.changeObjectiveSense(highspy.ObjSense.kMaximize if maximize else highspy.ObjSense.kMinimize)
    return h


def _binaries(h: highspy.Highs, lower: np.ndarray, upper: np.ndarray) -> None:
    n = len(lower)
    h.addVars(n, lower, upper)
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.array([highspy.HighsVarType.kInteger] * n))


def _offload(tensors, work, cpu, must, may, capacity: float, transfers: bool) -> highspy.Highs:
    """max gross(C) (less cross(C) with ``transfers``) over C of CPU time <= capacity."""
    n = len(work)
    h = _highs(maximize=True)
    _binaries(h, must, may)
    h.changeColsCost(n, np.arange(n, dtype=np.int32), work)
    h.addRow(-highspy.kHighsInf, float(capacity), n, np.arange(n, dtype=np.int32), cpu)
    if transfers:
        _crossing_columns(h, tensors, n, -tensors[3])
    return h


def _boundary(tensors, work, supported, size, memory: float, least: float, most: float) -> highspy.Highs:
    """min cross(S) over sets S an accelerator could hold of work in [least, most]."""
    n = len(work)
    h = _highs(maximize=False)
    _binaries(h, np.zeros(n), np.where(supported, 1.0, 0.0))
    _crossing_columns(h, tensors, n, tensors[3])
    h.addRow(float(least), float(most), n, np.arange(n, dtype=np.int32), work)
    if np.isfinite(memory):
        h.addRow(-highspy.kHighsInf, float(memory), n, np.arange(n, dtype=np.int32), size)
    return h


def _crossing_columns(h: highspy.Highs, tensors, first: int, cost: np.ndarray) -> None:
    """A variable per tensor (from column ``first``, at ``cost`` each), 1 where it crosses
    (:func:`.bound_setcover.add_crossings`)."""
    source, ptr, members, _ = tensors
    H = len(cost)
    h.addVars(H, np.zeros(H), np.ones(H))
    h.changeColsCost(H, np.arange(first, first + H, dtype=np.int32), cost)
    add_crossings(h, source, ptr, members, first)


def _solved_bound(h: highspy.Highs, seconds: float, stop: threading.Event | None) -> float | None:
    """The MIP's dual bound after at most ``seconds``; None where it has none (or none could
    be: the MIP is infeasible, where the caller's sets do not exist)."""
    if seconds <= 0:
        return None
    h.setOptionValue("time_limit", float(seconds))
    if stop is not None:
        h.cbMipInterrupt.subscribe(lambda event: event.interrupt() if stop.is_set() else None)
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return None
    bound = float(h.getInfo().mip_dual_bound)
    return bound if np.isfinite(bound) else None
