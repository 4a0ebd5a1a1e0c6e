"""A set-covering certificate that max load <= T is impossible (the throughput IP's bound).

A plan with max load at most T splits the classes into at most k accelerator sets (of
supported classes, within memory, work plus the set's own transfers at most T) and at
most l CPU sets.  The LP covering every class with fractions of such sets is below every
plan's count of accelerators, so dual prices under which no accelerator set is worth
enough prove, by weak duality, that more than k are needed.  Columns are generated:
local search, then an exact DP along an order of narrow frontier (:mod:`.pricing_dp`,
every few rounds while local search still finds sets), then a MIP where the DP cannot
run, look for a set that would lower the LP.  Covering rather than partitioning
keeps the prices settled.

Any prices at all make a certificate where no set is worth the threshold, so where the
graph repeats a block the LP first ties the prices of each class's copies
(:mod:`..block_shift`): a row per chain of copies, a few dozen rounds where the full LP
takes hundreds.  The full LP follows only where the tied one cannot certify.

Write-up: docs/throughput.md (The set-covering certificate, in detail).
"""

from __future__ import annotations

import threading
import time

import highspy
import numpy as np
from numba import njit

from ...workload import transposed
from ..block_shift import block_shift, chains
from ..orders import spectral_ranks
from . import pricing_dp

# known sets (the best-priced) that local search starts from, each round: the sets the MIP
# found lay 70-140 classes from the 8 best-priced but 2-30 from some lower-ranked one
# (op-level BERT-12 training at 369.69), so 8 seeds left most rounds to the MIP; the
# certificate there took 110-118 s with 8, 31 s with 32, 24 s with 128, 37 s with 512
SEEDS = 128
MOVES = 500  # local search steps per seed, at most
PURGE_EVERY = 50  # rounds between removals of sets that lost their price
PURGE_ABOVE = 0.05  # a set is removed when its reduced cost is above this (and it is not basic)
MARGIN = 1e-6  # relative: the MIP's threshold is lowered by this much, covering its tolerances
# relative: lower loads are tried until the refuted and the proven one are this close (with
# tied prices a try takes seconds: op-level BERT-24 training, 651.52 proven, 652.34 not)
RETRY_SPAN = 0.0005
# relative: the first step below a load where no certificate came, doubling at each such
# load (the best plan is most often within a few per cent of the optimum, and a step to
# halfway down to the floor would land far below it)
STEP_DOWN = 0.005
KNAPSACK_S = 2.0  # seconds, at most, for the exact CPU set (its bound is kept where it stops)
# rounds between the exact pricing's runs while local search still finds sets (counted, not
# timed, so that a search takes the same path on every run): the certificate at the best plan
# less 1%, standalone, op-level BERT-12 / BERT-6 training: every 2 rounds 49.7 / 10.3 s,
# 3: 39.0 / 10.8 s, 5: 27.7 / 14.0 s, 10: 37.5 / 19.5 s
FRONTIER_EVERY = 5
# tied prices only where they leave at most this share of the rows (a pass that ties a few
# classes costs about what the free one does: on a generated 9,600-node graph, whose nodes'
# costs are jittered, 2 classes were mapped)
TIED_MOST = 0.8
PROVEN, EXHAUSTED, STOPPED = "proven", "exhausted", "stopped"  # how a search ends


def infeasible(cl, k: int, l: int, memory: float, T: float, plan_devices: np.ndarray | None,
               seconds: float, stop: threading.Event | None = None) -> bool:
    """Whether no plan of the classes ``cl`` (:class:`..classes.Classes`) on ``k`` accelerators and
    ``l`` CPUs has max load at most ``T``, proven within ``seconds`` (or before ``stop`` is
    set); False where it cannot be shown (in time, or at all: the LP then has a fractional
    plan).  ``plan_devices`` (class -> device index) seeds the LP with a known plan's
    accelerator sets.  Tied prices first (where the graph repeats a block), then free ones."""
    deadline = time.perf_counter() + seconds
    sets = _Sets(cl, memory)
    outcome = EXHAUSTED
    for rows in sets.forms():
        outcome = _search(sets, _Master(sets, k, l, rows), k, l, T, plan_devices, deadline - time.perf_counter(), stop)
        if outcome != EXHAUSTED:
            break
    return outcome == PROVEN


