#!/usr/bin/env python3
"""Build a large placement workload (the paper's JSON) shaped like a transformer export.

Each layer is what an ONNX export of an encoder layer holds, about 57 operators: the
layer norms decomposed (ReduceMean, Sub, Pow, Sqrt, Div, ...), Q/K/V projections with
their bias Adds, Reshape/Transpose per head, the shape arithmetic that feeds them
(Shape, Gather, Unsqueeze, Concat: tiny), attention (MatMul, scale, mask,
Softmax, MatMul), the output projection, GELU decomposed, the feed-forward and the
residuals.  Latencies come from FLOPs (50 GFLOP/s per CPU core, 2 TFLOP/s per
accelerator, jittered by ``--seed``), weights are the memory, transfers bytes / 16 GB/s.
Layers are added until ``--nodes`` is reached; ``--shared-mask`` makes the attention mask
once, from the input, for every layer (as real exports do: then no node is on every
path); ``--isolated N`` instead gives N nodes without edges.

    python tools/make_large_workload.py OUT.json [--nodes 10000] [--k 4] [--l 2]
        [--memory-share 0.3] [--seed 0] [--isolated N] [--shared-mask]

``--memory-share`` is each accelerator's memory as a share of all the weights (0: no
limit).  Used by ``tools/bench_deadlines.py`` and the deadline tests.

``--structure varied`` builds instead a chain of blocks of about ``--block-nodes`` operators
whose shape the seed draws, block by block, so that no method or bound is tuned to one
generator: parallel branches (fan-outs of one to three, joined again), tiny shape
arithmetic the accelerators do not take (fed from the model's input, as exports hoist it, or
from inside the block), skip connections reading a block two to four back, and blocks
heavy or light (their work scaled from a tenth to four times).  ``--shapes`` fixes where
the shape arithmetic reads from.  ``--training`` adds the backward pass (each node's
gradient node in its colour class, gradients flowing back along every edge).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HIDDEN, SEQ, FFN = 768, 128, 3072
CPU_FLOPS, ACC_FLOPS, LINK = 50e9, 2e12, 16e9
ACT = SEQ * HIDDEN * 4


class _Builder:
    def __init__(self, seed: int):
        self.nodes: list[dict] = []
        self.edges: list[dict] = []
        self.rng = random.Random(seed)

    def add(self, name: str, flops: float, inputs=(), weights: float = 0.0,
            out_bytes: float = ACT, supported: bool = True) -> int:
        nid = len(self.nodes) + 1
        jitter = self.rng.uniform(0.8, 1.25)
        self.nodes.append({"name": name, "id": nid, "supportedOnFpga": int(supported),
                           "cpuLatency": round(1e3 * max(flops, 1e3) * jitter / CPU_FLOPS, 6),
                           "fpgaLatency": round(1e3 * max(flops, 1e4) * jitter / ACC_FLOPS, 6),
                           "isBackwardNode": 0, "size": float(weights), "_out": out_bytes})
        for src in inputs:
            self.edges.append({"sourceId": src, "destId": nid,
                               "cost": round(1e3 * self.nodes[src - 1]["_out"] / LINK, 6)})
        return nid

    def layer_norm(self, p: str, x: int) -> int:
        m = self.add(f"{p}.mean", SEQ * HIDDEN, [x], out_bytes=SEQ * 4)
        d = self.add(f"{p}.sub", SEQ * HIDDEN, [x, m])
        sq = self.add(f"{p}.pow", SEQ * HIDDEN, [d])
        v = self.add(f"{p}.var", SEQ * HIDDEN, [sq], out_bytes=SEQ * 4)
        e = self.add(f"{p}.eps", SEQ, [v], out_bytes=SEQ * 4)
        s = self.add(f"{p}.sqrt", SEQ, [e], out_bytes=SEQ * 4)
        n = self.add(f"{p}.div", SEQ * HIDDEN, [d, s])
        g = self.add(f"{p}.gamma", SEQ * HIDDEN, [n], weights=HIDDEN * 4)
        return self.add(f"{p}.beta", SEQ * HIDDEN, [g], weights=HIDDEN * 4)

    def linear(self, p: str, x: int, n_in: int, n_out: int) -> int:
        mm = self.add(f"{p}.matmul", 2 * SEQ * n_in * n_out, [x], weights=n_in * n_out * 4,
                      out_bytes=SEQ * n_out * 4)
        return self.add(f"{p}.bias", SEQ * n_out, [mm], weights=n_out * 4, out_bytes=SEQ * n_out * 4)

    def layer(self, i: int, x: int, mask: int | None = None) -> int:
        p = f"layer{i}"
        ln = self.layer_norm(f"{p}.ln1", x)
        shape = self.add(f"{p}.shape", 1, [ln], out_bytes=24)
        dim = self.add(f"{p}.gather", 1, [shape], out_bytes=8)
        unsq = self.add(f"{p}.unsqueeze", 1, [dim], out_bytes=8)
        new_shape = self.add(f"{p}.concat", 1, [unsq], out_bytes=32)
        heads = []
        for part in "qkv":
            h = self.linear(f"{p}.{part}", ln, HIDDEN, HIDDEN)
            r = self.add(f"{p}.{part}.reshape", 1, [h, new_shape])
            heads.append(self.add(f"{p}.{part}.transpose", SEQ * HIDDEN, [r]))
        qk = self.add(f"{p}.qk", 2 * SEQ * SEQ * HIDDEN, heads[:2], out_bytes=12 * SEQ * SEQ * 4)
        sc = self.add(f"{p}.scale", 12 * SEQ * SEQ, [qk], out_bytes=12 * SEQ * SEQ * 4)
        mk = self.add(f"{p}.mask", 12 * SEQ * SEQ, [sc] + ([mask] if mask else []),
                      out_bytes=12 * SEQ * SEQ * 4)
        sm = self.add(f"{p}.softmax", 5 * 12 * SEQ * SEQ, [mk], out_bytes=12 * SEQ * SEQ * 4)
        av = self.add(f"{p}.av", 2 * SEQ * SEQ * HIDDEN, [sm, heads[2]])
        t = self.add(f"{p}.merge.transpose", SEQ * HIDDEN, [av])
        r = self.add(f"{p}.merge.reshape", 1, [t, new_shape])
        o = self.linear(f"{p}.out", r, HIDDEN, HIDDEN)
        res1 = self.add(f"{p}.residual1", SEQ * HIDDEN, [o, x])
        ln2 = self.layer_norm(f"{p}.ln2", res1)
        up = self.linear(f"{p}.ffn_up", ln2, HIDDEN, FFN)
        g1 = self.add(f"{p}.gelu.div", SEQ * FFN, [up], out_bytes=SEQ * FFN * 4)
        g2 = self.add(f"{p}.gelu.erf", 10 * SEQ * FFN, [g1], out_bytes=SEQ * FFN * 4)
        g3 = self.add(f"{p}.gelu.add", SEQ * FFN, [g2], out_bytes=SEQ * FFN * 4)
        g4 = self.add(f"{p}.gelu.mul", SEQ * FFN, [up, g3], out_bytes=SEQ * FFN * 4)
        g5 = self.add(f"{p}.gelu.half", SEQ * FFN, [g4], out_bytes=SEQ * FFN * 4)
        down = self.linear(f"{p}.ffn_down", g5, FFN, HIDDEN)
        return self.add(f"{p}.residual2", SEQ * HIDDEN, [down, res1])


    def varied_block(self, i: int, x: int, earlier: list[int], source: int, size: int,
                     shapes: str = "mixed") -> int:
        """One block of about ``size`` operators, its structure drawn from the seed."""
        rng, p = self.rng, f"block{i}"
        scale = rng.choice((0.1, 0.3, 1.0, 1.0, 2.0, 4.0))
        width = int(HIDDEN * min(2.0, max(0.25, scale ** 0.5)))
        if len(earlier) >= 4 and rng.random() < 0.3:  # a skip connection across blocks
            x = self.add(f"{p}.skip", SEQ * width, [x, earlier[-rng.randint(2, 4)]])
        shape = None
        where = rng.choice(("none", "input", "inline")) if shapes == "mixed" else shapes
        if where != "none":  # shape arithmetic the accelerators do not take
            s = self.add(f"{p}.shape", 1, [source if where == "input" else x], out_bytes=24, supported=False)
            g = self.add(f"{p}.gather", 1, [s], out_bytes=8, supported=False)
            shape = self.add(f"{p}.concat", 1, [g], out_bytes=32, supported=False)
        branches = rng.choice((1, 1, 2, 3))
        per = max(2, (size - 6) // branches)
        ends = []
        for b in range(branches):
            y = x
            for j in range(per):
                kind = rng.random()
                if kind < 0.4:  # a projection: weights and most of the work
                    y = self.add(f"{p}.b{b}.matmul{j}", 2 * SEQ * width * width * scale, [y],
                                 weights=width * width * 4, out_bytes=SEQ * width * 4)
                elif kind < 0.5 and shape is not None:
                    y = self.add(f"{p}.b{b}.reshape{j}", 1, [y, shape], out_bytes=SEQ * width * 4)
                else:  # elementwise and reductions: little work, a full activation out
                    y = self.add(f"{p}.b{b}.ew{j}", SEQ * width * rng.choice((1, 5, 10)) * scale, [y],
                                 out_bytes=SEQ * width * 4)
            ends.append(y)
        y = self.add(f"{p}.join", SEQ * width, ends + [x] + ([shape] if shape else []), out_bytes=SEQ * HIDDEN * 4)
        return self.add(f"{p}.out", 2 * SEQ * width * HIDDEN * scale, [y], weights=width * HIDDEN * 4)


def with_training(nodes: list[dict], edges: list[dict]) -> tuple[list[dict], list[dict]]:
    """The training graph of a forward graph: each node's gradient node, twice its time, in
    its colour class (where its weights are, there is their gradient); gradients flow back
    along every edge reversed, and each gradient node reads what its forward node saved."""
    first = max(n["id"] for n in nodes) + 1
    back = {n["id"]: first + i for i, n in enumerate(nodes)}
    cost = {e["sourceId"]: e["cost"] for e in edges}
    grads = []
    for n in nodes:
        n["colorClass"] = n["id"]
        grads.append({**n, "name": n["name"] + ".grad", "id": back[n["id"]], "isBackwardNode": 1,
                      "cpuLatency": round(2 * n["cpuLatency"], 6), "fpgaLatency": round(2 * n["fpgaLatency"], 6),
                      "size": 0.0})
    flows = [{"sourceId": back[e["destId"]], "destId": back[e["sourceId"]], "cost": e["cost"]} for e in edges]
    saved = [{"sourceId": n["id"], "destId": back[n["id"]], "cost": cost.get(n["id"], 0.0)} for n in nodes]
    loss = nodes[-1]["id"]  # the last forward node's gradient starts the backward pass (the
    # gradients of nodes that feed nothing too)
    fed = {e["destId"] for e in flows}
    saved = [e for e in saved if e["sourceId"] != loss] + [
        {"sourceId": loss, "destId": back[n["id"]], "cost": 0.0} for n in nodes if back[n["id"]] not in fed]
    out_cost = {}
    for e in flows + saved:  # every out-edge of a node carries its tensor's one cost
        e["cost"] = out_cost.setdefault(e["sourceId"], e["cost"])
    return nodes + grads, edges + flows + saved


def build(nodes: int, k: int, l: int, memory_share: float, seed: int, isolated: int = 0,
          shared_mask: bool = False, structure: str = "encoder", block_nodes: int = 20,
          shapes: str = "mixed", training: bool = False) -> dict:
    b = _Builder(seed)
    if structure == "varied":
        source = x = b.add("input", SEQ, out_bytes=SEQ * 8, supported=False)
        blocks = []
        while len(b.nodes) < nodes - 1:
            x = b.varied_block(len(blocks), x, blocks, source, block_nodes, shapes)
            blocks.append(x)
        b.add("head", 2 * HIDDEN * HIDDEN, [x], weights=HIDDEN * HIDDEN * 4)
    elif isolated:
        for i in range(isolated):
            b.add(f"n{i}", b.rng.uniform(1e5, 1e8), weights=b.rng.uniform(0, 1e6))
    else:
        x = b.add("embeddings", 2 * SEQ * HIDDEN, weights=30522 * HIDDEN * 4, supported=False)
        mask = None
        if shared_mask:  # the attention mask made once from the input ids, read by every layer
            mask = x
            for step in ("unsqueeze", "cast", "sub", "mul"):
                mask = b.add(f"mask.{step}", SEQ, [mask], out_bytes=SEQ * 4)
        i = 0
        while len(b.nodes) < nodes - 1:
            x = b.layer(i, x, mask)
            i += 1
        b.add("pooler", 2 * HIDDEN * HIDDEN, [x], weights=HIDDEN * HIDDEN * 4)
    for n in b.nodes:
        del n["_out"]
    if training:
        b.nodes, b.edges = with_training(b.nodes, b.edges)
    total = sum(n["size"] for n in b.nodes if n["supportedOnFpga"])
    mem = memory_share * total if memory_share > 0 else 1e18
    return {"maxSizePerFPGA": mem, "maxFPGAs": k, "maxCPUs": l, "nodes": b.nodes, "edges": b.edges}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--k", type=int, default=4, help="accelerators (default 4)")
    ap.add_argument("--l", type=int, default=2, help="CPU cores (default 2)")
    ap.add_argument("--memory-share", type=float, default=0.0,
                    help="each accelerator's memory over all the weights (default 0: no limit)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--isolated", type=int, default=0, help="N nodes without edges instead")
    ap.add_argument("--shared-mask", action="store_true",
                    help="one attention mask, made from the input, read by every layer (as exports have)")
    ap.add_argument("--structure", choices=("encoder", "varied"), default="encoder",
                    help="transformer encoder layers (default), or blocks whose structure the seed draws")
    ap.add_argument("--block-nodes", type=int, default=20, help="operators per block with --structure varied")
    ap.add_argument("--shapes", choices=("mixed", "input", "inline", "none"), default="mixed",
                    help="with --structure varied: where each block's shape arithmetic reads from "
                         "(the model's input, inside the block, none, or drawn per block: mixed)")
    ap.add_argument("--training", action="store_true",
                    help="the training graph: each node's gradient node in its colour class (--nodes counts the forward pass)")
    a = ap.parse_args(argv)
    w = build(a.nodes, a.k, a.l, a.memory_share, a.seed, a.isolated, a.shared_mask, a.structure, a.block_nodes,
              a.shapes, a.training)
    Path(a.out).write_text(json.dumps(w) + "\n")
    print(f"wrote {a.out}: {len(w['nodes'])} nodes, {len(w['edges'])} edges")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
