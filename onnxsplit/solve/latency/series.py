"""``latency_series``: latency plans composed along the graph's cut vertices.

Between two consecutive cut vertices (:mod:`.blocks`) lies a block -- an Inception
module, a residual block -- and the blocks run one after another.  Each cut vertex runs
on the CPUs or in a call holding a run of whole blocks (which may begin or end partway
into a neighbouring block); the rest of a block runs as the latency IP's best plan of
that block alone; a DP over the cut vertices and the calls used picks the combination.
Unlike latency_dp (:func:`.dp.sequence_split`), a block's branches run side by side,
some in calls and some on the CPUs.

Write-up: docs/latency.md (latency_series).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ...errors import SolveError
from ...plan import Plan
from ...workload import Workload
from .. import anytime, evaluate
from ..classes import class_members
from ..finish import finish as wrap
from .blocks import BLOCK_NODES, Block, block_workload, blocks, cut_vertices, pinnable
from .cpsat import available as cp_sat_available
from .cpsat import solve_latency_cp
from .ip import solve_latency

SOLVE_SECONDS = 10.0  # at most, for one block's program
HIGHS_FIRST = 0.1  # seconds HiGHS has on a block's program before CP-SAT takes it over
MOST_CUTS = 150  # beyond, every j-th cut vertex only (blocks merge; the DP stays quick)


@dataclasses.dataclass
class Option:
    """One way to run a block's inside: the block IP's plan (node id -> its accelerator,
    None for the CPUs)."""

    latency: float
    assignment: dict[int, str | None]
    calls: int  # accelerator calls of its own
    call: str | None = None  # the accelerator that stands for the pinned end's call
    share: float = 0.0  # memory the pinned end's call holds inside the block


def _on_accelerators(sub: Workload, assignment: dict[int, str]) -> dict[int, str | None]:
    """``assignment`` with every CPU core as None."""
    index = sub.device_index
    return {i: d if sub.is_accelerator(index[d]) else None for i, d in assignment.items()}


def block_plans(w: Workload, block: Block, most: int, deadline: float, hard: set | None = None) -> dict[int, Option]:
    """t -> the best plan found for the block with both ends on the CPUs and at most t
    calls; t grows until one more call gains nothing, ``most`` is reached, or the
    deadline passes.  Each program starts from the plan before; ``hard`` collects the
    blocks whose programs HiGHS did not close quickly (:func:`_solve_block`)."""
    if not block.inside:
        return {0: Option(0.0, {}, 0)}
    sub = block_workload(w, block, 0)
    everything_cpu = {int(i): sub.devices[0].name for i in sub.ids}
    plans = {0: Option(evaluate.latency(sub, everything_cpu).value, dict.fromkeys(everything_cpu), 0)}
    best, start = plans[0].latency, everything_cpu
    for t in range(1, min(most, len(block.inside)) + 1 if len(block.inside) <= BLOCK_NODES else 1):
        left = deadline - time.perf_counter()
        if left <= 0.2:
            break
        sub = block_workload(w, block, t)
        plan = _solve_block(sub, min(SOLVE_SECONDS, left), start, block, hard)
        if plan.value is None or plan.value >= best - 1e-9:
            break  # one more call gains nothing: more rarely do
        placed = _on_accelerators(sub, plan.assignment)
        plans[t] = Option(plan.value, placed, len(set(placed.values()) - {None}))
        best, start = plan.value, plan.assignment
    return plans


def reaching_plan(w: Workload, block: Block, first_in_call: bool, deadline: float,
                  hard: set | None = None) -> list[Option]:
    """The block's best plan when the call that holds one end (the first: it ends in the
    block; the last: it begins in the block) takes at most half the block's memory, and
    nothing else runs on an accelerator; empty if none was found in time."""
    left = deadline - time.perf_counter()
    if not block.inside or len(block.inside) > BLOCK_NODES or left <= 0.2:
        return []
    room = 0.5 * float(w.size[block.inside].sum())
    sub = block_workload(w, block, 1, room if first_in_call else None, None if first_in_call else room)
    plan = _solve_block(sub, min(SOLVE_SECONDS, left), None, block, hard)
    if plan.value is None:
        return []
    placed = _on_accelerators(sub, plan.assignment)
    end = int(w.ids[block.first if first_in_call else block.last])
    call = placed[end]
    if call is None:
        return []
    share = sum(float(w.size[w.index[i]]) for i, d in placed.items() if d == call and i != end)
    return [Option(plan.value, placed, 0, call, share)]


def _solve_block(sub: Workload, seconds: float, start: dict[int, str] | None, block: Block,
                 hard: set | None) -> Plan:
    """The best plan of one of ``block``'s programs within ``seconds``: HiGHS first, which
    closes a small block in milliseconds; where it has not within HIGHS_FIRST, CP-SAT from
    its plan (an Inception module's parallel branches: HiGHS's big-M rows relax to nothing,
    and it took up to 3 s a program where CP-SAT takes a tenth of a second).  A block in
    ``hard`` (HiGHS fell short on one of its programs before) goes to CP-SAT at once."""
    begun = time.perf_counter()
    key = (block.first, block.last)
    cp_sat = cp_sat_available()
    plan = None
    if not (cp_sat and hard is not None and key in hard):
        with anytime.apart():  # (a bound of the block alone is none of the whole's)
            plan = solve_latency(sub, time_limit=min(HIGHS_FIRST, seconds) if cp_sat else seconds,
                                 gap=1e-6, warm_start=start, series_bound=False)
        if plan.status == "optimal" or not cp_sat:
            return plan
        if hard is not None:
            hard.add(key)
    left = seconds - (time.perf_counter() - begun)
    try:
        other = solve_latency_cp(sub, time_limit=max(left, 0.1), gap=1e-6,
                                 warm_start=plan.assignment if plan is not None and plan.value is not None else start)
    except SolveError:  # (a worker that gave no answer) HiGHS's plan stands, or HiGHS has the block after all
        if plan is not None:
            return plan
        with anytime.apart():
            return solve_latency(sub, time_limit=max(left, 0.1), gap=1e-6, warm_start=start, series_bound=False)
    if other.value is None or (plan is not None and plan.value is not None and plan.value <= other.value):
        return plan if plan is not None else other
    return other


def series_split(w: Workload, seconds: float) -> Plan | None:
    """The best plan of the family above, or None where the family does not apply: fewer
    than two cut vertices (once colour classes are kept inside blocks), no CPU to pin
    block ends on, or times too large to pin them (:func:`.blocks.pinnable`)."""
    begun = time.perf_counter()
    deadline = begun + seconds
    k = w.num_accelerators
    if w.n == 0 or w.num_cpus == 0 or k == 0 or not pinnable(w):
        return None
    cuts = cut_vertices(w)
    if len(cuts) < 2:
        return None
    if len(cuts) > MOST_CUTS:
        cuts = cuts[::-(-len(cuts) // MOST_CUTS)][:-1] + cuts[-1:]
    cuts = _classes_whole(w, cuts)
    if len(cuts) < 2:
        return None
    parts = blocks(w, cuts)
    hard: set = set()  # blocks whose programs go to CP-SAT at once
    own = [block_plans(w, b, k, deadline, hard) for b in parts]
    # a call that begins inside a block (holding its last cut vertex) or ends inside one
    begins = [reaching_plan(w, b, False, deadline, hard) if b.last is not None else [] for b in parts]
    ends = [reaching_plan(w, b, True, deadline, hard) if b.first is not None else [] for b in parts]
    dp = _ChainDP(w, cuts, parts, own, begins, ends)
    value, path = dp.solve()
    if path is None:
        return None
    plan = wrap(w, "latency", "latency_series", dp.assemble(path), begun,
                details={"composed_latency": float(value), "cut_vertices": len(cuts)})
    return plan if not plan.details["violations"] else None


def _classes_whole(w: Workload, cuts: list[int]) -> list[int]:
    """The cut vertices left once every colour class lies inside one block or is one cut
    vertex: those inside a class's span (and in a class that spans more) are dropped,
    merging their blocks, until none is."""
    classes = [c for c in class_members(w) if len(c) > 1]
    while len(cuts) >= 2:
        parts = blocks(w, cuts)
        place = np.empty(w.n, dtype=np.int64)  # 2j: inside block j; 2j+1: cut vertex j
        for j, b in enumerate(parts):
            place[b.inside] = 2 * j
        place[cuts] = 2 * np.arange(len(cuts)) + 1
        drop = set()
        for members in classes:
            lo, hi = int(place[members].min()), int(place[members].max())
            if lo != hi:
                drop.update(j for j in range(len(cuts)) if lo <= 2 * j + 1 <= hi)
        if not drop:
            break
        cuts = [c for j, c in enumerate(cuts) if j not in drop]
    return cuts


class _ChainDP:
    """The DP over the cut vertices.  ``finish[i, s]``: the earliest finish of cut vertex
    i (on the CPUs, or the last of a call that sends its outputs then) with s calls used.
    A call holds cut vertices a..b and the blocks between; it begins at a (all of block
    a's inside before it, or part of it: ``begins``) and ends at b (or in block b+1:
    ``ends``).  Calls about to begin at a are kept as (time so far, memory) pairs, none
    worse in both than another."""

    def __init__(self, w, cuts, parts, own, begins, ends):
        self.w, self.cuts, self.parts = w, cuts, parts
        self.own, self.begins, self.ends = own, begins, ends
        self.k = w.num_accelerators
        self.memory = float(w.accelerator_memory) * (1 + 1e-12)
        self.runs = _call_runs(w, cuts, parts)
        self.into_cut = [float(w.out_cost[list(w.predecessors[c])].sum()) for c in cuts]
        self.finish = np.full((len(cuts), self.k + 1), np.inf)
        self.how: dict[tuple[int, int], tuple] = {}
        self.calls: list[tuple] = []  # (a, s, time so far, memory, how it began)
        self.calls_at: dict[tuple[int, int], list[int]] = {}

    def _reach(self, i, s, value, move):
        if value < self.finish[i, s]:
            self.finish[i, s] = value
            self.how[i, s] = move

    def _begin(self, a, s, value, share, origin):
        kept = self.calls_at.setdefault((a, s), [])
        if any(self.calls[c][2] <= value and self.calls[c][3] <= share for c in kept):
            return
        kept[:] = [c for c in kept if not (value <= self.calls[c][2] and share <= self.calls[c][3])]
        kept.append(len(self.calls))
        self.calls.append((a, s, value, share, origin))

    def _after(self, i, s, done):
        """Cut vertex i finished at ``done``: block i+1, then cut vertex i+1."""
        j, nxt = i + 1, self.cuts[i + 1]
        for t, o in self.own[j].items():
            s2 = s + o.calls
            if s2 <= self.k:
                ready = done + o.latency
                self._reach(i + 1, s2, ready + self.w.cpu_latency[nxt], ("cpu", i, s, ("own", t)))
                if s2 < self.k:
                    self._begin(i + 1, s2, ready + self.into_cut[i + 1], 0.0, ("after", i, s, ("own", t)))
        for x, o in enumerate(self.begins[j]):
            if s + o.calls < self.k:
                self._begin(i + 1, s + o.calls, done + o.latency, o.share, ("after", i, s, ("begins", x)))

    def _run(self, c):
        a, s, value, share, _ = self.calls[c]
        m = len(self.cuts)
        for b, incoming, compute, outgoing, used in self.runs[a]:
            if share + used > self.memory:
                break
            body = value + (incoming - self.into_cut[a]) + compute
            self._reach(b, s + 1, body + outgoing, ("call", c, b, None))
            if b + 1 >= m:
                continue
            for x, o in enumerate(self.ends[b + 1]):
                s2 = s + 1 + o.calls
                if share + used + o.share <= self.memory and s2 <= self.k:
                    ready = body + outgoing - self.w.out_cost[self.cuts[b]] + o.latency
                    self._reach(b + 1, s2, ready + self.w.cpu_latency[self.cuts[b + 1]], ("call", c, b, x))
                    if s2 < self.k:
                        self._begin(b + 1, s2, ready + self.into_cut[b + 1], 0.0, ("call", c, b, x))

    def solve(self):
        m = len(self.cuts)
        self._after(-1, 0, 0.0)
        for a in range(m):
            for s in range(self.k + 1):
                for c in list(self.calls_at.get((a, s), [])):
                    self._run(c)
            if a < m - 1:
                for s in range(self.k + 1):
                    if np.isfinite(self.finish[a, s]):
                        self._after(a, s, self.finish[a, s])
        best, path = np.inf, None
        for s in range(self.k + 1):
            for t, o in self.own[m].items():
                if s + o.calls <= self.k and self.finish[m - 1, s] + o.latency < best:
                    best, path = self.finish[m - 1, s] + o.latency, (s, t)
        return best, path

    def assemble(self, path) -> dict[int, str]:
        """The assignment of the DP's best path: every call on an accelerator of its own."""
        w, cuts, parts = self.w, self.cuts, self.parts
        names = [d.name for d in w.devices]
        cpu = names[w.num_accelerators]
        fresh = iter(names[:w.num_accelerators])
        out: dict[int, str] = {}

        def place(j, option, call=None):
            kind, x = option
            o = {"own": self.own, "begins": self.begins, "ends": self.ends}[kind][j][x]
            renamed = {o.call: call} if o.call is not None else {}
            block = parts[j]
            for nid, device in o.assignment.items():
                if w.index[nid] in (block.first, block.last):
                    continue
                if device is None:
                    out[nid] = cpu
                else:
                    if device not in renamed:
                        renamed[device] = next(fresh)
                    out[nid] = renamed[device]

        def call_of(c, b, x):
            """Place call c (running to cut vertex b, ending in block b+1 with option x)."""
            a = self.calls[c][0]
            name = next(fresh)
            for j in range(a, b + 1):
                for v in _step(cuts, parts, a, j):
                    out[int(w.ids[v])] = name
            if x is not None:
                place(b + 1, ("ends", x), name)
            return name

        s, t = path
        place(len(parts) - 1, ("own", t))
        state = ("finish", len(cuts) - 1, s)
        while state is not None:
            if state[0] == "finish":
                _, i, s = state
                move = self.how[i, s]
                if move[0] == "cpu":
                    _, prev, s_prev, option = move
                    out[int(w.ids[cuts[i]])] = cpu
                    place(prev + 1, option)
                    state = ("finish", prev, s_prev) if prev >= 0 else None
                    continue
                _, c, b, x = move
                if x is not None:
                    out[int(w.ids[cuts[i]])] = cpu
                state = ("call", c, call_of(c, b, x))
            else:
                _, c, name = state
                origin = self.calls[c][4]
                if origin[0] == "after":
                    _, prev, s_prev, option = origin
                    place(prev + 1, option, name)
                    state = ("finish", prev, s_prev) if prev >= 0 else None
                else:
                    _, c_prev, b, x = origin
                    state = ("call", c_prev, call_of(c_prev, b, x))
        return out