def _search(sets: "_Sets", master: "_Master", k: int, l: int, T: float, plan_devices: np.ndarray | None,
            seconds: float, stop: threading.Event | None) -> str:
    """:func:`infeasible`'s search on one LP (tied or free prices; its columns from other
    loads kept where they fit): PROVEN, EXHAUSTED (no certificate can come at this T, with
    these prices) or STOPPED (out of time, or stopped)."""
    if k == 0 or not np.isfinite(T):
        return EXHAUSTED
    deadline = time.perf_counter() + seconds
    stop = stop or threading.Event()
    T = T * (1 + 1e-9) + 1e-12  # a plan scoring T, summed in another order, may read a hair above it
    master.restrict(T)
    pricing = _Pricing(sets, T, stop)
    frontier = sets.frontier()
    for S in _initial_sets(sets, k, T, plan_devices):
        master.add(S, on_cpu=False)
    rounds, frontier_due = 0, 0
    while time.perf_counter() < deadline and not stop.is_set():
        rounds += 1
        value, pi, tau = master.solve()
        if value is None or value <= k * (1 + MARGIN):
            return EXHAUSTED  # the LP over all sets is at most this: no certificate can come
        found = _improving_sets(sets, master, pi, T)
        cpu_set, cpu_value, mu = _cpu_set(sets.cpu, pi, T, l)
        cpu_added = cpu_value + tau > MARGIN and not master.has(cpu_set, on_cpu=True)
        if cpu_added:
            master.add(cpu_set, on_cpu=True)
        checked = frontier is not None and (not found or rounds >= frontier_due)
        if not checked and found:
            _add(master, found, rounds, pi, tau)
            continue
        if l:  # the greedy's fractional bound can sit far above the best CPU set: the threshold falls with it
            cpu_set, cpu_value, mu = _cpu_best(sets.cpu, pi, T, deadline - time.perf_counter(), stop)
            if cpu_value + tau > MARGIN and not master.has(cpu_set, on_cpu=True):
                master.add(cpu_set, on_cpu=True)
                if not found:
                    continue
        threshold = (pi.sum() - l * mu) / k
        certifies = threshold > 1 + 2 * MARGIN
        rhs = threshold * (1 - MARGIN) if certifies else 1 + 10 * MARGIN
        none = False
        if checked:
            outcome, better = frontier.find(pi, T, rhs, deadline - time.perf_counter(), stop)
            frontier_due = rounds + FRONTIER_EVERY
            if outcome == pricing_dp.NONE:
                if certifies:
                    return PROVEN
                none = True
            found = found + [S for S in better if _fresh(S, pi, master, found)]
        if not found and not none:
            S, none = pricing.find(pi, rhs, deadline - time.perf_counter())
            if none and certifies:
                return PROVEN
            if S is not None and _fresh(S, pi, master, found):
                found = [S]
        if not found:
            if none and cpu_added:
                continue
            return EXHAUSTED if none else STOPPED  # the LP converged without a certificate, or out of time
        _add(master, found, rounds, pi, tau)
    return STOPPED


def _fresh(S: np.ndarray, pi: np.ndarray, master: "_Master", found: list[np.ndarray]) -> bool:
    """Whether the set would lower the LP -- worth more than 1 beyond the solvers'
    tolerances, not a column already, nor among the sets ``found`` this round."""
    return pi[S].sum() > 1 + MARGIN and not master.has(S) and not any(np.array_equal(S, F) for F in found)


def _add(master: "_Master", found: list[np.ndarray], rounds: int, pi: np.ndarray, tau: float) -> None:
    for S in found:
        master.add(S, on_cpu=False)
    if rounds % PURGE_EVERY == 0:
        master.purge(pi, tau)


