#!/usr/bin/env python3
"""Are time limits and Ctrl-C kept?  Every method of ``onnxsplit solve`` on large workloads.

For each workload, objective and method: ``onnxsplit solve W --method M --time-limit T
--json`` in a subprocess; the table shows its wall time beside the limit (``over``: the
wall time above the allowed limit + max(10%, 5 s)... see ``allowed``), the plan's value,
bound and gap; then the same command interrupted with SIGINT after ``--interrupt-after``
seconds, and how long it took to end.

    python tools/bench_deadlines.py W.json [...] [--time-limit 20] [--methods dp,ip,...]
        [--objectives throughput,latency] [--interrupt-after 3] [--json OUT]

Workloads: ``python tools/make_large_workload.py W.json --nodes 10000``.  Exits 1 if any
run overran its limit or ended later than 2 s after SIGINT.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from onnxsplit.api import METHODS  # noqa: E402

INTERRUPT_S = 2.0
SKIP = {"given"}  # needs a split file


def allowed(limit: float) -> float:
    """The deadline a solve must keep: its limit plus 10% or 5 s, whichever is larger."""
    return limit + max(0.1 * limit, 5.0)


def _cmd(workload: str, method: str, objective: str, limit: float) -> list[str]:
    return [sys.executable, "-m", "onnxsplit", "solve", workload, "--method", method,
            "--objective", objective, "--time-limit", str(limit), "--json"]


def _ctrl_c_as_in_a_terminal() -> None:
    """A job started in the background ignores SIGINT, and so would its children."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def timed(workload: str, method: str, objective: str, limit: float) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(_cmd(workload, method, objective, limit), capture_output=True,
                           text=True, timeout=10 * allowed(limit))
    except subprocess.TimeoutExpired:
        return {"wall_s": time.perf_counter() - t0, "error": "killed at 10x the limit"}
    wall = time.perf_counter() - t0
    try:
        r = json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"wall_s": wall, "rc": p.returncode,
                "error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
    return {"wall_s": wall, "rc": p.returncode, "value": r.get("value"),
            "bound": r.get("lower_bound"), "status": r.get("status")}


def interrupted(workload: str, method: str, objective: str, limit: float, after: float) -> dict:
    p = subprocess.Popen(_cmd(workload, method, objective, limit), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_as_in_a_terminal)
    time.sleep(after)
    if p.poll() is not None:
        return {"end_s": None, "note": "finished first"}
    t0 = time.perf_counter()
    p.send_signal(signal.SIGINT)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return {"end_s": time.perf_counter() - t0, "rc": None, "note": "killed after 30 s"}
    return {"end_s": time.perf_counter() - t0, "rc": p.returncode,
            "last": (p.stderr.read().strip().splitlines() or [""])[-1]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workloads", nargs="+")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--methods", default="")
    ap.add_argument("--objectives", default="throughput,latency")
    ap.add_argument("--interrupt-after", type=float, default=3.0, help="0: no interrupt runs")
    ap.add_argument("--json", metavar="OUT")
    a = ap.parse_args(argv)
    wanted = [m for m in a.methods.split(",") if m] or [m for m in METHODS if m not in SKIP]
    rows, bad = [], 0
    print(f"{'workload':14} {'objective':10} {'method':15} {'limit':>6} {'wall':>7} {'ok':>3} "
          f"{'value':>12} {'bound':>12} {'gap':>7} {'sigint':>7}")
    for w in a.workloads:
        for objective in a.objectives.split(","):
            for m in wanted:
                if objective not in METHODS[m]:
                    continue
                r = timed(w, m, objective, a.time_limit)
                if a.interrupt_after > 0:
                    r["sigint"] = interrupted(w, m, objective, a.time_limit, a.interrupt_after)
                ok = r["wall_s"] <= allowed(a.time_limit) and \
                    (r.get("sigint", {}).get("end_s") or 0) <= INTERRUPT_S
                bad += not ok
                v, b = r.get("value"), r.get("bound")
                gap = f"{(v - b) / v:.1%}" if v and b else "-"
                s = r.get("sigint", {}).get("end_s")
                print(f"{Path(w).stem:14} {objective:10} {m:15} {a.time_limit:6.0f} "
                      f"{r['wall_s']:7.1f} {'yes' if ok else 'NO':>3} "
                      f"{v if v is not None else r.get('error', '-')!s:>12.12} "
                      f"{b if b is not None else '-'!s:>12.12} {gap:>7} "
                      f"{f'{s:.2f}' if s is not None else '-':>7}", flush=True)
                rows.append({"workload": w, "objective": objective, "method": m,
                             "limit_s": a.time_limit, **r})
    print(f"wall: seconds, allowed limit + max(10%, 5 s); sigint: seconds from SIGINT to exit "
          f"(allowed {INTERRUPT_S} s)")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
