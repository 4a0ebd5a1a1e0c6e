"""The throughput integer program (the paper's Section 5) on python-mip, HiGHS by default.

x[g, d] = 1 when colour class g runs on device d; an accelerator pays a tensor's transfer
when it holds some but not all of its producer and consumers (a hypergraph cut); every
load <= T; minimise T.  Optionally every part convex (``contiguous``), or for training
max forward + max backward load (``split_passes``).  :func:`solve_throughput` runs in
named phases (:class:`_Search`): transfer-free program, pairs, proof, full program.
Presolve, symmetry (left to HiGHS) and the bounds: docs/throughput.md.
"""

from __future__ import annotations

import time

import mip
import numpy as np

from ...errors import SolveError
from ...plan import Plan, gap_of
from ...workload import Workload
from .. import anytime, evaluate
from ..baselines.local_search import descend_from
from ..classes import Classes, build_classes
from ..finish import status_label
from ..milp import add_contiguity, crossing, finite, new_model, optimize
from . import bound_offload, bound_parts, bound_setcover, bound_spread, dp_ring, improve_pairs, ip_routed
from .bounds import lifted, split_bound

def solve_throughput(w: Workload, *, contiguous: bool = False, split_passes: bool = False,
                     time_limit: float = 60.0, solver: str = "highs", warm_start: dict[int, str] | None = None,
                     gap: float = 0.001, threads: int | None = None, verbose: bool = False) -> Plan:
    """Min max-load by integer programming; returns the best plan with its proven bound.

    The phases share ``time_limit``, each stopping once the gap is proven:

    1. :meth:`_Search.transfer_free` -- the program without transfers (at most
       TRANSFER_FREE_SHARE): smaller, often solved outright, its bound holds for the full
       program and its plan is a second start (skipped where it cannot prove 1%).
    2. :meth:`_Search.pairs` -- the best start, or a better-balanced ring split near it
       (:meth:`_Search.balanced_start`), re-divided two devices at a time
       (:mod:`.improve_pairs`, at most PAIRS_SHARE), then every boundary between devices
       moved at once (:func:`.improve_pairs.shift_boundaries`, at most SHIFT_SHARE).
    3. :meth:`_Search.prove` -- where transfers are much of the load: a set-covering
       certificate on a thread of its own (:mod:`.bound_setcover`, from the start of
       pairs, aimed below the best plan as it improves), a short try of the full program
       (FIRST_TRY_SHARE), the CPUs' share with its transfers (:mod:`.bound_offload`,
       OFFLOAD_SHARE), groups of three devices re-divided (:meth:`_Search.triples`,
       TRIPLES_SHARE), a spreading-metric bound (:mod:`.bound_spread`, SPREAD_SHARE) and
       bounds from parts of the graph (:mod:`.bound_parts`, PARTS_SHARE), each while the
       gap is open.
    4. :meth:`_Search.full_program` -- the full program warm-started from the best plan,
       for the time left; the proven bound is the largest of all.
    """
    if w.multi_class:
        return ip_routed.solve(w, contiguous=contiguous, split_passes=split_passes, time_limit=time_limit,
                               solver=solver, warm_start=warm_start, gap=gap, threads=threads, verbose=verbose)
    search = _Search(w, time_limit, gap, warm_start, dict(contiguous=contiguous, split_passes=split_passes,
                                                          solver=solver, threads=threads, verbose=verbose))
    search.transfer_free()
    search.pairs()
    search.prove()
    return search.full_program()


