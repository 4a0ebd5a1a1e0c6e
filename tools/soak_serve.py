#!/usr/bin/env python3
"""``onnxsplit serve`` soaked on localhost: many requests from a few clients, every answer
checked, and the resident memory of each of the server's processes (the command, Ray's
daemons, Serve's controller and proxy, the gateway and each part's replica) sampled as it
goes, so a leak shows as growth that does not level off.

    python tools/soak_serve.py MODEL --input-shape x=1..8x64 [--requests 20000] [--clients 4] \\
        [--seconds 600] [--warmup 200] [--every 10] [--no-batching] [--max-ongoing N] [--max-queued N]

The parts are made as tools/bench_serve.py makes them (the model's nodes halved over two
CPU devices, exported for the range); each request has the range's lower batch and is
one of a pool of distinct inputs whose answers onnxruntime computed on the original model.
The soak ends after ``--requests`` requests or ``--seconds``, whichever comes first
(both bounded: at most 1,000,000 requests and 24 hours).  It prints the requests,
failures, wrong answers, throughput, p50/p99 latency, the server's total memory every
``--every`` seconds, and each process's memory after the warm-up and at the end; exit
code 1 where any request failed or was answered wrong.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_serve import Client, Server, build_parts, closed_loop, model_parser, parse_range, requests  # noqa: E402
from ray_processes import descendants, label, rss_mib  # noqa: E402

MOST_REQUESTS = 1_000_000
MOST_SECONDS = 24 * 3600.0


def memory(pids: dict[int, str]) -> dict[int, float]:
    """pid -> resident MiB, of those still running."""
    out = {}
    for pid in pids:
        m = rss_mib(pid)
        if m is not None:
            out[pid] = m
    return out


def main() -> int:
    ap = model_parser(__doc__)
    ap.add_argument("--requests", type=int, default=20000, help="requests after the warm-up (default 20000)")
    ap.add_argument("--seconds", type=float, default=600.0, help="longest soak (default 600)")
    ap.add_argument("--clients", type=int, default=4, help="closed-loop clients (default 4)")
    ap.add_argument("--warmup", type=int, default=200, help="requests before the first sample (default 200)")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between memory samples (default 10)")
    ap.add_argument("--no-batching", action="store_true", help="serve with --no-batching")
    ap.add_argument("--max-ongoing", type=int, help="the server's --max-ongoing")
    ap.add_argument("--max-queued", type=int, help="the server's --max-queued")
    args = ap.parse_args()
    if not (1 <= args.requests <= MOST_REQUESTS and 0 < args.seconds <= MOST_SECONDS and args.clients >= 1
            and args.warmup >= 0 and args.every > 0):
        raise SystemExit(f"soak_serve: --requests 1..{MOST_REQUESTS}, --seconds up to {MOST_SECONDS:g}, "
                         f"--clients at least 1, --warmup at least 0, --every positive")
    r = parse_range(args.input_shape)
    rows = max(1, next(iter(r.values()))[0][0])
    flags = ["--no-batching"] if args.no_batching else []
    for flag, value in (("--max-ongoing", args.max_ongoing), ("--max-queued", args.max_queued)):
        if value is not None:
            flags += [flag, str(value)]

    with tempfile.TemporaryDirectory(prefix="soak-serve-") as tmp:
        tmp = Path(tmp)
        split, _ = build_parts(args.model, r, tmp)
        session, pool, expected = requests(args.model, r, rows)
        server = Server(split, flags, tmp)
        try:
            def make_call():
                return Client(server.url, "m", session)

            warm = closed_loop(make_call, pool, expected, args.clients, max(args.warmup, 1), args.seconds)
            pids = descendants(server.proc.pid)
            pids[server.proc.pid] = "python -m onnxsplit serve"
            first = memory(pids)
            print(f"# {args.model.name}: {rows} row(s) a request, {args.clients} clients, "
                  f"flags {' '.join(flags) or '-'}; warm-up {warm['done']} requests; {len(first)} server processes, "
                  f"{sum(first.values()):.1f} MiB in all", flush=True)
            samples, stop = [(0.0, first)], threading.Event()
            began = time.perf_counter()

            def sample():
                while not stop.wait(args.every):
                    samples.append((time.perf_counter() - began, memory(pids)))
                    print(f"  {samples[-1][0]:7.1f} s  {sum(samples[-1][1].values()):9.1f} MiB", flush=True)

            watcher = threading.Thread(target=sample, daemon=True)
            watcher.start()
            got = closed_loop(make_call, pool, expected, args.clients, args.requests, args.seconds)
            stop.set()
            watcher.join()
            samples.append((time.perf_counter() - began, memory(pids)))
        finally:
            server.stop()
    print(f"requests {got['done']}  failed {got['errors']}  wrong {got['bad']}  "
          f"{got['throughput']:.1f} req/s  p50 {got['p50']:.2f} ms  p99 {got['p99']:.2f} ms")
    if got["first_error"]:
        print(f"# first error: {got['first_error']}")
    # a leak grows on; a warm-up levels off: each process's growth in the soak's two halves
    (_, m0), (t1, m1), (t2, m2) = samples[0], samples[len(samples) // 2], samples[-1]
    print(f"{'process':<40} {'start MiB':>10} {'end MiB':>9} {'growth':>8} "
          f"{f'0-{t1:.0f} s':>10} {f'{t1:.0f}-{t2:.0f} s':>10}")

    def row(name, a, b, c):
        grow = lambda x, y: f"{y - x:+.2f}" if x is not None and y is not None else "gone"  # noqa: E731
        return (f"{name[:40]:<40} {a:>10.1f} {(f'{c:.1f}' if c is not None else 'gone'):>9} {grow(a, c):>8} "
                f"{grow(a, b):>10} {grow(b, c):>10}")

    for pid in sorted(m0, key=lambda p: label(pids[p])):
        print(row(label(pids[pid]), m0[pid], m1.get(pid), m2.get(pid)))
    print(row("all", sum(m0.values()), sum(m1.values()), sum(m2.values())))
    return 1 if got["errors"] or got["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
