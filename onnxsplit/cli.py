"""Command line: argument parsing and printing only; the work is done by onnxsplit.api.

Heavy modules (numpy, numba, the solvers) are imported inside the commands, so ``--help``
is instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DESCRIPTION = """\
Place a neural network's operators across devices (accelerators and CPU cores) to
maximise pipelined throughput or minimise single-stream latency, following Tarnawski et
al., "Efficient Algorithms for Device Placement of DNN Graph Operators" (NeurIPS 2020).

The main command,

  onnxsplit model.onnx --out parts/

profiles the model (cached), plans for the devices present (CPU cores, and CUDA or other
execution providers where installed; --devices cluster.json plans for hardware elsewhere),
writes one ONNX model per device with a manifest and plan.json, and checks that the parts
reproduce the original.  'onnxsplit run parts/' runs them as a pipeline and measures it.

A workload is the paper's JSON format: a DAG of nodes with CPU and accelerator
latencies, memory sizes and colour classes, edges with transfer costs, and the number of
accelerators (with their memory) and CPU cores.
"""

EPILOG = """\
examples:
  onnxsplit model.onnx --out parts/                   split for this machine, verify, summarise
  onnxsplit model.onnx --out parts/ --input-shape input_ids=1x128 --objective latency
  onnxsplit model.onnx --out parts/ --pin 'Shape|Gather=cpu' --devices cluster.json
  onnxsplit export model.onnx --plan parts/plan.json --out parts2/   re-apply an edited plan
  onnxsplit run parts/                                verify, then measure the pipeline
  onnxsplit profile model.onnx --input-shape input_ids=1x128 -o profile.json
                                                      time every operator on each device
  onnxsplit workload model.onnx --input-shape input_ids=1x128 --devices cluster.json \\
      --profile profile.json -o workload.json         an ONNX model as a workload
  onnxsplit solve workload.json                       optimal contiguous pipeline (DP)
  onnxsplit solve workload.json --json                the same, as one JSON object
  onnxsplit solve workload.json --method local_search --seed 1
  onnxsplit solve workload.json --objective latency --method greedy
  onnxsplit solve workload.json --method given --split expert.json
  onnxsplit compare workload.json                     every method, against the best proven bound
  onnxsplit evaluate workload.json split.json         score a split (e.g. a human expert's)
  onnxsplit evaluate workload.json split.json --objective latency
"""


COMMANDS = ("split", "export", "run", "generate", "serve", "solve", "compare", "evaluate", "profile", "workload",
            "devices")

DRIFT_NOTED = 0.10  # `run` suggests --recalibrate where a session moved more than this


def _methods():
    """The method registry (onnxsplit/solve/methods.py): choices and help come from it."""
    from .solve import methods

    return methods


def _number(cast, ok, needs: str, what: str):
    """An argparse type: ``cast(text)`` for which ``ok(value)`` holds (argparse's one-line
    error otherwise, saying ``what`` was expected and what it ``needs``)."""
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{needs}, got {text}")
        return value
    return parse


SEED_MAX = 2 ** 31 - 1  # METIS and SCOTCH take a C int (numpy any integer >= 0)


def _at_least(low: int):
    return _number(int, lambda v: v >= low, f"must be at least {low}", "an integer")


def _model_name(text: str) -> str:
    """serve's --name: one segment of its URLs (letters, digits, '.', '_', '-'), as Triton's
    model names are (a slash had made URLs no client could address)."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", text):
        raise argparse.ArgumentTypeError(f"a model name is letters, digits, '.', '_' and '-' "
                                         f"(one segment of a URL), got {text[:60]!r}")
    return text


def _positive(unit: str):
    return _number(float, lambda v: 0 < v < float("inf"), f"must be a positive number of {unit}", unit)


