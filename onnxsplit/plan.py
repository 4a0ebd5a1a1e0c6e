"""Plan: which device runs each node, in what pipeline order, and how good that is.

Solvers return Plans; the evaluator is the one judge of them.  A Plan's JSON is the
solve object every ``onnxsplit solve`` prints (``objective``, ``method``, ``status``,
``value``, ``lower_bound``, ``gap``, ``seconds``, ``assignment``), so a plan file can be
edited by hand and re-applied.  Split files in the paper's format (``{"fpgas": [{"nodes":
[...]}], "cpus": [...]}``, e.g. the human-expert splits) are read here too.

Write-up: README.md (Workloads and solvers).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import SplitError
from .files import loads
from .workload import Workload

STATUSES = ("optimal", "feasible", "time_limit", "infeasible")


@dataclass
class Plan:
    objective: str  # "throughput" | "latency"
    method: str
    status: str
    value: float | None
    assignment: dict[int, str]  # node id -> device name
    lower_bound: float | None = None
    gap: float | None = None
    seconds: float = 0.0
    stages: list[str] = field(default_factory=list)  # devices in pipeline order
    details: dict[str, Any] = field(default_factory=dict)  # solver-specific facts
    # latency plans: node id -> piece (call) number on its accelerator; empty = derived
    pieces: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        d = asdict(self)
        d["assignment"] = {str(k): v for k, v in sorted(self.assignment.items())}
        d["pieces"] = {str(k): v for k, v in sorted(self.pieces.items())}
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Plan":
        try:
            assignment = {int(k): str(v) for k, v in d["assignment"].items()}
            return cls(
                objective=d.get("objective", "throughput"),
                method=d.get("method", "given"),
                status=d.get("status", "feasible"),
                value=d.get("value"),
                assignment=assignment,
                lower_bound=d.get("lower_bound"),
                gap=d.get("gap"),
                seconds=float(d.get("seconds", 0.0)),
                stages=list(d.get("stages", [])),
                details=dict(d.get("details", {})),
                pieces={int(k): int(v) for k, v in d.get("pieces", {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SplitError(f"not a plan object: {e}") from None


def gap_of(value: float | None, lower_bound: float | None) -> float | None:
    """Relative gap (value - bound) / value, as MIP solvers report it."""
    if value is None or lower_bound is None:
        return None
    if value == 0:
        return 0.0
    return max(0.0, (value - lower_bound) / abs(value))


def read_json(path: str | Path) -> Any:
    """A split or plan file's JSON; SplitError naming the file when it cannot be read."""
    try:
        return loads(Path(path).read_text())
    except OSError as e:
        raise SplitError(f"{path}: cannot read: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise SplitError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except UnicodeDecodeError:
        raise SplitError(f"{path}: not a JSON text file") from None


def read_split(path: str | Path, workload: Workload) -> dict[int, str]:
    """Read a split file (paper format, or a plan's JSON) as node id -> device name.

    The paper's expert splits list forward nodes only: a node left out takes the device of
    the other members of its colour class (so training splits take the backward nodes
    along).  Accelerators are numbered in file order, CPU entries likewise.
    """
    data = read_json(path)
    if isinstance(data, dict) and "assignment" in data:
        return Plan.from_json(data).assignment
    if not isinstance(data, dict) or "fpgas" not in data or "cpus" not in data:
        raise SplitError(f"{path}: expected a split with 'fpgas' and 'cpus' lists, or a plan with 'assignment'")
    assignment: dict[int, str] = {}
    for kind, key in (("acc", "fpgas"), ("cpu", "cpus")):
        for i, machine in enumerate(_split_entries(data[key], key, path)):
            for nid in machine:
                if nid in assignment:
                    raise SplitError(f"{path}: node {nid} is listed twice")
                assignment[nid] = f"{kind}{i}"
    return complete_by_color_class(assignment, workload, where=str(path))


def _split_entries(entries: Any, key: str, path) -> list[list[int]]:
    """The node ids of each device a split file's ``fpgas`` or ``cpus`` list uses (an
    entry without nodes uses none), each checked: SplitError naming what is malformed."""
    example = '[{"nodes": [1, 2]}, ...]'
    if not isinstance(entries, list):
        raise SplitError(f"{path}: '{key}' must be a list like {example}, got {_shown(entries)}")
    used = []
    for pos, entry in enumerate(entries):
        where = f"{path}: {key}[{pos}]"
        if not isinstance(entry, dict):
            raise SplitError(f"{where} must be an object like {{\"nodes\": [1, 2]}}, got {_shown(entry)}")
        nodes = entry.get("nodes")
        if nodes is None:
            continue
        if not isinstance(nodes, list):
            raise SplitError(f"{where}.nodes must be a list of node ids, got {_shown(nodes)}")
        for nid in nodes:
            if isinstance(nid, bool) or not (isinstance(nid, int) or isinstance(nid, float) and nid.is_integer()):
                raise SplitError(f"{where}.nodes: a node id is an integer, got {_shown(nid)}")
        if nodes:
            used.append([int(nid) for nid in nodes])
    return used


def _shown(value: Any) -> str:
    """A JSON value as the file spells it, cut short."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def complete_by_color_class(assignment: dict[int, str], workload: Workload, where: str = "split") -> dict[int, str]:
    """Assign every missing node the device of its colour class (the class must agree)."""
    unknown = [nid for nid in assignment if nid not in workload.index]
    if unknown:
        raise SplitError(f"{where}: node {unknown[0]} is not in the workload")
    by_class: dict[int, set[str]] = {}
    classes = workload.color_class
    for nid, dev in assignment.items():
        by_class.setdefault(int(classes[workload.index[nid]]), set()).add(dev)
    out = dict(assignment)
    for i, node in enumerate(workload.nodes):
        if node.id in out:
            continue
        devs = by_class.get(int(classes[i]), set())
        if len(devs) != 1:
            why = "no other member of its colour class is placed" if not devs else \
                "its colour class is placed on several devices"
            raise SplitError(f"{where}: node {node.id} is not placed and {why}")
        out[node.id] = next(iter(devs))
    return out
