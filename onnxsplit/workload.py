"""The computational model every solver optimises, and the paper's JSON format.

A :class:`Workload` is a DAG of nodes, each with a latency on a CPU core and on an
accelerator, a memory size, an accelerator-support flag, a forward/backward flag and an
optional colour class (nodes of one class must share a device); every edge ``u -> w``
carries the transfer cost ``c(u)`` of u's outputs.  Devices are ``k`` identical
accelerators with memory ``M`` each (``acc0`` ..) and ``l`` CPU cores (``cpu0`` ..)
without a memory limit: the paper's model.  Real servers add further accelerator classes
(:class:`AcceleratorClass`, a latency per node each) and links that price a transfer by
the route it takes (:class:`Link`); the paper's model is the case without them.  The
reader/writer round-trips the format of Tarnawski et al.'s code package exactly
(``../shared/paper-workloads/FORMAT.md``: unknown keys kept, flags spelled as read).
Solvers see only this object, never ONNX.

Write-up: docs/README.md (The model the solvers optimise).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from .errors import WorkloadError
from .files import loads, write_atomic

_NODE_KEYS = ("id", "supportedOnFpga", "cpuLatency", "fpgaLatency", "isBackwardNode")
_EDGE_KEYS = ("sourceId", "destId", "cost")
_TOP_KEYS = ("maxSizePerFPGA", "maxFPGAs", "maxCPUs", "nodes", "edges")
_CLASS_KEYS, _LINK_KEYS = "acceleratorClasses", "links"  # the extension for real servers
_MODELLED_NODE_KEYS = set(_NODE_KEYS) | {"colorClass", "size", "name", "latencies"}
PAPER_CLASS, CPU_CLASS = "acc", "cpu"  # the paper's accelerator class, and the host's cores
_MODELLED_EDGE_KEYS = set(_EDGE_KEYS)


@dataclass(frozen=True)
class Node:
    id: int
    cpu_latency: float
    acc_latency: float
    supported: bool = True
    backward: bool = False
    color_class: int | None = None
    size: float | None = None  # None: absent in the file (means 0)
    name: str | None = None
    extra: dict = field(default_factory=dict, compare=False)
    # how the file spelled supportedOnFpga / isBackwardNode: True = 0/1, False = true/false
    int_flags: tuple[bool, bool] = field(default=(True, True), compare=False)
    # latency on each further accelerator class, by class name; a class absent cannot run it
    latencies: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Edge:
    source: int
    dest: int
    cost: float
    extra: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class AcceleratorClass:
    """A further kind of accelerator beside the paper's ``acc`` (an L4 beside an A100, an
    NPU beside a GPU): ``count`` devices of ``memory`` bytes each, named ``{name}{i}``
    (``{name}_{i}`` where the name ends in a digit); a node's latency on it is in the
    node's ``latencies``."""

    name: str
    count: int
    memory: float
    extra: dict = field(default_factory=dict, compare=False)

    def device_name(self, i: int) -> str:
        return f"{self.name}_{i}" if self.name[-1:].isdigit() else f"{self.name}{i}"


@dataclass(frozen=True)
class Link:
    """How a transfer between two classes is priced: ``latency + scale * c(u)`` seconds.

    Between an accelerator class and ``cpu``: its host link (staged transfers go through
    host memory; without one, scale 1 and latency 0, the paper's ``c(u)``).  Between two
    accelerator classes (or a class and itself, between two of its devices): a direct peer
    link, which a transfer between them takes instead of staging through the host."""

    a: str
    b: str
    scale: float = 1.0
    latency: float = 0.0
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def peer(self) -> bool:
        return CPU_CLASS not in (self.a, self.b)

    def to_json(self) -> dict:
        return {"between": [self.a, self.b], "scale": self.scale, "latency": self.latency, **self.extra}


MOST_DEVICES = 1024  # of each kind, or one per node where there are more nodes