class _Search:
    """The state the phases share: the best plan so far and its value, the floor of T
    (the best proven bound), the figures for the plan's details."""

    def __init__(self, w: Workload, time_limit: float, gap: float, warm_start, opts: dict):
        self.began = time.perf_counter()
        self.w, self.time_limit, self.gap, self.opts = w, time_limit, gap, opts
        self.contiguous, self.split_passes, self.solver = opts["contiguous"], opts["split_passes"], opts["solver"]
        self.cl = build_classes(w)
        # a packing bound the LP relaxation cannot see (bounds.py): T starts there
        self.floor = self.packing = _packing_floor(w, self.cl, self.split_passes)
        self.best_start, self.best_value = _scored_start(w, warm_start, self.contiguous, self.split_passes)
        self.transfer_heavy = not _transfer_free_can_prove(w, self.best_start, self.best_value, gap,
                                                           self.split_passes)
        self.details: dict = {}
        self.full = self.status = self.certificate = None

    def left(self) -> float:
        return self.time_limit - (time.perf_counter() - self.began)

    def share(self, fraction: float) -> float:
        """A phase's seconds: ``fraction`` of the time limit, at most what is left short of
        the end (some phases stop a second or two past their time: op-level BERT-24
        training's spreading LP, 1.8 s)."""
        return max(0.0, min(self.time_limit * fraction, self.left() - self.reserve()))

    def reserve(self) -> float:
        """Seconds kept at the end for the last phase to return in."""
        return min(END_RESERVE_S, END_RESERVE * self.time_limit)

    def open_gap(self) -> bool:
        g = gap_of(self.best_value, self.floor)
        return g is not None and g > self.gap

    def keep_if_better(self, candidate) -> float:
        """``candidate`` becomes the best plan where it is better; its value either way."""
        value = _scored_start(self.w, candidate, self.contiguous, self.split_passes)[1]
        if value < self.best_value:
            self.best_start, self.best_value = candidate, value
            if not (self.split_passes or self.contiguous):  # offers are scored as plain max-load plans
                anytime.offer(candidate, "an incumbent of the integer program")
            if self.certificate is not None:
                self.certificate.aim(value * (1 - SETPART_GAP), value)
        return value

    def transfer_free(self) -> None:
        w, cl = self.w, self.cl
        relaxed_bound = None
        phase_start = time.perf_counter()
        if cl.hyper and w.num_accelerators and not self.transfer_heavy:
            # no warm start here: on GNMT training HiGHS closed this program in 19 s from
            # scratch and not in 40 s from the DP's plan
            relaxed = _ThroughputIP(w, cl, transfers=False, floor=self.floor,
                                    gap=min(self.gap, TRANSFER_FREE_GAP), **self.opts)
            relaxed.optimize(self.left() * TRANSFER_FREE_SHARE)
            relaxed_bound = relaxed.bound()
            if relaxed_bound is not None:
                self.floor = max(self.floor, relaxed_bound)
            self.keep_if_better(relaxed.assignment())
        self.details.update(transfer_free_bound=relaxed_bound,
                            transfer_free_seconds=time.perf_counter() - phase_start)

    def pairs(self) -> None:
        pairs_from = pairs_to = self.best_value
        phase_start = shift_start = time.perf_counter()
        if self.best_start is not None and not (self.contiguous or self.split_passes):
            # branch and bound finds good plans slowly on many small classes: re-divide the
            # most loaded device's classes with one other device at a time
            start, pairs_from = self.balanced_start()
            self.start_certificate()
            # single colour-class moves first: the orders' cuts and the LP's rounding leave
            # loads a move apart, which pairs re-divide slowly on a large graph (10,000 nodes
            # of varied blocks, 8 accelerators, 60 s: lp_round's 121.63 -> 117.28 in 3.9 s,
            # where pairs had reached 120.48)
            polished = descend_from(self.w, start, time.perf_counter() + self.share(POLISH_SHARE))
            value = self.keep_if_better(polished)
            if value < pairs_from:
                start, pairs_from = polished, value
            self.keep_if_better(improve_pairs.improve(self.w, self.cl, start, self.share(PAIRS_SHARE), self.solver))
            # then every boundary at once, where pairs wait for each other
            shift_start, pairs_to = time.perf_counter(), self.best_value
            self.keep_if_better(improve_pairs.shift_boundaries(self.w, self.cl, self.best_start,
                                                               self.share(SHIFT_SHARE), self.solver))
            self.details.update(shift=[pairs_to, self.best_value], shift_seconds=time.perf_counter() - shift_start)
        cl = self.cl
        self.details = {"solver": self.solver, "objective_form": "max fwd + max bwd" if self.split_passes
                        else "max load", "classes": cl.n, "hyperedges": len(cl.hyper),
                        "contiguous": self.contiguous, **self.details,
                        "pairs": [pairs_from, pairs_to], "pairs_seconds": shift_start - phase_start}

    def balanced_start(self) -> tuple[dict[int, str], float]:
        """The plan pairs start from, and its max load: the best start, or where transfers
        weigh, a ring split (:func:`.dp_ring.ring_splits`) within PAIRS_START_SPAN of it
        whose accelerators' mean load is lower.  Pairs move work between devices and seldom remove a cut, so
        the mean is about as low as they can bring the max: on op-level BERT-48 training
        the spectral line's ring split (1277.32, each device two stretches of layers, mean
        1251.8) went to 1263.81, the angular one's (1284.80, one stretch each, mean
        1228.5) to 1255.27."""
        chosen = (self.best_start, self.best_value)
        if not self.transfer_heavy or self.cl.n > dp_ring.MOST_CLASSES:
            return chosen
        # (each split's value is the evaluator's max load: dp_ring's tests hold it so)
        near = [(assignment, value) for value, _, _, _, assignment in dp_ring.ring_splits(self.w)
                if value <= self.best_value * (1 + PAIRS_START_SPAN) and not evaluate.check(self.w, assignment)]
        lowest = _accelerator_mean(self.w, self.best_start) if near else 0.0
        for assignment, value in near:
            mean = _accelerator_mean(self.w, assignment)
            if mean < lowest:
                chosen, lowest = (assignment, value), mean
        return chosen

    def prove(self) -> None:
        """Where transfers are much of the load the relaxations without them say little,
        and parts of the graph can be far easier to prove than the whole.  The certificate
        runs on its own thread (from the start of pairs, :meth:`start_certificate`), aimed
        below the best plan so far; the full program gets a short try (op-level BERT: proven
        in about 2 s), then groups of three devices re-divided, then the other bounds."""
        if not (self.transfer_heavy and self.open_gap()):
            return
        w, cl, details = self.w, self.cl, self.details
        self.start_certificate()
        if cl.n * (w.num_accelerators + w.num_cpus) <= FIRST_TRY_MOST:
            full = _ThroughputIP(w, cl, transfers=True, floor=self.packing, gap=self.gap, **self.opts)
            full.warm(self.best_start)
            status = full.optimize(self.share(FIRST_TRY_SHARE))
            if status == mip.OptimizationStatus.OPTIMAL:
                self.full, self.status = full, status
                return
            # not proven: keep what it found, then the bounds, then the full program afresh
            self.floor = max(self.floor, full.bound() or 0.0)
            self.keep_if_better(full.assignment())
        if not self.split_passes:
            # what the CPUs take, with the tensors it costs (the split bound's is free)
            phase_start = time.perf_counter()
            offload = bound_offload.offload_bound(cl, w.num_accelerators, w.num_cpus, w.accelerator_memory,
                                                  self.best_value, self.share(OFFLOAD_SHARE))
            details["offload_bound"], details["offload_seconds"] = offload, time.perf_counter() - phase_start
            if offload is not None and offload > self.floor:
                self.floor = offload
                anytime.prove(offload)
        self.triples()
        if not self.split_passes and self.gap_still_open() and self.left() > 1.0:
            # transfers the LP relaxation cannot see: a spreading-metric LP
            phase_start = time.perf_counter()
            spreading = bound_spread.spreading_bound(cl, w.num_accelerators, w.num_cpus, self.floor,
                                                     self.best_value, self.share(SPREAD_SHARE))
            details["spreading_bound"] = spreading
            details["spreading_seconds"] = time.perf_counter() - phase_start
            self.floor = max(self.floor, spreading or 0.0)
        if self.gap_still_open() and self.left() > 1.0:
            phase_start = time.perf_counter()
            floor = self.floor
            part = bound_parts.grown_part_bounds(
                w, self.best_start, self.share(PARTS_SHARE), self.best_value * (1 - self.gap),
                lambda sub, sub_start, seconds: _part_bound(sub, sub_start, seconds, self.gap, self.opts, floor))
            details["part_bound"], details["part_seconds"] = part, time.perf_counter() - phase_start
            self.floor = max(self.floor, part) if part is not None else self.floor
        self.gap_still_open()

    def start_certificate(self) -> None:
        """The certificate on its own thread, where transfers weigh and it is not running yet:
        from the start of pairs, so that it has the time they and the shift take (op-level
        BERT-48 training: about 30 s of the 70 it needs), aimed lower as they improve."""
        if self.certificate is None and self.transfer_heavy and self.open_gap():
            self.certificate = _start_certificate(self.w, self.cl, self.best_start, self.best_value, self.floor,
                                                  self.split_passes, self.left())

    def gap_still_open(self) -> bool:
        """:meth:`open_gap` once the certificate's bound so far joins the floor."""
        if self.certificate is not None and (self.certificate.bound() or 0.0) > self.floor:
            self.floor = self.certificate.bound()
            anytime.prove(self.floor)
        return self.open_gap()

    def triples(self) -> None:
        """Where re-dividing pairs of devices stopped (the pairs phase), groups of three:
        op-level BERT-24 training 659.68 -> 658.20 in 31 s (at most TRIPLES_SHARE)."""
        if self.split_passes or self.contiguous or not self.gap_still_open():
            return
        phase_start = time.perf_counter()
        before = self.best_value
        better = improve_pairs.improve(self.w, self.cl, self.best_start, self.share(TRIPLES_SHARE), self.solver,
                                       group=3)
        self.keep_if_better(better)
        self.details["triples"] = [before, self.best_value]
        self.details["triples_seconds"] = time.perf_counter() - phase_start

    def full_program(self) -> Plan:
        w, details = self.w, self.details
        contiguous, split_passes = self.contiguous, self.split_passes
        method = "ip_contiguous" if contiguous else "ip"
        full, status = self.full, self.status
        # the transfer-free, the spreading, the certificate or a part's bound already proves
        # the best start within the gap, or no time is left for the full program
        proven = not self.open_gap() and gap_of(self.best_value, self.floor) is not None
        if self.best_start is not None and (proven or (full is None and self.left() <= self.reserve())):
            floor = _end_certificate(self.certificate, self.floor, details, cancel=True)
            return _throughput_plan(w, self.best_start, self.best_value, floor, contiguous, split_passes, proven,
                                    method, time.perf_counter() - self.began, details)
        # T's floor in the full program stays the packing bound: the transfer-free bound there
        # left the bound where it was and the plans worse (ResNet-50 inference, 80 s: 33.58
        # against 33.47); it joins the proven bound at the end instead
        if full is None:
            full = _ThroughputIP(w, self.cl, transfers=True, floor=self.packing, gap=self.gap, **self.opts)
            if self.best_start is not None:
                full.warm(self.best_start)
            status = full.optimize(max(1.0, self.left()))
        # the program had the time that was left: the certificate is stopped, not awaited
        floor = _end_certificate(self.certificate, self.floor, details, cancel=True)
        seconds = time.perf_counter() - self.began
        details["ip_objective"] = full.model.objective_value if full.model.num_solutions else None
        assignment = full.assignment()
        if assignment is None:
            assignment = self.best_start
        if assignment is None:
            st = "infeasible" if status == mip.OptimizationStatus.INFEASIBLE else "time_limit"
            return Plan("throughput", method, st, None, {}, lower_bound=full.bound(), seconds=seconds, details=details)
        value = _scored_start(w, assignment, contiguous, split_passes)[1]
        if value > self.best_value:  # the solver's incumbent is never worse than its start; be safe
            assignment, value = self.best_start, self.best_value
        lb = max(full.bound() or 0.0, floor)
        return _throughput_plan(w, assignment, value, lb, contiguous, split_passes,
                                status == mip.OptimizationStatus.OPTIMAL, method, seconds, details)


