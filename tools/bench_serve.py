#!/usr/bin/env python3
"""``onnxsplit serve`` under load on localhost: throughput and latency of the server with
dynamic batching, without it (``--no-batching``), of the whole model served the same way
(a one-part folder, and copies of it), of onnxsplit's own parts for the range where given
(``--parts``), each on serve's local engine (the parts in the server's process) and, where
asked, on Ray Serve, and of onnxruntime's default session called in this process, at each
concurrency, on the same requests -- and, where installed, OpenVINO's THROUGHPUT hint called
in this process (``ov``, in OpenVINO's default precision: bf16 on a CPU with bf16 units).

    python tools/bench_serve.py MODEL --input-shape x=1..8x64 --requests 400 --concurrency 1,4,16,32 \\
        [--parts FOLDER] [--rates 50,100] [--request-batch 1] [--plot out.html]

``--input-shape`` takes the main command's ranges (repeat it per input); dimension 0 is
the batch.  The parts are exported here with :func:`onnxsplit.export.export` for that
range (planned at its middle): ``split`` puts the first half of the nodes (in the graph's
order) on cpu0 and the rest on cpu1, one thread each; ``whole`` is the model as one part
on onnxruntime's default threads; ``copies`` one copy a core, a thread each.  ``plan`` is
the folder ``--parts`` names (``onnxsplit MODEL --input-shape RANGE --out FOLDER``).
A server name with ``@ray`` after it runs on Ray Serve (``serve --engine ray``).  Each
request has ``--request-batch`` rows (default the range's lower end) and
the middle of the range elsewhere -- or, with ``--pad-dimension NAME`` (a dimension the
model names, e.g. ``sequence``), lengths along it spread over its range, one per pooled
request; the ``-pad`` servers then batch them padded (``serve --pad-dimension``), the
others only those of equal length.

Closed loop: N clients (tritonclient.http, one thread each) send their next request as
soon as the last is answered.  Open loop (``--rates``): requests start at fixed times,
R per second, whatever the answers; a latency counts from the request's planned start,
so a server that falls behind shows it.  Each point ends after ``--requests`` requests or
``--point-seconds``, whichever comes first; every answer is compared with onnxruntime's
on the original model (``bad`` counts those that differ, ``err`` the failed requests):
within float32's rounding, or where a server computes in bf16 (OpenVINO's default, a plan
made in it) as the parts' own check allows (:func:`expected_in`).
``req/exec``: requests per execution of the parts, from the server's
``/v2/models/NAME/stats`` (1.0 without batching).  Localhost only; a server is stopped
(SIGINT) before the next starts.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import html
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onnxsplit import ranges  # noqa: E402

CPU = "CPUExecutionProvider"
DTYPES = {"tensor(float)": ("FP32", np.float32), "tensor(int64)": ("INT64", np.int64),
          "tensor(int32)": ("INT32", np.int32), "tensor(float16)": ("FP16", np.float16),
          "tensor(double)": ("FP64", np.float64), "tensor(bool)": ("BOOL", np.bool_)}
POOL = 8  # distinct requests, cycled (their expected answers computed once)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_range(specs: list[str]) -> dict[str, list[tuple[int, int]]]:
    out = {}
    for spec in specs:
        name, eq, dims = spec.partition("=")
        if not eq:
            raise SystemExit(f"bench_serve: bad --input-shape '{spec}': NAME=DIMS, e.g. x=1..8x64")
        out[name.strip()] = ranges.parse_dims(spec, dims)[0]
    return out


def build_parts(model: Path, r: dict, out: Path) -> dict[str, Path]:
    """The folders for the range ``r``: ``split`` (two parts, a core and a thread each),
    ``whole`` (one part on onnxruntime's default threads, all cores) and ``copies`` (one
    part, a copy a core, a thread each)."""
    from onnxsplit.export import export
    from onnxsplit.graph import OpGraph

    planned = ranges.middle(r)
    g = OpGraph.from_onnx(str(model), planned)
    names = [n.name for n in g.nodes]
    half = {n: "cpu0" if i < len(names) // 2 else "cpu1" for i, n in enumerate(names)}
    common = dict(providers={"cpu0": CPU, "cpu1": CPU}, threads={"cpu0": 1, "cpu1": 1},
                  plan={"objective": "throughput"}, shape_range={k: [list(d) for d in v] for k, v in r.items()})
    split = export(g, half, out / "split", **common).out
    alone = {n: "cpu0" for n in names}
    whole = export(g, alone, out / "whole", **{**common, "threads": {"cpu0": 0}}).out
    copies = export(g, alone, out / "copies", **common, replicas={"cpu0": os.cpu_count() or 1}).out
    return {"split": split, "whole": whole, "copies": copies}


def requests(model: Path, r: dict, rows: int, pad: str | None = None):
    """(POOL requests as {input: array}, their outputs from onnxruntime on the model);
    with ``pad``, the pool's lengths along that named dimension spread over its range."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=[CPU])
    middle = ranges.middle(r)
    rng = np.random.default_rng(0)
    lengths = [None] * POOL
    if pad:
        axes = {i.name: i.shape.index(pad) for i in session.get_inputs() if pad in list(i.shape)}
        if not axes:
            raise SystemExit(f"bench_serve: no input names a dimension '{pad}'")
        name, axis = next(iter(axes.items()))
        lo, hi = r[name][axis]
        lengths = [int(n) for n in np.linspace(lo, hi, POOL).round()]
    pool = []
    for k in range(POOL):
        feeds = {}
        for i in session.get_inputs():
            shape = [rows] + list(middle[i.name][1:])
            if lengths[k] is not None and pad in list(i.shape):
                shape[list(i.shape).index(pad)] = lengths[k]
            shape = tuple(shape)
            kind = DTYPES[i.type][1]
            feeds[i.name] = (rng.standard_normal(shape) if np.issubdtype(kind, np.floating)
                             else rng.integers(0, 2, shape)).astype(kind)
            if pad and "mask" in i.name.lower():  # (a tokenizer's mask: every token of the request real)
                feeds[i.name] = np.ones(shape, kind)
        pool.append(feeds)
    return session, pool, [session.run(None, f) for f in pool]