# The solvers add a workload's numbers up in float64 (a DP part's load is the difference of
# two prefix sums; an integer program's rows hold every node's time), so one number far
# beyond any model's leaves the others below its rounding (the DP and the evaluator then
# disagree, HiGHS fails), and a subnormal one overflows a ratio.  Every time, size and link
# scale is 0 or within these bounds; a node id fits the int64 arrays the solvers index by.
MOST_TIME = 1e12  # ms: a node's latency, a tensor's transfer cost, a link's latency (31 years)
MOST_BYTES = 1e18  # a node's size, an accelerator's memory (1e18 is how workloads spell unlimited)
MOST_SCALE = 1e12  # a link's time per ms of transfer at the first class's host bandwidth
LEAST_POSITIVE = 1e-30  # of each: a positive number below it is a rounding error of 0 (no subnormal)
ID_RANGE = (-2 ** 63, 2 ** 63 - 1)


@dataclass(frozen=True)
class Device:
    name: str
    kind: str  # "acc" or "cpu"
    index: int  # position in Workload.devices


@dataclass(frozen=True)
class Workload:
    """Nodes, edges and devices; derived arrays are computed once, on first use."""

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    num_accelerators: int
    num_cpus: int
    accelerator_memory: float
    extra: dict = field(default_factory=dict, compare=False)
    accelerator_classes: tuple[AcceleratorClass, ...] = ()
    links: tuple[Link, ...] = ()

    # ---- construction -------------------------------------------------------------
    def __post_init__(self):
        problems = self.problems()
        if problems:
            more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise WorkloadError(problems[0] + more)
        # a plan uses at most one device per node, so more are never needed, and listing a
        # cluster of a billion devices would take all the memory there is; up to
        # MOST_DEVICES stay, so that a split naming any of them still reads
        most = max(len(self.nodes), MOST_DEVICES)
        for name in ("num_accelerators", "num_cpus"):
            if getattr(self, name) > most:
                object.__setattr__(self, name, most)
        if any(c.count > most for c in self.accelerator_classes):
            object.__setattr__(self, "accelerator_classes", tuple(
                AcceleratorClass(c.name, min(c.count, most), c.memory, c.extra) for c in self.accelerator_classes))

    @classmethod
    def from_paper_json(cls, source: str | Path | dict) -> "Workload":
        """Read the paper's JSON (a path or an already parsed dict)."""
        if isinstance(source, dict):
            data, where = source, "workload"
        else:
            where = str(source)
            try:
                text = Path(source).read_text()
            except OSError as e:
                raise WorkloadError(f"{where}: cannot read: {e.strerror or e}") from None
            except UnicodeDecodeError:
                raise WorkloadError(f"{where}: not a JSON text file (an ONNX model goes to the main "
                                    f"command, or to 'onnxsplit workload' first)") from None
            try:
                data = loads(text)
            except json.JSONDecodeError as e:
                raise WorkloadError(f"{where}: not valid JSON ({e.msg} at line {e.lineno})") from None
        try:
            return _parse(data)
        except WorkloadError as e:
            raise WorkloadError(f"{where}: {e}") from None

    def to_paper_json(self) -> dict:
        def flag(value: bool, as_int: bool):
            return int(value) if as_int else bool(value)

        nodes = []
        for n in self.nodes:
            d: dict[str, Any] = {}
            if n.name is not None:
                d["name"] = n.name
            d["id"] = n.id
            d["supportedOnFpga"] = flag(n.supported, n.int_flags[0])
            d["cpuLatency"] = n.cpu_latency
            d["fpgaLatency"] = n.acc_latency
            d["isBackwardNode"] = flag(n.backward, n.int_flags[1])
            if n.color_class is not None:
                d["colorClass"] = n.color_class
            if n.size is not None:
                d["size"] = n.size
            if n.latencies:
                d["latencies"] = dict(n.latencies)
            d.update(n.extra)
            nodes.append(d)
        edges = []
        for e in self.edges:
            d = {"sourceId": e.source, "destId": e.dest, "cost": e.cost}
            d.update(e.extra)
            edges.append(d)
        out = {
            "maxSizePerFPGA": self.accelerator_memory,
            "maxFPGAs": self.num_accelerators,
            "maxCPUs": self.num_cpus,
            "nodes": nodes,
            "edges": edges,
        }
        if self.accelerator_classes:
            out[_CLASS_KEYS] = [{"name": c.name, "count": c.count, "memory": c.memory, **c.extra}
                                for c in self.accelerator_classes]
        if self.links:
            out[_LINK_KEYS] = [lk.to_json() for lk in self.links]
        out.update(self.extra)
        return out

    def write(self, path: str | Path, inputs=()) -> None:
        """The paper's JSON, written whole (never over one of ``inputs``)."""
        write_atomic(path, json.dumps(self.to_paper_json(), indent=1) + "\n", inputs)

    def replace(self, **changes) -> "Workload":
        """A copy with some fields changed (e.g. ``num_accelerators``)."""
        import dataclasses

        return dataclasses.replace(self, **changes)

    # ---- validation -------------------------------------------------------------------
    def restricted(self, keep: np.ndarray) -> "Workload":
        """The sub-workload of the nodes in ``keep`` (a node mask) and the edges among them:
        every plan of the whole is one of it, with no device's load larger (part bounds)."""
        keep = np.asarray(keep, dtype=bool)  # (masks, not scans: a block of 10,000 nodes is cut out thousands of times)
        edges = np.flatnonzero(keep[self.edge_src] & keep[self.edge_dst])
        return self.replace(nodes=tuple(self.nodes[i] for i in np.flatnonzero(keep)),
                            edges=tuple(self.edges[j] for j in edges))

    def problems(self) -> list[str]:
        """Every problem found, each naming the offending node, edge or field."""
        out: list[str] = []
        if self.num_accelerators < 0 or self.num_cpus < 0:
            out.append("maxFPGAs and maxCPUs must be >= 0")
        if self.num_accelerators + self.num_cpus + sum(
                c.count for c in self.accelerator_classes if isinstance(c.count, int)) == 0:
            out.append("no devices: maxFPGAs + maxCPUs is 0" + (" and no accelerator class has any"
                                                               if self.accelerator_classes else ""))
        out += _amount_problems("maxSizePerFPGA", self.accelerator_memory, MOST_BYTES)
        out += self._class_problems()
        known = {c.name for c in self.accelerator_classes}
        seen: set[int] = set()
        for n in self.nodes:
            if n.id in seen:
                out.append(f"node {n.id}: duplicate id")
            seen.add(n.id)
            if not ID_RANGE[0] <= n.id <= ID_RANGE[1]:
                out.append(f"node {n.id}: the id does not fit in 64 bits (ids are integers from "
                           f"{ID_RANGE[0]} to {ID_RANGE[1]})")
            for cls, value in n.latencies:
                if cls not in known:
                    out.append(f"node {n.id}: latency on unknown accelerator class '{cls}' "
                               f"(classes: {', '.join(sorted(known)) or 'none'})")
                elif not _in_range(value, MOST_TIME):
                    out += _amount_problems(f"node {n.id}: latency on '{cls}'", value, MOST_TIME)
            for label, value, most in (("cpuLatency", n.cpu_latency, MOST_TIME),
                                       ("fpgaLatency", n.acc_latency, MOST_TIME),
                                       ("size", n.size or 0.0, MOST_BYTES)):
                if not _in_range(value, most):
                    out += _amount_problems(f"node {n.id}: {label}", value, most)
        backward = {n.id: n.backward for n in self.nodes}
        cost_of: dict[int, float] = {}
        for e in self.edges:
            where = f"edge {e.source}->{e.dest}"
            for end in (e.source, e.dest):
                if end not in seen:
                    out.append(f"{where}: unknown node id {end}")
            if e.source == e.dest:
                out.append(f"{where}: self-loop")
            if not _in_range(e.cost, MOST_TIME) and (bad := _amount_problems(f"{where}: cost", e.cost, MOST_TIME)):
                out += bad
            elif e.source in cost_of and abs(cost_of[e.source] - e.cost) > 1e-6 * max(1.0, abs(e.cost)):
                out.append(f"{where}: cost {e.cost} differs from another out-edge of node {e.source} "
                           f"(cost {cost_of[e.source]}); a cost belongs to the source's tensor")
            else:
                cost_of.setdefault(e.source, e.cost)
            if backward.get(e.source) and backward.get(e.dest) is False:
                out.append(f"{where}: backward node {e.source} feeds forward node {e.dest}")
        if not out:
            cycle = _find_cycle(self.nodes, self.edges)
            if cycle:
                out.append("the graph has a cycle: " + " -> ".join(map(str, cycle + cycle[:1])))
        return out

    def _class_problems(self) -> list[str]:
        out: list[str] = []
        names = [PAPER_CLASS]
        for c in self.accelerator_classes:
            where = f"accelerator class '{c.name}'"
            if not isinstance(c.name, str) or not c.name.isidentifier():
                out.append(f"{where}: a name is letters, digits and '_', not starting with a digit")
            elif c.name in names or c.name == CPU_CLASS:
                out.append(f"{where}: the name is taken ({', '.join(names + [CPU_CLASS])} exist)")
            names.append(c.name)
            if isinstance(c.count, bool) or not isinstance(c.count, int) or c.count < 0:
                out.append(f"{where}: count must be an integer >= 0, got {c.count!r}")
            out += _amount_problems(f"{where}: memory", c.memory, MOST_BYTES)
        firsts = [c.device_name(0) for c in self.accelerator_classes if isinstance(c.name, str) and c.name]
        for name in set(firsts) & ({"acc0", "cpu0"} | {x for x in firsts if firsts.count(x) > 1}):
            out.append(f"accelerator classes: two classes would both name a device '{name}'")
        pairs: set[frozenset] = set()
        for lk in self.links:
            where = f"link {lk.a}-{lk.b}"
            for end in (lk.a, lk.b):
                if end not in names and end != CPU_CLASS:
                    out.append(f"{where}: unknown class '{end}' (classes: {', '.join(names + [CPU_CLASS])})")
            if lk.a == lk.b == CPU_CLASS:
                out.append(f"{where}: CPU cores share memory; there is no link to price")
            if frozenset((lk.a, lk.b)) in pairs:
                out.append(f"{where}: given twice")
            pairs.add(frozenset((lk.a, lk.b)))
            for label, value, most in (("scale", lk.scale, MOST_SCALE), ("latency", lk.latency, MOST_TIME)):
                out += _amount_problems(f"{where}: {label}", value, most)
        return out

    # ---- devices ------------------------------------------------------------------------
    @property
    def multi_class(self) -> bool:
        """Beyond the paper's model: further accelerator classes, or links pricing transfers."""
        return bool(self.accelerator_classes or self.links)

    def device_summary(self) -> str:
        """"2 accelerators, 2 CPU cores" (the paper's model) or "2 t4, 1 npu, 2 CPU cores"."""
        if self.accelerator_classes:
            accs = ", ".join(f"{count} {name}" for name, count in zip(self.class_names, self.class_counts) if count)
        else:
            accs = f"{self.num_accelerators} accelerators"
        return f"{accs or '0 accelerators'}, {self.num_cpus} CPU cores"

    @cached_property
    def class_names(self) -> tuple[str, ...]:
        """Accelerator classes, the paper's ``acc`` first."""
        return (PAPER_CLASS,) + tuple(c.name for c in self.accelerator_classes)

    @cached_property
    def class_counts(self) -> tuple[int, ...]:
        return (self.num_accelerators,) + tuple(c.count for c in self.accelerator_classes)

    @cached_property
    def class_memory(self) -> np.ndarray:
        return np.array([self.accelerator_memory] + [c.memory for c in self.accelerator_classes], dtype=np.float64)

    @property
    def accelerators_total(self) -> int:
        """Accelerator devices of every class: device indices below it are accelerators."""
        return sum(self.class_counts)

    @cached_property
    def devices(self) -> tuple[Device, ...]:
        accs = [Device(f"acc{i}", "acc", i) for i in range(self.num_accelerators)]
        for c in self.accelerator_classes:
            accs += [Device(c.device_name(i), "acc", len(accs) + i) for i in range(c.count)]
        cpus = [Device(f"cpu{i}", "cpu", len(accs) + i) for i in range(self.num_cpus)]
        return tuple(accs + cpus)

    @cached_property
    def device_index(self) -> dict[str, int]:
        return {d.name: d.index for d in self.devices}

    @cached_property
    def device_class(self) -> np.ndarray:
        """device index -> accelerator class index (0 is ``acc``), -1 for CPU cores."""
        return np.array([c for c, count in enumerate(self.class_counts) for _ in range(count)]
                        + [-1] * self.num_cpus, dtype=np.int64)

    def is_accelerator(self, device_index: int) -> bool:
        return device_index < self.accelerators_total

    @cached_property
    def class_latency(self) -> np.ndarray:
        """(class, node) -> latency on that accelerator class (0 where it cannot run)."""
        out = np.zeros((len(self.class_names), self.n))
        out[0] = self.acc_latency
        col = {name: c for c, name in enumerate(self.class_names)}
        for i, nd in enumerate(self.nodes):
            for name, value in nd.latencies:
                out[col[name], i] = value
        return out

    @cached_property
    def class_supported(self) -> np.ndarray:
        """(class, node) -> can that accelerator class run the node."""
        out = np.zeros((len(self.class_names), self.n), dtype=bool)
        out[0] = self.supported
        col = {name: c for c, name in enumerate(self.class_names)}
        for i, nd in enumerate(self.nodes):
            for name, _ in nd.latencies:
                out[col[name], i] = True
        return out

    def device_latency(self, device_index: int) -> np.ndarray:
        """Each node's latency on one device (CPU cores: ``cpu_latency``)."""
        c = int(self.device_class[device_index])
        return self.cpu_latency if c < 0 else self.class_latency[c]

    @cached_property
    def host_links(self) -> np.ndarray:
        """(class, 2) -> (scale, latency) of each accelerator class's link to host memory."""
        out = np.array([[1.0, 0.0]] * len(self.class_names))
        col = {name: c for c, name in enumerate(self.class_names)}
        for lk in self.links:
            if not lk.peer:
                out[col[lk.a if lk.b == CPU_CLASS else lk.b]] = (lk.scale, lk.latency)
        return out

    @cached_property
    def peer_links(self) -> dict[tuple[int, int], tuple[float, float]]:
        """(class, class) -> (scale, latency) of the direct links, both ways."""
        col = {name: c for c, name in enumerate(self.class_names)}
        out = {}
        for lk in self.links:
            if lk.peer:
                out[col[lk.a], col[lk.b]] = out[col[lk.b], col[lk.a]] = (lk.scale, lk.latency)
        return out

    def staged_cost(self, cls: int, u) -> float | np.ndarray:
        """Seconds an accelerator of class ``cls`` spends moving tensor(s) ``u`` to or from host memory."""
        scale, lat = self.host_links[cls]
        return lat + scale * self.out_cost[u]

    def peer_cost(self, a: int, b: int, u) -> float | np.ndarray | None:
        """Seconds a direct copy of tensor(s) ``u`` between classes ``a`` and ``b`` takes at
        each end; None where they have no direct link."""
        link = self.peer_links.get((a, b))
        return None if link is None else link[1] + link[0] * self.out_cost[u]

    # ---- derived arrays (indices 0..n-1 follow self.nodes) -------------------------------
    @property
    def n(self) -> int:
        return len(self.nodes)

    @cached_property
    def index(self) -> dict[int, int]:
        return {nd.id: i for i, nd in enumerate(self.nodes)}

    @cached_property
    def ids(self) -> np.ndarray:
        return np.array([nd.id for nd in self.nodes], dtype=np.int64)

    @cached_property
    def cpu_latency(self) -> np.ndarray:
        return np.array([nd.cpu_latency for nd in self.nodes], dtype=np.float64)

    @cached_property
    def acc_latency(self) -> np.ndarray:
        return np.array([nd.acc_latency for nd in self.nodes], dtype=np.float64)

    @cached_property
    def size(self) -> np.ndarray:
        return np.array([nd.size or 0.0 for nd in self.nodes], dtype=np.float64)

    @cached_property
    def supported(self) -> np.ndarray:
        return np.array([nd.supported for nd in self.nodes], dtype=bool)

    @cached_property
    def backward(self) -> np.ndarray:
        return np.array([nd.backward for nd in self.nodes], dtype=bool)

    @cached_property
    def color_class(self) -> np.ndarray:
        """A class label per node; nodes without a class get a label of their own."""
        labels: dict[Any, int] = {}
        out = np.empty(self.n, dtype=np.int64)
        for i, nd in enumerate(self.nodes):
            key = ("c", nd.color_class) if nd.color_class is not None else ("n", nd.id)
            out[i] = labels.setdefault(key, len(labels))
        return out

    @cached_property
    def edge_src(self) -> np.ndarray:
        return np.array([self.index[e.source] for e in self.edges], dtype=np.int64)

    @cached_property
    def edge_dst(self) -> np.ndarray:
        return np.array([self.index[e.dest] for e in self.edges], dtype=np.int64)

    @cached_property
    def out_cost(self) -> np.ndarray:
        """c(u): transfer cost of node u's output tensor (0 for nodes without out-edges)."""
        out = np.zeros(self.n, dtype=np.float64)
        for e, s in zip(self.edges, self.edge_src):
            out[s] = e.cost
        return out

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        succ: list[list[int]] = [[] for _ in range(self.n)]
        for s, d in zip(self.edge_src, self.edge_dst):
            succ[s].append(int(d))
        return tuple(tuple(dict.fromkeys(x)) for x in succ)

    @cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        pred: list[list[int]] = [[] for _ in range(self.n)]
        for s, d in zip(self.edge_src, self.edge_dst):
            pred[d].append(int(s))
        return tuple(tuple(dict.fromkeys(x)) for x in pred)

    @cached_property
    def topological_order(self) -> tuple[int, ...]:
        order = topological_sort(self.n, self.successors)
        assert order is not None  # validated acyclic in __post_init__
        return tuple(order)

    @property
    def is_training(self) -> bool:
        return bool(self.backward.any())


