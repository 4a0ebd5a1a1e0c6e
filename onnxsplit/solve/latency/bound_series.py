"""A latency lower bound composed along the graph's cut vertices (the series bound).

Every path passes each cut vertex (:mod:`.blocks`), so a plan's latency splits at them.
A DP over the cut vertices, with the calls used so far and an open call's memory, is
exact given each block's least time with its ends on the CPUs or in calls reaching into
it (cases CC, CO, OC, OO): the latency program on the block alone
(:func:`.blocks.block_workload`, its ends pinned), solved by CP-SAT (:mod:`.cpsat`).
The tables are filled lazily, only the entries on the DP's best path, and a room is
walked down one Pareto point at a time.  It sees a block's parallel branches competing
for the accelerators, which the path bound cannot.

Write-up: docs/latency.md (Series bound).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...workload import Workload
from .. import anytime, evaluate
from . import blocks as series
from .bounds import latency_lower_bound, longest_paths
from .cpsat import solve_latency_cp

SOLVE_SECONDS = 30.0  # at most, for one entry's program
WORKERS = 2  # entries solved at once (each in a CP-SAT worker process of its own)
GAP = 1e-4  # relative: an entry's program stops this close to its optimum (its proven bound counts)
STEP = 1e-5  # of an accelerator's memory: a walk's next room lies this far below the last call's
# memory (more than the solver's feasibility tolerance, which would let the same call fit again)
KINDS = ("CC", "CO", "OC", "OO")
INF = float("inf")


def series_lower_bound(w: Workload, deadline: float, target: float = INF,
                       blocks: list[series.Block] | None = None) -> float | None:
    """A lower bound on every one-call-per-accelerator plan's latency, improved until
    ``deadline`` (a time.perf_counter() value) or until it reaches ``target``; None where
    the graph does not split at cut vertices into small blocks (``blocks``: what
    :func:`block_parts` returned, if the caller has it)."""
    blocks = blocks or block_parts(w)
    if blocks is None:
        return None
    tables = []
    for b in blocks:
        if time.perf_counter() > deadline:
            return None
        tables.append(_Tables(w, b))
    best = None
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        while True:
            value, todo = _best_path(w, blocks, tables, deadline)
            if value is None:  # the deadline passed inside the DP: the last path's value stands
                return best
            best = value
            anytime.prove(value)  # every entry is a bound, solved or not: so is the path
            if not todo or value >= target or time.perf_counter() > deadline - 0.5:
                return value
            # one entry per block on a path: the solves share no table
            list(pool.map(lambda entry: tables[entry[0]].solve(entry[1], deadline), todo))


def block_parts(w: Workload) -> list[series.Block] | None:
    """The blocks between the cut vertices, where every block is small, every edge stays
    inside a block with its ends, and every node of a block descends from its first end
    and leads to its last: what the composition assumes; else None (also where the
    blocks' ends cannot be pinned: :func:`.blocks.pinnable`)."""
    if w.n == 0 or w.num_cpus == 0 or w.num_accelerators == 0 or not series.pinnable(w):
        return None
    cuts = series.cut_vertices(w)
    if len(cuts) < 2:
        return None
    blocks = series.blocks(w, cuts)
    where = np.full(w.n, -1, dtype=np.int64)
    for j, b in enumerate(blocks):
        if len(b.inside) > series.BLOCK_NODES:
            return None
        where[b.inside] = j
    for u, v in zip(w.edge_src.tolist(), w.edge_dst.tolist()):
        ju, jv = where[u], where[v]
        home = jv if jv >= 0 else ju
        if home < 0:  # two cut vertices: one after the other
            home = next(j for j, b in enumerate(blocks) if b.first == u)
        b = blocks[home]
        if not all(x in (b.first, b.last) or where[x] == home for x in (u, v)):
            return None
    for b in blocks:
        inside = set(b.inside)
        for end, nbrs in ((b.first, w.successors), (b.last, w.predecessors)):
            if end is not None and _reached(end, nbrs, inside) != inside:
                return None
    return blocks


def series_parts(w: Workload) -> tuple[Workload, list[series.Block]] | None:
    """A workload whose bound is ``w``'s, and its blocks: ``w`` itself where its own blocks
    serve, else its least relaxation (:func:`relaxed`, the longest span) whose blocks do;
    None where none does."""
    own = block_parts(w)
    if own is not None:
        return w, own
    depth = longest_paths(w, np.ones(w.n))[0]
    for span in FANOUT_SPANS:
        r, _ = relaxed(w, span, depth)
        parts = block_parts(r)
        if parts is not None:
            return r, parts
    return None


# levels an edge of a fanning-out node may span in a relaxation, longest first: the
# fewer edges dropped, the less the bound loses and the fewer blocks it composes
FANOUT_SPANS = (256, 128, 64, 32, 16, 8, 4, 2)


def relaxed(w: Workload, span: int, depth: np.ndarray | None = None) -> tuple[Workload, float]:
    """``w`` without the edges of a fanning-out node that reach more than ``span`` levels
    ahead (a decoder's mask and rotary tables feed every layer: no node is on every path),
    and without the nodes left feeding nothing (the mask's own nodes); with the work lost.

    Every plan of ``w``, restricted to what is left, is a plan of the relaxation with no
    larger latency: a call waits on fewer senders, receives and sends fewer tensors (each
    at its cost c(u)), runs fewer nodes, holds less memory; no path is added, so a call
    stays convex.  So a bound on it bounds ``w``.  ``depth``: each node's level (the
    longest path into it), where the caller has it."""
    if depth is None:
        depth = longest_paths(w, np.ones(w.n))[0]
    index, fan = w.index, np.array([len(s) for s in w.successors])
    kept = [e for e in w.edges
            if fan[index[e.source]] < 2 or depth[index[e.dest]] - depth[index[e.source]] <= span]
    left = np.zeros(w.n, dtype=np.int64)  # edges out of each node left: prune what feeds nothing
    feeds: dict[int, list[int]] = {}
    for e in kept:
        left[index[e.source]] += 1
        feeds.setdefault(index[e.dest], []).append(index[e.source])
    keep = np.ones(w.n, dtype=bool)
    stack = [v for v in range(w.n) if left[v] == 0 and fan[v] > 0]
    while stack:
        v = stack.pop()
        keep[v] = False
        for u in feeds.get(v, ()):
            left[u] -= 1
            if left[u] == 0 and keep[u]:
                stack.append(u)
    lost = float(w.cpu_latency[~keep].sum() + w.acc_latency[~keep].sum())
    return w.replace(edges=tuple(kept)).restricted(keep), lost


def _reached(root: int, nbrs, inside: set[int]) -> set[int]:
    seen, stack = set(), [root]
    while stack:
        for x in nbrs[stack.pop()]:
            if x in inside and x not in seen:
                seen.add(x)
                stack.append(x)
    return seen


class _Tables:
    """One block's four cases, filled lazily.  ``cc[t]`` is [value, solved]; a walk is a
    list of [value, floor, solved]: for CO and OO, a call holding at least ``floor`` of the
    block costs at least ``value``; for OC, a call ending here with more than ``floor`` of
    room left costs at least ``value``.  The last step of a walk covers everything below."""

    def __init__(self, w: Workload, block: series.Block):
        self.w, self.block = w, block
        self.memory = float(w.accelerator_memory)
        self.size = float(w.size[block.inside].sum())
        self.most = min(w.num_accelerators, len(block.inside))
        self.inside_ids = {int(w.ids[v]) for v in block.inside}
        kinds = [k for k in KINDS if (block.first is not None or k[0] == "C")
                 and (block.last is not None or k[1] == "C")]
        start = {k: self._cheap(k) for k in kinds}
        self.cc = {t: [start["CC"], False] for t in range(self.most + 1)}
        self.cc[0] = [self._all_cpu(), True]
        self.start = start
        self.known: dict[str, list] = {}  # kind -> [(latency, plan)] found by its programs
        # OO's walks also depend on the room the first end's call has left: keyed by it
        self.walks = {k: {t: ({} if k == "OO" else [[start[k], 0.0, False]]) for t in range(self.most + 1)}
                      for k in kinds if k != "CC"}

    def steps(self, kind: str, t: int, left: float | None = None) -> list:
        """The walk of ``kind`` with t calls of the block's own (OO: and ``left`` room in
        the first end's call), made on first use."""
        walks = self.walks[kind][t]
        if kind != "OO":
            return walks
        return walks.setdefault(left, [[self.start["OO"], 0.0, False]])

    def sub(self, kind: str, t: int, room: float | None, left: float | None = None):
        """The block's workload for ``kind`` with t calls of its own (and its pinned calls)."""
        b = self.block
        if kind == "CC":
            return series.block_workload(self.w, b, t)
        if kind == "CO":
            return series.block_workload(self.w, b, t + 1, None, room)
        if kind == "OC":
            return series.block_workload(self.w, b, t + 1, room, None)
        # two calls, rooms too small for both ends in one (that would be one call through):
        # with room below memory * (1 - 1e-8) the first end keeps room for the whole block
        first = self.memory if left is None else left
        return series.block_workload(self.w, b, t + 2, min(first, self.memory + self.size - room - 1e-9 * self.memory),
                                     room)

    def _cheap(self, kind: str) -> float:
        """A bound for every t and room: the block's path bound with every call allowed."""
        k = self.w.num_accelerators + 2
        room = self.top(kind) if kind != "CC" else None
        return latency_lower_bound(self.sub(kind, k, room), 1, seconds=1.0)

    def _all_cpu(self) -> float:
        sub = self.sub("CC", 0, None)
        return evaluate.latency(sub, {int(i): sub.devices[0].name for i in sub.ids}).value

    def _warm_start(self, sub: Workload, kind: str) -> dict[int, str]:
        """The best plan found so far for this case that the sub-workload allows (its rooms
        and calls), else :meth:`_pinned_alone`: a tight horizon (the best latency known)
        is what makes these programs quick."""
        for _, plan in sorted(self.known.get(kind, []), key=lambda x: x[0]):
            if all(d in sub.device_index for d in plan.values()) and not evaluate.check(sub, plan):
                return plan
        return self._pinned_alone(sub, kind)

    def _lift(self, kind: str, t: int, left: float | None, room: float, value: float) -> None:
        """Fewer calls of the block's own cost no less: walks with fewer calls are at least
        ``value`` at every room up to ``room``."""
        for u in range(t):
            steps = self.steps(kind, u, left)
            for i, step in enumerate(steps):
                if not step[2] and (self.top(kind) if i == 0 else steps[i - 1][1]) <= room:
                    step[0] = max(step[0], value)

    def _pinned_alone(self, sub: Workload, kind: str) -> dict[int, str]:
        """The plan every room allows: each pinned end alone in its call, the rest on the
        CPUs (it sets the horizon far below the pinned ends' CPU time)."""
        names = [d.name for d in sub.devices]
        plan = {int(i): names[sub.num_accelerators] for i in sub.ids}
        calls = iter(names[:sub.num_accelerators])
        for end, pinned in ((self.block.first, kind[0] == "O"), (self.block.last, kind[1] == "O")):
            if pinned:
                plan[int(self.w.ids[end])] = next(calls)
        return plan

    def top(self, kind: str) -> float:
        """The first room a walk tries: the whole block (OO: a hair under one accelerator's
        memory, so that the first end's call keeps room for the whole block)."""
        return min(self.size, self.memory * (1 - 1e-8)) if kind == "OO" else self.size

    def at(self, t: int) -> int:
        return min(t, self.most)

    def solve(self, key: tuple, deadline: float) -> None:
        """Solve one entry (('CC', t), (kind, t, step) or ('OO', t, left, step)); it then
        counts as solved."""
        kind, t = key[0], key[1]
        left = key[2] if kind == "OO" else None
        if kind == "CC":
            room = None
        else:
            steps = self.steps(kind, t, left)
            k = key[-1]
            room = self.top(kind) if k == 0 else steps[k - 1][1]
        sub = self.sub(kind, t, room, left)
        seconds = max(0.5, min(SOLVE_SECONDS, deadline - time.perf_counter()))
        plan = solve_latency_cp(sub, time_limit=seconds, gap=GAP, warm_start=self._warm_start(sub, kind))
        if plan.value is not None:
            self.known.setdefault(kind, []).append((plan.value, plan.assignment))
        lb = plan.lower_bound if plan.lower_bound is not None else 0.0
        if kind == "CC":
            entry = self.cc[t]
            entry[0], entry[1] = max(entry[0], lb), True
            for u in range(t):  # fewer calls cost no less
                self.cc[u][0] = max(self.cc[u][0], entry[0])
            return
        old = steps[k][0]
        del steps[k:]
        if lb >= series.pinned_cost(self.w, self.block, sub.num_accelerators) - 1e-6:
            return  # no plan keeps the pinned ends in calls at this room
        lb = max(lb, old)
        self._lift(kind, t, left, room, lb)
        used = None
        if plan.value is not None and plan.value <= lb * (1 + GAP) + 1e-9:  # (near) optimal: where it stands
            pin = int(self.w.ids[self.block.last if kind in ("CO", "OO") else self.block.first])
            call = plan.assignment.get(pin)
            used = sum(float(self.w.size[self.w.index[i]]) for i, d in plan.assignment.items()
                       if d == call and i in self.inside_ids)
        if used is None or used <= 0.0:
            steps.append([lb, 0.0, True])
            return
        floor = min(used, room) - STEP * self.memory
        steps.append([lb, floor, True])
        steps.append([lb, 0.0, False])


def _room_step(steps: list, room: float):
    """(value, index) of the OC step that covers ``room``; (inf, None) where none does."""
    for k, (value, floor, _) in enumerate(steps):
        if room > floor:
            return value, k
    return INF, None


def _best_path(w: Workload, blocks: list, tables: list[_Tables], deadline: float = INF):
    """(the DP's least latency, the unsolved entries on its best path as (block, key));
    (None, []) once ``deadline`` passes (thousands of blocks take a while)."""
    k = w.num_accelerators
    memory = float(w.accelerator_memory) * (1 + 1e-12)
    acc, cpu, size, sup = w.acc_latency, w.cpu_latency, w.size, w.supported
    # a state: ('P', calls) -- the cut vertex on the CPUs -- or ('Q', calls, memory) -- in
    # an open call; its value: the finish time, or the open call's start + work so far
    states = {("P", 0): (0.0, None)}
    layers = []
    for b, tab in zip(blocks, tables):
        if time.perf_counter() > deadline:
            return None, []
        c = b.last
        nxt: dict = {}

        def put(key, value, parent):
            if value < nxt.get(key, (INF,))[0]:
                nxt[key] = (value, parent)

        closed = ("P",) if c is not None else ("END",)  # the last end on the CPUs (or none)
        end_cpu = cpu[c] if c is not None else 0.0
        through = bool(sup[b.inside].all()) if c is not None else False
        inside_acc, inside_size = float(acc[b.inside].sum()), float(size[b.inside].sum())
        for key, (value, _) in states.items():
            s = key[1]
            for t in range(k + 1 - s):
                tt = tab.at(t)
                if key[0] == "P":
                    cc, solved = tab.cc[tt]
                    put(closed + (s + t,) * (c is not None), value + cc + end_cpu,
                        (key, None if solved else ("CC", tt)))
                    opened = tab.walks["CO"][tt] if c is not None and sup[c] and s + t < k else []
                else:
                    oc, i = _room_step(tab.walks["OC"][tt], memory - key[2])
                    if i is not None:
                        solved = tab.walks["OC"][tt][i][2]
                        put(closed + (s + t,) * (c is not None), value + oc + end_cpu,
                            (key, None if solved else ("OC", tt, i)))
                    left = tab.memory - key[2]
                    opened = tab.steps("OO", tt, left) if c is not None and sup[c] and s + t < k else []
                entry = ("CO", tt) if key[0] == "P" else ("OO", tt, left)
                for i, (v, floor, solved) in enumerate(opened):
                    if floor + size[c] <= memory:
                        put(("Q", s + t + 1, floor + size[c]), value + v + acc[c],
                            (key, None if solved else entry + (i,)))
            if key[0] == "Q" and through and sup[c] and key[2] + inside_size + size[c] <= memory:
                put(("Q", s, key[2] + inside_size + size[c]), value + inside_acc + acc[c], (key, None))
        states = _pareto(nxt)
        layers.append(states)
    if ("END",) not in states:
        return INF, []
    value, todo = states[("END",)][0], []
    key = ("END",)
    for j in range(len(layers) - 1, -1, -1):
        parent, entry = layers[j][key][1]
        if entry is not None:
            todo.append((j, entry))
        key = parent
    return value, todo


def _pareto(states: dict) -> dict:
    """The states worth keeping: of the open calls with the same calls used, those that
    no other beats on both value and memory."""
    out = {key: v for key, v in states.items() if key[0] != "Q"}
    open_calls = sorted((key for key in states if key[0] == "Q"), key=lambda q: (q[1], states[q][0], q[2]))
    last = (None, INF)
    for key in open_calls:
        if key[1] != last[0]:
            last = (key[1], INF)
        if key[2] < last[1]:
            out[key] = states[key]
            last = (key[1], key[2])
    return out