class Client:
    """One connection to a server (one per thread, as tritonclient wants)."""

    def __init__(self, url: str, name: str, session):
        import tritonclient.http as httpclient

        self.http, self.name = httpclient, name
        self.client = httpclient.InferenceServerClient(url, connection_timeout=120, network_timeout=120)
        self.inputs = [(i.name, DTYPES[i.type][0]) for i in session.get_inputs()]
        self.outputs = [o.name for o in session.get_outputs()]

    def __call__(self, feeds):
        ins = []
        for name, datatype in self.inputs:
            x = self.http.InferInput(name, list(feeds[name].shape), datatype)
            x.set_data_from_numpy(feeds[name])
            ins.append(x)
        got = self.client.infer(self.name, ins)
        return [got.as_numpy(o) for o in self.outputs]


def same(got, want) -> bool:
    """``want``: (the original's outputs, the error each may have beyond float32's rounding:
    None, or in bf16 the parts' own check's, :func:`expected_in`)."""
    outputs, allowed = want
    return all(g.shape == w.shape and (np.allclose(g, w, rtol=1e-4, atol=1e-5) if a is None else
                                       bool(np.all(np.abs(g.astype(np.float64) - w) <= a)))
               for g, w, a in zip(got, outputs, allowed))


def expected_in(precision: str, model: Path, session, pool, outputs) -> list:
    """Each pooled request's answer as a server computing in ``precision`` is held to it:
    float32 (`f32`) to onnxruntime's within rounding; `bf16` (OpenVINO's default on a CPU
    with bf16 units, and the parts' where the plan computes in it) as the parts' own check
    holds them (:mod:`onnxsplit.running.verify`): REDUCED_FACTOR times as far as the whole
    model moves when OpenVINO computes it in bf16, on that request."""
    if precision == "f32":
        return [(o, [None] * len(o)) for o in outputs]
    from onnxsplit.running import verify

    names = [o.name for o in session.get_outputs()]
    out = []
    for feeds, o in zip(pool, outputs):
        moved = verify.reduced_spread(model, feeds, dict(zip(names, o)), precision)["spread"]
        out.append((o, [None if n not in moved else max(1e-5 + 1e-4 * float(np.max(np.abs(w), initial=0)),
                                                        verify.REDUCED_FACTOR * moved[n])
                        for n, w in zip(names, o)]))
    return out