def csr(lists) -> tuple[np.ndarray, np.ndarray]:
    """Adjacency lists (e.g. ``Workload.successors``) as (pointer, index) arrays, the form
    compiled kernels take: list v is index[pointer[v]:pointer[v + 1]]."""
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    idx = np.array([u for x in lists for u in x], dtype=np.int64)
    return ptr, idx


def transposed(ptr: np.ndarray, index: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A CSR (:func:`csr`) turned round: for each of 0..n-1, the lists that hold it, in
    the lists' order (each tensor's classes -> each class's tensors)."""
    holder = np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))
    out = np.zeros(n + 1, dtype=np.int64)
    out[1:] = np.cumsum(np.bincount(index, minlength=n))
    return out, holder[np.argsort(index, kind="stable")]


# ---- parsing helpers -------------------------------------------------------------------

def _finite_nonneg(x) -> bool:
    # (an int is finite, and math.isfinite cannot take one beyond float's range)
    return isinstance(x, (int, float)) and not isinstance(x, bool) and \
        (isinstance(x, int) or math.isfinite(x)) and x >= 0


def _in_range(value, most: float) -> bool:
    """The common case of :func:`_amount_problems` finding none, quickly (a float in range;
    anything else goes there): validation runs on every sub-workload a solver cuts out."""
    return type(value) is float and (value == 0.0 or LEAST_POSITIVE <= value <= most)


