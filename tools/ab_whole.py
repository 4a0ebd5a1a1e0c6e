"""A parts folder against the original model's default session, A/B in many short rounds.

`onnxsplit run` alternates its sessions in nine rounds; on a noisy machine (a shared GPU
host, this 2-core box) one slow round moves a ratio by 10%.  This runs the two in many
alternating rounds, each side first in every other round, and prints the median of the
per-round ratios: whether a plan kept whole really runs exactly like onnxruntime's session.

    python tools/ab_whole.py PARTS_DIR [--ep CUDAExecutionProvider] [--threads 1] [--rounds 30]

``--threads``: the original's session gets that many intra-op threads (default 0: all),
to match a plan of copies on single-thread sessions (each side runs one sample at a time).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxsplit.profile.devices import CPU_EP  # noqa: E402
from onnxsplit.running.runner import Parts, random_feeds  # noqa: E402


def timed(parts: Parts, feeds, n: int) -> tuple[float, float]:
    """(median ms per call, mean ms per call) over ``n`` calls after one warm-up."""
    parts.run(feeds)
    t = [time.perf_counter()]
    for _ in range(n):
        parts.run(feeds)
        t.append(time.perf_counter())
    d = np.diff(t) * 1e3
    return float(np.median(d)), float(np.mean(d))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parts_dir")
    ap.add_argument("--ep", default=CPU_EP, help="the original model's session runs here")
    ap.add_argument("--threads", type=int, default=0, help="the original's intra-op threads (0: default)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--round-s", type=float, default=0.2, help="seconds per side per round")
    args = ap.parse_args()
    plan = Parts(args.parts_dir)
    whole = Parts.whole(plan.manifest["model"]["path"], args.ep, threads=args.threads)
    feeds = random_feeds(plan.inputs)
    t = time.perf_counter()
    plan.run(feeds)
    n = max(5, int(args.round_s / max(time.perf_counter() - t, 1e-6)))
    got = {"plan": [], "ort": []}
    for r in range(args.rounds):
        order = ("plan", "ort") if r % 2 == 0 else ("ort", "plan")
        for side in order:
            got[side].append(timed(plan if side == "plan" else whole, feeds, n))
    p, o = np.array(got["plan"]), np.array(got["ort"])
    print(f"{args.rounds} rounds of {n} calls each side; ms per call (median over rounds)")
    print(f"{'':8} {'median':>8} {'mean':>8}")
    print(f"{'plan':8} {np.median(p[:, 0]):8.3f} {np.median(p[:, 1]):8.3f}")
    print(f"{'ort':8} {np.median(o[:, 0]):8.3f} {np.median(o[:, 1]):8.3f}")
    print(f"ort/plan per round (above 1: the plan is faster): median-call "
          f"{np.median(o[:, 0] / p[:, 0]):.3f}, throughput {np.median(o[:, 1] / p[:, 1]):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