class Background:
    """The certificate sought on a thread of its own, beside the IP's other phases: HiGHS
    (here through highspy, there through python-mip's cffi) and the compiled local search
    release the GIL, so with two cores it gets the whole time limit instead of a share of
    it.  Where no certificate can come at ``target`` (the LP falls to k), lower loads are
    tried: a step below it, steps doubling while none comes, never below the highest one
    known impossible (``floor`` at first), then halfway between the two.  A better plan
    found meanwhile lowers the target (:meth:`aim`), which is tried next where it lies
    between the two (and where the target is proven, loads above it up to the best plan,
    ``plan``); a search under way at a load above that plan's is abandoned for it
    (none can come there), so the search may start from a first plan far from the best."""

    def __init__(self, cl, k: int, l: int, memory: float, target: float, floor: float,
                 plan_devices: np.ndarray | None, seconds: float, plan: float = np.inf):
        self.seconds: float | None = None  # until it ended, once it has
        self._bound: float | None = None
        self._target = target
        self._stop = threading.Event()
        self._abandon = threading.Event()  # the load under way is above a plan's: none can come there
        self._trying, self._plan = np.inf, plan  # the load searched now, the best plan's max load
        self._error: BaseException | None = None
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(cl, k, l, memory, floor, plan_devices, seconds),
                                        daemon=True)
        self._thread.start()

    def aim(self, target: float, plan: float = np.inf) -> None:
        """Seek the certificate at ``target`` next, where it is below the one sought so far;
        ``plan`` (a plan's max load) ends a search at a load above it."""
        self._target = min(self._target, target)
        self._plan = min(self._plan, plan)
        if self._plan < self._trying:
            self._abandon.set()

    def _run(self, cl, k, l, memory, floor, plan_devices, seconds) -> None:
        deadline = self._started + seconds
        try:
            sets = _Sets(cl, memory)  # the same at every load tried
            low = floor
            # tied prices first: they settle in seconds where free ones take minutes, so the
            # loads are narrowed with them; then free prices from the target down again.
            # Each LP keeps its columns from load to load (those that no longer fit leave)
            for rows in sets.forms():
                low = self._narrow(sets, _Master(sets, k, l, rows), k, l, low, plan_devices, deadline)
                if low is None:
                    break
        except BaseException as error:  # raised again in the caller's thread by finish()
            self._error = error
        self.seconds = time.perf_counter() - self._started

    def _narrow(self, sets, master, k, l, low, plan_devices, deadline) -> float | None:
        """Narrow the loads on one LP from the target down towards ``low`` (the highest
        proven, or the floor): the new highest proven, None once out of time."""
        high, T, step = np.inf, self._target, STEP_DOWN  # high: the lowest load where none can come
        stop = _Either(self._stop, self._abandon)
        while T > low:
            # (the order matters: aim() reads the load before it sets the event, this clears
            # the event before it reads the plan)
            self._trying = T
            self._abandon.clear()
            outcome = EXHAUSTED if self._plan < T else _search(sets, master, k, l, T, plan_devices,
                                                               deadline - time.perf_counter(), stop)
            if outcome == STOPPED and self._abandon.is_set() and not self._stop.is_set():
                outcome = EXHAUSTED  # a plan below T came meanwhile
            if outcome == PROVEN:
                self._bound = low = T
            elif outcome == EXHAUSTED:
                high = T
            else:
                return None
            # none can come beyond the best plan either: where the target itself is proven,
            # higher loads up to that plan are tried too (op-level ResNet-50 training: the
            # target, the plan less 0.99%, proven in 0.6 s)
            ceiling = min(high, self._plan)
            if low < self._target < high:
                T = self._target  # a better plan came meanwhile
            elif not np.isfinite(ceiling) or ceiling <= low * (1 + RETRY_SPAN):
                break
            elif outcome == EXHAUSTED:
                T, step = max((low + high) / 2, high * (1 - step)), 2 * step
            else:
                T = (low + ceiling) / 2
        self._trying = np.inf
        return low

    def bound(self) -> float | None:
        """The highest load proven impossible so far (None before the first certificate)."""
        return self._bound

    def finish(self, cancel: bool = False) -> float | None:
        """Wait for the search (stopping it first if ``cancel``); :meth:`bound` then."""
        if cancel:
            self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._bound


