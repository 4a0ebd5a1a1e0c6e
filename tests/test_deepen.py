"""tools/deepen_workload.py: a layered training graph deepened by copies of one layer is the
graph built with that many layers in the first place (networkx's isomorphism is the judge)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import networkx as nx
import pytest

from onnxsplit.workload import Workload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("deepen_workload", os.path.join(ROOT, "tools", "deepen_workload.py"))
deepen_workload = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(deepen_workload)


def layered(layers: int) -> dict:
    """A training graph as the paper's operator files have it: an embedding (layer 0) with
    a mask every layer reads, ``layers`` encoder layers of three operators each (their
    gradients in their colour classes, gradients flowing back), each with a weight and its
    optimizer (no layerId, as in the paper's files), and a head with the loss."""
    nodes, edges = [], []

    def node(name, layer, fpga, backward=False, colour=None, size=0.0):
        nid = len(nodes) + 1
        n = {"name": name, "id": nid, "supportedOnFpga": 1, "fpgaLatency": fpga, "cpuLatency": 20 * fpga,
             "isBackwardNode": int(backward), "colorClass": colour if colour is not None else 1000 + nid,
             "size": size}
        if layer is not None:
            n["layerId"] = layer
        nodes.append(n)
        return nid

    def edge(s, d):  # a cost belongs to the source's tensor
        edges.append({"sourceId": s, "destId": d, "cost": {mask: 0.01}.get(s, 0.5 if "weight" in nodes[s - 1]["name"]
                                                                             else 1.0)})

    emb = node("Gather1", 0, 1.0, colour=1)
    mask = node("Mul1", 0, 0.1, colour=2)
    edge(emb, mask)
    out, fwd = emb, []
    for L in range(1, layers + 1):
        a = node(f"LayerNorm{L}", L, 2.0, colour=10 * L + 1)
        wgt = node(f"{L}_weight", None, 0.0, colour=10 * L + 4, size=100.0)
        b = node(f"MatMul{L}", L, 5.0, colour=10 * L + 2)
        c = node(f"Add{L}", L, 1.0, colour=10 * L + 3)
        edge(out, a)
        edge(a, b)
        edge(wgt, b)
        edge(mask, b)
        edge(b, c)
        edge(out, c)
        fwd.append((a, b, c, wgt))
        out = c
    head = node("Head", layers + 1, 3.0, colour=5)
    edge(out, head)
    grad = node("Head_Grad", layers + 1, 6.0, backward=True, colour=5)
    edge(head, grad)
    for L in range(layers, 0, -1):
        a, b, c, wgt = fwd[L - 1]
        gc = node(f"Add{L}_Grad", L, 1.0, backward=True, colour=10 * L + 3)
        gb = node(f"MatMul{L}_Grad", L, 10.0, backward=True, colour=10 * L + 2)
        ga = node(f"LayerNorm{L}_Grad", L, 4.0, backward=True, colour=10 * L + 1)
        opt = node(f"Adam_{L}", None, 0.2, backward=True, colour=10 * L + 4)
        edge(grad, gc)
        edge(gc, gb)
        edge(b, gb)  # what the forward pass saved
        edge(gb, ga)
        edge(a, ga)
        edge(gb, opt)
        grad = ga
    edge(grad, node("Gather1_Grad", 0, 1.0, backward=True, colour=1))
    return {"maxSizePerFPGA": 1e9, "maxFPGAs": 2, "maxCPUs": 1, "nodes": nodes, "edges": edges}


def _graph(data: dict) -> nx.DiGraph:
    g = nx.DiGraph()
    for n in data["nodes"]:
        g.add_node(n["id"], fpga=n["fpgaLatency"], backward=n["isBackwardNode"], size=n["size"])
    for e in data["edges"]:
        g.add_edge(e["sourceId"], e["destId"], cost=e["cost"])
    return g


def _same_colours(a: dict, b: dict, mapping: dict) -> bool:
    """Two nodes share a colour class in ``a`` exactly where their images do in ``b``."""
    ca = {n["id"]: n["colorClass"] for n in a["nodes"]}
    cb = {n["id"]: n["colorClass"] for n in b["nodes"]}
    pairs = {(ca[u], cb[v]) for u, v in mapping.items()}
    return len(pairs) == len({p for p, _ in pairs}) == len({q for _, q in pairs})


@pytest.mark.parametrize("template", [None, 2, 4])
def test_a_deepened_graph_is_the_graph_built_deeper(template):
    deeper = deepen_workload.deepen(layered(5), 3, template)
    built = layered(8)
    Workload.from_paper_json(deeper)  # valid: a DAG, classes, ids
    matcher = nx.algorithms.isomorphism.DiGraphMatcher(
        _graph(deeper), _graph(built),
        node_match=lambda x, y: x == y, edge_match=lambda x, y: x == y)
    assert matcher.is_isomorphic()
    assert _same_colours(deeper, built, matcher.mapping)
    assert len({n["colorClass"] for n in deeper["nodes"]}) == len({n["colorClass"] for n in built["nodes"]})


def test_a_copy_wired_wrong_is_not_the_graph_built_deeper():
    """The oracle can fail: a copy reading the template's input, not its predecessor's output."""
    deeper = deepen_workload.deepen(layered(5), 1, 3)
    add3 = next(n["id"] for n in deeper["nodes"] if n["name"] == "Add3")
    add2 = next(n["id"] for n in deeper["nodes"] if n["name"] == "Add2")
    for e in deeper["edges"]:
        if e["sourceId"] == add3 and e["destId"] > len(layered(5)["nodes"]):
            e["sourceId"] = add2
            break
    matcher = nx.algorithms.isomorphism.DiGraphMatcher(_graph(deeper), _graph(layered(6)),
                                                       node_match=lambda x, y: x == y)
    assert not matcher.is_isomorphic()


def test_the_tool_refuses_a_graph_without_layers_in_one_line(tmp_path):
    flat = layered(3)
    for n in flat["nodes"]:
        n.pop("layerId", None)
    src = tmp_path / "flat.json"
    src.write_text(json.dumps(flat))
    out = tmp_path / "out.json"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "deepen_workload.py"), str(src), str(out),
                          "--add", "2"], capture_output=True, text=True)
    assert run.returncode == 2 and not out.exists()
    assert run.stderr.count("\n") == 1 and "deepen_workload: error: no layer" in run.stderr
    src.write_text(json.dumps(layered(3)))
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "deepen_workload.py"), str(src), str(out),
                          "--add", "2", "--k", "3"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    assert data["maxFPGAs"] == 3 and len(data["nodes"]) == len(layered(5)["nodes"])