def _amount_problems(name: str, value, most: float) -> list[str]:
    """The problem with a time, size or scale (``name``: where it is and which) as a list,
    empty where there is none: a finite number >= 0 that is 0 or from LEAST_POSITIVE to
    ``most`` (see MOST_TIME)."""
    if not _finite_nonneg(value):
        return [f"{name} must be a finite number >= 0, got {value!r}"]
    if value > most or 0 < value < LEAST_POSITIVE:
        return [f"{name} must be 0 or from {LEAST_POSITIVE:g} to {most:g}, got {value!r} "
                f"(outside that, the solvers' float sums lose precision)"]
    return []


def _need(d: dict, key: str, where: str):
    if key not in d:
        raise WorkloadError(f"{where}: missing field '{key}'")
    return d[key]


def _number(d: dict, key: str, where: str, default=None) -> float:
    if key not in d and default is not None:
        return default
    v = _need(d, key, where)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WorkloadError(f"{where}: field '{key}' must be a number, got {v!r}")
    return v  # kept as written (int or float) so that the file round-trips exactly


def _integer(d: dict, key: str, where: str) -> int:
    v = _need(d, key, where)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
        raise WorkloadError(f"{where}: field '{key}' must be an integer, got {v!r}")
    return int(v)


def _flag(d: dict, key: str, where: str) -> tuple[bool, bool]:
    """Returns (value, spelled_as_int)."""
    v = _need(d, key, where)
    if isinstance(v, bool):
        return v, False
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v), True
    raise WorkloadError(f"{where}: field '{key}' must be a bool or 0/1, got {v!r}")


