#!/usr/bin/env python3
"""Benchmark the baselines on the paper's workloads against the paper's own programs.

One table: workload, objective, method, our value, the reference value (expected.json),
ratio, seconds, whether our plan is memory-feasible, and a note.  "reference ignores
memory" marks rows whose reference value comes from a plan that breaks the memory limit
(the paper's programs only warn about memory for their baselines); "(plan unknown)" where
the reference ignored memory but its plan is not known.

    python tools/bench_baselines.py [--data DIR] [--kind throughput|latency|all] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

THROUGHPUT = [  # (method, reference key or None)
    ("local_search", "local_search10"),
    ("pipedream", "pipedream"),
    ("scotch", "scotch"),
    ("metis", None),
    ("one_accelerator", "one_accelerator"),
    ("given", "expert"),
    ("ort_default", None),
    ("hetero_greedy", None),
    ("greedy", None),
]
LATENCY = [
    ("greedy", "greedy"),
    ("given", "expert_split"),
    ("hetero_greedy", None),
    ("ort_default", None),
    ("one_accelerator", None),
]
REFERENCE_IGNORES_MEMORY = {"local_search", "scotch", "one_accelerator", "given"}
EXPERTS = {"bert24": "bert24", "gnmt": "gnmt", "inceptionv3": "inceptionv3", "resnet50": "resnet50"}


def default_data() -> Path:
    return Path(os.environ.get("ONNXSPLIT_PAPER_DATA", HERE.parent.parent / "shared" / "paper-workloads"))


def expert_file(data: Path, name: str) -> Path | None:
    """The human-expert split for a layer workload (training ones lift the inference split
    where no training split exists, as the paper does)."""
    if not name.startswith("layer_"):
        return None
    model, mode = name[len("layer_"):-len(".json")].rsplit("_", 1)
    for m in (mode, "inference"):
        p = data / "human-experts" / f"{model}_{m}_expert.json"
        if p.is_file():
            return p
    return None


def reference(row: dict, key: str | None) -> tuple[float | None, str | None]:
    """(value, the key it was found under); keys with suffixes (_over_memory, _lifted...)."""
    if key is None:
        return None, None
    for k, v in row.items():
        if (k == key or k.startswith(key + "_")) and isinstance(v, (int, float)):
            return float(v), k
    return None, None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=default_data())
    ap.add_argument("--kind", choices=["throughput", "latency", "all"], default="all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--restarts", type=int, default=10)
    args = ap.parse_args()

    from onnxsplit.errors import OnnxsplitError
    from onnxsplit.solve import methods as registry
    from onnxsplit.workload import Workload

    expected = json.loads((args.data / "expected.json").read_text())
    # compile the JIT kernels before timing anything
    warm = Workload.from_paper_json(args.data / "throughput" / "layer_bert24_inference.json")
    for m in ("local_search", "pipedream", "scotch", "metis"):
        registry.solve(warm, "throughput", m, registry.options_for(m, others="ignore", restarts=1))

    kinds = ["throughput", "latency"] if args.kind == "all" else [args.kind]
    head = (f"{'workload':34} {'objective':10} {'method':15} {'value':>11} {'reference':>11} {'ratio':>7} "
            f"{'seconds':>8} {'mem-ok':>6}  note")
    print(head)
    print("-" * len(head))
    for kind in kinds:
        methods = THROUGHPUT if kind == "throughput" else LATENCY
        for path in sorted((args.data / kind).glob("*.json"), key=lambda p: p.stat().st_size):
            name = path.name
            w = Workload.from_paper_json(path)
            row = expected.get(kind, {}).get(name, {})
            for method, key in methods:
                split = None
                if method == "given":
                    split = expert_file(args.data, name)
                    if split is None:
                        continue
                t = time.perf_counter()
                try:
                    plan = registry.solve(w, kind, method, registry.options_for(
                        method, others="ignore", seed=args.seed, restarts=args.restarts, split=split))
                except OnnxsplitError as e:
                    print(f"{name:34} {kind:10} {method:15} error: {e}")
                    continue
                seconds = time.perf_counter() - t
                ref, ref_key = reference(row, key)
                if method == "given" and kind == "throughput" and ref is None:
                    ref, ref_key = reference(row, "expert_lifted_from_inference")
                violations = plan.details.get("violations", [])
                mem_ok = not any(v.startswith("memory:") for v in violations)
                notes = []
                known_plan = method in ("one_accelerator", "given")  # the reference's plan is ours
                if ref_key and ref_key.endswith("over_memory"):
                    notes.append("reference ignores memory (its plan breaks the limit)")
                elif ref is not None and method in REFERENCE_IGNORES_MEMORY:
                    if known_plan and not mem_ok:
                        notes.append("reference ignores memory (its plan breaks the limit)")
                    elif not known_plan and float(w.size.sum()) > w.accelerator_memory:
                        notes.append("reference ignores memory (plan unknown)")
                other = [v for v in violations if not v.startswith("memory:")]
                if other:
                    notes.append(other[0])
                if method == "given" and ref_key == "expert_lifted_from_inference":
                    notes.append("inference expert split, backward nodes by colour class")
                value = "-" if plan.value is None else f"{plan.value:.4f}"
                reftxt = "-" if ref is None else f"{ref:.4f}"
                ratio = "-" if ref is None or plan.value is None else f"{plan.value / ref:.3f}"
                print(f"{name:34} {kind:10} {method:15} {value:>11} {reftxt:>11} {ratio:>7} {seconds:>8.2f} "
                      f"{'yes' if mem_ok else 'NO':>6}  {'; '.join(notes)}", flush=True)


if __name__ == "__main__":
    main()