def precision_of(folder: Path) -> str:
    """What a parts folder's OpenVINO parts compute in (its manifest's ``precision``)."""
    return json.loads((folder / "manifest.json").read_text()).get("precision") or "f32"


def closed_loop(make_call, pool, expected, concurrency: int, count: int, seconds: float) -> dict:
    """``concurrency`` clients, each sending as soon as answered, ``count`` requests in all."""
    lock, latencies, bad, errors = threading.Lock(), [], [0], []
    left = [count]
    stop = time.perf_counter() + seconds

    def worker(k: int):
        call = make_call()
        j = k
        while True:
            with lock:
                if left[0] <= 0 or time.perf_counter() > stop:
                    return
                left[0] -= 1
            t = time.perf_counter()
            try:
                got = call(pool[j % POOL])
            except Exception as e:  # noqa: BLE001 (counted in the table)
                with lock:
                    errors.append(" ".join(str(e).split())[:200])
                continue
            dt = time.perf_counter() - t
            with lock:
                latencies.append(dt)
                bad[0] += not same(got, expected[j % POOL])
            j += concurrency

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summary(latencies, bad[0], errors, time.perf_counter() - start)


def open_loop(make_call, pool, expected, rate: float, count: int, seconds: float, workers: int = 64) -> dict:
    """Requests started ``rate`` per second; latency from each one's planned start."""
    n = min(count, int(rate * seconds))
    local = threading.local()
    lock, latencies, bad, errors = threading.Lock(), [], [0], []

    def one(j: int, planned: float):
        if not hasattr(local, "call"):
            local.call = make_call()
        try:
            got = local.call(pool[j % POOL])
        except Exception as e:  # noqa: BLE001
            with lock:
                errors.append(" ".join(str(e).split())[:200])
            return
        with lock:
            latencies.append(time.perf_counter() - planned)
            bad[0] += not same(got, expected[j % POOL])

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        for j in range(n):
            planned = start + j / rate
            time.sleep(max(0.0, planned - time.perf_counter()))
            ex.submit(one, j, planned)
    return summary(latencies, bad[0], errors, time.perf_counter() - start)