class _Either:
    """Set where either event is: the search's ``stop`` for the time limit or an abandoned load."""

    def __init__(self, *events: threading.Event):
        self.events = events

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


class _Sets:
    """The classes' accelerator data as arrays for the compiled local search (and their CPU time)."""

    def __init__(self, cl, memory: float):
        self.n = cl.n
        self.work = (cl.acc_fwd + cl.acc_bwd).astype(np.float64)
        self.size = cl.size.astype(np.float64)
        self.supported = cl.supported.astype(np.bool_)
        self.cpu = cl.cpu_fwd + cl.cpu_bwd
        self.memory = float(memory) * (1 + 1e-12)
        self.h_source, self.h_ptr, self.h_members, self.weight = cl.hyper_arrays()
        self.c_ptr, self.c_hyper = transposed(self.h_ptr, self.h_members, cl.n)  # class -> its tensors
        self.spectral = spectral_ranks(self.n, self.h_source, self.h_ptr, self.h_members, self.weight)
        features = np.column_stack([self.work, self.cpu, self.size, self.supported])
        label = chains(block_shift(features, self.h_source, self.h_ptr, self.h_members, self.weight))
        tied = label.max(initial=-1) + 1 <= TIED_MOST * self.n
        self.chains = label if tied else None  # class -> its chain of copies
        self._frontier: pricing_dp.FrontierPricing | None = None

    def forms(self) -> list[np.ndarray | None]:
        """The LP's rows to try, in order: one per chain of copies (where the graph repeats
        a block), then one per class (None)."""
        return ([self.chains] if self.chains is not None else []) + [None]

    def frontier(self) -> "pricing_dp.FrontierPricing | None":
        """The exact pricing DP (built once, the same at every load), None beyond its size."""
        if self._frontier is None and self.n <= pricing_dp.CLASSES_MOST:
            self._frontier = pricing_dp.FrontierPricing(self)
        return self._frontier

    def load(self, members) -> float:
        inside = np.zeros(self.n, dtype=np.bool_)
        inside[np.asarray(members, dtype=np.int64)] = True
        return _load(inside, self.work, self.h_ptr, self.h_members, self.weight)[0]

    def fits(self, members, T: float) -> bool:
        members = np.asarray(members, dtype=np.int64)
        return (bool(self.supported[members].all()) and float(self.size[members].sum()) <= self.memory
                and self.load(members) <= T)


def _initial_sets(sets: _Sets, k: int, T: float, plan_devices):
    """Every class alone, every longest run of consecutive classes that fits (in the
    topological order and in the spectral line and ring, :func:`..orders.spectral_ranks`:
    op-level BERT-24 training at 650, the LP began at 20.5 accelerators with the first
    alone and at 8.0 with the plain Laplacian's line too, 6.5 after 120 s against 7.8),
    and the known plan's accelerator sets that fit."""
    out = [np.array([g]) for g in range(sets.n) if sets.fits([g], T)]
    orders = [np.arange(sets.n)] + [np.argsort(rank) for rank in sets.spectral.values()]
    for order in orders:
        end = 0
        for start in range(sets.n):
            end = max(end, start)
            while end < sets.n and sets.fits(np.sort(order[start:end + 1]), T):
                end += 1
            if end > start + 1:
                out.append(np.sort(order[start:end]))
    if plan_devices is not None:
        for d in range(k):
            members = np.flatnonzero(plan_devices == d)
            if members.size and sets.fits(members, T):
                out.append(members)
    return out