def _start_certificate(w: Workload, cl: Classes, start: dict[int, str] | None, value: float, floor: float,
                       split_passes: bool, seconds: float) -> "bound_setcover.Background | None":
    """The set-covering certificate that no plan reaches SETPART_GAP below ``value``
    (bound_setcover.py: each accelerator's set pays its own transfers, which the relaxation and the
    spreading LP see only on average), sought on a thread of its own until the time limit,
    at lower loads where it cannot come; None where it cannot raise the bound or does not
    apply (max fwd + max bwd)."""
    target = value * (1 - SETPART_GAP)
    if split_passes or start is None or not w.num_accelerators or not target > floor:
        return None
    return bound_setcover.Background(cl, w.num_accelerators, w.num_cpus, w.accelerator_memory, target, floor,
                              cl.devices_of(w, start), seconds, value)


def _end_certificate(certificate: "bound_setcover.Background | None", floor: float, details: dict, cancel: bool) -> float:
    """The floor raised by the certificate where it holds (waiting for it, or stopping it
    first where ``cancel``), its figures in ``details``."""
    if certificate is None:
        return floor
    bound = certificate.finish(cancel=cancel)
    details["setpart_bound"], details["setpart_seconds"] = bound, certificate.seconds
    return max(floor, bound or 0.0)