def _parse(data: Any) -> Workload:
    if not isinstance(data, dict):
        raise WorkloadError("top level must be a JSON object")
    for key in _TOP_KEYS:
        _need(data, key, "workload")
    if not isinstance(data["nodes"], list) or not isinstance(data["edges"], list):
        raise WorkloadError("'nodes' and 'edges' must be lists")
    nodes = []
    for pos, raw in enumerate(data["nodes"]):
        if not isinstance(raw, dict):
            raise WorkloadError(f"node #{pos}: must be an object")
        nid = _integer(raw, "id", f"node #{pos}")
        where = f"node {nid}"
        supported, a = _flag(raw, "supportedOnFpga", where)
        backward, b = _flag(raw, "isBackwardNode", where)
        cc = raw.get("colorClass")
        if cc is not None:
            cc = _integer(raw, "colorClass", where)
        size = _number(raw, "size", where) if "size" in raw else None
        more = raw.get("latencies", {})
        if not isinstance(more, dict):
            raise WorkloadError(f"{where}: 'latencies' must be an object (class name -> latency)")
        nodes.append(Node(
            id=nid,
            cpu_latency=_number(raw, "cpuLatency", where),
            acc_latency=_number(raw, "fpgaLatency", where),
            supported=supported,
            backward=backward,
            color_class=cc,
            size=size,
            name=raw.get("name"),
            extra={k: v for k, v in raw.items() if k not in _MODELLED_NODE_KEYS},
            int_flags=(a, b),
            latencies=tuple((str(k), _number(more, k, where + " latencies")) for k in more),
        ))
    edges = []
    for pos, raw in enumerate(data["edges"]):
        if not isinstance(raw, dict):
            raise WorkloadError(f"edge #{pos}: must be an object")
        where = f"edge #{pos}"
        src = _integer(raw, "sourceId", where)
        dst = _integer(raw, "destId", where)
        edges.append(Edge(src, dst, _number(raw, "cost", f"edge {src}->{dst}"),
                          extra={k: v for k, v in raw.items() if k not in _MODELLED_EDGE_KEYS}))
    return Workload(
        nodes=tuple(nodes),
        edges=tuple(edges),
        num_accelerators=_integer(data, "maxFPGAs", "workload"),
        num_cpus=_integer(data, "maxCPUs", "workload"),
        accelerator_memory=_number(data, "maxSizePerFPGA", "workload"),
        extra={k: v for k, v in data.items() if k not in _TOP_KEYS + (_CLASS_KEYS, _LINK_KEYS)},
        accelerator_classes=_parse_classes(data.get(_CLASS_KEYS, [])),
        links=_parse_links(data.get(_LINK_KEYS, [])),
    )


