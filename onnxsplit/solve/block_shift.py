"""The shift from one repeated block to the next: a partial map of the colour classes.

A transformer or a ResNet repeats one block, so most classes have a twin one block on,
with the same work, memory and support and tensors of the same weights to the twins of
their neighbours.  The map found here sends each class it can to that twin; the classes
it leaves out (the embedding, the head, the first and last block's edges) map nowhere.
Following it from a class gives the class's *chain*: its copies in every block.

Why: the set-covering certificate (:mod:`.throughput.bound_setcover`) may price the
classes any way it likes, so it can give every class on a chain the same price.  Its LP
then has a row per chain instead of a row per class, and converges in a few dozen rounds
where the full one takes hundreds (op-level BERT-24 training at 650: 11 s against 877 s).

Nothing here needs to be exact: a class sent to the wrong twin only makes a chain whose
prices are tied for no reason, which weakens the certificate but never makes it wrong.
The map is found by colour refinement (Weisfeiler-Lehman on the class hypergraph, a few
rounds, so that blocks far from the ends look alike) and then grown from one pair of
same-coloured classes along tensors of the same colour (or, near the ends, of the same
colour in an earlier round), without passing through a tensor that both ends share (a
weight every layer reads would map each class to itself).
"""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np

from ..workload import transposed

ROUNDS = 3  # of colour refinement: enough to tell a block's classes apart, few enough that
# a class's colour does not see how far it lies from the graph's ends
ANCHORS = 5  # colours tried as the first pair (the most frequent), the largest map kept
DIGITS = 9  # significant digits compared: summed in another order, twins differ in the last ones


def block_shift(features: np.ndarray, source: np.ndarray, ptr: np.ndarray, members: np.ndarray,
                weight: np.ndarray) -> np.ndarray:
    """class -> its twin one block on (-1 where none): ``features`` (n x f) must match,
    tensors as in :meth:`..classes.Classes.hyper_arrays` (members hold the source)."""
    n = len(features)
    shift = np.full(n, -1, dtype=np.int64)
    if n < 2:
        return shift
    c_ptr, c_hyper = transposed(ptr, members, n)  # class -> its tensors
    colours, tensor_colours = _refine(features, source, ptr, members, weight, c_ptr, c_hyper)
    best = 0
    for group in _anchor_groups(colours):
        middle = len(group) // 2 - 1
        grown = _grow(group[middle], group[middle + 1], colours, tensor_colours, source, ptr, members, c_ptr, c_hyper)
        if (grown >= 0).sum() > best:
            best, shift = int((grown >= 0).sum()), grown
    return shift


def _anchor_groups(colours) -> list[list[int]]:
    """The largest groups of classes alike, at the finest round where some are (a short
    graph's ends reach its middle in a few rounds), at most ANCHORS."""
    for colour in reversed(colours):
        groups: dict[int, list[int]] = defaultdict(list)
        for g, c in enumerate(colour.tolist()):
            groups[c].append(g)
        alike = sorted((group for group in groups.values() if len(group) >= 2), key=len, reverse=True)
        if alike:
            return alike[:ANCHORS]
    return []


def chains(shift: np.ndarray) -> np.ndarray:
    """class -> its chain's index (classes ``shift`` leaves out are chains of one)."""
    n = len(shift)
    back = np.full(n, -1, dtype=np.int64)
    back[shift[shift >= 0]] = np.flatnonzero(shift >= 0)
    label = np.full(n, -1, dtype=np.int64)
    count = 0
    for g in range(n):
        if label[g] >= 0:
            continue
        first = g
        while back[first] >= 0 and back[first] != g:  # (a cycle is walked once)
            first = back[first]
        x = first
        while x >= 0 and label[x] < 0:
            label[x] = count
            x = shift[x]
        count += 1
    return label


def _refine(features, source, ptr, members, weight, c_ptr, c_hyper):
    """(class colours, tensor colours) after each round of refinement, the first by
    features (and weight) alone, the last the finest."""
    def key(row):
        return tuple(float(f"{float(v):.{DIGITS}g}") for v in row)

    colours = [_relabel([key(row) for row in features])]
    weights = [key([wt]) for wt in weight]
    tensors = [_relabel(weights)]
    for _ in range(ROUNDS):
        colour = colours[-1]
        tensor = _relabel([(weights[h], int(colour[source[h]]), tuple(sorted(colour[members[ptr[h]:ptr[h + 1]]].tolist())))
                           for h in range(len(weight))])
        colours.append(_relabel([(int(colour[g]), tuple(sorted((int(source[h] == g), int(tensor[h]))
                                                               for h in c_hyper[c_ptr[g]:c_ptr[g + 1]])))
                                 for g in range(len(features))]))
        tensors.append(tensor)
    return colours, tensors


def _relabel(keys: list) -> np.ndarray:
    ids: dict = {}
    return np.array([ids.setdefault(k, len(ids)) for k in keys], dtype=np.int64)


def _grow(a: int, b: int, colours, tensor_colours, source, ptr, members, c_ptr, c_hyper) -> np.ndarray:
    """The map grown from a -> b: a mapped class's tensors go to its image's tensors of the
    same role and colour, their members to members of the same colour, each paired at the
    finest round of refinement where both are alike (the classes near the graph's ends
    differ in the later rounds only), ties in index order."""
    n = len(colours[0])
    shift = np.full(n, -1, dtype=np.int64)
    taken = np.zeros(n, dtype=np.bool_)
    shift[a], taken[b] = b, True
    queue = deque([a])
    while queue:
        u = queue.popleft()
        v = int(shift[u])
        mine = [(int(source[h] == u), int(h)) for h in c_hyper[c_ptr[u]:c_ptr[u + 1]]]
        theirs = [(int(source[h] == v), int(h)) for h in c_hyper[c_ptr[v]:c_ptr[v + 1]]]
        for (_, h1), (_, h2) in _pairs(mine, theirs, lambda item, r: (item[0], int(tensor_colours[r][item[1]]))):
            if h1 == h2:
                continue
            for x, y in _pairs(members[ptr[h1]:ptr[h1 + 1]].tolist(), members[ptr[h2]:ptr[h2 + 1]].tolist(),
                               lambda g, r: int(colours[r][g])):
                if shift[x] < 0 and not taken[y] and x != y:
                    shift[x], taken[y] = y, True
                    queue.append(x)
    return shift


def _pairs(mine: list, theirs: list, colour) -> list[tuple]:
    """Items of ``mine`` paired with items of ``theirs`` of equal ``colour(item, round)``,
    the finest round first, then the coarser ones for what is left."""
    out = []
    mine, theirs = sorted(mine), sorted(theirs)
    for r in range(ROUNDS, -1, -1):
        by: dict = defaultdict(list)
        for j, y in enumerate(theirs):
            by[colour(y, r)].append(j)
        left, used = [], set()
        for x in mine:
            same = by.get(colour(x, r))
            if same:
                j = same.pop(0)
                out.append((x, theirs[j]))
                used.add(j)
            else:
                left.append(x)
        mine, theirs = left, [y for j, y in enumerate(theirs) if j not in used]
        if not mine or not theirs:
            break
    return out