class _Parser(argparse.ArgumentParser):
    """Bad arguments end as one line naming the problem (and the command's --help)."""

    def error(self, message: str):
        sys.stderr.write(f"onnxsplit: error: {message} (see '{self.prog} --help')\n")
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="onnxsplit", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    out.add_argument("--memory-limit", type=_positive("GB"), metavar="GB",
                     help="most memory the solvers' tables may take (default: half of what is "
                          "available; also ONNXSPLIT_MEMORY_LIMIT)")

    s = sub.add_parser("solve", parents=[out], help="find a placement for a workload",
                       description="Find a placement (node -> device) for a workload and print it.")
    s.add_argument("workload", help="workload JSON (the paper's format)")
    s.add_argument("--objective", default="throughput", choices=["throughput", "latency"],
                   help="throughput: minimise the max load of any device (pipelined); "
                        "latency: minimise one sample's end-to-end time (default: throughput)")
    registry = _methods()
    s.add_argument("--method", default=None, choices=list(registry.METHODS), metavar="METHOD",
                   help="default: dp for throughput, ip for latency. "
                        + "; ".join(f"{m.name}: {m.summary}" for m in registry.REGISTRY if m.kind == "method")
                        + ". Baselines: " + "; ".join(f"{m.name}: {m.summary}" for m in registry.REGISTRY
                                                     if m.kind == "baseline"))
    s.add_argument("--quiet", action="store_true", help="no progress lines on long solves")
    s.add_argument("--seed", type=_number(int, lambda v: 0 <= v <= SEED_MAX, f"must be from 0 to {SEED_MAX}",
                                          "an integer"), default=0,
                   help="random seed of local_search, scotch, metis (default 0)")
    s.add_argument("--restarts", type=_at_least(1), default=10,
                   help="random restarts of local_search, scotch, metis; the best is kept (default 10)")
    s.add_argument("--split", metavar="FILE", help="the split that method 'given' scores (paper format or a plan)")
    ipg = s.add_argument_group("integer program options (--method ip)")
    ipg.add_argument("--contiguous", action="store_true", help="throughput: every device's part is convex")
    ipg.add_argument("--split-passes", action="store_true",
                     help="training: minimise max forward load + max backward load")
    ipg.add_argument("--pieces", type=_at_least(1), default=1, metavar="Q",
                     help="latency: up to Q contiguous calls per accelerator (default 1)")
    ipg.add_argument("--time-limit", type=_positive("seconds"), default=60.0, metavar="S",
                     help="seconds (ip and dp); the best plan found and its proven lower bound are "
                          "returned (default 60)")
    ipg.add_argument("--solver", default="highs", choices=["highs", "cbc"], help="MIP backend (default highs)")
    ipg.add_argument("--no-warm-start", action="store_true", help="do not start from a DP/greedy plan")
    s.add_argument("-o", "--output", metavar="PLAN.json", help="also write the plan (the JSON object) here")

    c = sub.add_parser("compare", parents=[out], help="every method on one workload, against the best bound",
                       description="Run every method on one workload and print their values beside the best "
                                   "proven lower bound (how far each is from the optimum at most).")
    c.add_argument("workload", help="workload JSON (the paper's format), or an ONNX model (profiled "
                                    "for the devices, as the main command does)")
    c.add_argument("--objective", default="throughput", choices=["throughput", "latency"])
    cm = c.add_argument_group("for an ONNX model")
    cm.add_argument("--input-shape", action="append", default=[], metavar="NAME=DIMS",
                    help="bind an input's shape (repeat per input, or a,b: input_ids=1x128,mask=1x128)")
    cm.add_argument("--input-value", action="append", default=[], metavar="NAME=NUMBER",
                    help="feed this input NUMBER when measuring")
    cm.add_argument("--devices", metavar="CLUSTER.json", help="cluster spec (default: this machine)")
    cm.add_argument("--accelerator", metavar="NAME", help="the cluster's accelerator, when it has several")
    cm.add_argument("--profile", metavar="PROFILE.json", help="profile file (default: the cache)")
    c.add_argument("--time-limit", type=_positive("seconds"), default=60.0, metavar="S", help="for the integer program (default 60)")
    c.add_argument("--html", metavar="REPORT.html",
                   help="also write a report: every method against the bound, the placement drawn "
                        "as a graph coloured by device, loads, and timelines of the best plan")
    c.add_argument("--draw", metavar="METHOD", help="the method whose plan the report draws "
                   "(default: the best valid plan)")

    model = argparse.ArgumentParser(add_help=False)
    model.add_argument("model", help="ONNX model file (weights may be in external data files)")
    model.add_argument("--input-shape", action="append", default=[], metavar="NAME=DIMS",
                       help="bind an input's shape, e.g. input_ids=1x128 (repeat per input, or "
                            "comma-separated: input_ids=1x128,attention_mask=1x128); needed "
                            "for inputs with dynamic dimensions.  The main command and export take "
                            "a range per dimension, input_ids=1..8x16..512 (planned at its middle, "
                            "or at the shape after '@': input_ids=1..8x16..512@1x128), and "
                            "write parts for every shape in it")
    model.add_argument("--input-value", action="append", default=[], metavar="NAME=NUMBER",
                       help="feed this input NUMBER (every element) when measuring and checking, "
                            "instead of random floats / ones for integers, e.g. sr=16000 where "
                            "an input steers control flow (repeat per input, or comma-separated)")
    model.add_argument("--repeats", type=_at_least(1), default=10, metavar="N",
                       help="timed runs per operator (operators under 1 ms get 5x as many; default 10)")
    model.add_argument("--quiet", action="store_true", help="no progress bar")

    pr = sub.add_parser("profile", parents=[model, out], help="time every operator of an ONNX model",
                        description="Time every operator of an ONNX model on one CPU thread "
                                    "and on every accelerator execution provider present, and "
                                    "compare the sum with the whole model's time. Results are "
                                    "cached in the profile file by model hash and device: asking "
                                    "again runs nothing.")
    pr.add_argument("-o", "--output", metavar="PROFILE.json",
                    help="profile file to read and add to (default: a per-user cache file, "
                         "$ONNXSPLIT_CACHE_DIR or ~/.cache/onnxsplit)")
    pr.add_argument("--providers", metavar="EP,...",
                    help="execution providers to profile (default: every one present)")
    pr.add_argument("--warmup", type=int, default=2, metavar="N", help="untimed runs first (default 2)")
    pr.add_argument("--method", choices=("auto", "in_graph", "alone"), default="auto",
                    help="in_graph: time operators inside whole-model runs with onnxruntime's "
                         "profiler; alone: each in a model of its own; auto (default): in_graph "
                         "on the CPU for models whose operators average 20 us or more, else alone")
    pr.add_argument("--no-group", action="store_true",
                    help="time every operator, even ones identical to an operator already timed "
                         "(timing them alone)")
    pr.add_argument("--force", action="store_true", help="measure again even if the file has it")

    wl = sub.add_parser("workload", parents=[model], help="turn an ONNX model into a workload",
                        description="Build the paper's workload JSON for an ONNX model on a "
                                    "cluster: CPU latencies measured, accelerator latencies "
                                    "measured where its execution provider is present or "
                                    "profiled, else estimated from its peak FLOP/s and memory "
                                    "bandwidth; transfer costs from the link's latency and "
                                    "bandwidth.")
    wl.add_argument("--devices", metavar="CLUSTER.json",
                    help="cluster spec, JSON or YAML (default: this machine; see 'onnxsplit devices')")
    wl.add_argument("--profile", metavar="PROFILE.json",
                    help="profile file to use and add missing measurements to (default: the cache)")
    wl.add_argument("--accelerator", metavar="NAME",
                    help="the cluster's accelerator device to use, when it has several")
    wl.add_argument("--shared-weights", default="first", choices=["first", "each", "color"],
                    help="a weight read by several operators counts toward the memory of: the "
                         "first reader (default), every reader, or the first with all readers "
                         "tied into one colour class")
    wl.add_argument("--activations", default="outputs", choices=["outputs", "none"],
                    help="add each operator's output bytes to its memory size (default) or not")
    wl.add_argument("-o", "--output", metavar="WORKLOAD.json",
                    help="write the workload here (default: print it)")

    placed = argparse.ArgumentParser(add_help=False)
    placed.add_argument("--out", required=True, metavar="DIR", help="folder to write the parts into (new)")
    placed.add_argument("--devices", metavar="CLUSTER.json",
                        help="cluster spec to plan for (default: this machine's CPU cores and "
                             "execution providers; see 'onnxsplit devices')")
    placed.add_argument("--accelerator", metavar="NAME",
                        help="the cluster's accelerator device to use, when it has several")
    placed.add_argument("--profile", metavar="PROFILE.json",
                        help="profile file to use and add to (default: the per-user cache)")
    placed.add_argument("--force", action="store_true", help="replace an existing --out folder")
    placed.add_argument("--recalibrate", action="store_true",
                        help="measure the whole model as users run onnxruntime again, though the "
                             "profile holds a calibration (when `run` shows the machine moved since)")
    placed.add_argument("--precision", choices=("auto", "f32", "bf16"), default="auto",
                        help="what parts on OpenVINO compute in: auto (default) as OpenVINO does by "
                             "default here (bf16 on a CPU with bf16 units, faster; the check then allows "
                             "what the whole model moves when OpenVINO runs it in bf16), or f32, or bf16")
    placed.add_argument("--no-verify", action="store_true",
                        help="do not run the parts against the original model")

    sp = sub.add_parser("split", parents=[model, placed, out], help="the main command: split a model "
                        "into verified per-device parts (also: onnxsplit MODEL --out DIR)",
                        description="Profile the model (or reuse the cached profile), plan for the "
                                    "devices, write per-device ONNX parts, manifest.json and "
                                    "plan.json into --out, and check the parts against the "
                                    "original model.")
    sp.add_argument("--objective", choices=["throughput", "latency"],
                    help="throughput: pipelined samples per second; latency: one sample's time "
                         "(default: throughput; latency with --context)")
    sp.add_argument("--context", type=_at_least(1), metavar="N",
                    help="a decoder with past (input_ids, attention_mask, past_key_values.*): plan one "
                         "decoding step with N tokens in context (its KV cache counted on each part's "
                         "device), and make the parts for every step up to it, for onnxsplit generate "
                         "(instead of --input-shape)")
    sp.add_argument("--prefill", type=_at_least(1), metavar="C",
                    help="with --context: the parts take up to C prompt tokens in one call (default: "
                         "128, at most N); a longer prompt is prefilled C tokens a call")
    sp.add_argument("--pin", action="append", default=[], metavar="REGEX=DEVICE",
                    help="keep operators whose name contains REGEX (or whose op type is REGEX) on "
                         "DEVICE: cpu, or the accelerator (e.g. 'Shape|Gather=cpu'); repeatable")
    sp.add_argument("--method", default="auto", choices=["auto"] + list(registry.METHODS), metavar="METHOD",
                    help="auto (default): the exact DP for throughput where the graph allows, else "
                         "the linearized DP; the integer program for latency with accelerators. "
                         "Or any method of 'onnxsplit solve'")
    sp.add_argument("--time-limit", type=_positive("seconds"), default=30.0, metavar="S",
                    help="seconds for the solver (default 30; with several accelerator classes, as long "
                         "again for each class alone)")

    ex = sub.add_parser("export", parents=[model, placed, out], help="write the parts of a given plan",
                        description="Apply a plan.json (as the main command writes it; nodes by "
                                    "name, devices acc0.., cpu0..; edit it freely) to the model "
                                    "and write the verified parts into --out.")
    ex.add_argument("--plan", required=True, metavar="PLAN.json", help="the plan to apply")

    rn = sub.add_parser("run", parents=[out], help="verify and time an exported parts folder",
                        description="Load each part on its execution provider, check one sample "
                                    "against the original model, then stream samples through a "
                                    "pipeline (one worker per device, one single-threaded session "
                                    "per CPU core) and compare with the whole model in one "
                                    "single-threaded session and with the plan's prediction.")
    rn.add_argument("parts", help="folder written by onnxsplit (with manifest.json)")
    rn.add_argument("--model", metavar="MODEL.onnx",
                    help="the original model (default: the path in the manifest)")
    rn.add_argument("--samples", type=_at_least(1), default=50, metavar="N", help="timed samples (default 50)")
    rn.add_argument("--warmup", type=_at_least(0), default=5, metavar="N", help="untimed samples first (default 5)")
    rn.add_argument("--time-limit", type=_positive("seconds"), default=300.0, metavar="S",  # (compare.TIME_LIMIT_S)
                    help="measure in about S seconds (default 300): a slow model or a large shape "
                         "gets fewer warm-up samples, samples and rounds (at least 3), and says so")
    rn.add_argument("--no-measure", action="store_true", help="only verify the outputs")
    rn.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS",
                    help="run at this input shape, inside the range the parts were made for "
                         "(inputs not given follow by the model's dimension names); repeatable")
    rn.add_argument("--engine", choices=("threads", "ray"), default="threads",
                    help="threads: this process (default); ray: one Ray actor per part")
    rn.add_argument("--address", metavar="ADDR",
                    help="with --engine ray: a running Ray cluster to join (default: start a local one)")
    rn.add_argument("--fallback-cpu", action="store_true",
                    help="run a part whose execution provider or device this machine lacks on the CPU "
                         "(its outputs are checked; its timings are not the plan's)")
    rn.add_argument("--report", action="store_true",
                    help="also time each part and draw what was measured beside the prediction in "
                         "PARTS/report.html (replaced in one step; only a report onnxsplit wrote)")

    gn = sub.add_parser("generate", parents=[out],
                        help="generate tokens through a decoder's parts (prefill, greedy decoding)",
                        description="Prefill the prompt, then decode greedily one token a step, each "
                                    "layer's cache fed back to the part that made it; tokens/s beside "
                                    "the same loop over the original model in onnxruntime's default "
                                    "session (whose tokens the parts' must equal) and beside "
                                    "onnxruntime-genai where it runs the model.")
    gn.add_argument("parts", help="folder written by onnxsplit from a decoder with past (with manifest.json)")
    gn.add_argument("--prompt", required=True, metavar="IDS", help="token ids, comma-separated: 1,15043,29991")
    gn.add_argument("--max-new-tokens", type=_at_least(1), default=32, metavar="N",
                    help="tokens to generate (default 32)")
    gn.add_argument("--eos", type=_at_least(0), metavar="ID", help="stop after this token id")
    gn.add_argument("--rounds", type=_at_least(1), default=3, metavar="N",
                    help="generations of each, in turn; the median of each rate kept (default 3)")
    gn.add_argument("--no-baseline", action="store_true",
                    help="only the parts: no check against the original model, no peers")
    gn.add_argument("--fallback-cpu", action="store_true",
                    help="run a part whose execution provider this machine lacks on the CPU")

    sv = sub.add_parser("serve", help="serve a parts folder over HTTP (Open Inference Protocol)",
                        description="Serve the parts behind an HTTP endpoint speaking the Open Inference "
                                    "Protocol (KServe v2, as Triton does): GET /v2/health/ready, GET "
                                    "/v2/models/NAME, POST /v2/models/NAME/infer (and /generate for a "
                                    "decoder with past).  The parts run in this process (--engine local, "
                                    "the default) or as a Ray Serve application, one deployment per part "
                                    "(--engine ray, the default with --address).  Ctrl-C stops it.")
    sv.add_argument("parts", help="folder written by onnxsplit (with manifest.json)")
    sv.add_argument("--port", type=_number(int, lambda v: 1 <= v <= 65535, "must be from 1 to 65535", "an integer"),
                    default=8000, metavar="N", help="HTTP port (default 8000)")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--name", metavar="NAME", type=_model_name,
                    help="the model's name in the URLs (default: the model file's stem)")
    sv.add_argument("--engine", choices=["local", "ray"],
                    help="local: the parts in this process, run by the pipeline that `run` measures (the "
                         "default); ray: Ray Serve, a deployment a part (the default with --address)")
    sv.add_argument("--address", metavar="ADDR", help="a running Ray cluster to join (--engine ray; default: "
                                                      "start a local one)")
    sv.add_argument("--fallback-cpu", action="store_true",
                    help="serve a part whose execution provider the cluster lacks on a CPU")
    sv.add_argument("--ready-file", metavar="FILE", help=argparse.SUPPRESS)
    bt = sv.add_argument_group("dynamic batching", "Concurrent requests whose shapes differ only in dimension 0 "
                               "run through the parts as one batch (where the parts were exported for a "
                               "range in which dimension 0 varies; Triton's option names)")
    bt.add_argument("--max-batch-size", type=_at_least(1), metavar="N",
                    help="rows in one batch (default: the upper end of the batch dimension's range)")
    bt.add_argument("--max-queue-delay-microseconds", type=_at_least(0), metavar="N",
                    help="how long the oldest request may wait for others to join its batch once a batch "
                         "could go (default 0, as Triton's: batches grow while the parts are busy)")
    bt.add_argument("--preferred-batch-size", type=_at_least(1), action="append", default=[], metavar="N",
                    help="a batch size sent as soon as it is reached; repeatable")
    bt.add_argument("--pad-dimension", metavar="NAME",
                    help="batch requests that differ along the dimension NAME (e.g. sequence) too, padded "
                         "with zeros to a batch's longest, each answer cut back to its own length: for "
                         "models with an attention mask over it (answers then equal each request served "
                         "alone up to float rounding, not bit for bit)")
    bt.add_argument("--no-batching", action="store_true", help="run each request alone")
    sv.add_argument("--request-timeout-ms", type=_at_least(1), metavar="N",
                    help="answer 504 to a request not answered within N ms, its wait in the queue "
                         "included (default: no limit)")
    sv.add_argument("--max-ongoing", type=_at_least(1), metavar="N",
                    help="requests the server works on at once (default 16; raised to fill the batches "
                         "in flight where batching is on)")
    sv.add_argument("--max-queued", type=_at_least(0), metavar="N",
                    help="requests waiting beyond those (default 64); more are answered 503 at once")

    dv = sub.add_parser("devices", help="print this machine's cluster spec",
                        description="Print this machine's devices and links as a cluster spec "
                                    "(JSON): a starting point for --devices.")
    dv.add_argument("--check", metavar="CLUSTER.json", help="read and validate a cluster file instead")

    e = sub.add_parser("evaluate", parents=[out], help="score a given split",
                       description="Score a split file (paper format or a plan's JSON) and list its violations.")
    e.add_argument("workload", help="workload JSON (the paper's format)")
    e.add_argument("split", help='split JSON: {"fpgas": [{"nodes": [...]}], "cpus": [...]} or a plan')
    e.add_argument("--objective", default="throughput", choices=["throughput", "latency"])
    for command in (c, pr, wl, sp, ex, rn, gn, sv, dv):  # those that open sessions
        command.add_argument("--ep-library", action="append", default=[], metavar="NAME=PATH",
                             help="load a plugin execution provider from its library (onnxruntime "
                                  "1.23+), e.g. OpenVINOExecutionProvider=/path/libonnxruntime_"
                                  "providers_openvino_plugin.so; installed packages onnxsplit knows "
                                  "(onnxruntime-ep-openvino) load without it")
    return p