def _objects(raw: Any, key: str) -> Iterable[tuple[str, dict]]:
    """(where, entry) for each entry of the list under ``key``, each checked an object."""
    if not isinstance(raw, list):
        raise WorkloadError(f"'{key}' must be a list")
    for pos, entry in enumerate(raw):
        where = f"{key} #{pos}"
        if not isinstance(entry, dict):
            raise WorkloadError(f"{where}: must be an object")
        yield where, entry


def _parse_classes(raw: Any) -> tuple[AcceleratorClass, ...]:
    out = []
    for where, c in _objects(raw, _CLASS_KEYS):
        name = _need(c, "name", where)
        if not isinstance(name, str):
            raise WorkloadError(f"{where}: 'name' must be a string")
        out.append(AcceleratorClass(name, _integer(c, "count", f"accelerator class '{name}'"),
                                    _number(c, "memory", f"accelerator class '{name}'"),
                                    {k: v for k, v in c.items() if k not in ("name", "count", "memory")}))
    return tuple(out)


def _parse_links(raw: Any) -> tuple[Link, ...]:
    out = []
    for where, lk in _objects(raw, _LINK_KEYS):
        ends = _need(lk, "between", where)
        if not (isinstance(ends, list) and len(ends) == 2 and all(isinstance(x, str) for x in ends)):
            raise WorkloadError(f"{where}: 'between' must name two classes, e.g. [\"acc\", \"cpu\"]")
        out.append(Link(ends[0], ends[1], _number(lk, "scale", where, default=1.0),
                        _number(lk, "latency", where, default=0.0),
                        {k: v for k, v in lk.items() if k not in ("between", "scale", "latency")}))
    return tuple(out)