def _improving_sets(sets: _Sets, master: "_Master", pi: np.ndarray, T: float) -> list[np.ndarray]:
    """Sets worth more than 1 at prices ``pi``, by local search from the best-priced known sets."""
    known = master.accelerator_sets()
    worth = np.array([pi[S].sum() for S in known])
    found: list[np.ndarray] = []
    # the classes a set gains from (priced, supported), dearest first: most prices are 0
    cand = np.flatnonzero((pi > 1e-12) & sets.supported)
    priced = cand[np.argsort(-pi[cand], kind="stable")]
    for i in np.argsort(-worth, kind="stable")[:SEEDS]:
        inside = np.zeros(sets.n, dtype=np.bool_)
        inside[known[i]] = True
        _local_search(inside, pi, priced, T, sets.memory, sets.size, sets.work, sets.c_ptr,
                      sets.c_hyper, sets.h_ptr, sets.h_members, sets.weight, MOVES)
        S = np.flatnonzero(inside)
        if _fresh(S, pi, master, found):
            found.append(S)
    return found


def _cpu_set(cpu: np.ndarray, pi: np.ndarray, T: float, l: int):
    """(a CPU set of CPU time <= T chosen greedily by price per time, its worth, an upper
    bound on any CPU set's worth -- the fractional knapsack's; 0 without CPUs)."""
    if l == 0:
        return np.array([], dtype=np.int64), 0.0, 0.0
    free = np.flatnonzero((pi > 0) & (cpu <= 0))
    cand = np.flatnonzero((pi > 0) & (cpu > 0) & (cpu <= T))
    order = cand[np.argsort(-pi[cand] / cpu[cand], kind="stable")]
    room, chosen, bound, whole = T, list(free), float(pi[free].sum()), True
    for g in order:
        if cpu[g] <= room:
            room -= cpu[g]
            chosen.append(g)
            if whole:
                bound += pi[g]
        elif whole:
            bound += pi[g] * room / cpu[g]  # the fractional knapsack stops at its first split item
            whole = False
    chosen = np.array(sorted(chosen), dtype=np.int64)
    value = float(pi[chosen].sum())
    return chosen, value, max(bound, value)


def _cpu_best(cpu: np.ndarray, pi: np.ndarray, T: float, seconds: float, stop: threading.Event):
    """:func:`_cpu_set` exactly: the 0/1 knapsack on highspy (its dual bound where it runs
    out of time). On op-level BERT-12 training the fractional bound was 0.285 where the LP's
    CPU price was 0.167, which took the certificate's threshold from 1.042 to 1.022 and the
    pricing MIP from 3 s to 25 s."""
    greedy, greedy_value, fractional = _cpu_set(cpu, pi, T, 1)
    cand = np.flatnonzero((pi > 0) & (cpu > 0) & (cpu <= T))
    free = np.flatnonzero((pi > 0) & (cpu <= 0))
    if fractional <= greedy_value * (1 + 1e-9) or not cand.size or seconds <= 0:
        return greedy, greedy_value, fractional
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(min(seconds, KNAPSACK_S)))
    h.setOptionValue("mip_rel_gap", 1e-9)
    h.cbMipInterrupt.subscribe(lambda event: event.interrupt() if stop.is_set() else None)
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    m = len(cand)
    h.addVars(m, np.zeros(m), np.ones(m))
    h.changeColsCost(m, np.arange(m, dtype=np.int32), pi[cand].astype(np.float64))
    h.changeColsIntegrality(m, np.arange(m, dtype=np.int32), np.array([highspy.HighsVarType.kInteger] * m))
    h.addRow(-highspy.kHighsInf, float(T), m, np.arange(m, dtype=np.int32), cpu[cand].astype(np.float64))
    h.run()
    base = float(pi[free].sum())
    upper = min(fractional, base + float(h.getInfo().mip_dual_bound) + 1e-9)
    if not h.getInfo().primal_solution_status:
        return greedy, greedy_value, max(upper, greedy_value)
    chosen = cand[np.array(h.getSolution().col_value) > 0.5]
    if float(cpu[chosen].sum()) > T:  # within the MIP's tolerance only: keep the greedy's
        return greedy, greedy_value, max(upper, greedy_value)
    S = np.array(sorted(np.concatenate([free, chosen])), dtype=np.int64)
    value = float(pi[S].sum())
    if value < greedy_value:
        S, value = greedy, greedy_value
    return S, value, max(upper, value)