def entry() -> None:
    """The ``onnxsplit`` command: :func:`main`, then the process ends (at once where a
    solve that was stopped at its time limit still runs: see interrupt.finish)."""
    from .interrupt import finish

    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C before the command's own watch: parsing, its imports
        print("onnxsplit: interrupted", file=sys.stderr)
        code = 130
    finish(code)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        argv.insert(0, "split")  # onnxsplit MODEL --out DIR
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 2
    from . import limits
    from .errors import CheckFailed, OnnxsplitError
    from .interrupt import run

    command = {"split": _split, "export": _export, "run": _run, "generate": _generate, "serve": _serve,
               "solve": _solve,
               "evaluate": _evaluate,
               "compare": _compare, "profile": _profile, "workload": _workload,
               "devices": _devices}[args.command]
    try:
        limits.set_limit(getattr(args, "memory_limit", None))  # for this command only
        for spec in getattr(args, "ep_library", None) or []:
            from .providers import plugins

            plugins.add_libraries(spec)  # (child processes and Ray's actors load them too)
        return run(lambda: command(args))  # Ctrl-C ends it within 2 s (see interrupt.py)
    except CheckFailed as e:  # (exit 1, as a failed check of `run`: the parts are wrong, not the input)
        _error(e)
        return 1
    except OnnxsplitError as e:
        _error(e)
        return 2
    except KeyboardInterrupt:
        print("onnxsplit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head & co. (before OSError: it is one)
        sys.stderr.close()
        return 0
    except OSError as e:  # a file the user named cannot be read or written
        where = f"'{e.filename}': " if getattr(e, "filename", None) else ""
        _error(f"{where}{e.strerror or e}")
        return 2
    finally:
        limits.set_limit(None)


def _error(what) -> None:
    """The one line a failed command ends with (:func:`.progress.escaped`)."""
    from .progress import escaped

    print(f"onnxsplit: error: {escaped(str(what))}", file=sys.stderr)


def _split(args) -> int:
    from . import api
    from .workflow import split

    shapes, shape_range = api.parse_input_ranges(args.input_shape)
    objective = args.objective or "throughput"
    if args.prefill is not None and args.context is None:
        from .errors import OnnxsplitError

        raise OnnxsplitError("--prefill goes with --context")
    if args.context is not None:
        from .errors import OnnxsplitError
        from .running.generate import decode_step

        if args.input_shape:
            raise OnnxsplitError("give --context or --input-shape, not both")
        shapes, shape_range = decode_step(args.model, args.context, args.prefill)
        objective = args.objective or "latency"
    result = split(args.model, args.out, devices=args.devices, objective=objective,
                   input_shapes=shapes, shape_range=shape_range, pins=args.pin,
                   input_fills=api.parse_input_values(args.input_value),
                   method=args.method, time_limit=args.time_limit, force=args.force,
                   quiet=args.quiet or args.json, verify=not args.no_verify, profile=args.profile,
                   accelerator=args.accelerator, recalibrate=args.recalibrate, precision=args.precision)
    return _print_split(result, args.json)


def _export(args) -> int:
    from . import api
    from .workflow import export_plan

    shapes, shape_range = api.parse_input_ranges(args.input_shape)
    result = export_plan(args.model, args.plan, args.out, devices=args.devices,
                         input_shapes=shapes, shape_range=shape_range, force=args.force,
                         input_fills=api.parse_input_values(args.input_value),
                         quiet=args.quiet or args.json, verify=not args.no_verify,
                         profile=args.profile, accelerator=args.accelerator,
                         recalibrate=args.recalibrate, precision=args.precision)
    return _print_split(result, args.json)


def _print_split(result: dict, as_json: bool) -> int:
    verify = result.get("verify")
    bad = verify is not None and not verify["ok"]
    if as_json:
        print(json.dumps(result))
        return 1 if bad else 0
    m, plan, pred = result["model"], result["plan"], result["predicted"]
    from .shapes import dims_text

    shapes = _shapes_text(m["input_shapes"])
    print(f"model: {m['path']}, {m['operators']} operators, {m['weight_bytes'] / 2**20:.1f} MiB of "
          f"weights" + (f"; {shapes}" if shapes else ""))
    how = f"{plan['objective']} by {plan['method']}, {plan['status']}"
    if plan.get("gap") is not None:
        how += f", gap {plan['gap']:.1%}"
    print(f"plan: {how} ({plan['seconds']:.1f} s)")
    if plan["details"].get("why"):
        print(f"  kept whole: {plan['details']['why']}")
    print(f"  {'device':<8} {'nodes':>6} {'load ms':>10}  parts")
    for row in result["devices"]:
        print(f"  {row['device']:<8} {row['nodes']:>6} {row['load_ms']:>10.3f}  {' '.join(row['parts'])}")
    single = pred["single_device"]
    tput = pred["throughput_per_s"]
    source = {"parts": " (its parts timed as written)", "calibration": " (as calibrated)"}
    print(f"predicted: {tput:.1f} samples/s pipelined ({1e3 / tput:.2f} ms per sample), "
          f"latency {pred['latency_ms']:.2f} ms{source.get(pred.get('from'), '')}")
    weighed = plan["details"].get("candidates") or []
    if weighed:
        print("weighed (predicted before any was written, best first):")
        for c in weighed[:6]:
            print(f"  {c['throughput_per_s']:>10.1f}/s {c['latency_ms']:>9.2f} ms  {c['what'].split(';')[0]}")
    elif single.get("throughput_per_s") and len(result["parts"]) > 1:
        print(f"best single device ({single['device']}): {single['throughput_per_s']:.1f} samples/s, "
              f"latency {single['latency_ms']:.2f} ms; the plan: {tput / single['throughput_per_s']:.2f}x "
              "the throughput")
    for provider, w in (result.get("providers") or {}).items():
        print(f"per operator, one thread: {provider} faster on {w['faster_on']} of {w['operators']} "
              f"({w['time_share']:.0%} of the time when each runs on the faster); the faster of each "
              f"{w['best_of_both_ms']:.3g} ms against {w['cpu_ms']:.3g} ms on the CPU EP and "
              f"{w['own_ms']:.3g} ms on {provider}")
    for v in result["violations"]:
        print(f"warning: the plan breaks: {v}")
    _print_per_shape(result)
    if result.get("precision"):
        on_openvino = _openvino_parts(result)
        print(f"precision: {on_openvino} part(s) on OpenVINO compute in {result['precision']}, as OpenVINO does "
              "by default on this CPU (--precision f32 holds them to float32); the rest in float32"
              if on_openvino else f"precision: float32 (OpenVINO was weighed in {result['precision']}, its "
              "default on this CPU, and no part runs on it)")
    else:
        _bf16_hint(result)
    if verify is not None:
        where = f" (worst at {_shapes_text(verify['shapes'])})" if verify.get("shapes") else ""
        print(f"verify: max abs error {verify['max_abs_error']:.2g}, max rel error "
              f"{verify['max_rel_error']:.2g} over {verify['outputs']} outputs{where}"
              + (f" (tolerance {_tolerance_text(verify)})" if not bad else " -- ABOVE " + _tolerance_text(verify)))
    print(f"wrote {result['out']}: {' '.join(result['parts'])} manifest.json plan.json"
          + (" report.html" if result.get("report") else ""))
    at = ""
    if result.get("per_shape"):
        last = _given_for_run(result["per_shape"][-1]["shapes"], Path(result["out"]))
        at = " " + " ".join(f"--shape {k}={dims_text(v)}" for k, v in last.items())
    print(f"next: onnxsplit run {result['out']}{at}   (measured beside onnxruntime's own sessions)")
    return 1 if bad else 0


def _given_for_run(shapes: dict, out: Path) -> dict:
    """The shapes ``run --shape`` needs: an input whose shape follows by the model's
    dimension names from those before it (a decoder's caches after the first) is left out."""
    from . import ranges

    try:
        specs = json.loads((out / "manifest.json").read_text())["model"]["inputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return shapes
    given: dict = {}
    for k, v in shapes.items():
        if ranges.follow_names(given, specs).get(k) != tuple(v):
            given[k] = tuple(v)
    return given


def _shapes_text(shapes: dict, text=None) -> str:
    """Inputs and their shapes (``text``: how a shape is written, dims_text by default),
    inputs numbered alike with one shape written once: a decoder's 64 caches are
    ``past_key_values.N.key=1x8x128x64 (32 inputs) past_key_values.N.value=...``."""
    import re

    from .shapes import dims_text

    text = text or dims_text
    groups: dict[tuple[str, str], list[str]] = {}
    for k, v in shapes.items():
        groups.setdefault((re.sub(r"\d+", "N", k), text(v)), []).append(k)
    return " ".join(f"{names[0]}={dims}" if len(names) == 1 else f"{pattern}={dims} ({len(names)} inputs)"
                    for (pattern, dims), names in groups.items())


def _openvino_parts(result: dict) -> int:
    """How many of the written parts run on OpenVINO (its runtime or its plugin EP)."""
    from .providers import openvino

    try:
        parts = json.loads((Path(result["out"]) / "manifest.json").read_text()).get("parts") or []
    except (OSError, ValueError, KeyError):
        return 0
    return sum(p.get("execution_provider") in (openvino.RUNTIME, openvino.PLUGIN_EP) for p in parts)


def _bf16_hint(result: dict) -> None:
    """Where OpenVINO was weighed on a CPU with bf16 units, say that it computes in bf16 by
    default there, and how to split for that: a user comparing with OpenVINO as installed
    meets bf16's speed."""
    from .providers import openvino

    if openvino.RUNTIME in (result.get("providers") or {}) and openvino.bf16_units():
        print("precision: float32; OpenVINO computes in bf16 by default on this CPU (bf16 units): "
              "--precision bf16 splits for that, the check then allowing what bf16 moves")


def _print_per_shape(result: dict) -> None:
    """The range's check shapes: each one's verification and promise."""
    from . import ranges

    rows = result.get("per_shape")
    if not rows:
        return
    r = result["model"].get("shape_range") or {}
    print(f"shapes: {_shapes_text(r, ranges.text)}, planned at "
          f"{_shapes_text(next((x['shapes'] for x in rows if x['planned']), {}))}")
    print(f"  {'shape':<36} {'latency ms':>11} {'samples/s':>10}  verify")
    for x in rows:
        lat, tput = x.get("latency_ms"), x.get("throughput_per_s")
        v = x["verify"]
        # (no promise where the parts run on a device this machine lacks: checked on the CPU)
        lat_text = f"{lat:>11.2f}" if lat else f"{'-':>11}"
        tput_text = f"{tput:>10.1f}" if tput else f"{'-':>10}"
        print(f"  {_shapes_text(x['shapes']):<36} {lat_text} {tput_text}  {'ok' if v['ok'] else 'FAILED'}, "
              f"max rel error {v['max_rel_error']:.2g}")


def _tolerance_text(verify: dict) -> str:
    from .running.verify import says

    return says(verify)


def _generate(args) -> int:
    from .errors import OnnxsplitError
    from .running.generate import run_generation

    try:
        prompt = [int(t) for t in args.prompt.replace(" ", "").split(",") if t]
    except ValueError:
        raise OnnxsplitError(f"--prompt takes token ids separated by commas, not {args.prompt!r}") from None
    if any(t < 0 for t in prompt):
        raise OnnxsplitError("--prompt: token ids are not negative")
    r = run_generation(args.parts, prompt, args.max_new_tokens, eos=args.eos,
                       baseline=not args.no_baseline, fallback_cpu=args.fallback_cpu, rounds=args.rounds)
    bad = "check" in r and not r["check"]["ok"]
    if bad:
        c = r["check"]
        why = (f"token {c['first_difference']} differs" if c["first_difference"] is not None else
               f"logits off by {c['max_rel_logit_error']:.2g} of their largest (tolerance {c['tolerance']:g})")
        print(f"onnxsplit: check failed: the parts do not generate as the original model does ({why})",
              file=sys.stderr)
    if args.json:
        print(json.dumps(r))
        return 1 if bad else 0
    print(f"{r['parts_dir']}: {r['parts']} part(s) on {', '.join(r['devices'])}")
    print(f"caches: {r['caches']}")
    print(f"generated {len(r['tokens'])} token(s): {' '.join(map(str, r['tokens']))}")
    if "check" in r:
        c = r["check"]
        print(f"check: {'the same tokens as' if c['first_difference'] is None else 'NOT the same tokens as'} "
              f"the original model in onnxruntime, logits within {c['max_rel_logit_error']:.2g} of their "
              f"largest (tolerance {c['tolerance']:g})")
    names = {"onnxsplit": "onnxsplit's parts", "onnxruntime": "onnxruntime, the whole model (default session)",
             "onnxruntime_genai": "onnxruntime-genai, the whole model"}
    how = f"the prompt {r['prefill_chunk']} token(s) a call" if r["prefill_chunk"] < len(r["prompt"]) else \
        "the prompt in one call"
    print(f"  {'median of ' + str(r['rounds']) + ', ' + how:48} {'prefill tok/s':>14} {'decode tok/s':>13} "
          f"{'first token ms':>15}")
    for k, v in r["rates"].items():
        cells = [f"{x:.1f}" if x is not None else "-" for x in
                 (v["prefill_tokens_per_s"], v["decode_tokens_per_s"], v["first_token_ms"])]
        print(f"  {names[k]:48} {cells[0]:>14} {cells[1]:>13} {cells[2]:>15}")
    if "genai" in r:
        print(f"  (onnxruntime-genai not measured: {r['genai']})")
    elif "genai_tokens_equal" in r and not r["genai_tokens_equal"]:
        print("  (onnxruntime-genai's tokens differ from onnxruntime's on the same model: its own decoding)")
    return 1 if bad else 0


def _run(args) -> int:
    if args.address and args.engine != "ray":
        from .errors import OnnxsplitError

        raise OnnxsplitError("--address needs --engine ray")
    if args.engine == "ray":
        from .running.ray_engine import run_parts
    else:
        from .running.compare import run_parts

    extra = {"address": args.address} if args.engine == "ray" else {}
    if args.shape:
        from . import api
        from .running.manifest import inputs_at, read_manifest
        from .running.runner import random_feeds

        extra["feeds"] = random_feeds(inputs_at(read_manifest(args.parts), api.parse_input_shapes(args.shape)))
    if args.report:
        from .measured_report import check_writable

        check_writable(args.parts)  # before the run, not after it
        extra["time_parts"] = True
    from .progress import ticking

    with ticking("checking" if args.no_measure else "checking, then measuring in rounds", args.json):
        result = run_parts(args.parts, model=args.model, samples=args.samples, warmup=args.warmup,
                           measure=not args.no_measure, fallback_cpu=args.fallback_cpu,
                           time_limit=args.time_limit, **extra)
    if args.report:
        from . import measured_report
        from .running.manifest import read_manifest

        try:  # (what was measured is printed all the same)
            result["report"] = str(measured_report.write(args.parts, read_manifest(args.parts), result))
        except OSError as e:
            print(f"onnxsplit: warning: {args.parts}/report.html not written ({e.strerror or e})",
                  file=sys.stderr)
    bad = not result["verify"]["ok"]
    if bad:  # also on stderr: a script sees why the exit status is 1
        from .running.verify import failed

        print(f"onnxsplit: check failed: {failed(result['verify'])}", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return 1 if bad else 0
    v = result["verify"]
    how = "one onnxruntime session (annotated.onnx)" if result["run_as"] == "session" else \
        f"{len(result['parts'])} part(s) on {', '.join(result['devices'])}"
    if result.get("engine") == "ray":
        how += f", on Ray ({len(set(w['node'] for w in result['placed'].values()))} node(s))"
    print(f"{result['parts_dir']}: runs as {how}")
    moved = result.get("fell_back") or []
    if moved:
        print(f"fallback: {', '.join(moved)} ran on the CPU (absent here): the timings below are not the plan's")
    print(f"verify: max abs error {v['max_abs_error']:.2g}, max rel error {v['max_rel_error']:.2g} "
          f"over {v['outputs']} outputs" + (f" (tolerance {_tolerance_text(v)})" if v["ok"]
                                            else " -- ABOVE " + _tolerance_text(v)))
    if "assignment" in result:
        a = result["assignment"]
        print(f"placement: of {a['checked']} annotated nodes onnxruntime kept by name, "
              f"{a['checked'] - a['elsewhere']} run where the plan put them, {a['elsewhere']} "
              f"elsewhere ({a['fused']} fused under new names)")
    if result.get("report"):
        print(f"report: {result['report']} (measured beside predicted)")
    if "measured" not in result:
        return 1 if bad else 0
    rows = [("onnxsplit, measured", result["measured"]), ("onnxsplit, predicted", result["predicted"])]
    rows += [(name, b) for name, b in (result.get("baselines") or {}).items()]
    print(f"  {'':<28} {'latency ms':>11} {'samples/s':>10} {'vs onnxsplit':>13}")
    ratios = result.get("ratios") or {}
    for label, r in rows:
        if not r:
            continue
        if "error" in r:
            print(f"  {label:<28} {'-':>11} {'-':>10}  {r['error'][:60]}")
            continue
        ratio = ratios.get(label)
        if r.get("precision", "f32") != "f32":  # (OpenVINO's default on a CPU with bf16 units)
            label = f"{label} ({r['precision']})"
        rtext = f"{ratio['throughput']:.2f}x / {ratio['latency']:.2f}x" if ratio else ""
        print(f"  {label:<28} {r['latency_ms']:>11.2f} {r['throughput_per_s']:>10.1f} {rtext:>13}")
    if ratios:
        print("  (vs onnxsplit: its throughput over the row's, the row's latency over its; above "
              "1: onnxsplit is faster)")
    reduced = sorted({b["precision"] for b in (result.get("baselines") or {}).values()
                      if b.get("precision", "f32") != "f32"})
    if reduced and result.get("precision", "f32") == "f32":
        print(f"  (OpenVINO computes in {reduced[0]} on this CPU by default, the parts in float32: split with "
              f"--precision {reduced[0]} to let onnxsplit's OpenVINO parts compute so too)")
    cut = result["measured"].get("time_limited")
    if cut:
        print(f"  (measured in {cut['rounds']} rounds of {cut['per_round']} sample(s) a session, "
              f"{cut['warmup']} to warm up, to finish within --time-limit {cut['time_limit_s']:g} s: "
              "a larger limit measures longer)")
    err = result.get("prediction_error")
    if err:
        print(f"prediction: measured over predicted {err['throughput']:+.0%} throughput, "
              f"{err['latency']:+.0%} latency")
    drift = result.get("drift") or {}
    for name, d in drift.items():
        print(f"  the machine since the prediction: {name} measured {d['throughput']:+.0%} throughput, "
              f"{d['latency']:+.0%} latency against the calibration's figures")
    if any(abs(v) > DRIFT_NOTED for d in drift.values() for v in d.values()):
        print("  (split again with --recalibrate to measure the machine as it runs now)")
    for name, d in (result.get("relative_error") or {}).items():
        print(f"  beside {name}, as predicted: measured ratio over predicted ratio "
              f"{d['throughput']:+.0%} throughput, {d['latency']:+.0%} latency (what the machine "
              "moved on both sides cancels out)")
    return 1 if bad else 0


def _solve(args) -> int:
    from . import api

    from .files import check_output, check_replaceable, json_with, write_atomic

    inputs = (args.workload, args.split)
    check_output(args.output, inputs)  # before the solve, not after it
    check_replaceable(args.output, json_with("objective", "method", "assignment"), "plan")
    workload = api.load_workload(args.workload)
    args.method = args.method or ("dp" if args.objective == "throughput" else "ip")
    if args.split and args.method != "given":
        from .errors import OnnxsplitError

        raise OnnxsplitError("--split is read by --method given only")
    given = dict(seed=args.seed, restarts=args.restarts, split=args.split, contiguous=args.contiguous,
                 split_passes=args.split_passes, pieces=args.pieces, time_limit=args.time_limit,
                 solver=args.solver, warm_start=not args.no_warm_start)
    from .solve import anytime

    from .progress import solve_line

    # (lines, not a redrawn bar: said in a pipe or a log too, as they always were)
    anytime.report = None if args.quiet or args.json else solve_line
    try:
        plan = api.solve(workload, objective=args.objective, method=args.method,
                         options=_methods().options_for(args.method, others="ignore", **given))
    finally:
        anytime.report = None
    obj = plan.to_json()
    if args.output:
        write_atomic(args.output, json.dumps(obj, indent=1) + "\n", inputs)
    if args.json:
        print(json.dumps(obj))
    else:
        _print_plan(workload, plan)
    if plan.value is None:  # also on stderr: a script sees why the exit status is 1
        why = "; ".join(plan.details.get("violations", [])[:1]) or plan.details.get("stopped") \
            or plan.status
        print(f"onnxsplit: no plan: {why}", file=sys.stderr)
        return 1
    return 0 if plan.status != "infeasible" else 1



def _print_plan(workload, plan) -> None:
    from .solve import evaluate

    print(f"{plan.objective} by {plan.method}: {plan.status}", end="")
    if plan.value is None:
        print(" (no placement satisfies memory, support and colour classes)")
        for v in plan.details.get("violations", []):
            print(f"  - {v}")
        return
    unit = "time per sample" if plan.objective == "throughput" else "latency"
    print(f", {unit} {plan.value:.6g}", end="")
    if plan.gap is not None:
        print(f", gap {plan.gap:.2%}", end="")
    print(f"  ({plan.seconds:.2f} s)")
    violations = plan.details.get("violations", [])
    if violations:
        print("  violations (this plan is not feasible):")
        for v in violations:
            print(f"  - {v}")
    if any(d not in workload.device_index for d in plan.assignment.values()):
        return  # a given split naming more devices than the workload has: scored above, no table
    rows = evaluate.device_rows(workload, plan.assignment, plan.stages or None)
    print(f"  {'stage':>5}  {'device':<7} {'nodes':>6} {'load':>12}")
    for i, row in enumerate(rows):
        print(f"  {i:>5}  {row['device']:<7} {row['nodes']:>6} {row['load']:>12.6g}")
    used = set(plan.assignment.values())
    idle = [d.name for d in workload.devices if d.name not in used]
    if idle:
        print(f"  unused: {', '.join(idle)}")
    single = evaluate.max_load(workload, {nid: "acc0" for nid in plan.assignment}).value \
        if workload.num_accelerators and workload.supported.all() else None
    if single is not None and plan.value > 0 and plan.objective == "throughput":
        print(f"  one accelerator alone: {single:.6g} ({single / plan.value:.2f}x slower)")


def _compare(args) -> int:
    from . import api
    from .files import check_output, check_replaceable, html_with
    from .report import GENERATOR

    check_output(args.html, (args.workload, args.profile, args.devices))
    check_replaceable(args.html, html_with(GENERATOR), "compare report")
    whole = []  # the model kept whole as onnxruntime runs it: what the methods must beat
    if args.workload.endswith(".onnx"):
        from . import machine
        from .workflow import prepare

        prep = prepare(args.workload, devices=args.devices, profile=args.profile,
                       input_shapes=api.parse_input_shapes(args.input_shape),
                       input_fills=api.parse_input_values(args.input_value),
                       accelerator=args.accelerator, quiet=args.json)
        workload = prep.workload
        if prep.as_run.get("cpu"):
            whole = [{"what": c.plan.details["why"], "ms": c.value(args.objective),
                      "latency_ms": c.predicted["latency_ms"],
                      "throughput_per_s": c.predicted["throughput_per_s"]}
                     for c in machine.whole_candidates(workload, args.objective, prep.as_run["cpu"],
                                                       prep.as_run.get("acc"), prep.on_cores)]
    else:
        workload = api.load_workload(args.workload)
    result = api.compare(workload, args.objective, time_limit=args.time_limit)
    bound = result["best_lower_bound"]
    if args.html:
        _write_report(args, workload, result)
    if args.json:
        rows = [{"method": r["method"], "error": r["error"]} if "error" in r else r["plan"].to_json()
                for r in result["rows"]]
        print(json.dumps({"objective": args.objective, "best_lower_bound": bound, "methods": rows,
                          "onnxruntime": whole}))
        return 0
    print(f"{args.objective}: {workload.n} nodes, {workload.device_summary()}; "
          f"best proven lower bound: {bound:.6g}" if bound is not None else
          f"{args.objective}: no method proved a lower bound")
    print(f"  {'method':<16} {'status':<11} {'value':>12} {'vs bound':>9} {'seconds':>8}")
    for r in result["rows"]:
        if "error" in r:
            why = "the paper's model only" if "takes the paper's model only" in r["error"] else r["error"]
            print(f"  {r['method']:<16} {'-':<11} {'-':>12} {'-':>9} {'-':>8}  {why}")
            continue
        p = r["plan"]
        value = f"{p.value:>12.6g}" if p.value is not None else f"{'-':>12}"
        versus = f"{p.value / bound - 1:>+9.1%}" if p.value is not None and bound else f"{'-':>9}"
        note = "  (breaks: " + p.details["violations"][0] + ")" if p.details.get("violations") else ""
        if p.details.get("contiguous") and p.status == "optimal":
            note = "  (optimal among contiguous pipelines)"
        print(f"  {r['method']:<16} {p.status:<11} {value} {versus} {p.seconds:>8.2f}{note}")
    if whole:
        unit = "ms per sample" if args.objective == "throughput" else "ms"
        print(f"the methods' values are the profile's model (single-thread cores, graph "
              f"optimisations off); the model kept whole, as onnxruntime runs it here "
              f"(measured, {unit}):")
        for w in sorted(whole, key=lambda w: w["ms"]):
            print(f"  {w['ms']:>12.6g}  {w['what']}")
    return 0


def _write_report(args, workload, result) -> None:
    from pathlib import Path

    from . import report
    from .errors import OnnxsplitError
    from .files import write_atomic

    if args.draw:
        found = [r.get("plan") for r in result["rows"] if r["method"] == args.draw]
        if not found or found[0] is None or found[0].value is None:
            raise OnnxsplitError(f"--draw {args.draw}: that method gave no plan here")
        drawn = found[0]
    else:
        drawn = report.best_plan(result["rows"])
        if drawn is None:
            raise OnnxsplitError("no method gave a valid plan to draw")
    page = report.render(workload, result["rows"], args.objective, result["best_lower_bound"], drawn,
                         title=f"onnxsplit compare {Path(args.workload).name}")
    write_atomic(args.html, page, (args.workload, args.profile, args.devices))
    if not args.json:
        print(f"report: {args.html}")


def _evaluate(args) -> int:
    from . import api

    workload = api.load_workload(args.workload)
    assignment = api.read_split_file(args.split, workload)
    result = api.evaluate_split(workload, assignment, args.objective)
    if args.json:
        print(json.dumps(result))
        return 0
    label = "max load (time per sample)" if args.objective == "throughput" else "latency"
    print(f"{label}: {result['value']:.6g}")
    for dev, load in result["loads"].items():
        print(f"  {dev:<7} {load:>12.6g}")
    if result["violations"]:
        print("violations:")
        for v in result["violations"]:
            print(f"  - {v}")
    else:
        print("valid: memory, support and colour classes respected")
    return 0


def _profile(args) -> int:
    from pathlib import Path

    from . import api

    shapes = api.parse_input_shapes(args.input_shape)
    providers = [p.strip() for p in args.providers.split(",") if p.strip()] if args.providers else None
    prof = api.profile_model(args.model, shapes, output=args.output, providers=providers,
                             repeats=args.repeats, warmup=args.warmup, group=not args.no_group,
                             force=args.force, quiet=args.quiet, method=args.method,
                             input_fills=api.parse_input_values(args.input_value))
    if args.json:
        print(json.dumps({"path": str(prof.path), "model_hash": prof.model_hash,
                          "measured": list(prof.fresh),
                          "entries": [e.to_json() for e in prof.entries]}))
        return 0
    entries = prof.entries
    first = entries[0]
    from .shapes import dims_text

    shapes_txt = " ".join(f"{k}={dims_text(v)}" for k, v in prof.input_shapes.items())
    print(f"{Path(args.model).name}: {first.model.get('nodes', len(first.nodes))} operators"
          + (f", {shapes_txt}" if shapes_txt else ""))
    print(f"  {'device':<44} {'sum of operators':>16} {'whole model':>12} {'ratio':>6} {'seconds':>8}")
    for e in entries:
        whole = e.whole_model_ms.get("median")
        total = e.node_sum_ms()
        ratio = f"{total / whole:.2f}" if whole else "-"
        unsupported = sum(1 for t in e.nodes.values() if not t.supported)
        label = f"{e.execution_provider} ({e.hardware})"[:44]
        how = "measured now" if e.execution_provider in prof.fresh else f"cached {e.measured_at}"
        print(f"  {label:<44} {total:>13.3f} ms {whole or 0:>9.3f} ms {ratio:>6} {e.seconds:>8.1f}"
              f"  {how}" + (f", {unsupported} unsupported" if unsupported else ""))
    print(f"profile file: {prof.path}")
    return 0


def _workload(args) -> int:
    from collections import Counter

    from . import api

    shapes = api.parse_input_shapes(args.input_shape)
    from .files import check_output, check_replaceable, json_with

    inputs = (args.model, args.profile, args.devices)
    check_output(args.output, inputs)  # before the profiling, not after it
    check_replaceable(args.output, json_with("nodes", "onnxsplit"), "workload")
    w = api.build_workload(args.model, shapes, devices=args.devices, profile=args.profile,
                           accelerator=args.accelerator, shared_weights=args.shared_weights,
                           activations=args.activations, repeats=args.repeats, quiet=args.quiet,
                           input_fills=api.parse_input_values(args.input_value))
    if not args.output:
        print(json.dumps(w.to_paper_json()))
        return 0
    w.write(args.output, inputs)
    meta = w.extra["onnxsplit"]
    sources = Counter(f"cpu {n.extra['latencySource']['cpu']}" for n in w.nodes)
    if w.num_accelerators:
        sources.update(f"accelerator {n.extra['latencySource']['acc']}" for n in w.nodes)
    for c in w.accelerator_classes:
        sources.update(f"{c.name} {n.extra['latencySource'][c.name]}" for n in w.nodes)
    acc = meta["accelerator"]
    kinds = [(w.num_accelerators, acc["name"], acc["memory"])] if acc else []
    kinds += [(c.count, c.name, c.memory) for c in w.accelerator_classes]
    acc_txt = ", ".join(f"{count} x {name} ({memory / 2**30:.1f} GiB each)" for count, name, memory in kinds) \
        or "no accelerator"
    print(f"{args.output}: {w.n} nodes, {len(w.edges)} edges; {acc_txt}, {w.num_cpus} CPU cores")
    totals = [(name, w.class_latency[c], w.class_supported[c])
              for c, name in enumerate(w.class_names) if w.class_counts[c]]
    print(f"  total latency: CPU {sum(n.cpu_latency for n in w.nodes):.3f} ms"
          + "".join(f", {'accelerator' if name == 'acc' else name} {float(lat[sup].sum()):.3f} ms over "
                    f"{int(sup.sum())} supported nodes" for name, lat, sup in totals))
    print("  latencies: " + ", ".join(f"{k} {v}" for k, v in sorted(sources.items())))
    return 0


def _serve(args) -> int:
    engine = args.engine or ("ray" if args.address else "local")
    if engine == "local" and args.address:
        from .errors import OnnxsplitError

        raise OnnxsplitError("--address joins a Ray cluster: serve there with --engine ray")
    common = dict(port=args.port, host=args.host, name=args.name, fallback_cpu=args.fallback_cpu,
                  ready_file=args.ready_file, batching=not args.no_batching, max_batch_size=args.max_batch_size,
                  max_queue_delay_microseconds=args.max_queue_delay_microseconds,
                  preferred_batch_size=args.preferred_batch_size, pad_dimension=args.pad_dimension,
                  request_timeout_ms=args.request_timeout_ms, max_ongoing=args.max_ongoing,
                  max_queued=args.max_queued)
    if engine == "local":
        from .running.serve_local import serve_here

        return serve_here(args.parts, **common)
    from .running.serve import serve_parts

    return serve_parts(args.parts, address=args.address, **common)


def _devices(args) -> int:
    from . import api
    from .profile.devices import provider_lines

    cluster = api.load_cluster(args.check)
    print(json.dumps(cluster.to_json(), indent=1))
    for note in cluster.notes:
        print(f"onnxsplit: note: {note}", file=sys.stderr)
    if not args.check:
        for line in provider_lines():
            print(f"onnxsplit: note: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
