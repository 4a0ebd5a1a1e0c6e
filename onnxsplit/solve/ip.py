"""Integer program for max-load (throughput), on python-mip with HiGHS (CBC selectable).

The model follows the paper's IP (Section 5): x[g, d] = 1 when colour class g runs on
device d; a tensor's transfer cost is paid by an accelerator that holds some but not all
of {its producer, its consumers} (a hypergraph cut, one y[h, d] per tensor and device);
every load <= T; minimise T.  Optionally every device's part is convex
(``contiguous``), and for training the alternative objective max forward load + max
backward load (``split_passes``).

What makes it tractable on open-source solvers, none of it changing the optimum:

* **presolve** -- colour classes become one variable per device; tensors with the same
  set of classes (and pass) are one hyperedge; classes that cannot run on accelerators
  get no accelerator variables;
* **symmetry** -- identical accelerators (and identical CPU cores) can be renamed at
  will.  HiGHS finds that symmetry itself and handles it in its search (orbitopes); rows
  that order the devices (class i may use device d only if device d-1 holds a class
  before i) hide it from HiGHS and prove far more slowly: op-level BERT-6 inference (3
  accelerators) 0.10% in 88 s without them, 5.24% after 120 s with them, op-level
  ResNet-50 training (6) 0.10% in 118 s against 16.0%.  So the rows are added for CBC only;
* **warm start** -- the DP's plan (or any plan), relabelled into that order;
* **a packing bound** (``bounds``) as the floor of T, which the LP relaxation cannot
  see on a few large classes, and a **spreading-metric bound** (``spread``) for the
  transfers it cannot see either;
* **a time limit** that returns the best plan found with the solver's proven lower bound.

The plan returned is re-scored by the evaluator; its value is the evaluator's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import interrupt
from ..errors import OnnxsplitError, SolveError, SplitError
from ..plan import Plan, gap_of
from ..workload import Workload
from . import anytime, evaluate, pairs, setpart, spread, subgraph
from .bounds import packing_bound
from .segments import latency_lower_bound, longest_paths
from .seriesbound import block_parts, series_lower_bound

SOLVERS = ("highs", "cbc")


@dataclass(frozen=True)
class Classes:
    """Colour classes as the IP's units, in topological order of their first node."""

    of_node: np.ndarray  # node index -> class index
    acc_fwd: np.ndarray
    acc_bwd: np.ndarray
    cpu_fwd: np.ndarray
    cpu_bwd: np.ndarray
    size: np.ndarray
    supported: np.ndarray
    hyper: list[tuple[int, tuple[int, ...], float, bool]]  # (source class, members, weight, backward)

    @property
    def n(self) -> int:
        return len(self.size)

    def devices_of(self, w: Workload, assignment: dict[int, str]) -> np.ndarray:
        """class index -> device index of a plan (colour classes share a device)."""
        out = np.full(self.n, -1, dtype=np.int64)
        out[self.of_node] = evaluate.device_array(w, assignment)
        return out

    def assignment(self, w: Workload, devices: np.ndarray) -> dict[int, str]:
        """node id -> device name, each node on its class's device."""
        names = [d.name for d in w.devices]
        return {int(w.ids[v]): names[devices[self.of_node[v]]] for v in range(w.n)}

    def hyper_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The hyperedges as arrays: (source class, CSR pointer into members, members, weight)."""
        sizes = [len(m) for _, m, _, _ in self.hyper]
        ptr = np.zeros(len(self.hyper) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum(sizes)
        return (np.array([s for s, _, _, _ in self.hyper], dtype=np.int64), ptr,
                np.array([g for _, m, _, _ in self.hyper for g in m], dtype=np.int64),
                np.array([wt for _, _, wt, _ in self.hyper], dtype=np.float64))

    def device_costs(self) -> tuple[np.ndarray, np.ndarray]:
        """(each class's forward + backward time on an accelerator, inf where unsupported;
        the same on a CPU)."""
        return (np.where(self.supported, self.acc_fwd + self.acc_bwd, np.inf),
                self.cpu_fwd + self.cpu_bwd)


def build_classes(w: Workload) -> Classes:
    order_pos = np.empty(w.n, dtype=np.int64)
    order_pos[list(w.topological_order)] = np.arange(w.n)
    first: dict[int, int] = {}
    for v in w.topological_order:
        first.setdefault(int(w.color_class[v]), len(first))
    of_node = np.array([first[int(c)] for c in w.color_class], dtype=np.int64)
    n = len(first)
    bwd = w.backward

    def total(values, mask):
        return np.bincount(of_node[mask], weights=values[mask], minlength=n)

    merged: dict[tuple, float] = {}
    consumers: dict[int, set[int]] = {}
    for s, d in zip(w.edge_src, w.edge_dst):
        consumers.setdefault(int(s), set()).add(int(of_node[d]))
    for u, cls in consumers.items():
        src = int(of_node[u])
        members = tuple(sorted(cls | {src}))
        if len(members) > 1 and w.out_cost[u] > 0:
            key = (src, members, bool(bwd[u]))
            merged[key] = merged.get(key, 0.0) + float(w.out_cost[u])
    return Classes(
        of_node=of_node,
        acc_fwd=total(w.acc_latency, ~bwd), acc_bwd=total(w.acc_latency, bwd),
        cpu_fwd=total(w.cpu_latency, ~bwd), cpu_bwd=total(w.cpu_latency, bwd),
        size=np.bincount(of_node, weights=w.size, minlength=n),
        supported=np.bincount(of_node, weights=(~w.supported).astype(float), minlength=n) == 0,
        hyper=[(s, m, wt, b) for (s, m, b), wt in merged.items()],
    )


def solve_throughput(w: Workload, *, contiguous: bool = False, split_passes: bool = False,
                     time_limit: float = 60.0, solver: str = "highs", warm_start: dict[int, str] | None = None,
                     gap: float = 0.001, threads: int | None = None, verbose: bool = False) -> Plan:
    """Min max-load by integer programming; returns the best plan with its proven bound.

    The phases share ``time_limit``.  First (at most TRANSFER_FREE_SHARE of it) the same
    program without transfers: far smaller, it is often solved outright, and its bound
    holds for the full program (transfers only add load) -- on layer graphs, whose
    transfers are small, it is most of the proof (skipped where it cannot prove 1%:
    :func:`_transfer_free_can_prove`).  Its plan, scored with transfers, is a second warm
    start.  The better start is improved by re-dividing two devices' classes at a time
    (:mod:`pairs`, at most PAIRS_SHARE of the time).  Where the transfer-free phase was
    skipped and the gap is still open, the full program gets a short try (FIRST_TRY_SHARE);
    if that does not prove the gap, a set-covering LP seeks a certificate that no plan
    reaches SETPART_GAP below the best (:mod:`setpart`; each accelerator's set pays its own
    transfers; lower loads where none can come there) on a thread of its own, beside
    everything that follows and up to the time limit; a spreading-metric LP bounds the
    transfers every plan pays (:mod:`spread`, at most SPREAD_SHARE), and prefixes and
    suffixes of the graph are solved for bounds (:mod:`subgraph`, at most PARTS_SHARE): a
    part is often far easier than the whole and as hard (one whose plan already scores
    within the bound so far is skipped: it cannot raise it).  Then the full program; the
    proven bound is the largest of them.
    """
    import mip

    start = time.perf_counter()
    cl = build_classes(w)

    def left():
        return time_limit - (time.perf_counter() - start)

    # a packing bound the LP relaxation cannot see (bounds.py): T starts there
    floor = packing = _packing_floor(w, cl, split_passes)
    opts = dict(contiguous=contiguous, split_passes=split_passes, solver=solver, threads=threads,
                verbose=verbose)
    best_start, best_value = _scored_start(w, warm_start, contiguous, split_passes)

    def keep_if_better(candidate):
        nonlocal best_start, best_value
        value = _scored_start(w, candidate, contiguous, split_passes)[1]
        if value < best_value:
            best_start, best_value = candidate, value
            if not (split_passes or contiguous):  # offers are scored as plain max-load plans
                anytime.offer(candidate, "an incumbent of the integer program")

    relaxed_bound = None
    phase_start = time.perf_counter()
    transfer_heavy = not _transfer_free_can_prove(w, best_start, best_value, gap, split_passes)
    if cl.hyper and w.num_accelerators and not transfer_heavy:
        # no warm start here: on GNMT training HiGHS closed this program in 19 s from
        # scratch and not in 40 s from the DP's plan
        relaxed = _ThroughputIP(w, cl, transfers=False, floor=floor, gap=min(gap, TRANSFER_FREE_GAP), **opts)
        relaxed.optimize(left() * TRANSFER_FREE_SHARE)
        relaxed_bound = relaxed.bound()
        if relaxed_bound is not None:
            floor = max(floor, relaxed_bound)
        keep_if_better(relaxed.assignment())
    transfer_free_seconds = time.perf_counter() - phase_start
    pairs_from = best_value
    phase_start = time.perf_counter()
    if best_start is not None and not (contiguous or split_passes):
        # branch and bound finds good plans slowly on many small classes: re-divide the
        # most loaded device's classes with one other device at a time (pairs.py)
        best_start = pairs.improve(w, cl, best_start, time_limit * PAIRS_SHARE, solver)
        best_value = _scored_start(w, best_start, contiguous, split_passes)[1]
        anytime.offer(best_start, "the warm start re-divided by pairs")
    details = {"solver": solver, "objective_form": "max fwd + max bwd" if split_passes else "max load",
               "classes": cl.n, "hyperedges": len(cl.hyper), "contiguous": contiguous,
               "transfer_free_bound": relaxed_bound, "transfer_free_seconds": transfer_free_seconds,
               "pairs": [pairs_from, best_value], "pairs_seconds": time.perf_counter() - phase_start}
    method = "ip_contiguous" if contiguous else "ip"
    full = status = certificate = None
    if transfer_heavy and gap_of(best_value, floor) is not None and gap_of(best_value, floor) > gap:
        # where transfers are much of the load the relaxations without them say little, and
        # parts of the graph can be far easier to prove than the whole (subgraph.py); the
        # full program first gets a short try (op-level BERT: proven in about 2 s)
        full = _ThroughputIP(w, cl, transfers=True, floor=packing, gap=gap, **opts)
        full.warm(best_start)
        status = full.optimize(time_limit * FIRST_TRY_SHARE)
        if status != mip.OptimizationStatus.OPTIMAL:
            # not proven: keep what it found, then the parts, then the full program afresh
            floor = max(floor, full.bound() or 0.0)
            keep_if_better(full.assignment())
            full = status = None
            certificate = _start_certificate(w, cl, best_start, best_value, floor, split_passes, left())
            if not split_passes:
                # transfers the LP relaxation cannot see: a spreading-metric LP (spread.py)
                phase_start = time.perf_counter()
                spreading = spread.spreading_bound(cl, w.num_accelerators, w.num_cpus, floor, best_value,
                                                   time_limit * SPREAD_SHARE)
                details["spreading_bound"] = spreading
                details["spreading_seconds"] = time.perf_counter() - phase_start
                floor = max(floor, spreading or 0.0)
            if certificate is not None:
                floor = max(floor, certificate.bound() or 0.0)
            if gap_of(best_value, floor) > gap:
                phase_start = time.perf_counter()
                part = subgraph.grown_part_bounds(
                    w, best_start, time_limit * PARTS_SHARE, best_value * (1 - gap),
                    lambda sub, sub_start, seconds: _part_bound(sub, sub_start, seconds, gap, opts, floor))
                details["part_bound"], details["part_seconds"] = part, time.perf_counter() - phase_start
                floor = max(floor, part) if part is not None else floor
            if certificate is not None:
                floor = max(floor, certificate.bound() or 0.0)
    if best_start is not None and gap_of(best_value, floor) is not None and gap_of(best_value, floor) <= gap:
        # the transfer-free, the spreading, the certificate or a part's bound already proves
        # the best start within the gap
        floor = _end_certificate(certificate, floor, details, cancel=True)
        return _throughput_plan(w, best_start, best_value, floor, contiguous, split_passes, True,
                                method, time.perf_counter() - start, details)
    # T's floor in the full program stays the packing bound: the transfer-free bound there
    # left the bound where it was and the plans worse (ResNet-50 inference, 80 s: 33.58
    # against 33.47); it joins the proven bound at the end instead
    if full is None:
        full = _ThroughputIP(w, cl, transfers=True, floor=packing, gap=gap, **opts)
        if best_start is not None:
            full.warm(best_start)
        status = full.optimize(max(1.0, left()))
    floor = _end_certificate(certificate, floor, details, cancel=status == mip.OptimizationStatus.OPTIMAL)
    seconds = time.perf_counter() - start
    details["ip_objective"] = full.model.objective_value if full.model.num_solutions else None
    assignment = full.assignment()
    if assignment is None:
        assignment = best_start
    if assignment is None:
        st = "infeasible" if status == mip.OptimizationStatus.INFEASIBLE else "time_limit"
        return Plan("throughput", method, st, None, {}, lower_bound=full.bound(), seconds=seconds, details=details)
    value = _scored_start(w, assignment, contiguous, split_passes)[1]
    if value > best_value:  # the solver's incumbent is never worse than its start; be safe
        assignment, value = best_start, best_value
    lb = max(full.bound() or 0.0, floor)
    return _throughput_plan(w, assignment, value, lb, contiguous, split_passes,
                            status == mip.OptimizationStatus.OPTIMAL, method, seconds, details)


def _start_certificate(w: Workload, cl: Classes, start: dict[int, str] | None, value: float, floor: float,
                       split_passes: bool, seconds: float) -> "setpart.Background | None":
    """The set-covering certificate that no plan reaches SETPART_GAP below ``value``
    (setpart.py: each accelerator's set pays its own transfers, which the relaxation and the
    spreading LP see only on average), sought on a thread of its own until the time limit,
    at lower loads where it cannot come; None where it cannot raise the bound or does not
    apply (max fwd + max bwd)."""
    target = value * (1 - SETPART_GAP)
    if split_passes or start is None or not w.num_accelerators or not target > floor:
        return None
    return setpart.Background(cl, w.num_accelerators, w.num_cpus, w.accelerator_memory, target, floor,
                              cl.devices_of(w, start), seconds)


def _end_certificate(certificate: "setpart.Background | None", floor: float, details: dict, cancel: bool) -> float:
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


def _packing_floor(w: Workload, cl: Classes, split_passes: bool) -> float:
    """The packing bound (bounds.py) as T's floor; 0 where it says nothing (or for the
    max forward + max backward objective, which it does not bound)."""
    floor = 0.0 if split_passes else packing_bound(*cl.device_costs(), w.num_accelerators, w.num_cpus)
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
    import mip

    deadline = time.perf_counter() + seconds
    cl = build_classes(sub)
    contiguous, split_passes = opts["contiguous"], opts["split_passes"]
    complete = bool(start) and len(start) == sub.n  # a plan of the whole part
    if complete:
        value = _scored_start(sub, start, contiguous, split_passes)[1]
        if value > proven and np.isfinite(value) and not (contiguous or split_passes):
            start = pairs.improve(sub, cl, start, seconds * PART_PAIRS_SHARE, opts["solver"])
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
# of the time limit, for the full program before the parts: its heuristics find the plan
# the certificate is sought below (op-level BERT-12 training: 418.32 to 373.42 after 17 s;
# with 10% the certificate started from 418.32 and, in the bench, none came: 14.27%)
FIRST_TRY_SHARE = 0.2
PAIRS_SHARE = 0.25  # of the time limit, at most, for the pairwise re-optimisation
PART_PAIRS_SHARE = 0.25  # of a part's time, at most, for improving its warm start
TRANSFER_FREE_GAP = 1e-4
PATH_BOUND_SHARE = 0.25  # of the latency IP's time left, at most, for the path bound's cuts
SERIES_BOUND_SHARE = 0.6  # of the latency IP's time left after the path bound, for the composed bound


def _throughput_plan(w: Workload, assignment, value: float, lb: float, contiguous: bool,
                     split_passes: bool, solved: bool, method: str, seconds: float, details: dict) -> Plan:
    """The plan, checked by the evaluator, with its proven bound and gap."""
    problems = evaluate.check(w, assignment, contiguity="convex" if contiguous else "none")
    if problems:
        raise SolveError(f"internal error: IP plan is invalid: {problems[0]}")
    lb = min(lb, value) if lb > 0 else None
    g = gap_of(value, lb)
    return Plan("throughput", method, _status_label(solved, g), value, assignment, lower_bound=lb, gap=g, seconds=seconds,
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
        import mip

        self.w, self.cl = w, cl
        k, l = w.num_accelerators, w.num_cpus
        accs, cpus = range(k), range(k, k + l)
        self.model = model = _new_model(solver, gap, verbose)
        if threads:
            model.threads = threads
        self.x = x = {}
        for g in range(cl.n):
            for d in list(cpus) + (list(accs) if cl.supported[g] else []):
                x[g, d] = model.add_var(var_type=mip.BINARY)
        for g in range(cl.n):
            model += mip.xsum(x[g, d] for d in range(k + l) if (g, d) in x) == 1
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
            _add_contiguity(model, w, cl, x, k + l)
        model.objective = T

    def warm(self, assignment: dict[int, str]) -> None:
        self.model.start = _start(self.cl, assignment, self.w, self.x)

    def optimize(self, seconds: float):
        return optimize(self.model, max(1.0, seconds))

    def bound(self) -> float | None:
        return _finite(self.model.objective_bound)

    def assignment(self) -> dict[int, str] | None:
        if self.model.num_solutions == 0:
            return None
        chosen = np.full(self.cl.n, -1, dtype=np.int64)
        for (g, d), var in self.x.items():
            if var.x is not None and var.x > 0.5:
                chosen[g] = d
        return self.cl.assignment(self.w, chosen)


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


_Model = None  # made on first use: python-mip is imported only where a program is built


def _model_class():
    import mip

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

    return Model


def _new_model(solver: str, gap: float, verbose: bool):
    """An empty minimisation model on the chosen backend, stopping at relative gap ``gap``."""
    import mip

    if solver not in SOLVERS:
        raise OnnxsplitError(f"unknown solver '{solver}' (choose from {', '.join(SOLVERS)})")
    global _Model
    if _Model is None:
        _Model = _model_class()
    model = _Model(sense=mip.MINIMIZE, solver_name="CBC" if solver == "cbc" else "highs")
    model.verbose = int(verbose)
    model.max_mip_gap = gap
    if solver == "highs":
        _stop_when_interrupted(model)
    return model


def optimize(model, seconds: float):
    """``model.optimize`` for at most ``seconds``; Interrupted where it was stopped (see
    :func:`_stop_when_interrupted`)."""
    try:
        status = model.optimize(max_seconds=seconds)
    except KeyError:  # python-mip has no name for HiGHS's "interrupted" status
        interrupt.check()
        raise
    interrupt.check()
    return status


_HIGHS_INTERRUPTS = (1, 2, 6)  # HiGHS's kCallback{Simplex,Ipm,Mip}Interrupt


def _stop_when_interrupted(model) -> None:
    """HiGHS stops at its next interrupt callback once the command is interrupted or the
    solve's caller has stopped waiting (onnxsplit.interrupt); without this, Ctrl-C or a
    time limit waits for the native call to return."""
    try:
        from mip.highs import ffi

        solver = model.solver
        stop = interrupt.stop_event()

        def on_callback(kind, message, data_out, data_in, user):
            if data_in != ffi.NULL and interrupt.stopped(stop):
                data_in.user_interrupt = 1

        callback = ffi.callback("HighsCCallbackType", on_callback)
        solver._lib.Highs_setCallback(solver._model, callback, ffi.NULL)
        for kind in _HIGHS_INTERRUPTS:
            solver._lib.Highs_startCallback(solver._model, kind)
        model._onnxsplit_interrupt = callback  # kept alive as long as the model
    except Exception:  # another python-mip or HiGHS: run without it
        pass


def _status_label(solved: bool, gap: float | None) -> str:
    """"optimal" once the gap is closed, by the solver or by a bound of our own; otherwise
    "feasible" where the solver stopped within its tolerance (it reports OPTIMAL then),
    or "time_limit" where time ran out."""
    if gap is not None and gap <= 1e-6:
        return "optimal"
    return "feasible" if solved else "time_limit"


def _finite(v):
    return float(v) if v is not None and np.isfinite(v) else None


def _break_symmetry(model, x, n: int, devices: range) -> None:
    """Identical devices in order: class g may use device d only if d-1 holds a class < g."""
    import mip

    devs = list(devices)
    for i, d in enumerate(devs):
        if i == 0:
            continue
        prev = devs[i - 1]
        for g in range(n):
            if (g, d) in x:
                model += x[g, d] <= mip.xsum(x[h, prev] for h in range(g) if (h, prev) in x)


def _add_contiguity(model, w: Workload, cl: Classes, x, ndev: int) -> None:
    """Every device's part is convex within each pass (the paper's z formulation).

    z[v, d] = 1 on v and on everything reachable from d's nodes; a node reached through a
    path that left d may not be on d.  The reference constrains the forward pass only; a
    training pipeline needs its backward parts convex too, so both passes are constrained.
    """
    for backward in ((False, True) if w.is_training else (False,)):
        nodes = np.flatnonzero(w.backward == backward)
        for d in range(ndev):
            z = {v: model.add_var(lb=0.0, ub=1.0) for v in nodes}
            xd = {v: x.get((int(cl.of_node[v]), d), 0) for v in nodes}
            for v in nodes:
                model += z[v] >= xd[v]
            for s, t in zip(w.edge_src, w.edge_dst):
                if w.backward[s] == backward and w.backward[t] == backward:
                    model += z[t] <= z[s]
                    # same class: x - x would be 0, but python-mip 2.0 builds "x - x" as -x
                    # (duplicate terms overwrite), so the trivial constraint is left out
                    if cl.of_node[s] != cl.of_node[t]:
                        model += z[t] <= xd[t] - xd[s] + 1


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

def solve_latency(w: Workload, *, pieces: int = 1, time_limit: float = 60.0, solver: str = "highs",
                  warm_start: dict[int, str] | None = None, gap: float = 0.01,
                  verbose: bool = False, series_bound: bool = True) -> Plan:
    """Min single-stream latency with up to ``pieces`` contiguous calls per accelerator.

    The paper's latency IP: x[v, s] puts node v in slot s (the CPUs, with unbounded
    parallelism, or piece p of accelerator d); each piece is convex; a piece starts once
    every tensor it receives is ready, then computes, receives and sends; a node's finish
    time is its piece's finish; pieces of one accelerator run one after another.  The
    big-M is the best latency known beforehand (all on the CPUs, or the warm start), which
    also caps the objective.  Identical accelerators are ordered by the first node of their
    first piece; a piece is used only if the one before it is.  The objective starts at
    the path bound (:func:`segments.latency_lower_bound`), which sees the memory limit
    forcing layers apart and the branches beside a path where the LP relaxation does
    not (at most PATH_BOUND_SHARE of the time left); a warm start already within
    ``gap`` of it is returned without building the program.  Next, with one call per
    accelerator (and ``series_bound``), the bound composed along the cut vertices
    (:mod:`seriesbound`, its blocks solved by CP-SAT) gets SERIES_BOUND_SHARE of the time
    left, and again a warm start it proves within ``gap`` is returned as it is.
    """
    import mip

    if pieces < 1:
        raise OnnxsplitError("--pieces must be at least 1")
    start_time = time.perf_counter()
    k, l, n = w.num_accelerators, w.num_cpus, w.n
    order = list(w.topological_order)
    pos = {v: i for i, v in enumerate(order)}
    cost = w.out_cost
    edges = list(zip(w.edge_src.tolist(), w.edge_dst.tolist()))

    if (why := _runs_nowhere(w)) is not None:
        return Plan("latency", "ip", "infeasible", None, {}, seconds=time.perf_counter() - start_time,
                    details={"why": why})
    ub, start_plan = _latency_upper_bound(w, warm_start, pieces)
    cheapest = np.minimum(w.cpu_latency if l > 0 else np.inf, np.where(w.supported, w.acc_latency, np.inf))
    # head[v]: longest path into v (inclusive), each node at its cheapest latency.  v cannot
    # finish before it (a call's finish includes all its work, and its inputs come first);
    # it bounds lat[v] below and shrinks the big-M of "v finishes with its call".  (No
    # tail bound: lat[v] is its call's finish, which may already include v's successors.)
    head = longest_paths(w, cheapest)[0]
    # the LP relaxation does not see the memory limit forcing layers apart; the best cut
    # of a few heavy paths does (segments.py), and bounds the objective from below
    path_seconds = PATH_BOUND_SHARE * max(0.0, time_limit - (time.perf_counter() - start_time))
    floor = max(float(head.max(initial=0.0)), latency_lower_bound(w, pieces, seconds=path_seconds))
    details = {"solver": solver, "pieces_per_accelerator": pieces, "big_m": ub, "path_bound": floor}

    def proven_start():
        """The warm start, where the bounds so far prove it within the gap; else None."""
        if start_plan is None or gap_of(ub, floor) is None or gap_of(ub, floor) > gap:
            return None
        a, pc = start_plan
        value = evaluate.latency(w, a, pc).value
        lb = min(floor, value)
        g = gap_of(value, lb)
        return Plan("latency", "ip", _status_label(True, g), value, a, lower_bound=lb, gap=g,
                    seconds=time.perf_counter() - start_time, pieces=pc, details=details)

    if (plan := proven_start()) is not None:
        return plan
    # the bound composed along cut vertices sees parallel branches competing for the
    # accelerators, which neither the path bound nor the program's relaxation does: where
    # it applies, it gets SERIES_BOUND_SHARE of the time left, before the program is built
    from .cpsat import available as cp_sat_available

    parts = block_parts(w) if series_bound and pieces == 1 and cp_sat_available() else None
    if parts:
        left = time_limit - (time.perf_counter() - start_time)
        composed = series_lower_bound(w, time.perf_counter() + SERIES_BOUND_SHARE * left, ub * (1 - gap), parts)
        details["series_bound"] = float(composed) if composed is not None else None
        floor = max(floor, composed or 0.0)
        if (plan := proven_start()) is not None:
            return plan
    model = _new_model(solver, gap, verbose)
    slots = [(d, p) for d in range(k) for p in range(pieces)]
    CPU = (-1, 0)
    x: dict[tuple[int, tuple[int, int]], mip.Var] = {}
    for v in range(n):
        if l > 0:
            x[v, CPU] = model.add_var(var_type=mip.BINARY)
        if w.supported[v]:
            for s in slots:
                x[v, s] = model.add_var(var_type=mip.BINARY)
    for v in range(n):
        model += mip.xsum(x[v, s] for s in [CPU] + slots if (v, s) in x) == 1
    # colour classes: one device for the whole class (its pieces may differ)
    first_of: dict[int, int] = {}
    for v in range(n):
        c = int(w.color_class[v])
        if c not in first_of:
            first_of[c] = v
            continue
        u = first_of[c]
        if l > 0:
            model += x[v, CPU] == x[u, CPU]
        for d in range(k):
            on_v = [x[v, (d, p)] for p in range(pieces) if (v, (d, p)) in x]
            on_u = [x[u, (d, p)] for p in range(pieces) if (u, (d, p)) in x]
            model += mip.xsum(on_v) == mip.xsum(on_u)
    for d in range(k):
        model += mip.xsum(w.size[v] * x[v, (d, p)] for v in range(n) for p in range(pieces)
                          if (v, (d, p)) in x) <= w.accelerator_memory

    def xs(v, s):
        return x.get((v, s), 0)

    lat = [model.add_var(lb=float(head[v]), ub=max(float(head[v]), ub)) for v in range(n)]
    st = {s: model.add_var(lb=0.0, ub=ub) for s in slots}
    fin = {s: model.add_var(lb=0.0, ub=ub) for s in slots}
    senders = sorted({u for u, _ in edges})
    for s in slots:
        on_slot = [v for v in range(n) if (v, s) in x]
        z = {v: model.add_var(lb=0.0, ub=1.0) for v in range(n)}
        for v in on_slot:
            model += z[v] >= x[v, s]
        cin = {u: model.add_var(lb=0.0, ub=1.0) for u in senders}
        cout = {u: model.add_var(lb=0.0, ub=1.0) for u in senders}
        for u, t in edges:
            model += z[t] <= z[u]
            if (t, s) in x:
                model += z[t] <= xs(t, s) - xs(u, s) + 1
            if (t, s) in x:
                model += cin[u] >= xs(t, s) - xs(u, s)
            if (u, s) in x:
                model += cout[u] >= xs(u, s) - xs(t, s)
        for u in senders:
            model += st[s] >= lat[u] - (1 - cin[u]) * ub
        work = mip.xsum(w.acc_latency[v] * x[v, s] for v in on_slot)
        comm = mip.xsum(cost[u] * (cin[u] + cout[u]) for u in senders if cost[u] > 0)
        model += fin[s] == st[s] + work + comm
        for v in on_slot:
            model += lat[v] >= fin[s] - (1 - x[v, s]) * max(0.0, ub - float(head[v]))
    for v in range(n):
        if l > 0:
            model += lat[v] >= w.cpu_latency[v] * x[v, CPU]
    for u, t in edges:
        model += lat[t] >= lat[u] + (w.cpu_latency[t] * x[t, CPU] if l > 0 else 0)
    for d in range(k):
        for p in range(1, pieces):
            model += st[d, p] >= fin[d, p - 1]
            for v in range(n):
                if (v, (d, p)) in x:
                    model += x[v, (d, p)] <= mip.xsum(x[u, (d, p - 1)] for u in range(n) if (u, (d, p - 1)) in x)
        if d >= 1:
            for v in range(n):
                if (v, (d, 0)) in x:
                    model += x[v, (d, 0)] <= mip.xsum(x[u, (d - 1, 0)] for u in range(n)
                                                      if pos[u] < pos[v] and (u, (d - 1, 0)) in x)
    T = model.add_var(lb=min(floor, ub), ub=ub)
    for v in range(n):
        model += T >= lat[v]
    model.objective = T
    if start_plan is not None:
        a, pc = start_plan
        model.start = [(var, 1.0 if _slot_of(w, a, pc, v) == s else 0.0) for (v, s), var in x.items()]
    left = time_limit - (time.perf_counter() - start_time)
    status = optimize(model, max(1.0, left))
    method = "ip"
    bound = _finite(model.objective_bound)
    bound = max(bound, floor) if bound is not None else floor
    seconds = time.perf_counter() - start_time
    assignment: dict[int, str] = {}
    piece_of: dict[int, int] = {}
    if model.num_solutions:
        names = [dv.name for dv in w.devices]
        for (v, s), var in x.items():
            if var.x is not None and var.x > 0.5:
                nid = int(w.ids[v])
                if s == CPU:
                    assignment[nid] = names[k]  # the latency model's CPUs are one pool
                else:
                    assignment[nid] = names[s[0]]
                    piece_of[nid] = s[1] + 1
    # none found, or one the solver's tolerances let over a memory limit by a few bytes
    if not assignment or evaluate.check(w, assignment):
        if start_plan is not None:  # the solver kept nothing better than the warm start
            a, pc = start_plan
            value = evaluate.latency(w, a, pc).value
            lb = min(bound, value) if bound is not None else None
            return Plan("latency", method, "time_limit", value, a, lower_bound=lb, gap=gap_of(value, lb),
                        seconds=seconds, pieces=pc, details=details)
        st_label = "infeasible" if status == mip.OptimizationStatus.INFEASIBLE else "time_limit"
        return Plan("latency", method, st_label, None, {}, lower_bound=bound, seconds=seconds, details=details)
    value = evaluate.latency(w, assignment, piece_of).value
    lb = min(bound, value) if bound is not None else None
    g = gap_of(value, lb)
    return Plan("latency", method, _status_label(status == mip.OptimizationStatus.OPTIMAL, g), value, assignment,
                lower_bound=lb, gap=g, seconds=seconds,
                pieces=piece_of, details={**details, "ip_objective": model.objective_value})


def _runs_nowhere(w: Workload) -> str | None:
    """Why no plan exists where a node has no device to run on; None where every node has one."""
    if w.num_cpus == 0 and not (w.num_accelerators > 0 and w.supported.all()):
        return ("a node runs on no device: no CPU core and it is not accelerator-supported"
                if w.num_accelerators else "no devices")
    return None


def _slot_of(w: Workload, assignment: dict[int, str], pieces: dict[int, int], v: int):
    nid = int(w.ids[v])
    dev = w.device_index[assignment[nid]]
    if dev >= w.num_accelerators:
        return (-1, 0)
    return (dev, pieces[nid] - 1)


def _in_symmetry_order(w: Workload, assignment: dict[int, str], pieces: dict[int, int]) -> dict[int, str]:
    """``assignment`` with its accelerators renamed so that the first pieces begin in
    topological order, as the latency IP's symmetry breaking asks: a start that breaks it
    is one the solver rejects (and searches without an incumbent)."""
    pos = np.empty(w.n, dtype=np.int64)
    pos[list(w.topological_order)] = np.arange(w.n)
    first: dict[str, int] = {}
    for nid, piece in pieces.items():
        d = assignment[nid]
        if piece == 1:
            first[d] = min(first.get(d, w.n), int(pos[w.index[nid]]))
    names = [dv.name for dv in w.devices[:w.num_accelerators]]
    rename = {d: names[i] for i, d in enumerate(sorted(first, key=first.get))}
    return {nid: rename.get(d, d) for nid, d in assignment.items()}


def _latency_upper_bound(w: Workload, warm_start: dict[int, str] | None, pieces: int):
    """The best latency known before solving (all on the CPUs, or the warm start) and, when
    the warm start fits the IP (at most ``pieces`` calls per accelerator), its pieces."""
    best = np.inf
    plan = None
    if w.num_cpus > 0:
        cpu = w.devices[w.num_accelerators].name
        best = evaluate.latency(w, {int(i): cpu for i in w.ids}).value
    if warm_start:
        dev = evaluate.device_array(w, warm_start)
        pc = evaluate.accelerator_pieces(w, dev)
        if not evaluate.check(w, warm_start) and pc.max(initial=0) <= pieces:
            cpu_name = w.devices[w.num_accelerators].name if w.num_cpus else None
            a = {int(i): (cpu_name if dev[j] >= w.num_accelerators else warm_start[int(i)])
                 for j, i in enumerate(w.ids)}
            pc_map = {int(w.ids[j]): int(pc[j]) for j in range(w.n) if dev[j] < w.num_accelerators}
            a = _in_symmetry_order(w, a, pc_map)
            try:
                value = evaluate.latency(w, a, pc_map).value
            except SplitError:  # the pieces wait on each other: no schedule with these calls
                value = None
            if value is not None and value <= best:
                best, plan = value, (a, pc_map)
    if not np.isfinite(best):
        # no CPU and no usable start: the sum of all latencies bounds any schedule
        best = float(w.cpu_latency.sum() + w.acc_latency.sum() + 2 * w.out_cost.sum()) + 1.0
    return float(best) * (1 + 1e-9) + 1e-9, plan