class _Master:
    """The LP over the sets known so far, on highspy: a row per class (>= 1), or per chain
    of ``rows`` (class -> row, >= the chain's length: the classes on a chain share a
    price), and one for the CPUs (<= l); an artificial column per row keeps it feasible."""

    def __init__(self, sets: _Sets, k: int, l: int, rows: np.ndarray | None = None):
        self.highspy = highspy
        self.sets = sets
        self.rows = np.arange(sets.n) if rows is None else rows
        self.m = m = int(self.rows.max(initial=-1)) + 1
        self.h = h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("presolve", "off")  # keeps the basis from round to round
        h.setOptionValue("simplex_strategy", 4)  # primal simplex: new columns keep the basis primal feasible
        inf = highspy.kHighsInf
        length = np.bincount(self.rows, minlength=m).astype(np.float64)
        h.addRows(m, length, np.full(m, inf), 0, np.zeros(m, dtype=np.int32), np.array([], dtype=np.int32),
                  np.array([]))
        h.addRow(-inf, float(l), 0, np.array([], dtype=np.int32), np.array([]))
        for r in range(m):  # uncovered at a cost above any plan's count
            h.addCol(float(k + 1), 0.0, inf, 1, np.array([r], dtype=np.int32), np.array([1.0]))
        self.columns: list[tuple[np.ndarray, bool]] = []  # (classes, on the CPUs)
        self.loads: list[float] = []  # each column's load (accelerator) or time (CPU)
        self.known: set[tuple[tuple[int, ...], bool]] = set()

    def has(self, S: np.ndarray, on_cpu: bool = False) -> bool:
        """Whether the set is a column already (one the LP's tolerances left priced a hair above 1)."""
        return (tuple(S.tolist()), on_cpu) in self.known

    def add(self, S: np.ndarray, on_cpu: bool) -> None:
        if self.has(S, on_cpu):
            return
        self.known.add((tuple(S.tolist()), on_cpu))
        count = np.bincount(self.rows[S], minlength=self.m)
        rows = np.flatnonzero(count)
        values = count[rows].astype(np.float64)
        if on_cpu:
            rows, values = np.append(rows, self.m), np.append(values, 1.0)
        self.h.addCol(0.0 if on_cpu else 1.0, 0.0, self.highspy.kHighsInf, len(rows),
                      rows.astype(np.int32), values)
        self.columns.append((np.asarray(S, dtype=np.int64), on_cpu))
        self.loads.append(float(self.sets.cpu[S].sum()) if on_cpu else self.sets.load(S))

    def restrict(self, T: float) -> None:
        """Drop the columns whose load is above ``T`` (kept from a higher load tried before)."""
        self._drop([j for j, load in enumerate(self.loads) if load > T])

    def accelerator_sets(self) -> list[np.ndarray]:
        return [S for S, on_cpu in self.columns if not on_cpu]

    def solve(self):
        """(the LP's value, the classes' prices, the CPU row's price); value None if unsolved."""
        h = self.h
        h.run()
        if h.getModelStatus() != self.highspy.HighsModelStatus.kOptimal:
            return None, None, None
        duals = np.array(h.getSolution().row_dual)
        return h.getInfo().objective_function_value, duals[:self.m][self.rows], float(duals[self.m])

    def purge(self, pi: np.ndarray, tau: float) -> None:
        """Drop nonbasic accelerator sets whose reduced cost rose above PURGE_ABOVE: the LP
        grows slower and stays quick (op-level BERT-6 training, in a prototype: 205 s to 83 s)."""
        status = self.h.getBasis().col_status
        basic = self.highspy.HighsBasisStatus.kBasic
        self._drop([j for j, (S, on_cpu) in enumerate(self.columns)
                    if not on_cpu and status[self.m + j] != basic and 1.0 - pi[S].sum() > PURGE_ABOVE])

    def _drop(self, drop: list[int]) -> None:
        if drop:
            self.h.deleteCols(len(drop), np.array([self.m + j for j in drop], dtype=np.int32))
            gone = set(drop)
            self.known -= {(tuple(self.columns[j][0].tolist()), self.columns[j][1]) for j in drop}
            self.columns = [c for j, c in enumerate(self.columns) if j not in gone]
            self.loads = [c for j, c in enumerate(self.loads) if j not in gone]