def _transfer_free_can_prove(w: Workload, start: dict[int, str] | None, value: float, gap: float,
                             split_passes: bool) -> bool:
    """Whether the transfer-free program's bound could bring ``value``'s gap within
    max(gap, 1%): that program's optimum is at most the start's compute alone (its loads
    without transfers), so where that is below value * (1 - max(gap, 1%)) the phase cannot.
    On op-level ResNet-50 compute alone is 110.5 against 124.35 and the phase's bound was
    53.8: its time goes to the full program instead."""
    if start is None or split_passes or not np.isfinite(value):
        return True
    score = evaluate.max_load(w, start)
    loads = np.array([score.loads[d.name] for d in w.devices])
    paid = evaluate.communication(w, evaluate.device_array(w, start)) * (np.arange(len(w.devices)) < w.num_accelerators)
    return float((loads - paid).max()) >= value * (1 - max(gap, 0.01))


def _accelerator_mean(w: Workload, assignment: dict[int, str]) -> float:
    """The accelerators' mean load (the evaluator's)."""
    loads = evaluate.max_load(w, assignment).loads
    return float(np.mean([loads[d.name] for d in w.devices[:w.num_accelerators]]))


def _packing_floor(w: Workload, cl: Classes, split_passes: bool) -> float:
    """The packing and split bounds (bounds.py) as T's floor, also offered to the time
    limit's watch; 0 where they say nothing (or for the max forward + max backward
    objective, which they do not bound)."""
    if split_passes:
        return 0.0
    acc, cpu = cl.device_costs()
    split = split_bound(acc, cpu, cl.size, w.num_accelerators, w.num_cpus, w.accelerator_memory)
    floor = lifted(acc, cpu, w.num_accelerators, w.num_cpus, split)
    if np.isfinite(floor):
        anytime.prove(floor)
    return floor if np.isfinite(floor) else 0.0