def _step(cuts: list[int], parts: list[Block], a: int, b: int) -> list[int]:
    """The nodes a call from cut vertex a takes in when it reaches cut vertex b."""
    return ([] if b == a else parts[b].inside) + [cuts[b]]


def _call_runs(w: Workload, cuts: list[int], parts: list[Block]) -> list[list[tuple]]:
    """runs[a]: (b, incoming, compute, outgoing, memory) for every call holding cut vertices
    a..b and the blocks between that fits one accelerator (its incoming and outgoing
    tensors' time, its compute).  The call grows in topological order, so each node's
    tensors are counted once."""
    memory = float(w.accelerator_memory) * (1 + 1e-12)
    cost, preds, succs = w.out_cost, w.predecessors, w.successors
    out: list[list[tuple]] = []
    inside = np.zeros(w.n, dtype=bool)
    sent = np.zeros(w.n, dtype=bool)
    waiting = np.zeros(w.n, dtype=np.int64)  # successors of a member not yet inside
    for a in range(len(cuts)):
        inside[:] = False
        sent[:] = False
        incoming = outgoing = compute = used = 0.0
        found = []
        for b in range(a, len(cuts)):
            add = _step(cuts, parts, a, b)
            if not all(w.supported[v] for v in add):
                break
            used += float(w.size[add].sum())
            if used > memory:
                break
            for v in add:
                inside[v] = True
                compute += float(w.acc_latency[v])
                for u in preds[v]:
                    if inside[u]:
                        waiting[u] -= 1
                        if waiting[u] == 0:
                            outgoing -= cost[u]
                    elif not sent[u]:
                        sent[u] = True
                        incoming += cost[u]
                waiting[v] = len(succs[v])
                if waiting[v]:
                    outgoing += cost[v]
            found.append((b, incoming, compute, max(outgoing, 0.0), used))
        out.append(found)
    return out
