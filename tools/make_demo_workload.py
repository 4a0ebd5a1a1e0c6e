#!/usr/bin/env python3
"""Build models/demo_workload.json: a small transformer encoder as a placement workload.

Until the ONNX importer lands, ``make demo`` splits this.  Four encoder layers (LayerNorm,
Q/K/V projections in parallel, attention, output projection, residual, feed-forward), a
latency from FLOPs at 50 GFLOP/s per CPU core and 2 TFLOP/s per accelerator, weights as
memory, and transfer cost = bytes / 16 GB/s.  Three accelerators with 40 MB each (memory
binds: the weights are 4 x 28 MB) and two CPU cores.

    python tools/make_demo_workload.py [OUT.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HIDDEN, SEQ, FFN, LAYERS = 768, 128, 3072, 4
CPU_FLOPS, ACC_FLOPS, LINK = 50e9, 2e12, 16e9
ACT = SEQ * HIDDEN * 4  # bytes of one activation


def build() -> dict:
    nodes, edges = [], []

    def add(name, flops, weights=0, act_bytes=ACT, supported=True):
        nid = len(nodes) + 1
        nodes.append({"name": name, "id": nid, "supportedOnFpga": int(supported),
                      "cpuLatency": round(1e3 * flops / CPU_FLOPS, 6),
                      "fpgaLatency": round(1e3 * flops / ACC_FLOPS, 6),
                      "isBackwardNode": 0, "size": float(weights), "_out": act_bytes})
        return nid

    def link(src, dst):
        edges.append({"sourceId": src, "destId": dst, "cost": round(1e3 * nodes[src - 1]["_out"] / LINK, 6)})

    prev = add("embeddings", 2 * SEQ * HIDDEN, weights=30522 * HIDDEN * 4, supported=False)
    for i in range(LAYERS):
        ln = add(f"layer{i}.ln1", 8 * SEQ * HIDDEN)
        link(prev, ln)
        qkv = []
        for part in "qkv":
            n = add(f"layer{i}.{part}", 2 * SEQ * HIDDEN * HIDDEN, weights=HIDDEN * HIDDEN * 4)
            link(ln, n)
            qkv.append(n)
        attn = add(f"layer{i}.attention", 4 * SEQ * SEQ * HIDDEN)
        for n in qkv:
            link(n, attn)
        proj = add(f"layer{i}.out_proj", 2 * SEQ * HIDDEN * HIDDEN, weights=HIDDEN * HIDDEN * 4)
        link(attn, proj)
        res1 = add(f"layer{i}.residual1", SEQ * HIDDEN)
        link(proj, res1)
        link(prev, res1)
        ln2 = add(f"layer{i}.ln2", 8 * SEQ * HIDDEN)
        link(res1, ln2)
        ff1 = add(f"layer{i}.ffn_up", 2 * SEQ * HIDDEN * FFN, weights=HIDDEN * FFN * 4, act_bytes=SEQ * FFN * 4)
        link(ln2, ff1)
        ff2 = add(f"layer{i}.ffn_down", 2 * SEQ * HIDDEN * FFN, weights=HIDDEN * FFN * 4)
        link(ff1, ff2)
        prev = add(f"layer{i}.residual2", SEQ * HIDDEN)
        link(ff2, prev)
        link(res1, prev)
    head = add("pooler", 2 * HIDDEN * HIDDEN, weights=HIDDEN * HIDDEN * 4)
    link(prev, head)
    for n in nodes:
        del n["_out"]
    return {"maxSizePerFPGA": 40e6, "maxFPGAs": 3, "maxCPUs": 2, "nodes": nodes, "edges": edges}


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "models" / "demo_workload.json")
    out.write_text(json.dumps(build(), indent=1) + "\n")
    print(f"wrote {out}")