class _Pricing:
    """The MIP for an accelerator set with load <= T worth at least a threshold, on highspy:
    a 0/1 per class, a crossing variable per tensor (at least |member - source|); it stops
    early once ``stop`` is set."""

    def __init__(self, sets: _Sets, T: float, stop: threading.Event):

        self.highspy = highspy
        self.n = n = sets.n
        H = len(sets.weight)
        self.h = h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.cbMipInterrupt.subscribe(lambda event: event.interrupt() if stop.is_set() else None)
        h.setOptionValue("mip_max_improving_sols", 1)  # the first set found is enough
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)  # its worth steers the search
        inf = highspy.kHighsInf
        h.addVars(n, np.zeros(n), np.where(sets.supported, 1.0, 0.0))
        h.changeColsIntegrality(n, np.arange(n, dtype=np.int32),
                                np.array([highspy.HighsVarType.kInteger] * n))
        h.addVars(H, np.zeros(H), np.ones(H))
        every = np.arange(n + H, dtype=np.int32)
        h.addRow(-inf, float(T), n + H, every, np.concatenate([sets.work, sets.weight]))
        h.addRow(-inf, sets.memory, n, every[:n], sets.size)
        add_crossings(h, sets.h_source, sets.h_ptr, sets.h_members, n)
        self.base_rows = h.getNumRow()

    def find(self, pi: np.ndarray, rhs: float, seconds: float):
        """(a set worth at least ``rhs`` or None, whether none exists -- proven)."""
        if seconds <= 0:
            return None, False
        h, n = self.h, self.n
        h.changeColsCost(n, np.arange(n, dtype=np.int32), pi.astype(np.float64))
        h.addRow(float(rhs), self.highspy.kHighsInf, n, np.arange(n, dtype=np.int32), pi.astype(np.float64))
        h.setOptionValue("time_limit", float(seconds))
        h.run()
        status = h.getModelStatus()
        solution = np.array(h.getSolution().col_value[:n]) if h.getInfo().primal_solution_status else None
        h.deleteRows(1, np.array([self.base_rows], dtype=np.int32))
        if status == self.highspy.HighsModelStatus.kInfeasible:
            return None, True
        if solution is not None:
            S = np.flatnonzero(solution > 0.5)
            if pi[S].sum() >= rhs * (1 - MARGIN) - 1e-12:
                return S, False
        return None, False


def add_crossings(h: highspy.Highs, h_source, h_ptr, h_members, first: int) -> None:
    """Rows making each tensor's variable (column ``first + e``, the caller's) at least
    |member - source| for each of its members, the classes being columns 0..n-1: 1 where
    a set holds some of the tensor's classes but not all."""
    starts, index, value = [], [], []
    for e in range(len(h_ptr) - 1):
        source = int(h_source[e])
        for m in h_members[h_ptr[e]:h_ptr[e + 1]]:
            if m != source:
                for sign in (1.0, -1.0):  # crossing >= +-(member - source)
                    starts.append(len(index))
                    index += [first + e, int(m), source]
                    value += [1.0, -sign, sign]
    if starts:
        h.addRows(len(starts), np.zeros(len(starts)), np.full(len(starts), highspy.kHighsInf), len(index),
                  np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32), np.array(value))