def topological_sort(n: int, succ: Iterable[Iterable[int]]) -> list[int] | None:
    """Kahn's algorithm with a stack (depth-first-ish, as the reference does); None on a cycle."""
    succ = list(succ)
    indeg = [0] * n
    for s in succ:
        for d in s:
            indeg[d] += 1
    stack = [v for v in range(n) if indeg[v] == 0]
    order = []
    while stack:
        v = stack.pop()
        order.append(v)
        for d in succ[v]:
            indeg[d] -= 1
            if indeg[d] == 0:
                stack.append(d)
    return order if len(order) == n else None


def _find_cycle(nodes, edges) -> list[int] | None:
    """Node ids along one cycle, or None for a DAG."""
    index = {nd.id: i for i, nd in enumerate(nodes)}
    succ: list[list[int]] = [[] for _ in nodes]
    for e in edges:
        succ[index[e.source]].append(index[e.dest])
    if topological_sort(len(nodes), succ) is not None:
        return None
    color = [0] * len(nodes)  # 0 new, 1 on stack, 2 done
    for root in range(len(nodes)):
        if color[root]:
            continue
        path, iters = [root], [iter(succ[root])]
        color[root] = 1
        while path:
            nxt = next(iters[-1], None)
            if nxt is None:
                color[path.pop()] = 2
                iters.pop()
            elif color[nxt] == 1:
                cyc = path[path.index(nxt):]
                return [nodes[i].id for i in cyc]
            elif color[nxt] == 0:
                color[nxt] = 1
                path.append(nxt)
                iters.append(iter(succ[nxt]))
    return None