def _part_bound(sub: Workload, start: dict[int, str], seconds: float, gap: float, opts: dict,
                proven: float = 0.0):
    """(the proven lower bound of the full program on a sub-workload, whether it proved
    the part optimal within ``gap``), warm-started from the plan restricted to it.

    Where that plan, first improved by re-dividing pairs of devices (as for the whole),
    scores at most ``proven`` (the whole's bound so far), the part's optimum does too and
    no bound it proves can raise it: it is not solved, and (None, True) lets the next,
    larger part be tried (op-level ResNet-50 training: a half that took 18 s for a bound
    of 89, against 221 proven, is skipped)."""
    deadline = time.perf_counter() + seconds
    cl = build_classes(sub)
    contiguous, split_passes = opts["contiguous"], opts["split_passes"]
    complete = bool(start) and len(start) == sub.n  # a plan of the whole part
    if complete:
        value = _scored_start(sub, start, contiguous, split_passes)[1]
        if value > proven and np.isfinite(value) and not (contiguous or split_passes):
            start = improve_pairs.improve(sub, cl, start, seconds * PART_PAIRS_SHARE, opts["solver"])
            value = _scored_start(sub, start, contiguous, split_passes)[1]
        if value <= proven:
            return None, True
    floor = _packing_floor(sub, cl, split_passes)
    program = _ThroughputIP(sub, cl, transfers=True, floor=floor, gap=gap, **opts)
    if complete:
        program.warm(start)
    status = program.optimize(deadline - time.perf_counter())
    bound = program.bound()
    return max(bound, floor) if bound is not None else floor, status == mip.OptimizationStatus.OPTIMAL


