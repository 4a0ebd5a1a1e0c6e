"""Small hand-built workloads for unit tests."""

from __future__ import annotations


def node(i, cpu=10.0, acc=1.0, size=0.0, supported=True, backward=False, cc=None, **extra):
    d = {"id": i, "supportedOnFpga": int(supported), "cpuLatency": cpu, "fpgaLatency": acc,
         "isBackwardNode": int(backward), "size": size, **extra}
    if cc is not None:
        d["colorClass"] = cc
    return d


def edge(s, t, cost=0.5):
    return {"sourceId": s, "destId": t, "cost": cost}


def workload(nodes, edges, k=2, l=1, mem=1e9):
    return {"maxSizePerFPGA": mem, "maxFPGAs": k, "maxCPUs": l, "nodes": nodes, "edges": edges}


def diamond(k=2, l=1, mem=1e9):
    """a -> b, a -> c, b -> d, c -> d with distinct costs."""
    return workload(
        [node(1, 10, 1), node(2, 20, 2), node(3, 30, 3), node(4, 40, 4)],
        [edge(1, 2, 0.5), edge(1, 3, 0.5), edge(2, 4, 0.25), edge(3, 4, 0.125)],
        k=k, l=l, mem=mem)
