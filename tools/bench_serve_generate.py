#!/usr/bin/env python3
"""Served generation beside ``onnxsplit generate`` and the peers it prints, on the same prompt.

    python tools/bench_serve_generate.py PARTS [--prompt-tokens 128] [--new-tokens 64] [--requests 6] \\
        [--engines local,ray] [--fallback-cpu]

First ``onnxsplit generate PARTS`` (the parts, onnxruntime's default session and
onnxruntime-genai on the original model, medians of 3: its own table, printed as it is);
then, per engine, ``onnxsplit serve PARTS --engine E`` (bench_serve.py's ``Server``) sent ``--requests`` generation requests one after another
(``POST /v2/models/m/generate``): the median of the decode tokens/s and first-token
milliseconds the server reports, and whether every request's tokens equal generate's.
The prompt is ``--prompt-tokens`` ids drawn with a fixed seed.  Localhost only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serve import Server  # noqa: E402  (the server in a child process, as bench_serve starts it)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", type=Path)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--engines", default="local,ray")
    ap.add_argument("--fallback-cpu", action="store_true",
                    help="run a part whose provider this machine lacks on the CPU (generate and serve)")
    args = ap.parse_args()
    import numpy as np

    prompt = [int(x) for x in np.random.default_rng(1).integers(3, 1000, args.prompt_tokens)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "onnxsplit"]
    fallback = ["--fallback-cpu"] if args.fallback_cpu else []
    got = subprocess.run([*cmd, "generate", str(args.parts), "--prompt", ",".join(map(str, prompt)),
                          "--max-new-tokens", str(args.new_tokens), *fallback], env=env, capture_output=True, text=True)
    print(got.stdout.rstrip())
    if got.returncode != 0:
        print(got.stderr.strip()[-500:], file=sys.stderr)
        return 1
    line = next((ln for ln in got.stdout.splitlines() if ln.startswith("generated ")), "")
    want = [int(t) for t in re.findall(r"\d+", line.split(":", 1)[1])] if ":" in line else None
    body = json.dumps({"input_ids": prompt, "max_tokens": args.new_tokens}).encode()
    rows, bad = [], 0
    with tempfile.TemporaryDirectory(prefix="bench-serve-gen-") as tmp:
        for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
            server = Server(args.parts, ["--engine", engine, *fallback], Path(tmp))
            try:
                rates, first, same = [], [], 0
                for _ in range(args.requests):
                    req = urllib.request.Request(f"http://{server.url}/v2/models/m/generate", data=body,
                                                 method="POST")
                    with urllib.request.urlopen(req, timeout=600) as r:
                        answer = json.loads(r.read())
                    rates.append(answer["parameters"]["decode_tokens_per_s"])
                    first.append(answer["parameters"]["first_token_ms"])
                    same += answer["output_ids"] == want
                bad += args.requests - same
                rows.append((engine, statistics.median(rates), statistics.median(first), same))
            finally:
                server.stop()
    print()
    print(f"  served, {args.requests} requests one after another, medians   decode tok/s  first token ms  "
          "tokens as generate's")
    for engine, rate, ms, same in rows:
        print(f"  onnxsplit serve --engine {engine:<38} {rate:>12.1f} {ms:>15.1f}  {same}/{args.requests}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