TRANSFER_FREE_SHARE = 0.3  # of the time limit, at most, for the transfer-free phase
PARTS_SHARE = 0.3  # of the time limit, at most, for the bounds on parts of the graph
SETPART_GAP = 0.0099  # the certificate is sought this far below the best plan
SPREAD_SHARE = 0.15  # of the time limit, at most, for the spreading-metric bound
OFFLOAD_SHARE = 0.2  # of the time limit, at most, for the CPUs' share with its transfers (5 small MIPs; on
# op-level BERT-48 training the least part boundary c' takes 10 s to prove)
# of the time limit, for the full program before the parts: its heuristics find the plan
# the certificate is sought below (op-level BERT-12 training: 418.32 to 373.42 after 17 s;
# with 10% the certificate started from 418.32 and, in the bench, none came: 14.27%)
FIRST_TRY_SHARE = 0.2
FIRST_TRY_MOST = 40_000  # classes x devices, at most, for that try: on a 10,000-node graph (90,900
# binaries) HiGHS's presolve alone ran 24-31 s past a 12 s limit, and nothing was proven
PAIRS_SHARE = 0.25  # of the time limit, at most, for the pairwise re-optimisation
SHIFT_SHARE = 0.1  # of the time limit, at most, for moving every boundary at once after pairs
POLISH_SHARE = 0.1  # of the time limit, at most, for single class moves on the start pairs begin from
PAIRS_START_SPAN = 0.01  # a ring split this far above the best start may still be the one pairs start from
TRIPLES_SHARE = 0.3  # of the time limit, at most, for re-dividing three devices at a time
END_RESERVE, END_RESERVE_S = 0.02, 2.0  # of the time limit, and at most this, kept for the end
PART_PAIRS_SHARE = 0.25  # of a part's time, at most, for improving its warm start
TRANSFER_FREE_GAP = 1e-4


def _throughput_plan(w: Workload, assignment, value: float, lb: float, contiguous: bool,
                     split_passes: bool, solved: bool, method: str, seconds: float, details: dict) -> Plan:
    """The plan, checked by the evaluator, with its proven bound and gap."""
    problems = evaluate.check(w, assignment, contiguity="convex" if contiguous else "none")
    if problems:
        raise SolveError(f"internal error: IP plan is invalid: {problems[0]}")
    lb = min(lb, value) if lb > 0 else None
    g = gap_of(value, lb)
    return Plan("throughput", method, status_label(solved, g), value, assignment, lower_bound=lb, gap=g, seconds=seconds,
                details=details)


def _scored_start(w: Workload, assignment: dict[int, str] | None, contiguous: bool,
                  split_passes: bool) -> tuple[dict[int, str] | None, float]:
    """(the plan, its objective value) if it is valid for this program, else (None, inf)."""
    if not assignment or evaluate.check(w, assignment, contiguity="convex" if contiguous else "none"):
        return None, float("inf")
    if split_passes:
        return assignment, _split_pass_value(w, assignment)
    return assignment, evaluate.max_load(w, assignment).value


