#!/usr/bin/env python3
"""Deepen a layered workload (the paper's JSON) by copying one of its layers: an operator
BERT-24 training graph from the paper's BERT-12, where no deeper file was published.

The paper's operator graphs give each node the encoder layer it belongs to (``layerId``).
One layer (``--template``, default the middle one) is copied ``--add`` times.  The copies
sit between the template and the layer after it, each wired to the next as the template
is to its successor (forward out of its last residual, gradients back into it), each
reading what the template reads from outside the chain (the attention mask), with its
own colour classes and its own weights (nodes without a layer that only the template
touches).  Generated graphs (``make_large_workload.py``)
are what a generator thinks a network is; this is the network the paper measured, made
longer, which is the held-out case the solvers must prove.

    python tools/deepen_workload.py IN.json OUT.json --add 12 [--template L] [--k K] [--l L]

(``--add 12`` on the paper's bert_L-12_training.json: 24 encoder layers.)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path


def deepen(data: dict, extra: int, template: int | None = None) -> dict:
    """The workload with ``extra`` copies of layer ``template`` (default: the middle one
    of those with a layer on either side)."""
    nodes, edges = data["nodes"], data["edges"]
    layer_of = {n["id"]: n.get("layerId") for n in nodes}
    numbered = sorted({v for v in layer_of.values() if isinstance(v, int)})
    wired = {(layer_of[e["sourceId"]], layer_of[e["destId"]]) for e in edges}
    inner = [v for v in numbered if (v - 1, v) in wired and (v, v + 1) in wired]
    if not inner:
        raise ValueError("no layer (layerId) is wired to one before it and one after it")
    t = template if template is not None else inner[len(inner) // 2]
    if t not in inner:
        raise ValueError(f"layer {t} is not wired to a layer on either side (those that are: "
                         f"{', '.join(map(str, inner))})")
    if extra <= 0:
        return data
    neighbours = defaultdict(set)
    for e in edges:
        neighbours[e["sourceId"]].add(layer_of[e["destId"]])
        neighbours[e["destId"]].add(layer_of[e["sourceId"]])
    # the template: its layer's nodes and the unlayered ones only it touches (its weights)
    inside = {n["id"] for n in nodes if layer_of[n["id"]] == t or
              (layer_of[n["id"]] is None and neighbours[n["id"]] <= {t, None} and t in neighbours[n["id"]])}
    classes = defaultdict(set)
    for n in nodes:
        classes[n.get("colorClass", ("own", n["id"]))].add(n["id"])
    for members in classes.values():
        if members & inside and not members <= inside:
            raise ValueError(f"a colour class spans layer {t} and the rest: it cannot be copied")
    by_id = {n["id"]: n for n in nodes}
    after = [e for e in edges if e["sourceId"] in inside and layer_of[e["destId"]] == t + 1 or
             layer_of[e["sourceId"]] == t + 1 and e["destId"] in inside]
    before = [e for e in edges if layer_of[e["sourceId"]] == t - 1 and e["destId"] in inside or
              e["sourceId"] in inside and layer_of[e["destId"]] == t - 1]
    port = _ports(by_id, before, after, inside)
    next_id = max(by_id) + 1
    next_class = max((n["colorClass"] for n in nodes if "colorClass" in n), default=0) + 1
    out_nodes = [dict(n, layerId=n["layerId"] + extra) if isinstance(n.get("layerId"), int) and n["layerId"] > t
                 else dict(n) for n in nodes]
    out_edges = [e for e in edges if not any(e is a for a in after)]
    # what each copy repeats: the template's own edges, and those to and from outside the
    # chain of layers (the attention mask it reads, the head's gradients it sends)
    own = [e for e in edges if e["sourceId"] in inside and e["destId"] in inside]
    out = [e for e in edges if e["sourceId"] in inside and e["destId"] not in inside
           and layer_of[e["destId"]] not in (t - 1, t + 1)]
    into = [e for e in edges if e["destId"] in inside and e["sourceId"] not in inside
            and layer_of[e["sourceId"]] not in (t - 1, t + 1)]
    previous = {v: v for v in inside}  # the copy before (at first the template itself)
    for c in range(1, extra + 1):
        copy, recoloured = {}, {}
        for v in sorted(inside):
            copy[v] = next_id
            next_id += 1
            n = dict(by_id[v], id=copy[v], name=f"{by_id[v].get('name', v)}@{c}")
            if isinstance(n.get("layerId"), int):
                n["layerId"] = t + c
            if "colorClass" in n:
                if n["colorClass"] not in recoloured:
                    recoloured[n["colorClass"]] = next_class
                    next_class += 1
                n["colorClass"] = recoloured[n["colorClass"]]
            out_nodes.append(n)
        out_edges += [dict(e, sourceId=copy[e["sourceId"]], destId=copy[e["destId"]]) for e in own]
        out_edges += [dict(e, sourceId=copy[e["sourceId"]]) for e in out]
        out_edges += [dict(e, destId=copy[e["destId"]]) for e in into]
        for e in after:  # the copy before is wired to this one as the template to its successor
            if e["sourceId"] in inside:
                out_edges.append(dict(e, sourceId=previous[e["sourceId"]], destId=copy[port[e["destId"]]]))
            else:
                out_edges.append(dict(e, sourceId=copy[port[e["sourceId"]]], destId=previous[e["destId"]]))
        previous = copy
    for e in after:  # the last copy to the template's successor
        if e["sourceId"] in inside:
            out_edges.append(dict(e, sourceId=previous[e["sourceId"]]))
        else:
            out_edges.append(dict(e, destId=previous[e["destId"]]))
    return {**{k: v for k, v in data.items() if k not in ("nodes", "edges")}, "nodes": out_nodes, "edges": out_edges}


def _ports(by_id: dict, before: list, after: list, inside: set) -> dict:
    """Each successor node on the template's boundary -> the template's node in its place
    (the one its predecessor wires to the same way), matched by pass and name less digits."""
    def key(v):
        n = by_id[v]
        return bool(n.get("isBackwardNode")), re.sub(r"\d+", "#", str(n.get("name", "")))

    own = defaultdict(list)
    for e in before:
        v = e["destId"] if e["destId"] in inside else e["sourceId"]
        if v not in own[key(v)]:
            own[key(v)].append(v)
    port = {}
    for e in after:
        v = e["destId"] if e["sourceId"] in inside else e["sourceId"]
        match = own.get(key(v), [])
        if len(match) != 1:
            raise ValueError(f"node {v} of the next layer has no single counterpart in the template")
        port[v] = match[0]
    return port


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source")
    ap.add_argument("out")
    ap.add_argument("--add", type=int, required=True, help="copies of the template layer to add")
    ap.add_argument("--template", type=int, help="the layer copied (default: the middle one)")
    ap.add_argument("--k", type=int, help="accelerators (default: the source's)")
    ap.add_argument("--l", type=int, help="CPU cores (default: the source's)")
    args = ap.parse_args(argv)
    try:
        out = deepen(json.loads(Path(args.source).read_text()), args.add, args.template)
    except (ValueError, KeyError, OSError, json.JSONDecodeError) as error:
        print(f"deepen_workload: error: {error}", file=sys.stderr)
        return 2
    if args.k is not None:
        out["maxFPGAs"] = args.k
    if args.l is not None:
        out["maxCPUs"] = args.l
    tmp = Path(args.out + ".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(args.out)
    print(f"wrote {args.out}: {len(out['nodes'])} nodes, {len(out['edges'])} edges")
    return 0


if __name__ == "__main__":
    sys.exit(main())
