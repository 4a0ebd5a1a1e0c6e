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
not one: k c* becomes 2 c* + (k - 2) c' (:func:`_least_boundaries`).  Memory and the CPUs'
split into l cores only remove plans.

Write-up: docs/throughput.md (ip, phase 4: The CPUs' share with its transfers).
"""

from __future__ import annotations

import threading
import time

import highspy
import numpy as np

from .bound_setcover import add_crossings

SHARE_OF_TIME = (0.15, 0.45, 0.1, 0.1, 0.2)  # of the seconds given: gross*, c' and c*'s two other cases,
# net* (last: where the boundaries leave the CPUs no gain it is skipped; op-level BERT-48 training: 11.7 s unproven)


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
    gained = gross
    least = W - gross - (k - 1) * upper  # the least work an accelerator holds
    if least > 0:
        size = np.asarray(cl.size, dtype=np.float64)
        boundaries = _least_boundaries(tensors, work, supported, size, memory, least, upper, k,
                                       lambda case: left(1 + case), stop)
        if boundaries is not None:
            boundary, inner = boundaries
            gained = gross - (k * boundary if k <= 2 else 2 * boundary + (k - 2) * inner)
    if gained > 0:  # net* >= 0 (C empty): where the boundaries leave nothing it cannot lower it
        net = _solved_bound(_offload(tensors, work, cpu, must, may, l * upper, transfers=True),
                            left(4), stop)
        if net is not None:
            gained = min(gained, net)
    return (W - gained) / k


def _least_boundaries(tensors, work, supported, size, memory: float, least: float, most: float, k: int,
                      seconds_of, stop: threading.Event | None) -> tuple[float, float] | None:
    """(c*, c'): the least boundary of a set of work in [least, most] that fits one
    accelerator, and of such a set holding neither of two classes pinned near the graph's
    ends (:func:`_ends`); None where a MIP gave no bound.  On a chain of layers at most two
    parts hold a pin and the others pay two ends' worth, so the k accelerators' boundaries
    sum to at least 2 c* + (k - 2) c'.  c* is the least of three MIPs: the set holds
    neither pin (c'), the first, or the second and not the first.  Each is far quicker
    than the one unpinned MIP, whose branch and bound tries every place a part may start
    (op-level BERT-24 training: 3.5, 0.4 and 0.7 s against 14.1 s, all 17.58).
    ``seconds_of(case)`` is the time for case 0, 1, 2."""
    first, second = _ends(tensors, work, k)
    cases = [{first: 0.0, second: 0.0}, {first: 1.0}]
    if second != first:
        cases.append({first: 0.0, second: 1.0})
    bounds = []
    for case, fixed in enumerate(cases):
        if any(value and not supported[g] for g, value in fixed.items()):
            bounds.append(np.inf)  # no accelerator holds that pin
            continue
        h = _boundary(tensors, work, supported, size, memory, least, most)
        held = np.array(list(fixed), dtype=np.int32)
        values = np.array(list(fixed.values()))
        h.changeColsBounds(len(held), held, values, values)
        bound = _solved_bound(h, seconds_of(case), stop, infeasible=np.inf)
        if bound is None:
            return None
        bounds.append(bound)
    return min(bounds), bounds[0]


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


def _solved_bound(h: highspy.Highs, seconds: float, stop: threading.Event | None,
                  infeasible: float | None = None) -> float | None:
    """The MIP's dual bound after at most ``seconds``; None where it has none, and
    ``infeasible`` where none could be (the MIP is infeasible: the caller's sets do not
    exist)."""
    if seconds <= 0:
        return None
    h.setOptionValue("time_limit", float(seconds))
    if stop is not None:
        h.cbMipInterrupt.subscribe(lambda event: event.interrupt() if stop.is_set() else None)
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return infeasible
    bound = float(h.getInfo().mip_dual_bound)
    return bound if np.isfinite(bound) else None