class _ThroughputIP:
    """The max-load program on one backend; ``transfers=False`` leaves out the hyperedge
    cut (a relaxation: every plan's load is at least its work)."""

    def __init__(self, w: Workload, cl: Classes, *, transfers: bool, floor: float, contiguous: bool,
                 split_passes: bool, solver: str, gap: float, threads: int | None, verbose: bool):
        self.w, self.cl = w, cl
        k, l = w.num_accelerators, w.num_cpus
        accs, cpus = range(k), range(k, k + l)
        self.model = model = new_model(solver, gap, verbose)
        if threads:
            model.threads = threads
        self.x = x = {}
        for g in range(cl.n):
            for d in list(cpus) + (list(accs) if cl.supported[g] else []):
                x[g, d] = model.add_var(var_type=mip.BINARY)
        for g in range(cl.n):
            model += mip.xsum(x[g, d] for d in range(k + l) if (g, d) in x) == 1
        if float(cl.size[cl.supported].sum()) > w.accelerator_memory:  # (else every row holds: 1e18 unlimited)
            for d in accs:
                model += mip.xsum(cl.size[g] * x[g, d] for g in range(cl.n) if (g, d) in x) <= w.accelerator_memory
        if solver == "cbc":  # HiGHS handles the symmetry itself, and better (module docstring)
            _break_symmetry(model, x, cl.n, accs)
            _break_symmetry(model, x, cl.n, cpus)

        def xv(g, d):
            return x.get((g, d), 0)

        # communication: y[h, d] >= |x[member, d] - x[source, d]| (only accelerators pay)
        comm = {(d, b): [] for d in accs for b in (False, True)}
        for src, members, weight, backward in (cl.hyper if transfers else ()):
            for d in accs:
                if all((m, d) not in x for m in members):
                    continue
                comm[d, backward].append(weight * crossing(model, src, members, lambda g: xv(g, d)))

        def load(d, backward: bool):
            if d < k:
                lat = cl.acc_bwd if backward else cl.acc_fwd
                return (mip.xsum(lat[g] * x[g, d] for g in range(cl.n) if (g, d) in x)
                        + mip.xsum(comm[d, backward]))
            lat = cl.cpu_bwd if backward else cl.cpu_fwd
            return mip.xsum(lat[g] * x[g, d] for g in range(cl.n))

        self.T = T = model.add_var(lb=floor)
        if split_passes:
            tf, tb = model.add_var(lb=0.0), model.add_var(lb=0.0)
            for d in range(k + l):
                model += tf >= load(d, False)
                model += tb >= load(d, True)
            model += T == tf + tb
        else:
            for d in range(k + l):
                model += T >= load(d, False) + load(d, True)
        if contiguous:
            add_contiguity(model, w, cl.of_node, x, k + l)
        model.objective = T

    def warm(self, assignment: dict[int, str]) -> None:
        self.model.start = _start(self.cl, assignment, self.w, self.x)

    def optimize(self, seconds: float):
        return optimize(self.model, max(1.0, seconds))

    def bound(self) -> float | None:
        return finite(self.model.objective_bound)

    def assignment(self) -> dict[int, str] | None:
        if self.model.num_solutions == 0:
            return None
        chosen = np.full(self.cl.n, -1, dtype=np.int64)
        for (g, d), var in self.x.items():
            if var.x is not None and var.x > 0.5:
                chosen[g] = d
        return self.cl.assignment(self.w, chosen)


def _break_symmetry(model, x, n: int, devices: range) -> None:
    """Identical devices in order: class g may use device d only if d-1 holds a class < g."""
    devs = list(devices)
    for i, d in enumerate(devs):
        if i == 0:
            continue
        prev = devs[i - 1]
        for g in range(n):
            if (g, d) in x:
                model += x[g, d] <= mip.xsum(x[h, prev] for h in range(g) if (h, prev) in x)


def _start(cl: Classes, assignment: dict[int, str], w: Workload, x) -> list:
    """The warm start as x values, devices relabelled to satisfy the symmetry breaking."""
    cls_dev = cl.devices_of(w, assignment)
    k = w.num_accelerators
    relabel: dict[int, int] = {}
    next_acc, next_cpu = 0, k
    for g in range(cl.n):
        d = int(cls_dev[g])
        if d not in relabel:
            if d < k:
                relabel[d], next_acc = next_acc, next_acc + 1
            else:
                relabel[d], next_cpu = next_cpu, next_cpu + 1
    out = []
    for (g, d), var in x.items():
        out.append((var, 1.0 if relabel[int(cls_dev[g])] == d else 0.0))
    return out


def _split_pass_value(w: Workload, assignment: dict[int, str]) -> float:
    """max forward load + max backward load (the alternative training objective)."""
    fw = evaluate.pass_loads(w, assignment, backward=False)
    bw = evaluate.pass_loads(w, assignment, backward=True)
    return max(fw.values(), default=0.0) + max(bw.values(), default=0.0)


# ---- latency ---------------------------------------------------------------------------------------

