"""Compile the solvers' numba kernels once, into numba's on-disk cache.

A kernel is compiled on its first call, and a first solve pays that out of its time
limit: the quick methods that warm-start the integer programs then spend their share of
it compiling, not searching (on BERT-base with a memory-limited GPU the latency warm
start took ten times as long on a cold cache).  ``make`` runs this after installing (so
does tools/gpu_check.sh on a fresh machine): every method but the integer programs, and
those programs' warm starts, on small workloads that reach the kernels, with a generous
time limit.  Kernels only large graphs reach (the throughput program's background
bounds) are still compiled on their first call.

    python -m onnxsplit.solve.precompile
"""

from __future__ import annotations

import sys
import time

from ..errors import OnnxsplitError
from ..workload import Workload
from . import methods, warm_starts


def _workload(memory: float, training: bool, classes: bool) -> dict:
    """Four blocks (a fork and join, then a chain) in a row: cut vertices between blocks,
    parallel branches inside; with ``training``, each node's backward twin in its colour
    class; with ``classes``, a second accelerator class (real servers' model)."""
    nodes, edges = [], []

    def node(i: int, cpu: float, acc: float, backward: bool = False, cc: int | None = None) -> None:
        d = {"id": i, "supportedOnFpga": 1, "cpuLatency": cpu, "fpgaLatency": acc,
             "isBackwardNode": int(backward), "size": 10.0}
        if cc is not None:
            d["colorClass"] = cc
        if classes:
            d["latencies"] = {"gpu": acc / 2}
        nodes.append(d)

    last = None
    for b in range(4):
        base = 10 * b
        for j, (cpu, acc) in enumerate([(4, 1), (9, 2), (7, 1.5), (3, 1), (6, 2)]):
            node(base + j, cpu + b, acc, cc=base + j if training else None)
        for s, t in [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]:
            edges.append({"sourceId": base + s, "destId": base + t, "cost": 0.5})
        if last is not None:
            edges.append({"sourceId": last, "destId": base, "cost": 0.5})
        last = base + 4
    if training:
        forward = [n["id"] for n in nodes]
        for i in forward:
            node(100 + i, 5.0, 1.0, backward=True, cc=i)
        for e in [e for e in edges if e["sourceId"] < 100]:
            edges.append({"sourceId": 100 + e["destId"], "destId": 100 + e["sourceId"], "cost": 0.5})
        edges.append({"sourceId": last, "destId": 100 + last, "cost": 0.5})
    data = {"maxSizePerFPGA": memory, "maxFPGAs": 2, "maxCPUs": 2, "nodes": nodes, "edges": edges}
    if classes:
        data["acceleratorClasses"] = [{"name": "gpu", "count": 1, "memory": memory}]
        data["links"] = [{"between": ["gpu", "cpu"], "scale": 0.5, "latency": 0.05}]
    return data


def precompile(time_limit: float = 120.0) -> int:
    """Run every method but the integer programs (HiGHS has no kernels to compile; their
    warm starts are run instead) on the small workloads; the number of solves run."""
    done = 0
    for memory in (1e9, 60.0):
        for training, classes in ((False, False), (True, False), (False, True)):
            w = Workload.from_paper_json(_workload(memory, training, classes))
            for objective in methods.OBJECTIVES:
                for name in methods.names(objective):
                    if name == "ip":
                        start = getattr(warm_starts, objective)
                        start(w, time_limit, methods.quick(objective), methods.quick_solve)
                        continue
                    try:
                        methods.solve(w, objective, name, methods.options_for(name, time_limit=time_limit))
                    except OnnxsplitError:
                        pass  # a method that does not take this workload: nothing to compile
                    done += 1
    return done


def main() -> int:
    t = time.perf_counter()
    n = precompile()
    print(f"onnxsplit: solver kernels compiled ({n} solves, {time.perf_counter() - t:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