def summary(latencies, bad: int, errors: list, wall: float) -> dict:
    ms = np.array(latencies) * 1000 if latencies else np.array([np.nan])
    return {"done": len(latencies), "bad": bad, "errors": len(errors), "first_error": errors[0] if errors else "",
            "throughput": len(latencies) / wall if wall > 0 else 0.0,
            "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99))}


class Server:
    """``onnxsplit serve FOLDER`` in a child process, until :meth:`stop`."""

    def __init__(self, folder: Path, flags: list[str], tmp: Path):
        self.port = free_port()
        ready = tmp / f"ready-{self.port}.json"
        self.log = open(tmp / f"serve-{self.port}.log", "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "onnxsplit", "serve", str(folder), "--port",
                                      str(self.port), "--name", "m", "--ready-file", str(ready), *flags],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 180
        while not ready.exists() and self.proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        if not ready.exists():
            log = self.log.name
            self.stop()
            raise SystemExit(f"bench_serve: the server did not start: {Path(log).read_text()[-500:]}")
        self.url = f"127.0.0.1:{self.port}"

    def per_execution(self) -> tuple[int, int]:
        """(requests, executions) so far, from the stats route."""
        with urllib.request.urlopen(f"http://{self.url}/v2/models/m/stats", timeout=30) as r:
            s = json.loads(r.read())["model_stats"][0]
        per = s["batching"]["requests_per_execution"]
        return sum(e["requests"] * e["count"] for e in per), sum(e["count"] for e in per)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def plot(rows: list[dict], path: Path) -> None:
    """p50 latency against throughput (both log), one line per server (closed loop), as SVG in HTML."""
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    series: dict[str, list[tuple[float, float, str]]] = {}
    for r in rows:
        if r["mode"].startswith("closed") and r["done"]:
            series.setdefault(r["server"], []).append((r["throughput"], r["p50"], r["mode"]))
    xs = [p[0] for s in series.values() for p in s] or [1]
    ys = [p[1] for s in series.values() for p in s] or [1]
    w, h, m = 640, 400, 50
    x_lo, x_hi = np.log10(max(min(xs), 1e-3)) - 0.1, np.log10(max(xs)) + 0.1  # (log: ORT is far faster)
    y_lo, y_hi = np.log10(max(min(ys), 1e-3)) - 0.1, np.log10(max(ys)) + 0.1

    def px(x, y):
        return (m + (np.log10(max(x, 1e-3)) - x_lo) / (x_hi - x_lo) * (w - 2 * m),
                h - m - (np.log10(max(y, 1e-3)) - y_lo) / (y_hi - y_lo) * (h - 2 * m))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
             f'font-size="12"><rect width="{w}" height="{h}" fill="white"/>',
             f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
             f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
             f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">'
             f'throughput (requests/s, log; {min(xs):.3g} to {max(xs):.3g})</text>',
             f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">'
             f'p50 latency (ms, log; {min(ys):.2g} to {max(ys):.3g})</text>']
    for k, (name, pts) in enumerate(series.items()):
        c = colours[k % len(colours)]
        xy = [px(x, y) for x, y, _ in pts]
        parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="'
                     + " ".join(f"{a:.1f},{b:.1f}" for a, b in xy) + '"/>')
        for (a, b), (x, y, mode) in zip(xy, pts):
            parts.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{c}"><title>{html.escape(name)} '
                         f'{mode}: {x:.1f}/s, {y:.2f} ms</title></circle>')
        parts.append(f'<text x="{w - m - 150}" y="{m + 16 * k}" fill="{c}">{html.escape(name)}</text>')
    parts.append("</svg>")
    path.write_text("<!doctype html><meta charset='utf-8'><title>onnxsplit serve</title>"
                    "<h3>onnxsplit serve: p50 latency against throughput (closed loop)</h3>" + "".join(parts) + "\n")


