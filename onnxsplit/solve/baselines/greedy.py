"""Greedy placements: the paper's latency greedy (accelerators filled one after another by
memory) and OpenVINO HETERO's (nodes in topological order to the first device that
supports them and has room).  Write-up: docs/baselines.md.
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from ...errors import SolveError
from ...plan import Plan
from ...workload import Workload
from ..classes import class_members, inseparable_blocks
from ..finish import finish, need_devices


def greedy(workload: Workload, objective: str = "latency") -> Plan:
    """The paper's latency greedy (its ``greedy.cpp``), respecting accelerator support.

    Blocks in topological order; open an accelerator and put blocks on it while they fit
    its memory; a block too large for any accelerator (or not supported, or arriving after
    the last accelerator is used) goes to the CPU, and the next block opens a fresh
    accelerator.  Each accelerator holds a range of one topological order, so its part is
    convex and the plan runs as a pipeline.
    """
    start = time.perf_counter()
    blocks = inseparable_blocks(workload)
    k, memory = workload.num_accelerators, workload.accelerator_memory
    ids = workload.ids
    assignment: dict[int, str] = {}
    stages: list[str] = []
    used = 0
    order = blocks.order
    i = 0

    def place(b: int, name: str) -> None:
        for v in blocks.members[b]:
            assignment[int(ids[v])] = name

    while i < len(order):
        b = order[i]
        if blocks.size[b] > memory or blocks.unsupported[b] or used == k:
            if workload.num_cpus == 0:
                raise SolveError("greedy: a block fits no accelerator and the workload has no CPU core")
            place(b, "cpu0")
            i += 1
            continue
        name = f"acc{used}"
        used += 1
        stages.append(name)
        total = 0.0
        while i < len(order) and not blocks.unsupported[order[i]] and total + blocks.size[order[i]] <= memory:
            total += blocks.size[order[i]]
            place(order[i], name)
            i += 1
    if "cpu0" in assignment.values():
        stages.append("cpu0")
    return finish(workload, objective, "greedy", assignment, start, stages=stages,
                  details={"blocks": len(order), "accelerators_used": used})


def hetero_greedy(workload: Workload, objective: str = "throughput") -> Plan:
    """Walk nodes in topological order (file order among ready nodes); each goes to the
    highest-priority device that supports it and still has room: acc0 until its memory is
    full, then acc1, ...; never back to an earlier one (with several classes, the devices
    in class order, a node skipping those that cannot run it).  Unsupported nodes, and
    nodes that fit no accelerator (or come after the last is full), run on the CPU.  A
    colour class is placed whole, when its first node is reached."""
    start = time.perf_counter()
    k = workload.accelerators_total
    memory = workload.class_memory[workload.device_class[:k]]
    members = class_members(workload)
    label = workload.color_class
    class_size = np.array([workload.size[m].sum() for m in members])
    runs = np.array([[bool(workload.class_supported[workload.device_class[d], m].all()) for d in range(k)]
                     for m in members], dtype=bool).reshape(len(members), k)
    device_of_class: dict[int, str] = {}
    current, used = 0, np.zeros(k)
    indeg = [len(p) for p in workload.predecessors]
    ready = [v for v in range(workload.n) if indeg[v] == 0]
    heapq.heapify(ready)
    while ready:
        v = heapq.heappop(ready)
        c = int(label[v])
        if c not in device_of_class:
            dev = None
            for d in range(current, k):
                if not runs[c, d] or class_size[c] > memory[d]:
                    continue
                if used[d] + class_size[c] > memory[d]:
                    if d == current:  # the device in hand is full: on to the next
                        current += 1
                    continue
                dev = workload.devices[d].name
                used[d] += class_size[c]
                break
            if dev is None:
                need_devices(workload, cpu=True, method="hetero_greedy")
                dev = "cpu0"
            device_of_class[c] = dev
        for w in workload.successors[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(ready, w)
    assignment = {int(workload.ids[v]): device_of_class[int(label[v])] for v in range(workload.n)}
    return finish(workload, objective, "hetero_greedy", assignment, start)