@njit(cache=True, nogil=True)
def _load(inside, work, h_ptr, h_members, weight):
    """(the set's work plus the weight of every tensor crossing its boundary, how many
    members of each tensor it holds)."""
    held = np.zeros(len(weight), dtype=np.int64)
    load = 0.0
    for g in range(len(inside)):
        if inside[g]:
            load += work[g]
    for h in range(len(weight)):
        c = 0
        for t in range(h_ptr[h], h_ptr[h + 1]):
            if inside[h_members[t]]:
                c += 1
        held[h] = c
        if 0 < c < h_ptr[h + 1] - h_ptr[h]:
            load += weight[h]
    return load, held


@njit(cache=True, nogil=True)
def _change(g, add, held, work, c_ptr, c_hyper, h_ptr, weight):
    """The load's change when class g joins (add) or leaves the set."""
    d = work[g] if add else -work[g]
    for t in range(c_ptr[g], c_ptr[g + 1]):
        h = c_hyper[t]
        size = h_ptr[h + 1] - h_ptr[h]
        before = 0 < held[h] < size
        after_count = held[h] + 1 if add else held[h] - 1
        after = 0 < after_count < size
        if before != after:
            d += weight[h] if after else -weight[h]
    return d


@njit(cache=True, nogil=True)
def _move(g, add, inside, held, c_ptr, c_hyper):
    inside[g] = add
    for t in range(c_ptr[g], c_ptr[g + 1]):
        held[c_hyper[t]] += 1 if add else -1


@njit(cache=True, nogil=True)
def _local_search(inside, pi, priced, T, memory, size, work, c_ptr, c_hyper, h_ptr, h_members, weight, moves):
    """Raise the set's worth at prices ``pi`` keeping it feasible (load <= T, memory):
    add the best-priced class that fits; else drop classes of no worth that lower the
    load; else swap one class for a better-priced one that fits.  ``priced``: the
    supported classes of positive price, dearest first (ties by index), the only ones
    worth adding, so each scan stops at the first that fits."""
    n = len(inside)
    load, held = _load(inside, work, h_ptr, h_members, weight)
    used = 0.0
    for g in range(n):
        if inside[g]:
            used += size[g]
    for _ in range(moves):
        best = -1
        for g in priced:
            if not inside[g] and used + size[g] <= memory and \
                    load + _change(g, True, held, work, c_ptr, c_hyper, h_ptr, weight) <= T:
                best = g
                break
        if best >= 0:
            load += _change(best, True, held, work, c_ptr, c_hyper, h_ptr, weight)
            _move(best, True, inside, held, c_ptr, c_hyper)
            used += size[best]
            continue
        dropped = False
        for g in range(n):
            if inside[g] and pi[g] <= 1e-12:
                d = _change(g, False, held, work, c_ptr, c_hyper, h_ptr, weight)
                if d < -1e-12:
                    _move(g, False, inside, held, c_ptr, c_hyper)
                    load += d
                    used -= size[g]
                    dropped = True
        if dropped:
            continue
        gain, out, into = 1e-9, -1, -1
        if len(priced) == 0:
            break
        for a in range(n):
            if not inside[a] or pi[priced[0]] - pi[a] <= gain:
                continue
            da = _change(a, False, held, work, c_ptr, c_hyper, h_ptr, weight)
            _move(a, False, inside, held, c_ptr, c_hyper)
            for b in priced:  # dearest first: the first that fits is a's best swap
                if pi[b] - pi[a] <= gain:
                    break
                if inside[b] or b == a or used - size[a] + size[b] > memory:
                    continue
                if load + da + _change(b, True, held, work, c_ptr, c_hyper, h_ptr, weight) <= T:
                    gain, out, into = pi[b] - pi[a], a, b
                    break
            _move(a, True, inside, held, c_ptr, c_hyper)
        if out < 0:
            break
        load += _change(out, False, held, work, c_ptr, c_hyper, h_ptr, weight)
        _move(out, False, inside, held, c_ptr, c_hyper)
        load += _change(into, True, held, work, c_ptr, c_hyper, h_ptr, weight)
        _move(into, True, inside, held, c_ptr, c_hyper)
        used += size[into] - size[out]
    return load