def model_parser(doc: str) -> argparse.ArgumentParser:
    """A tool's arguments so far: the model and the range its parts are exported for."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--input-shape", action="append", required=True, metavar="NAME=DIMS",
                    help="a range, dimension 0 the batch: x=1..8x64 (repeat per input)")
    return ap


def main() -> int:
    ap = model_parser(__doc__)
    ap.add_argument("--requests", type=int, default=400, help="requests per point (default 400)")
    ap.add_argument("--concurrency", default="1,4,16,32", help="closed-loop clients, comma-separated")
    ap.add_argument("--rates", default="", help="open-loop requests per second, comma-separated (default none)")
    ap.add_argument("--request-batch", type=int, help="rows per request (default the range's lower end)")
    ap.add_argument("--point-seconds", type=float, default=30.0, help="longest time per point (default 30)")
    ap.add_argument("--servers", help="which to measure: KIND, KIND-nobatch or KIND-pad for a KIND of split, "
                                      "whole, copies or plan (--parts), each served in one process "
                                      "(serve's local engine) or, with @ray after it, on Ray Serve; and "
                                      "ort and ov, onnxruntime's default session and OpenVINO's THROUGHPUT "
                                      "hint called in this process (default "
                                      "split,split-nobatch,whole,copies,split@ray,ort,ov, plan "
                                      "first with --parts; with --pad-dimension the -pad ones and split)")
    ap.add_argument("--parts", type=Path, metavar="FOLDER",
                    help="onnxsplit's own parts for the range (the main command's --out): the server 'plan'")
    ap.add_argument("--pad-dimension", metavar="NAME",
                    help="requests of lengths spread over this dimension's range, served padded by the "
                         "-pad servers (serve --pad-dimension)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every server this many times, in turn, and print the medians (default 1)")
    ap.add_argument("--max-queue-delay-microseconds", type=int, metavar="N",
                    help="the batcher's delay, given to every server (default: serve's)")
    ap.add_argument("--plot", type=Path, metavar="OUT.html", help="write latency against throughput here")
    args = ap.parse_args()
    r = parse_range(args.input_shape)
    concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    rates = [float(x) for x in args.rates.split(",") if x.strip()]
    if args.requests < 1 or not concurrency or min(concurrency) < 1 or any(x <= 0 for x in rates):
        raise SystemExit("bench_serve: --requests, --concurrency and --rates must be positive")
    rows_per_request = args.request_batch or max(1, next(iter(r.values()))[0][0])
    servers = args.servers or ("split-pad,split,whole-pad,copies-pad,split-pad@ray,ort" if args.pad_dimension
                               else "split,split-nobatch,whole,copies,split@ray,ort")
    if args.parts and not args.servers:
        servers = ("plan-pad," if args.pad_dimension else "plan,") + servers
    if not args.servers and importlib.util.find_spec("openvino") is not None:
        servers += ",ov"  # (the peer a CPU user would pick, where installed)
    wanted = [s.strip() for s in servers.split(",") if s.strip()]
    kinds = {f"{k}{v}" for k in ("split", "whole", "copies", "plan") for v in ("", "-nobatch", "-pad")}
    unknown = {w.removesuffix("@ray") for w in wanted} - kinds - {"ort", "ov"} | ({"ort@ray", "ov@ray"} & set(wanted))
    if any(w.startswith("plan") for w in wanted) and not args.parts:
        raise SystemExit("bench_serve: the server 'plan' serves --parts FOLDER")
    if not args.pad_dimension and any(w.removesuffix("@ray").endswith("-pad") for w in wanted):
        raise SystemExit("bench_serve: the -pad servers need --pad-dimension")
    if unknown:
        raise SystemExit(f"bench_serve: unknown server {sorted(unknown)[0]!r}")

    table: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        tmp = Path(tmp)
        built = build_parts(args.model, r, tmp)
        if args.parts:
            built["plan"] = args.parts.resolve()
        session, pool, outputs = requests(args.model, r, rows_per_request, args.pad_dimension)
        checks: dict[str, list] = {}

        def expected_for(precision: str) -> list:  # (computed once a precision)
            if precision not in checks:
                checks[precision] = expected_in(precision, args.model, session, pool, outputs)
            return checks[precision]
        print(f"# {args.model.name}: range {', '.join(f'{k}={ranges.text(v)}' for k, v in r.items())}, "
              f"{rows_per_request} row(s) per request, {args.requests} requests per point, "
              f"{os.cpu_count()} CPUs", flush=True)
        pad = ["--pad-dimension", args.pad_dimension or ""]
        folders = {f"{k}{v}": (folder, {"": [], "-nobatch": ["--no-batching"], "-pad": pad}[v])
                   for k, folder in built.items() for v in ("", "-nobatch", "-pad")}
        for which in [w for _ in range(max(1, args.rounds)) for w in wanted]:  # (the list, round after round)
            if which == "ov":  # OpenVINO's own runtime as its users run it for throughput, in this process
                import openvino as ov

                from onnxsplit.providers import openvino as ov_provider

                # in OpenVINO's own default precision, as its users get it (bf16 on a CPU with bf16 units)
                precision = ov_provider.default_precision()
                compiled = ov.Core().compile_model(str(args.model), "CPU", {"PERFORMANCE_HINT": "THROUGHPUT"})

                def make_call(compiled=compiled):  # an infer request a client: the streams run them side by side
                    request = compiled.create_infer_request()
                    return lambda feeds: [np.array(v) for v in request.infer(feeds).values()]
                server, label = None, f"ov THROUGHPUT hint ({precision})"
            elif which == "ort":  # onnxruntime's default session, called in this process
                import onnxruntime as ort

                direct = ort.InferenceSession(str(args.model), providers=[CPU])

                def make_call(direct=direct):
                    return lambda feeds: direct.run(None, feeds)
                server, label, precision = None, "ort default session", "f32"
            else:
                kind, _, engine = which.partition("@")
                folder, flags = folders[kind]
                label = f"{kind.split('-')[0]}{' (ray)' if engine else ''}, " + {
                    "": "batching", "nobatch": "no batching", "pad": "padded batches"}[kind.partition("-")[2]]
                delay = [] if args.max_queue_delay_microseconds is None or "--no-batching" in flags else [
                    "--max-queue-delay-microseconds", str(args.max_queue_delay_microseconds)]
                server = Server(folder, [*flags, *delay, "--engine", engine or "local"], tmp)
                precision = precision_of(folder)
                if precision != "f32":
                    label += f" ({precision})"

                def make_call(server=server):
                    return Client(server.url, "m", session)
            try:
                expected = expected_for(precision)
                make_call()(pool[0])  # warm up
                points = [(f"closed c={c}", lambda c=c: closed_loop(make_call, pool, expected, c, args.requests,
                                                                    args.point_seconds)) for c in concurrency]
                points += [(f"open {x:g}/s", lambda x=x: open_loop(make_call, pool, expected, x, args.requests,
                                                                   args.point_seconds)) for x in rates]
                for mode, measure in points:
                    before = server.per_execution() if server else (0, 0)
                    got = measure()
                    after = server.per_execution() if server else (1, 1)
                    execs = after[1] - before[1]
                    got.update(server=label, mode=mode,
                               per_exec=(after[0] - before[0]) / execs if execs else float("nan"))
                    table.append(got)
                    print(line(got), flush=True)
            finally:
                if server is not None:
                    server.stop()
    if args.rounds > 1:
        table = medians(table)
        print(f"\n# medians of {args.rounds} rounds (the servers in turn, round after round); done, bad, err summed")
    print()
    print(head())
    for row in table:
        print(line(row))
    for row in table:
        if row["first_error"]:
            print(f"# {row['server']} {row['mode']}: first error: {row['first_error']}")
    if args.plot:
        plot(table, args.plot)
        print(f"# plot: {args.plot}")
    return 1 if any(row["bad"] or row["errors"] for row in table) else 0


def medians(table: list[dict]) -> list[dict]:
    """One row per server and load: the median of each rate and latency over its rounds
    (a slow stretch of a shared machine then hits one round, not one server)."""
    keyed: dict[tuple, list[dict]] = {}
    for row in table:
        keyed.setdefault((row["server"], row["mode"]), []).append(row)
    out = []
    for rows in keyed.values():
        m = dict(rows[0])
        for k in ("throughput", "p50", "p99", "per_exec"):
            m[k] = float(np.median([r[k] for r in rows]))
        for k in ("done", "bad", "errors"):
            m[k] = sum(r[k] for r in rows)
        m["first_error"] = next((r["first_error"] for r in rows if r["first_error"]), "")
        out.append(m)
    return out


def head() -> str:
    return (f"{'server':<28} {'load':<14} {'done':>5} {'bad':>4} {'err':>4} {'req/s':>8} {'p50 ms':>8} "
            f"{'p99 ms':>8} {'req/exec':>8}")


def line(r: dict) -> str:
    per = "-" if r["server"].startswith(("ort", "ov ")) else f"{r['per_exec']:.2f}"
    return (f"{r['server']:<28} {r['mode']:<14} {r['done']:>5} {r['bad']:>4} {r['errors']:>4} "
            f"{r['throughput']:>8.1f} {r['p50']:>8.2f} {r['p99']:>8.2f} {per:>8}")


if __name__ == "__main__":
    sys.exit(main())
