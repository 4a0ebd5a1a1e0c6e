"""The model's own structure, collapsed to a screenful of groups.

A report that draws every operator is unreadable past a few hundred of them, and today's
exports have thousands.  People think of a model as its modules (``layers.3``,
``self_attn``), so nodes are grouped by the name scopes exporters write
(``/model/layers.3/self_attn/q_proj/MatMul``, or dotted ones: ``layer12.attn.q``); where
names carry no scope (torch dynamo's ``node_MatMul_12``), by the blocks the graph repeats
(the operator types of one stretch of the order recurring, as layers do), and failing
that by stretches of the topological order.  The tree is opened level by level, the
largest groups first and repeated siblings together (every ``layers.N`` or none), while it
stays within ``most`` rows; a run of repeated siblings too long for that is binned
(``layers.0 … layers.5``), its members kept as the bin's children.  Blocks that are alike
but not equal (a ResNet's, where they downsample) are cut after the operator type that
recurs nearly evenly (its residual Add).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

MOST_GROUPS = 36  # rows at the top level: one screen
_MIN_BLOCK = 4  # a repeated block has at least this many operators


@dataclass
class Group:
    """Nodes (indices, in order) under one name; ``children`` is the next level down."""
    name: str
    path: str
    nodes: list[int]
    children: list["Group"] = field(default_factory=list)
    first: int = 0  # position of its first node in the order
    own: bool = False  # a module's own operators, beside its submodules

    @property
    def pattern(self) -> str:
        """The path with its numbers blanked: repeated siblings (``layers.N``) share it."""
        return re.sub(r"\d+", "#", self.path)


def _scope_separator(names: Sequence[str]) -> str | None:
    """'/' or '.' where most names carry a scope that way, else None."""
    for sep in ("/", "."):
        scoped = sum(1 for n in names if len([p for p in n.split(sep) if p]) > 1)
        if names and scoped >= 0.5 * len(names):
            return sep
    return None


class _Scope:
    def __init__(self, name: str, path: str):
        self.name, self.path = name, path
        self.children: dict[str, _Scope] = {}
        self.direct: list[int] = []
        self.nodes: list[int] = []


def _scope_tree(names: Sequence[str], order: Sequence[int], sep: str) -> _Scope:
    root = _Scope("", "")
    for v in order:
        parts = [p for p in names[v].split(sep) if p][:-1]
        at = root
        at.nodes.append(v)
        for p in parts:
            if p not in at.children:
                at.children[p] = _Scope(p, f"{at.path}{sep}{p}".lstrip(sep))
            at = at.children[p]
            at.nodes.append(v)
        at.direct.append(v)
    return root


def _from_scope(s: _Scope, pos: Sequence[int]) -> Group:
    kids = [_from_scope(c, pos) for c in s.children.values()]
    if kids and s.direct:  # a module's own operators beside its submodules
        own = f"{s.name} (own ops)" if s.name else "(no scope)"
        kids.append(Group(own, f"{s.path} (own ops)" if s.path else own, list(s.direct),
                          first=pos[s.direct[0]], own=True))
    kids.sort(key=lambda g: g.first)
    return Group(s.name, s.path, list(s.nodes), kids, pos[s.nodes[0]] if s.nodes else 0)


def _bin(rows: list[Group], most: int) -> list[Group]:
    """Runs of repeated siblings merged into bins of consecutive members, as few per bin
    as fit ``most`` rows (rows unchanged where no bin size fits)."""
    runs: list[list[Group]] = []
    for g in rows:
        if runs and runs[-1][0].pattern == g.pattern:
            runs[-1].append(g)
        else:
            runs.append([g])
    longest = max(len(r) for r in runs)
    for k in range(2, longest + 1):
        if sum(math.ceil(len(r) / k) for r in runs) <= most:
            break
    else:
        return rows
    out = []
    for run in runs:
        for i in range(0, len(run), k):
            chunk = run[i:i + k]
            if len(chunk) == 1:
                out.append(chunk[0])
                continue
            name = f"{chunk[0].name} … {chunk[-1].name}"
            nodes = sorted((v for g in chunk for v in g.nodes), key=lambda v: v)
            out.append(Group(name, f"{chunk[0].path} … {chunk[-1].path}", nodes, chunk, chunk[0].first))
    return out


def collapse(top: list[Group], most: int = MOST_GROUPS) -> list[Group]:
    """Open groups, the largest family of repeated siblings first, while the rows stay
    within ``most``; bin where a level alone is too long."""
    rows = sorted(top, key=lambda g: g.first)
    if len(rows) > most:
        return _bin(rows, most)
    while True:
        for g in sorted((r for r in rows if r.children), key=lambda r: -len(r.nodes)):
            family = {id(r) for r in rows if r.children and r.pattern == g.pattern}
            opened = sorted([c for r in rows for c in (_named(r, len(family) > 1) if id(r) in family else [r])],
                            key=lambda r: r.first)
            if len(opened) > most:
                opened = _bin(opened, most)
            if len(rows) < len(opened) <= most:
                rows = opened
                break
        else:
            return rows


def _named(g: Group, qualified: bool) -> list[Group]:
    """``g``'s children as rows: named under ``g`` where its repeated siblings open too
    (``layers.3/self_attn``: many rows would read ``self_attn`` alike)."""
    if not qualified:
        return g.children
    return [Group(f"{g.name} (own ops)" if c.own else f"{g.name}/{c.name}", c.path, c.nodes, c.children,
                  c.first, c.own) for c in g.children]


def _graph_order(n: int, edges: Sequence[tuple[int, int]], topological: Sequence[int]) -> list[int]:
    """The nodes in the order the model lists them where that is topological (exporters
    write a model module by module), else ``topological``."""
    if all(a < b for a, b in edges):
        return list(range(n))
    return list(topological)


def repeated_blocks(kinds: Sequence[str], min_block: int = _MIN_BLOCK) -> tuple[int, int, int] | None:
    """(start, period, count) of the longest stretch of ``kinds`` (operator types in
    order) that repeats one block, found from the spacing of an operator type that recurs
    evenly; None where nothing repeats at least twice."""
    n = len(kinds)
    at: dict[str, list[int]] = {}
    for i, k in enumerate(kinds):
        at.setdefault(k, []).append(i)
    periods = set()
    for where in at.values():
        gaps = {b - a for a, b in zip(where, where[1:])}
        if len(where) >= 2 and len(gaps) == 1 and min(gaps) >= min_block:
            periods.add(gaps.pop())
    best = None
    for p in sorted(periods):
        run = 0
        for i in range(n - p + 1):  # (i == n - p closes the last run)
            if i < n - p and kinds[i] == kinds[i + p]:
                run += 1
                continue
            count = (run + p) // p
            if count >= 2 and (best is None or count * p > best[1] * best[2]):
                best = (i - run, p, count)
            run = 0
    return best


def _crossing(order: list[int], edges: Sequence[tuple[int, int]]) -> list[int]:
    """For each position b of the order, the edges from before b to b or after: few at a
    boundary between layers (the residual stream), many inside one."""
    pos = {v: i for i, v in enumerate(order)}
    diff = [0] * (len(order) + 1)
    for a, b in edges:
        if pos[a] < pos[b]:
            diff[pos[a] + 1] += 1
            diff[pos[b] + 1] -= 1
    out, run = [], 0
    for d in diff[:-1]:
        run += d
        out.append(run)
    return out


def _alike(a: Sequence[str], b: Sequence[str]) -> bool:
    """Two stretches hold nearly the same operators (a first layer that also makes the mask)."""
    shared = sum((Counter(a) & Counter(b)).values())
    return shared >= 0.8 * max(len(a), len(b))


def _extended(seq: Sequence[str], start: int, count: int, p: int) -> tuple[int, int]:
    """(start, count) of blocks of ``p`` grown by the stretches nearly alike on each side."""
    n = len(seq)
    while count and start - p >= 0 and _alike(seq[start - p:start], seq[start:start + p]):
        start, count = start - p, count + 1
    while count and start + (count + 1) * p <= n and _alike(seq[start + count * p:start + (count + 1) * p],
                                                             seq[start + (count - 1) * p:start + count * p]):
        count += 1
    return start, count


def _blocks(order: list[int], kinds: Sequence[str], edges: Sequence[tuple[int, int]]) -> list[Group] | None:
    """The blocks the order repeats (:func:`repeated_blocks`), their boundaries moved to
    where the fewest edges cross (between layers, not inside one), and stretches nearly
    alike on either side taken in (a first layer that differs a little)."""
    seq = [kinds[v] for v in order]
    found = repeated_blocks(seq)
    if found is None or found[1] * found[2] < 0.3 * len(order):
        return None
    start, p, count = found
    cross = _crossing(order, edges)
    n = len(order)
    cost = {f: sum(cross[b] for b in range(start + f, min(start + f + count * p, n), p)) for f in range(p)}
    least = min(cost.values())
    # (between equally clean phases, a layer's two residual halves say, the one whose
    # blocks then cover the most)
    start, count = max((_extended(seq, start + f, min(count, (n - start - f) // p), p)
                        for f in range(p) if cost[f] == least), key=lambda sc: sc[1])
    out = []
    if start:
        out.append(Group("before the blocks", "before the blocks", order[:start], first=0))
    for b in range(count):
        a = start + b * p
        out.append(Group(f"block {b + 1}", f"block {b + 1}", order[a:a + p], first=a))
    end = start + count * p
    if end < n:
        out.append(Group("after the blocks", "after the blocks", order[end:], first=end))
    return out


def _stretches_to(order: list[int], kinds: Sequence[str], most: int) -> list[Group] | None:
    """The order cut after each occurrence of the operator type that recurs at nearly even
    spacing (residual Adds in a ResNet, whose blocks differ where they downsample): the
    most blocks within ``most`` rows that cover a good share of the graph; None where none does."""
    at: dict[str, list[int]] = {}
    for i, v in enumerate(order):
        at.setdefault(kinds[v], []).append(i)
    best = None
    for kind, where in at.items():
        gaps = [b - a for a, b in zip(where, where[1:])]
        if not 4 <= len(where) <= most - 1 or min(gaps) < _MIN_BLOCK or max(gaps) > 2 * min(gaps):
            continue
        if (where[-1] - where[0]) >= 0.3 * len(order) and (best is None or len(where) > len(best[1])):
            best = (kind, where)
    if best is None:
        return None
    kind, where = best
    out, start = [], 0
    for b, i in enumerate(where):
        out.append(Group(f"to {kind} {b + 1}", f"to {kind} {b + 1}", order[start:i + 1], first=start))
        start = i + 1
    if start < len(order):
        out.append(Group(f"after {kind} {len(where)}", f"after {kind} {len(where)}", order[start:], first=start))
    return out


def _chunks(order: list[int], most: int) -> list[Group]:
    size = max(math.ceil(len(order) / min(most, 24)), 20)
    return [Group(f"ops {a + 1}–{min(a + size, len(order))}", f"ops {a + 1}–{min(a + size, len(order))}",
                  order[a:a + size], first=a) for a in range(0, len(order), size)]


def group_nodes(names: Sequence[str], kinds: Sequence[str], edges: Sequence[tuple[int, int]],
                topological: Sequence[int], most: int = MOST_GROUPS) -> tuple[str, list[Group]]:
    """(how the nodes were grouped, the top-level groups): nodes are indices into
    ``names`` and ``kinds`` (operator types); ``edges`` (producer, consumer) and
    ``topological`` (an order of all nodes) say the graph's order."""
    order = _graph_order(len(names), edges, topological)
    pos = [0] * len(names)
    for i, v in enumerate(order):
        pos[v] = i
    sep = _scope_separator(names)
    if sep is not None:
        root = _from_scope(_scope_tree(names, order, sep), pos)
        rows = collapse(root.children or [root], most)
        if len(rows) > 1:
            return f"name scopes ('{sep}')", rows
    blocks = _blocks(order, kinds, edges)
    if blocks is not None:
        return "repeated blocks (operator types recurring in the graph's order)", collapse(blocks, most)
    blocks = _stretches_to(order, kinds, most)
    if blocks is not None:
        return "blocks ending at an operator type that recurs evenly", blocks
    return "stretches of the graph's order (the names carry no scopes)", _chunks(order, most)
