"""Brute-force reference implementations for tiny workloads (independent of onnxsplit.solve).

Everything here works on the paper's JSON dict directly and never imports onnxsplit, so
it is an independent judge of ``onnxsplit.solve.evaluate`` and ``onnxsplit.solve.throughput.dp``.

* :func:`max_load` and :func:`latency` -- the two objectives, straight from their
  definitions.
* :func:`respects_constraints` -- memory, accelerator support, colour classes.
* :func:`is_chain_of_ideals` -- is there an order of the used parts such that every
  prefix union (restricted to forward nodes, plus one stand-in per orphan backward class)
  is predecessor-closed?  Found by a depth-first search over orders of the parts.
* :func:`is_convex` -- no path (within the forward graph, then within the backward
  graph) leaves a part and re-enters it.
* :func:`class_assignments` -- every assignment of colour classes to devices that meets
  memory and support, up to renaming identical devices (accelerators among themselves,
  CPU cores among themselves): all objectives and constraints are symmetric under that.
* :func:`brute_min_max_load` -- the minimum max-load over those assignments, optionally
  only over chain-of-ideals splits.
* :func:`random_workload` -- a seeded generator of small inference/training workloads;
  :func:`random_multi_class` adds further accelerator classes, host links and peer links
  (the extended format: a transfer staged through host memory costs the sender its host
  link once per tensor and each receiving accelerator its own; a peer link between two
  accelerator classes is taken instead, each end paying it, once per receiving device).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property

TOL = 1e-12


class PieceCycle(ValueError):
    """The accelerator pieces of an assignment depend on each other in a cycle (no schedule)."""


# ---- a plain view of the JSON ---------------------------------------------------------------

@dataclass
class G:
    ids: list
    cpu: dict
    acc: dict
    size: dict
    sup: dict
    bwd: dict
    cls: dict  # node id -> hashable class key (own key when no colorClass)
    preds: dict  # id -> set of ids
    succs: dict
    cost: dict  # id -> c(id) (0 when no out-edges)
    k: int
    l: int
    M: float
    # further accelerator classes: (name, count, memory); their latencies (None: cannot run)
    more: list = None
    lat: dict = None  # class name -> {id: latency or None}
    host: dict = None  # class name -> (scale, latency)
    peer: dict = None  # (class, class) -> (scale, latency), both orders

    @cached_property
    def devices(self) -> list[str]:
        out = [f"acc{i}" for i in range(self.k)]
        for name, count, _ in self.more:
            out += [f"{name}_{i}" if name[-1].isdigit() else f"{name}{i}" for i in range(count)]
        return out + [f"cpu{i}" for i in range(self.l)]

    @cached_property
    def dclass(self) -> dict:
        """device -> its accelerator class name, None for CPU cores."""
        out = {f"acc{i}": "acc" for i in range(self.k)}
        for name, count, _ in self.more:
            for i in range(count):
                out[f"{name}_{i}" if name[-1].isdigit() else f"{name}{i}"] = name
        return {d: out.get(d) for d in self.devices}

    def memory(self, cls: str) -> float:
        return self.M if cls == "acc" else next(m for n, _, m in self.more if n == cls)

    def runs(self, v, d) -> bool:
        c = self.dclass[d]
        return True if c is None else (self.sup[v] if c == "acc" else self.lat[c][v] is not None)

    def time(self, v, d) -> float:
        c = self.dclass[d]
        # (a node its class cannot run is a support violation; its time counts as 0)
        return self.cpu[v] if c is None else (self.acc[v] if c == "acc" else self.lat[c][v] or 0.0)

    def staged(self, d, u) -> float:
        scale, lat = self.host.get(self.dclass[d], (1.0, 0.0))
        return lat + scale * self.cost[u]

    def direct(self, a, b, u):
        """Seconds of a direct copy of u from device a to device b, None: no peer link."""
        ca, cb = self.dclass[a], self.dclass[b]
        if a == b or ca is None or cb is None or (ca, cb) not in self.peer:
            return None
        scale, lat = self.peer[ca, cb]
        return lat + scale * self.cost[u]

    @cached_property
    def order(self) -> list:
        indeg = {v: len(self.preds[v]) for v in self.ids}
        ready = sorted(v for v in self.ids if indeg[v] == 0)
        out = []
        while ready:
            v = ready.pop(0)
            out.append(v)
            for w in sorted(self.succs[v]):
                indeg[w] -= 1
                if indeg[w] == 0:
                    ready.append(w)
        if len(out) != len(self.ids):
            raise ValueError("not a DAG")
        return out

    @cached_property
    def classes(self) -> dict:
        """class key -> list of member ids (in id-list order)."""
        out: dict = {}
        for v in self.ids:
            out.setdefault(self.cls[v], []).append(v)
        return out


def _flag(x) -> bool:
    return bool(x)


def view(data: dict) -> G:
    ids = [nd["id"] for nd in data["nodes"]]
    g = G(
        ids=ids,
        cpu={nd["id"]: float(nd["cpuLatency"]) for nd in data["nodes"]},
        acc={nd["id"]: float(nd["fpgaLatency"]) for nd in data["nodes"]},
        size={nd["id"]: float(nd.get("size", 0) or 0) for nd in data["nodes"]},
        sup={nd["id"]: _flag(nd["supportedOnFpga"]) for nd in data["nodes"]},
        bwd={nd["id"]: _flag(nd["isBackwardNode"]) for nd in data["nodes"]},
        cls={nd["id"]: (("c", nd["colorClass"]) if nd.get("colorClass") is not None else ("n", nd["id"]))
             for nd in data["nodes"]},
        preds={v: set() for v in ids},
        succs={v: set() for v in ids},
        cost={v: 0.0 for v in ids},
        k=int(data["maxFPGAs"]),
        l=int(data["maxCPUs"]),
        M=float(data["maxSizePerFPGA"]),
        more=[(c["name"], int(c["count"]), float(c["memory"])) for c in data.get("acceleratorClasses", [])],
        lat={c["name"]: {nd["id"]: nd.get("latencies", {}).get(c["name"]) for nd in data["nodes"]}
             for c in data.get("acceleratorClasses", [])},
        host={}, peer={},
    )
    for lk in data.get("links", []):
        a, b = lk["between"]
        val = (float(lk.get("scale", 1.0)), float(lk.get("latency", 0.0)))
        if "cpu" in (a, b):
            g.host[b if a == "cpu" else a] = val
        else:
            g.peer[a, b] = g.peer[b, a] = val
    for e in data["edges"]:
        s, d = e["sourceId"], e["destId"]
        g.succs[s].add(d)
        g.preds[d].add(s)
        g.cost[s] = float(e["cost"])
    return g


def _g(data_or_g) -> G:
    return data_or_g if isinstance(data_or_g, G) else view(data_or_g)


def is_acc(name: str) -> bool:
    return not name.startswith("cpu")


# ---- objectives -------------------------------------------------------------------------------

def device_loads(data, assignment: dict) -> dict:
    g = _g(data)
    loads = {}
    for d in g.devices:
        if not is_acc(d):
            loads[d] = sum(g.cpu[v] for v in g.ids if assignment[v] == d)
            continue
        total = sum(g.time(v, d) for v in g.ids if assignment[v] == d)
        for u in g.ids:
            if not g.succs[u]:
                continue
            consumer_devs = {assignment[w] for w in g.succs[u]}
            a = assignment[u]
            if a == d:  # d sends u: a direct copy to each peer, once through the host for the rest
                others = consumer_devs - {d}
                direct = [g.direct(d, b, u) for b in others]
                total += sum(x for x in direct if x is not None)
                if any(x is None for x in direct):
                    total += g.staged(d, u)
            elif d in consumer_devs:  # d receives u
                x = g.direct(a, d, u)
                total += g.staged(d, u) if x is None else x
        loads[d] = total
    return loads


def max_load(data, assignment: dict) -> float:
    return max(device_loads(data, assignment).values(), default=0.0)


def pieces(data, assignment: dict) -> dict:
    """node id -> block key: ("cpu", v) for CPU nodes, (device, piece number) otherwise."""
    g = _g(data)
    block = {}
    for d in g.devices:
        if not is_acc(d):
            continue
        label = {}
        for v in g.order:
            if assignment[v] == d:
                label[v] = max([1] + [label[u] + (assignment[u] != d) for u in g.preds[v]])
            else:
                label[v] = max([0] + [label[u] for u in g.preds[v]])
        for v in g.ids:
            if assignment[v] == d:
                block[v] = (d, label[v])
    for v in g.ids:
        if not is_acc(assignment[v]):
            block[v] = ("cpu", v)
    return block


def switch_pieces(data, assignment: dict) -> dict:
    """The fallback blocks: a path starts a new piece whenever it changes device."""
    g = _g(data)
    label = {}
    for v in g.order:
        label[v] = max([1] + [label[u] + (assignment[u] != assignment[v]) for u in g.preds[v]])
    return {v: (assignment[v], label[v]) if is_acc(assignment[v]) else ("cpu", v) for v in g.ids}


def latency(data, assignment: dict) -> float:
    """Latency with the reference's pieces; if those wait on each other in a cycle, with
    the fallback pieces (a new piece at every device switch)."""
    try:
        return _latency(data, assignment, pieces(data, assignment))
    except PieceCycle:
        return _latency(data, assignment, switch_pieces(data, assignment))


def _latency(data, assignment: dict, block: dict) -> float:
    g = _g(data)
    members: dict = {}
    for v in g.ids:
        members.setdefault(block[v], []).append(v)
    memo: dict = {}
    active: set = set()

    def finish(b) -> float:
        if b in memo:
            return memo[b]
        if b in active:
            raise PieceCycle("pieces form a cycle")
        active.add(b)
        nodes = members[b]
        if b[0] == "cpu":
            v = nodes[0]
            val = max([0.0] + [finish(block[u]) for u in g.preds[v]]) + g.cpu[v]
        else:
            inside = set(nodes)
            d = b[0]
            senders = {u for v in nodes for u in g.preds[v] if u not in inside}
            start = max([0.0] + [finish(block[u]) for u in senders])
            incoming = 0.0
            for u in senders:
                x = g.direct(assignment[u], d, u)
                incoming += g.staged(d, u) if x is None else x
            compute = sum(g.time(v, d) for v in nodes)
            outgoing = 0.0
            for u in nodes:
                away = {assignment[w] for w in g.succs[u] if w not in inside}
                direct = [g.direct(d, e, u) for e in away]
                outgoing += sum(x for x in direct if x is not None)
                if any(x is None for x in direct):
                    outgoing += g.staged(d, u)
            val = start + incoming + compute + outgoing
        active.discard(b)
        memo[b] = val
        return val

    return max([0.0] + [finish(block[v]) for v in g.ids])


# ---- constraints ---------------------------------------------------------------------------------

def constraint_violations(data, assignment: dict) -> list[str]:
    g = _g(data)
    out = []
    for d in g.devices:
        if is_acc(d):
            used = sum(g.size[v] for v in g.ids if assignment[v] == d)
            if used > g.memory(g.dclass[d]) * (1 + TOL):
                out.append(f"memory {d}")
    for v in g.ids:
        if not g.runs(v, assignment[v]):
            out.append(f"support {v}")
    for key, mem in g.classes.items():
        if len({assignment[v] for v in mem}) > 1:
            out.append(f"colour {key}")
    return out


def respects_constraints(data, assignment: dict) -> bool:
    return not constraint_violations(data, assignment)


# ---- contiguity ----------------------------------------------------------------------------------

def orphan_classes(data) -> list:
    """Colour classes whose members are all backward nodes."""
    g = _g(data)
    return [key for key, mem in g.classes.items() if all(g.bwd[v] for v in mem)]


def order_graph(data):
    """(items, preds) of the graph the chain of ideals is taken in.

    Items are the forward node ids plus ("standin", class) for every orphan backward class.
    Edges: every forward edge, and for every backward edge u -> v touching an orphan class,
    an edge from the forward side of v's class to the forward side of u's class (the
    forward side of a class: its stand-in, or every forward member).
    """
    g = _g(data)
    orphans = set(orphan_classes(g))
    items = [v for v in g.ids if not g.bwd[v]] + [("standin", c) for c in sorted(orphans, key=repr)]
    preds = {x: set() for x in items}
    for v in g.ids:
        if not g.bwd[v]:
            preds[v] |= {u for u in g.preds[v] if not g.bwd[u]}

    def fwd_side(c):
        return [("standin", c)] if c in orphans else [x for x in g.classes[c] if not g.bwd[x]]

    for u in g.ids:
        for v in g.succs[u]:
            if g.bwd[u] and g.bwd[v] and (g.cls[u] in orphans or g.cls[v] in orphans):
                for a in fwd_side(g.cls[v]):
                    for b in fwd_side(g.cls[u]):
                        if a != b:
                            preds[b].add(a)
    return items, preds


def item_device(data, assignment: dict, item):
    g = _g(data)
    if isinstance(item, tuple) and item[0] == "standin":
        return assignment[g.classes[item[1]][0]]
    return assignment[item]


def is_chain_of_ideals(data, assignment: dict, with_standins: bool = True) -> bool:
    """Some order of the used parts makes every prefix union predecessor-closed."""
    g = _g(data)
    if with_standins:
        items, preds = order_graph(g)
    else:
        items = [v for v in g.ids if not g.bwd[v]]
        preds = {v: {u for u in g.preds[v] if not g.bwd[u]} for v in items}
    parts: dict = {}
    for x in items:
        parts.setdefault(item_device(g, assignment, x), set()).add(x)
    names = sorted(parts)

    def search(done: set, remaining: list) -> bool:
        if not remaining:
            return True
        for i, d in enumerate(remaining):
            union = done | parts[d]
            if all(preds[x] <= union for x in parts[d]):
                if search(union, remaining[:i] + remaining[i + 1:]):
                    return True
        return False

    return search(set(), names)


def is_convex(data, assignment: dict) -> bool:
    """Per pass (forward graph; backward graph for training) no path leaves a part and returns."""
    g = _g(data)
    training = any(g.bwd.values())
    passes = [set(g.ids)] if not training else [{v for v in g.ids if not g.bwd[v]},
                                                 {v for v in g.ids if g.bwd[v]}]
    for mask in passes:
        reach = {}
        for v in reversed(g.order):
            if v in mask:
                r = set()
                for w in g.succs[v]:
                    if w in mask:
                        r.add(w)
                        r |= reach[w]
                reach[v] = r
        for u in mask:
            for w in reach[u]:
                if assignment[w] != assignment[u] and any(assignment[x] == assignment[u] for x in reach[w]):
                    return False
    return True


def accelerators_convex(data, assignment: dict) -> bool:
    """Every accelerator's part convex; CPU nodes each apart, as the latency model runs them
    (unbounded parallelism: the CPUs' nodes need not be convex)."""
    return is_convex(data, {v: (d if is_acc(d) else f"cpu-{v}") for v, d in assignment.items()})


# ---- enumeration ---------------------------------------------------------------------------------

def all_assignments(data):
    """Every map node -> device (no symmetry reduction, no constraints): tiny graphs only."""
    import itertools

    g = _g(data)
    for combo in itertools.product(g.devices, repeat=len(g.ids)):
        yield dict(zip(g.ids, combo))


def class_assignments(data):
    """Assignments giving each colour class one device, meeting memory and support,
    one per orbit of renaming identical devices (within each device class, first uses of
    its devices in order)."""
    g = _g(data)
    units = list(g.classes.values())
    usize = [sum(g.size[v] for v in u) for u in units]
    kinds: dict = {}  # device class (None: CPU) -> its devices in order
    for d in g.devices:
        kinds.setdefault(g.dclass[d], []).append(d)
    mem = {d: 0.0 for d in g.devices}
    choice = [None] * len(units)

    def rec(i, used: dict):
        if i == len(units):
            yield {v: choice[j] for j, u in enumerate(units) for v in u}
            return
        for kind, devs in kinds.items():
            if not all(g.runs(v, devs[0]) for v in units[i]):
                continue
            for j in range(min(used.get(kind, 0) + 1, len(devs))):
                d = devs[j]
                if kind is not None and mem[d] + usize[i] > g.memory(kind) * (1 + TOL):
                    continue
                mem[d] += usize[i]
                choice[i] = d
                yield from rec(i + 1, {**used, kind: max(used.get(kind, 0), j + 1)})
                mem[d] -= usize[i]

    yield from rec(0, {})


def brute_latency_one_call(data):
    """Min latency over assignments where every accelerator runs one convex call (CPU nodes
    on one core: the latency model's CPUs run in parallel, and need not be convex); None
    where no assignment is valid."""
    import itertools

    g = _g(data)
    devices = [d for d in g.devices if is_acc(d)] + (["cpu0"] if g.l else [])
    best = None
    for combo in itertools.product(devices, repeat=len(g.ids)):
        a = dict(zip(g.ids, combo))
        if not respects_constraints(g, a) or not accelerators_convex(g, a):
            continue
        try:
            val = _latency(g, a, pieces(g, a))
        except PieceCycle:
            continue
        best = val if best is None else min(best, val)
    return best


def brute_min_max_load(data, chain: bool, with_standins: bool = True):
    """(min max-load, an optimal assignment) or (None, None) when nothing is valid."""
    g = _g(data)
    best, arg = None, None
    for a in class_assignments(g):
        val = max_load(g, a)
        if best is not None and val >= best:
            continue
        if chain and not is_chain_of_ideals(g, a, with_standins=with_standins):
            continue
        best, arg = val, a
    return best, arg


# ---- random workloads ------------------------------------------------------------------------------

def _lat(rng: random.Random, zero_p: float):
    if rng.random() < zero_p:
        return 0.0, 0.0
    fpga = round(rng.uniform(0.2, 5.0), 3)
    cpu = round(fpga * rng.uniform(2.0, 10.0), 3)
    return cpu, fpga


def _cost(rng: random.Random) -> float:
    return 0.0 if rng.random() < 0.2 else round(rng.uniform(0.05, 3.0), 3)


def random_workload(seed: int, training: bool = False, orphans: int | None = None,
                    n_range=(2, 7), k_range=(1, 3), l_range=(0, 2),
                    zero_p=0.15, unsupported_p=0.15, class_p=0.3) -> dict:
    """A small random workload in the paper's JSON format (seeded, reproducible)."""
    rng = random.Random(seed)
    n = rng.randint(*n_range)
    ids = rng.sample(range(0, 60), n)  # arbitrary, non-contiguous ids; listed in this order
    topo = ids[:]
    rng.shuffle(topo)  # the DAG follows this order
    density = rng.choice([0.2, 0.4, 0.6])
    fwd_edges = [(topo[i], topo[j]) for i in range(n) for j in range(i + 1, n) if rng.random() < density]
    nodes = []
    cost = {}
    next_class = [100]

    def fresh_class():
        next_class[0] += 1
        return next_class[0]

    classes: dict = {}
    if rng.random() < class_p:  # some shared colour classes among forward nodes
        for _ in range(rng.randint(1, 2)):
            a, b = rng.sample(ids, 2)
            c = classes.get(a) or classes.get(b) or fresh_class()
            classes[a] = classes[b] = c
    for v in ids:
        cpu, fpga = _lat(rng, zero_p)
        nd = {"id": v, "supportedOnFpga": int(rng.random() >= unsupported_p), "cpuLatency": cpu,
              "fpgaLatency": fpga, "isBackwardNode": 0}
        if v in classes:
            nd["colorClass"] = classes[v]
        elif training or rng.random() < 0.2:
            nd["colorClass"] = classes[v] = fresh_class()
        if rng.random() < 0.85:
            nd["size"] = rng.randint(0, 10)
        nodes.append(nd)
        cost[v] = _cost(rng)
    edges = [(s, d) for s, d in fwd_edges]

    if training:
        partner = {}
        used_ids = set(ids)
        pool = [x for x in range(60, 200) if x not in used_ids]
        rng.shuffle(pool)
        for v in ids:
            if rng.random() < 0.9:  # most forward nodes have a backward partner
                b = pool.pop()
                partner[v] = b
                cpu, fpga = _lat(rng, zero_p)
                nd = {"id": b, "supportedOnFpga": int(rng.random() >= unsupported_p), "cpuLatency": cpu,
                      "fpgaLatency": fpga, "isBackwardNode": 1, "colorClass": classes[v]}
                if rng.random() < 0.85:
                    nd["size"] = rng.randint(0, 10)
                nodes.append(nd)
                cost[b] = _cost(rng)
                edges.append((v, b))
        for s, d in fwd_edges:  # mirrored backward edges
            if s in partner and d in partner:
                edges.append((partner[d], partner[s]))
        bwd_order = [partner[v] for v in reversed(topo) if v in partner]
        n_orph = rng.choice([0, 0, 1, 1, 2]) if orphans is None else orphans
        for _ in range(n_orph):
            o = pool.pop()
            pos = rng.randint(0, len(bwd_order))
            before, after = bwd_order[:pos], bwd_order[pos:]
            for x in before:
                if rng.random() < 0.5:
                    edges.append((x, o))
            for x in after:
                if rng.random() < 0.5:
                    edges.append((o, x))
            if rng.random() < 0.3:
                edges.append((rng.choice(ids), o))
            bwd_order.insert(pos, o)
            cpu, fpga = _lat(rng, zero_p)
            nd = {"id": o, "supportedOnFpga": int(rng.random() >= unsupported_p), "cpuLatency": cpu,
                  "fpgaLatency": fpga, "isBackwardNode": 1}
            if rng.random() < 0.7:
                nd["colorClass"] = fresh_class()
            if rng.random() < 0.85:
                nd["size"] = rng.randint(0, 10)
            nodes.append(nd)
            cost[o] = _cost(rng)
        rng.shuffle(nodes)

    total = sum(nd.get("size", 0) for nd in nodes)
    r = rng.random()
    if r < 0.4:
        M = total + 0.5  # never binding
    elif r < 0.85:
        M = int(total * rng.uniform(0.25, 0.8)) + 0.5  # often binding
    else:
        M = 1e9
    k = rng.randint(*k_range)
    l = rng.randint(*l_range)
    if k + l == 0:
        l = 1
    return {
        "maxSizePerFPGA": M,
        "maxFPGAs": k,
        "maxCPUs": l,
        "nodes": nodes,
        "edges": [{"sourceId": s, "destId": d, "cost": cost[s]} for s, d in edges],
    }


def random_assignment(data, rng: random.Random) -> dict:
    g = _g(data)
    mode = rng.random()
    if mode < 0.1:
        d = rng.choice(g.devices)
        return {v: d for v in g.ids}
    return {v: rng.choice(g.devices) for v in g.ids}


def random_multi_class(seed: int, **kw) -> dict:
    """:func:`random_workload` with one or two further accelerator classes (0-2 devices
    each, own memory, own latencies, some nodes they cannot run), host links and peer links."""
    rng = random.Random(seed * 7919 + 1)
    data = random_workload(seed, **kw)
    names = rng.sample(["gpu", "npu", "l4", "a100"], rng.randint(1, 2))
    total = sum(nd.get("size", 0) for nd in data["nodes"])
    data["maxFPGAs"] = rng.randint(0, 1)
    classes = []
    for name in names:
        classes.append({"name": name, "count": rng.randint(1, 2),
                        "memory": rng.choice([total + 0.5, int(total * rng.uniform(0.3, 0.8)) + 0.5])})
        for nd in data["nodes"]:
            if rng.random() < 0.85:
                nd.setdefault("latencies", {})[name] = round(rng.uniform(0.1, 6.0), 3)
    data["acceleratorClasses"] = classes
    links = []
    for c in ["acc"] + names:
        if rng.random() < 0.5:
            links.append({"between": [c, "cpu"], "scale": round(rng.uniform(0.3, 2.0), 3),
                          "latency": rng.choice([0.0, 0.05])})
    pool = ["acc"] + names
    peer_p = rng.choice([0.0, 0.5])
    for i, a in enumerate(pool):
        for b in pool[i:]:
            if rng.random() < peer_p:
                links.append({"between": [a, b], "scale": round(rng.uniform(0.05, 0.8), 3),
                              "latency": rng.choice([0.0, 0.02])})
    data["links"] = links
    while sum(c["count"] for c in classes) + data["maxFPGAs"] + data["maxCPUs"] > 5:
        data["maxCPUs"] = max(0, data["maxCPUs"] - 1) if data["maxCPUs"] else data["maxCPUs"]
        if data["maxCPUs"] == 0:
            classes[-1]["count"] = max(0, classes[-1]["count"] - 1)
    if data["maxFPGAs"] + data["maxCPUs"] + sum(c["count"] for c in classes) == 0:
        data["maxCPUs"] = 1
    return data
