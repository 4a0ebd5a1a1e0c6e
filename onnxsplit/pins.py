"""--pin REGEX=DEVICE: operators the user places by hand, forced in the workload before
it is solved (and checked in the plan that comes back)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Iterable

from .errors import OnnxsplitError


def parse_pins(specs: Iterable[str], workload, accelerator) -> list[tuple[str, re.Pattern, str]]:
    """'REGEX=DEVICE' -> (spec, pattern, device class): DEVICE is ``cpu``, or the
    accelerator's name or class (or ``acc``); with several accelerator classes, ``acc``
    (any of them) or a class's name."""
    out = []
    acc_names = {"acc"} | ({accelerator.name, accelerator.cls} if accelerator is not None else set())
    if workload.accelerator_classes:
        acc_names = {"acc"} | {c.name for c in workload.accelerator_classes if c.count}
    for spec in specs:
        rx, sep, dev = spec.rpartition("=")
        if not sep or not rx or not dev:
            raise OnnxsplitError(f"--pin '{spec}': expected REGEX=DEVICE, e.g. 'Shape|Gather=cpu'")
        try:
            pattern = re.compile(rx)
        except re.error as e:
            raise OnnxsplitError(f"--pin '{spec}': bad regular expression: {e}") from None
        if dev == "cpu":
            kind = "cpu"
        elif dev in acc_names:
            kind = dev if workload.accelerator_classes else "acc"
            if workload.accelerators_total == 0:
                raise OnnxsplitError(f"--pin '{spec}': there is no accelerator to pin to")
        else:
            raise OnnxsplitError(f"--pin '{spec}': unknown device '{dev}' "
                                 f"(choose from {', '.join(['cpu'] + sorted(acc_names))})")
        out.append((spec, pattern, kind))
    return out


def apply_pins(workload, pins) -> tuple[Any, dict[int, str]]:
    """The workload with pinned nodes forced: to the CPU by marking them unsupported on the
    accelerator, to the accelerator by a CPU latency no plan can afford.  A node matches
    when the pattern is found in its name or equals its op type.  Returns (workload,
    node id -> pinned device class)."""
    pinned: dict[int, str] = {}
    for spec, pattern, kind in pins:
        hits = [n for n in workload.nodes
                if pattern.search(n.name or "") or pattern.fullmatch(n.extra.get("opType", ""))]
        if not hits:
            raise OnnxsplitError(f"--pin '{spec}' matches no operator (by name or op type)")
        for n in hits:
            pinned[n.id] = kind
    if not pinned:
        return workload, pinned
    huge = 1e3 * (float(workload.cpu_latency.sum()) + float(workload.class_latency.sum()) + 1.0)
    nodes = []
    for n in workload.nodes:
        kind = pinned.get(n.id)
        if kind == "cpu":
            n = replace(n, supported=False, latencies=())
        elif kind is not None:
            if kind != "acc":  # one class of several: the others cannot run it
                n = replace(n, supported=n.supported and kind == "acc",
                            latencies=tuple((c, t) for c, t in n.latencies if c == kind))
            if not (n.supported or n.latencies):
                raise OnnxsplitError(f"--pin: operator '{n.name}' is pinned to "
                                     f"{'the accelerator' if kind == 'acc' else kind} but it cannot run it")
            n = replace(n, cpu_latency=huge)
        nodes.append(n)
    return replace(workload, nodes=tuple(nodes)), pinned


def pinned_where(workload, device: str, kind: str) -> bool:
    """Is ``device`` one a node pinned to ``kind`` (cpu, acc or a class's name) may be on."""
    index = workload.device_index[device]
    if kind == "cpu":
        return not workload.is_accelerator(index)
    return workload.is_accelerator(index) and (
        kind == "acc" or workload.class_names[workload.device_class[index]] == kind)
