"""Run an exported parts folder: verify it against the original model, and measure it.

:class:`Parts` loads each part on its execution provider with the threads, graph
optimisation level and copies the manifest gives it (a CPU device: one session with its
cores as intra-op threads; a model kept whole: onnxruntime's default session, or copies of
it side by side).  A plan whose manifest says ``run_as: session`` runs as ONE onnxruntime
session over ``annotated.onnx``: each node carries ``layer_ann`` and ``session.json``'s
``session.layer_assignment_settings`` puts it on its device; the session's own record of
the assignment is checked against the plan.  Samples run two ways:

- :meth:`Parts.run`: one sample through the parts in order, in the calling thread;
- :meth:`Parts.stream`: samples through a pipeline -- worker threads per device (one per
  copy), each taking ready (part, sample) calls from the device's queue, oldest sample
  first; at most ``depth`` samples are in flight, which bounds every queue.  onnxruntime
  releases the GIL while a part runs, so devices work in parallel.  A part that fails
  stops the pipeline and re-raises as ``RunError`` naming the part and the sample; every
  wait has a timeout, so nothing hangs.

:func:`run_parts` does what ``onnxsplit run`` prints: the outputs of one sample against
the original model on the same inputs (``verify``: within tolerances that scale with each
output and with how far the original's own outputs move between onnxruntime's
configurations, :mod:`onnxsplit.running.verify`), single-stream latency and pipelined throughput
(``measured``), the plan's prediction, and in the same run what a user would run instead
(``baselines``, :func:`baselines`) with the ratios.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from ..providers import openvino
from . import timing
from . import verify as verify_outputs
from ..errors import OnnxsplitError, RunError
from .manifest import read_manifest
from ..export import level_fields, part_deps
from ..files import loads
from ..profile.devices import CPU_EP, shares_cpu
from ..profile.measure import session_options

POLL_S = 0.05  # how often a waiting thread looks for a stop
# A session plan is refused when onnxruntime moves more than this share of the annotated
# nodes elsewhere (a few moves are its own rules: the CUDA EP leaves shape computations on
# the CPU); fewer are reported with the run
MOVED_SHARE = 0.1


def _providers(ep: str, fallback_cpu: bool = False) -> list[str]:
    from ..profile.devices import available_providers

    present = available_providers()
    if ep not in present and fallback_cpu:
        return [CPU_EP]
    if ep not in present:
        raise RunError(f"execution provider '{ep}' is not available here "
                       f"(available: {', '.join(present)})")
    return [ep] if ep == CPU_EP else [ep, CPU_EP]


def _absent_devices(parts, fallback_cpu: bool) -> set[str]:
    """Refuse, before any session is made, a plan whose parts address more devices of an
    execution provider than this machine has (a plan for two GPUs on a one-GPU machine);
    with ``fallback_cpu``, the names of the parts to run on the CPU instead."""
    from ..profile.devices import available_providers, device_count

    present = available_providers()
    absent = set()
    for p in parts:
        ep, i = p.get("execution_provider"), p.get("device_id")
        if i is None or ep not in present:
            continue  # (an EP that is absent is refused, or falls back, where it is loaded)
        have = device_count(ep)
        if have is not None and i >= have:
            if fallback_cpu:
                absent.add(p["name"])
                continue
            raise RunError(f"part {p['name']} runs on {ep} device {i}, but this machine has "
                           f"{have} such device{'s' if have != 1 else ''} (ids 0..{have - 1})")
    return absent


def _check_runs_on(sess, ep: str, what: str) -> None:
    """Refuse a session that onnxruntime did not set up on ``ep`` (older onnxruntime falls
    back to the CPU silently; a CPU-only build ignores an EP it lacks with a warning)."""
    got = sess.get_providers()
    if ep not in got:
        raise RunError(f"{what} was to run on {ep} but onnxruntime set it up on "
                       f"{', '.join(got)}")


def random_feeds(specs: Iterable[Mapping[str, Any]], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for a check run: floats uniform in [0, 1); integers and booleans ones (an index
    and a mask every model accepts), as the profiler feeds them, but token ids spread under
    an input's ``index_below`` (so that the check reads many rows of an embedding, not one);
    an input's ``fill`` (the --input-value it was split with) where the manifest has one."""
    from .. import shapes

    rng = np.random.default_rng(seed)
    out = {}
    for s in specs:
        et = shapes.elem_type(s["dtype"])
        if et is None:
            raise RunError(f"input '{s['name']}' has type {s['dtype']}: pass its value explicitly")
        out[s["name"]] = shapes.stand_in(et, tuple(s["shape"]), False, rng, s.get("fill"), s.get("index_below"))
    return out


class Parts:
    """A loaded parts folder (or one whole model, :meth:`whole`), ready to run samples.

    Each part is a list of sessions: one, or ``replicas`` copies that the pipeline feeds
    side by side (a whole model served as copies, one per core).  A part's ``threads`` is
    its sessions' intra-op threads (0: onnxruntime's default, all cores), ``optimization``
    its graph optimisation level (``all``, as users run onnxruntime, or ``disabled``)."""

    def __init__(self, parts_dir: str | Path, *, optimize: bool = False,
                 cpu_threads: int | None = 1, fallback_cpu: bool = False, served: bool = False):
        """``fallback_cpu``: run a part whose execution provider is absent on the CPU (to
        check parts made for hardware elsewhere); ``served``: sessions for a server (see
        :func:`onnxsplit.providers.sessions.open_sessions`).  ``optimize`` and ``cpu_threads`` apply
        to parts whose manifest entry does not say (folders from before they were
        recorded)."""
        self.dir = Path(parts_dir)
        self.manifest = read_manifest(self.dir)
        self.assignment: dict[str, Any] | None = None
        if self.manifest.get("run_as") == "session":
            specs = [session_spec(self.dir, self.manifest)]
        else:
            specs = self.manifest["parts"]
        self._load(specs, optimize, cpu_threads, fallback_cpu, served)
        if self.manifest.get("run_as") == "session" \
                and self.execution_providers[0] == specs[0]["execution_provider"]:
            # (a plan for hardware elsewhere, run on the CPU here, has nothing to check)
            self.assignment = _check_assignment(self.sessions[0][0], specs[0]["node_providers"])

    @classmethod
    def whole(cls, model_path: str | Path, ep: str = CPU_EP, *, threads: int = 0,
              optimization: str = "all", replicas: int = 1,
              config: Mapping[str, str] | None = None) -> "Parts":
        """The original model as one part: ``replicas`` sessions on ``ep``, each with
        ``threads`` intra-op threads -- onnxruntime's own session as a user runs it
        (``optimization``: a level of ``export.LEVELS``)."""
        level = level_fields(optimization, ep == CPU_EP)
        spec = {"name": "whole", "file": str(Path(model_path).resolve()), "device": "whole",
                "execution_provider": ep, "threads": threads, "optimization": level["optimization"],
                "replicas": replicas, "config": {**level.get("config", {}), **dict(config or {})},
                "inputs": None, "outputs": None}
        return cls.of_specs([spec])

    @classmethod
    def of_specs(cls, specs: list[dict[str, Any]], model: Mapping[str, Any] | None = None
                 ) -> "Parts":
        """Parts from manifest entries whose ``file`` is an absolute path (``model``: the
        manifest's inputs and outputs of the whole, else the first part's)."""
        self = cls.__new__(cls)
        self.dir = Path(specs[0]["file"]).parent
        self.assignment = None
        self.manifest = {"parts": list(specs), "model": model}
        self._load(self.manifest["parts"], True, specs[0].get("threads"), False)
        return self

    def _load(self, specs, optimize: bool, cpu_threads: int | None, fallback_cpu: bool,
              served: bool = False) -> None:
        from ..providers.sessions import NO_SPIN, SessionError, open_sessions, part_session_config

        self.parts = list(specs)
        self.devices = list(dict.fromkeys(p["device"] for p in self.parts))
        self.sessions: list[list[Any]] = []
        self.execution_providers = []  # the EP each part runs on (the CPU's where it fell back)
        self.spins = False  # a session's intra-op threads spin on after its runs
        absent = _absent_devices(self.parts, fallback_cpu)
        for p in self.parts:
            threads = p.get("threads")
            if threads is None and p["execution_provider"] == CPU_EP:
                threads = cpu_threads
            level = p.get("optimization")
            opt = optimize if level is None else level == "all"
            eps = p.get("execution_providers") or [p["execution_provider"]]
            providers = [CPU_EP] if p["name"] in absent else _providers(eps[0], fallback_cpu)
            if len(eps) > 1 and providers[0] == eps[0]:
                providers = list(dict.fromkeys(list(eps) + [CPU_EP]))
            # (a pipeline's sessions share the cores)
            config = part_session_config(p.get("config"), eps[0], providers[0], threads, len(specs) > 1)
            self.spins |= threads != 1 and config.get(NO_SPIN) != "0"
            addressed = p.get("device_id") if providers[0] == eps[0] != CPU_EP else None
            shapes = {t["name"]: t["shape"] for t in p.get("inputs") or []
                      if isinstance(t.get("shape"), list)} or None
            try:
                copies = open_sessions(self.dir / p["file"], providers, threads=threads,
                                       optimize=opt, config=config,
                                       copies=int(p.get("replicas") or 1), device_id=addressed,
                                       shapes=shapes, served=served)
            except SessionError as e:
                raise RunError(f"part {p['name']} ({p['file']}) cannot be loaded on "
                               f"{providers[0]}: {e}") from None
            for sess in copies:
                _check_runs_on(sess, providers[0], f"part {p['name']} ({p['file']})")
            self.sessions.append(copies)
            self.execution_providers.append(providers[0])
        first = self.sessions[0][0]
        if self.manifest.get("model"):
            self.output_names = [o["name"] for o in self.manifest["model"]["outputs"]]
        else:
            self.output_names = [o.name for o in first.get_outputs()]
        self._input_names = [[i["name"] for i in p["inputs"]] if p.get("inputs") is not None
                             else [i.name for i in s[0].get_inputs()]
                             for p, s in zip(self.parts, self.sessions)]
        self._out_names = [[o["name"] for o in p["outputs"]] if p.get("outputs") is not None
                           else [o.name for o in s[0].get_outputs()]
                           for p, s in zip(self.parts, self.sessions)]
        self._deps = part_deps(self._input_names, self._out_names)
        self._consumers: list[list[int]] = [[] for _ in self.parts]
        for i, deps in enumerate(self._deps):
            for d in deps:
                self._consumers[d].append(i)

    @property
    def inputs(self) -> list[dict[str, Any]]:
        if self.manifest.get("model"):
            return self.manifest["model"]["inputs"]
        return [{"name": i.name, "dtype": i.type, "shape": i.shape}
                for i in self.sessions[0][0].get_inputs()]

    def io(self, i: int) -> tuple[list[str], list[str]]:
        """Part ``i``'s input and output names, in the order its session takes and gives them."""
        return self._input_names[i], self._out_names[i]

    def workers(self, device: str) -> int:
        """How many samples ``device`` runs at once: its parts' largest replica count."""
        return max(len(s) for p, s in zip(self.parts, self.sessions) if p["device"] == device)

    def check_feeds(self, feeds: Mapping[str, Any]) -> None:
        missing = [s["name"] for s in self.inputs if s["name"] not in feeds]
        if missing:
            raise RunError(f"input '{missing[0]}' is not given")

    def _call(self, i: int, values: Mapping[str, Any], copy: int = 0) -> dict[str, Any]:
        p = self.parts[i]
        sessions = self.sessions[i]
        try:
            got = sessions[copy % len(sessions)].run(self._out_names[i],
                                                     {t: values[t] for t in self._input_names[i]})
        except Exception as e:
            raise RunError(f"part {p['name']} on {p['device']} failed: "
                           f"{' '.join(str(e).split())[:300]}") from None
        return dict(zip(self._out_names[i], got))

    def run(self, feeds: Mapping[str, Any], took: list[float] | None = None) -> dict[str, Any]:
        """One sample through every part in order; the model's outputs by name (``took``:
        each part's call time in seconds is appended to it)."""
        self.check_feeds(feeds)
        values = dict(feeds)
        for i in range(len(self.parts)):
            t = time.perf_counter() if took is not None else 0.0
            values.update(self._call(i, values))
            if took is not None:
                took.append(time.perf_counter() - t)
        return {o: values[o] for o in self.output_names}

    def stream(self, samples: Iterable[Mapping[str, Any]], depth: int | None = None,
               timeout_s: float | None = None) -> Iterator[dict[str, Any]]:
        """Pipelined run: yields each sample's outputs, in order of the samples.  A plan of
        one part on OpenVINO's runtime with several streams runs as OpenVINO runs them,
        through its own queue of infer requests (without a deadline to keep): the
        threaded pipeline, a Python thread per stream, ran the same compiled model slower."""
        depth = depth or self.default_depth()
        if timeout_s is None and self._openvino_streams():
            def checked():
                for feeds in samples:
                    self.check_feeds(feeds)
                    yield {t: feeds[t] for t in self._input_names[0]}
            try:
                for got in self.sessions[0][0].stream(checked(), min(depth, len(self.sessions[0]))):
                    yield {o: got[o] for o in self.output_names}
            except openvino.OpenVINOError as e:
                p = self.parts[0]
                raise RunError(f"part {p['name']} on {p['device']} failed: {e}") from None
            return
        yield from Pipeline(self, depth, timeout_s).run(samples)

    def _openvino_streams(self) -> bool:
        """Whether this is one part on OpenVINO's runtime with several streams whose
        outputs are the model's."""
        return (len(self.parts) == 1 and self.execution_providers[0] == openvino.RUNTIME
                and len(self.sessions[0]) > 1 and set(self.output_names) <= set(self._out_names[0]))

    def release(self) -> None:
        """Let go of the sessions and their memory (the folder is measured in a process of its
        own: :func:`run_parts`); the figures read from the manifest stay."""
        self.sessions = []

    def default_depth(self) -> int:
        """Samples in flight for throughput: two per worker; one where a single worker runs
        everything (a second in flight would only add the hand-offs' Python work, which
        competes with the session's own threads for the cores)."""
        workers = sum(self.workers(d) for d in self.devices)
        return 1 if workers == 1 else 2 * workers


def session_spec(parts_dir: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The annotated model as one part: one onnxruntime session runs the plan, each node
    on the device its ``layer_ann`` names (``session.json``)."""
    from ..export import SESSION_FILE

    try:
        spec = loads((parts_dir / SESSION_FILE).read_text())
    except (OSError, ValueError) as e:  # ValueError: not JSON, not text
        raise RunError(f"{parts_dir / SESSION_FILE}: cannot be read ({e})") from None
    if not isinstance(spec, dict):
        raise RunError(f"{parts_dir / SESSION_FILE}: expected a JSON object")
    eps = spec.get("execution_providers")
    if not isinstance(eps, list) or not eps or not isinstance(spec.get("file"), str):
        raise RunError(f"{parts_dir / SESSION_FILE}: expected 'file' and a list "
                       "'execution_providers'")
    return {"name": "session", "file": spec["file"], "device": "session",
            "execution_provider": eps[0], "execution_providers": eps,
            "threads": spec.get("threads", 0), "optimization": spec.get("optimization", "all"),
            "config": spec.get("config") or {}, "replicas": 1,
            "node_providers": spec.get("node_providers") or {},
            "inputs": manifest["model"]["inputs"], "outputs": manifest["model"]["outputs"]}


def _check_assignment(sess, want: Mapping[str, str]) -> dict[str, Any]:
    """Where onnxruntime put the annotated model's nodes, against the plan (``want``: node
    -> EP): its own record (``session.record_ep_graph_assignment_info``).  Nodes that
    onnxruntime fused under a new name are not in the record by their names and are
    counted apart."""
    try:
        info = sess.get_provider_graph_assignment_info()
    except Exception as e:
        raise RunError(f"onnxruntime gave no record of where it put the nodes: {e}") from None
    got = {n.name: sg.ep_name for sg in info for n in sg.get_nodes()}
    checked = [n for n in want if n in got]
    wrong = [n for n in checked if got[n] != want[n]]
    if len(wrong) > MOVED_SHARE * max(len(checked), 1):
        raise RunError(f"onnxruntime put {len(wrong)} of {len(checked)} annotated nodes on "
                       f"another device than the plan (first: '{wrong[0]}' on {got[wrong[0]]}, "
                       f"planned on {want[wrong[0]]})")
    return {"checked": len(checked), "fused": len(want) - len(checked), "elsewhere": len(wrong),
            "moved": {n: f"{want[n]} -> {got[n]}" for n in wrong[:10]}}


class Pipeline:
    """Samples through the parts, each device's parts run by its own worker threads; outputs
    in the order of the samples (:meth:`Parts.stream`), or each as it finishes, with its
    sample's number (`serve`'s local engine keeps one running and watches :attr:`stop`)."""

    def __init__(self, parts: Parts, depth: int, timeout_s: float | None):
        self.p = parts
        self.depth = max(1, depth)
        self.timeout_s = timeout_s
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.queues = {d: queue.PriorityQueue() for d in parts.devices}
        self.slots = threading.Semaphore(self.depth)
        self.done: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.state: dict[int, dict[str, Any]] = {}  # sample -> {"values", "waiting", "left"}

    def run(self, samples: Iterable[Mapping[str, Any]], ordered: bool = True) -> Iterator[Any]:
        """Each sample's outputs, in the samples' order; ``ordered=False``: (sample number,
        outputs) as each finishes -- a server's small batch is not held behind a large one
        that started before it on the other stream (its batches of unequal sizes had served
        fewer requests than the same server unbatched)."""
        workers = [threading.Thread(target=self._work, args=(d, k), daemon=True,
                                    name=f"onnxsplit-{d}-{k}")
                   for d in self.p.devices for k in range(self.p.workers(d))]
        for w in workers:
            w.start()
        feeder = threading.Thread(target=self._feed, args=(iter(samples),), daemon=True,
                                  name="onnxsplit-feed")
        feeder.start()
        finished: dict[int, dict[str, Any]] = {}
        next_out = 0
        try:
            while True:
                item = self._get(self.done)
                if item is None:
                    break
                s, outputs = item
                if not ordered:
                    yield item
                    continue
                finished[s] = outputs
                while next_out in finished:
                    yield finished.pop(next_out)
                    next_out += 1
        finally:
            self.stop.set()
            for w in workers:
                w.join(timeout=10)
            feeder.join(timeout=10)
        if self.error is not None:
            raise self.error

    def _get(self, q: queue.Queue):
        """Next item, or None once stopped (a failure, or the end of the samples)."""
        start = time.monotonic()
        while True:
            if self.error is not None:
                return None
            try:
                return q.get(timeout=POLL_S)
            except queue.Empty:
                if self.stop.is_set():
                    return None
                if self.timeout_s is not None and time.monotonic() - start > self.timeout_s:
                    self._fail(RunError(f"no sample finished within {self.timeout_s:g} s"))
                    return None

    def _fail(self, e: BaseException) -> None:
        with self.lock:
            if self.error is None:
                self.error = e
        self.stop.set()

    def _feed(self, samples: Iterator[Mapping[str, Any]]) -> None:
        s = 0
        try:
            for feeds in samples:
                self.p.check_feeds(feeds)
                while not self.slots.acquire(timeout=POLL_S):
                    if self.stop.is_set():
                        return
                if self.stop.is_set():
                    return
                with self.lock:
                    self.state[s] = {"values": dict(feeds),
                                     "waiting": [len(d) for d in self.p._deps],
                                     "left": len(self.p.parts)}
                for i, deps in enumerate(self.p._deps):
                    if not deps:
                        self.queues[self.p.parts[i]["device"]].put((s, i))
                s += 1
        except BaseException as e:  # a bad sample: stop with its error
            self._fail(e if isinstance(e, OnnxsplitError) else RunError(f"sample {s}: {e}"))
            return
        # all fed: end once every sample is out
        while not self.stop.is_set():
            with self.lock:
                if not self.state:
                    break
            time.sleep(POLL_S / 5)
        self.done.put(None)

    def _work(self, device: str, copy: int = 0) -> None:
        q = self.queues[device]
        while not self.stop.is_set():
            try:
                s, i = q.get(timeout=POLL_S)
            except queue.Empty:
                continue
            st = self.state[s]
            try:
                got = self.p._call(i, st["values"], copy)
            except BaseException as e:
                self._fail(RunError(f"{e} (sample {s})") if isinstance(e, RunError) else e)
                return
            ready = []
            with self.lock:
                st["values"].update(got)
                for c in self.p._consumers[i]:
                    st["waiting"][c] -= 1
                    if st["waiting"][c] == 0:
                        ready.append(c)
                st["left"] -= 1
                last = st["left"] == 0
                if last:
                    del self.state[s]
            for c in ready:
                self.queues[self.p.parts[c]["device"]].put((s, c))
            if last:
                self.done.put((s, {o: st["values"][o] for o in self.p.output_names}))
                self.slots.release()


# ------------------------------------------------------------------------------ measuring


def compare_outputs(got: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`verify.compare_outputs`, a shape that differs a RunError."""
    try:
        return verify_outputs.compare_outputs(got, want)
    except verify_outputs.ShapeMismatch as e:
        raise RunError(str(e)) from None


def single_device_ep(parts: Parts) -> tuple[str, str]:
    """(device, EP) to run the whole model on for comparison: the plan's best single device
    where a part runs on it here (the accelerator, where the whole model on it is faster than
    on a core), else a CPU core."""
    single = (parts.manifest.get("predicted") or {}).get("single_device") or {}
    device = single.get("device")
    for p, ep in zip(parts.parts, parts.execution_providers):
        if device and p["device"] == device and ep != CPU_EP:
            return device, ep
    return "cpu0", CPU_EP


def measure_single(sess, feeds: Mapping[str, Any], samples: int, warmup: int) -> dict[str, float]:
    """The whole model serially in one session: median latency, throughput = 1 / latency."""
    for _ in range(warmup):
        sess.run(None, dict(feeds))
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        sess.run(None, dict(feeds))
        times.append(time.perf_counter() - t)
    med = float(np.median(times))
    return {"latency_ms": med * 1e3, "throughput_per_s": 1.0 / med if med > 0 else float("inf")}


def measure_pipeline(parts: Parts, feeds: Mapping[str, Any], samples: int, warmup: int,
                     depth: int | None = None) -> dict[str, float]:
    """Single-stream latency: with one sample in flight, the median time between finishes
    (each sample enters as the one before leaves).  Throughput: ``depth`` samples in
    flight (two per worker), steady state: from the first finish after warm-up to the last
    before the pipeline drains (its last samples run with workers idle).  Where one worker runs everything (a model kept whole, a plan in one
    session), samples are run one after another in the calling thread, as a user's own
    loop over ``session.run`` would: no hand-offs between threads.  A configuration held
    in a process of its own (:class:`.apart.Apart`) is measured there, by this function."""
    own = getattr(parts, "measure_pipeline", None)
    if own is not None:
        return own(feeds, samples, warmup, depth)
    for _ in range(warmup):
        parts.run(feeds)
    if parts.default_depth() == 1 and depth in (None, 1):
        clock = time.perf_counter
        t = [clock()]
        for _ in range(samples):
            parts.run(feeds)
            t.append(clock())
        one = np.diff(t)
        return {"latency_ms": float(np.median(one)) * 1e3,
                "throughput_per_s": samples / (t[-1] - t[0]) if t[-1] > t[0] else float("inf"),
                "samples": samples}

    def finishes(n: int, d: int) -> list[float]:
        t = [time.perf_counter()]
        for _out in parts.stream((feeds for _ in range(n)), depth=d):
            t.append(time.perf_counter())
        return t

    one = np.diff(finishes(warmup + samples, 1)[warmup:])
    depth = depth or parts.default_depth()
    # the last samples drain with workers idle: the window ends before them
    drain = max(depth // 2, 1)
    streamed = max(samples, 4 * depth)
    t = finishes(warmup + streamed, depth)
    workers = max(parts.default_depth() // 2, 1)  # two in flight per worker (or actor)
    latency = float(np.median(one))
    return {"latency_ms": latency * 1e3,
            "throughput_per_s": steady_rate(t[1 + warmup:len(t) - (drain - 1)], workers),
            "samples": samples}


def time_calls(parts: Parts, feeds: Mapping[str, Any], budget_s: float = 0.5,
               most: int = 50) -> list[float]:
    """Each part's own time on one sample (ms, median over repeats), the parts run one
    after another as in :meth:`Parts.run`: about ``budget_s`` in all, at least 3 and at
    most ``most`` repeats after one to warm up."""
    def once() -> list[float]:
        took: list[float] = []
        parts.run(feeds, took)
        return took

    repeats = int(min(most, max(3, budget_s / max(sum(once()), 1e-6))))
    runs = np.array([once() for _ in range(repeats)])
    return [float(v) * 1e3 for v in np.median(runs, axis=0)]


def steady_rate(finish_times, workers: int) -> float:
    """Samples per second from finish times in steady state, over whole turns of the
    ``workers``: copies started together finish in bursts (two copies of a 52 ms model:
    gaps of 50, 3, 49, 4 ms ...), and a window holding one burst more than the other end
    is off by up to 1 / turns (T5's encoder, 17 against 18 samples a round: 35.5 against
    37.7/s for the same copies)."""
    workers = max(workers, 1)
    turns = (len(finish_times) - 1) // workers * workers
    steady = finish_times[:turns + 1] if turns > 0 else finish_times
    span = steady[-1] - steady[0] if len(steady) > 1 else 0.0
    return (len(steady) - 1) / span if span > 0 else float("inf")


# measurements alternate between the plan and the baselines, medians kept: on this shared
# 2-core machine one round of two copies moves by 5% either way, so the median of 5
# rounds' ratios put identical copies 0.92-0.95x apart in two runs of T5's encoder
ROUNDS = 9
# A round of one session at least this long (more samples for a fast model): two copies
# of light_shufflenet, identical, measured 0.93-1.18x apart over 0.3 s rounds and
# 0.95-1.03x over 1 s ones on this shared 2-core machine.  The calibration, which weighs
# many configurations, keeps shorter rounds (calibrate.ROUND_S).
MIN_ROUND_S = 1.0
MAX_ROUND_SAMPLES = 1000
# ``run``'s measurement within this many seconds by default (``--time-limit``): ViT-S at a
# batch of 4 took over 12 minutes here in 9 paired rounds of five sessions.  A budget that
# binds cuts warm-ups, then samples a round, then rounds, never below these
TIME_LIMIT_S = 300.0
MIN_ROUNDS = 3
MIN_SAMPLES = 2
# a pause before a measurement that follows a session whose intra-op threads spin on
# after its run (``Parts.spins``): they take a core from whatever runs next.  Two
# single-thread copies of T5's encoder took 98.7 ms a pair right after the default
# session's runs, 73.1 ms 20 ms later and 61.7-63.3 ms after 50-300 ms (medians of 15,
# this shared 2-core machine)
SETTLE_S = 0.1


def default_session_name(ep: str) -> str:
    """The baseline name of onnxruntime's default session on ``ep``."""
    return f"ort_default_{_short(ep)}"


def _short(ep: str) -> str:
    """``CUDAExecutionProvider`` -> ``cuda``: how baseline names spell an EP."""
    return ep.removesuffix("ExecutionProvider").lower()


def copies_name(cores: int) -> str:
    """The baseline name of one single-thread copy of the model per core."""
    return f"ort_replicas_cpu_{cores}x1"


def openvino_name(hint: str) -> str:
    """The baseline name of OpenVINO's runtime with one of its performance hints."""
    return f"openvino_{hint.lower()}"


def baseline_runs(accelerators: Iterable[str] = (), capacity_kb: int | None = None
                  ) -> dict[str, tuple[str, dict[str, Any]]]:
    """What a user runs instead of onnxsplit, name -> (EP, how ``Parts.whole`` runs it, or
    with ``hint`` how :class:`openvino.Hinted` does): onnxruntime's default session on the
    CPU (all graph optimisations, default threads); copies of the whole model side by
    side, one single-thread session per core; where installed, OpenVINO's own runtime
    with its LATENCY and THROUGHPUT hints (in what it computes in by default: bf16 on a CPU
    with bf16 units) and each plugin EP on the CPU as onnxruntime runs it by default
    (OpenVINO's EP in what onnxsplit's OpenVINO parts compute in: ``plugins.precision_config``); on each accelerator EP, its default session
    (onnxruntime puts what the EP cannot run on the CPU) and, with ``capacity_kb``, its
    capacity-aware partitioning under that memory budget, ad hoc and with the per-node
    memory statistics it collects first."""
    import os

    from ..profile.devices import cpu_providers

    cores = os.cpu_count() or 1
    runs: dict[str, tuple[str, dict[str, Any]]] = {
        default_session_name(CPU_EP): (CPU_EP, {"threads": 0}),
        copies_name(cores): (CPU_EP, {"threads": 1, "replicas": cores}),
    }
    for ep in cpu_providers():
        if ep == openvino.RUNTIME:
            for hint in openvino.HINTS:
                runs[openvino_name(hint)] = (ep, {"threads": 0, "hint": hint})
        else:
            runs[default_session_name(ep)] = (ep, {"threads": 0})
    for ep in dict.fromkeys(accelerators):
        short = _short(ep)
        runs[default_session_name(ep)] = (ep, {"threads": 0})
        if capacity_kb is not None and ep == "CUDAExecutionProvider":
            setting = f"{int(capacity_kb)},"
            runs[f"ort_capacity_{short}"] = (ep, {"threads": 0, "config": {
                "session.resource_cuda_partitioning_settings": setting}})
            runs[f"ort_capacity_stats_{short}"] = (ep, {"threads": 0, "config": {
                "session.resource_cuda_partitioning_settings": setting + "{stats}"}})
    return runs


def build_configuration(recipe: tuple) -> Any:
    """A configuration from its recipe, in this process: ``("parts", folder, options)``
    (:class:`Parts`), ``("whole", model, ep, how)`` (:meth:`Parts.whole`'s keywords) or
    ``("hinted", model, hint)`` (OpenVINO's runtime as its hint runs it).  A recipe, not
    a loaded object, is what a process of its own is given (:class:`.apart.Apart`)."""
    kind, path, *rest = recipe
    if kind == "parts":
        return Parts(path, **rest[0])
    if kind == "whole":
        ep, how = rest
        return Parts.whole(path, ep, **how)
    if kind == "hinted":
        return openvino.Hinted(path, rest[0])
    raise ValueError(f"unknown configuration {kind!r}")


def baselines(model_path: str | Path, feeds: Mapping[str, Any], *, samples: int, warmup: int,
              accelerators: Iterable[str] = (), capacity_kb: int | None = None,
              plan: "Parts | None" = None, rounds: int = ROUNDS,
              also: Mapping[str, Any] | None = None, time_limit: float | None = None,
              apart: bool = True) -> dict[str, dict[str, Any]]:
    """The baselines (:func:`baseline_runs`) measured on ``feeds``, and ``plan`` (as
    ``"onnxsplit"``) and ``also`` (name -> loaded parts) alongside: every session is
    loaded first, then ``rounds`` rounds each measure every one in turn, so a shared
    machine's slow minute hits all alike; the medians over the rounds are kept, within
    ``time_limit`` seconds where one is given (:func:`measure_rounds`).  ``apart``: each
    baseline held in a process of its own (:class:`.apart.Apart`; the caller's ``plan``
    and ``also`` are as it loaded them), none then slowed by having been loaded first."""
    import shutil

    from .. import interrupt
    from .apart import Apart

    loaded: dict[str, Any] = {}
    out: dict[str, dict[str, Any]] = {}
    if plan is not None:
        loaded["onnxsplit"] = plan
    loaded.update(also or {})
    mine: list[Any] = []  # the processes this call started, ended on the way out
    stats_dir = None
    try:
        for name, (ep, how) in baseline_runs(accelerators, capacity_kb).items():
            config = dict(how.get("config") or {})
            try:
                for k, v in config.items():
                    if "{stats}" in v:
                        stats_dir = stats_dir or interrupt.fresh_dir(prefix="onnxsplit-stats-")
                        stats = Path(stats_dir) / "node_memory.csv"
                        _collect_memory_stats(model_path, ep, feeds, stats)
                        config[k] = v.replace("{stats}", str(stats))
                recipe = ("hinted", str(model_path), how["hint"]) if "hint" in how \
                    else ("whole", str(model_path), ep, dict(how, config=config))
                if apart:
                    loaded[name] = Apart(recipe, feeds)
                    mine.append(loaded[name])
                else:
                    loaded[name] = build_configuration(recipe)
            except (RunError, openvino.OpenVINOError) as e:
                out[name] = {"error": str(e)}
                continue
            out[name] = {"execution_provider": ep, "threads": how["threads"],
                         "replicas": getattr(loaded[name], "requests", how.get("replicas", 1)),
                         **({"hint": how["hint"], "precision": loaded[name].precision} if "hint" in how else {})}
        measured = measure_rounds(loaded, feeds, samples, warmup, rounds,
                                  pair_with="onnxsplit" if plan is not None else None, time_limit=time_limit)
    finally:
        for held in mine:
            held.close()
        if stats_dir is not None:  # (made above by fresh_dir: nothing of the user's)
            shutil.rmtree(stats_dir, ignore_errors=True)
            interrupt.unregister(stats_dir)
    for name, got in measured.items():
        if "error" in got:
            out[name] = got
        elif "error" not in out.get(name, {}):
            out.setdefault(name, {}).update(got)
    return out


def measure_rounds(loaded: Mapping[str, Parts], feeds: Mapping[str, Any], samples: int,
                   warmup: int, rounds: int = ROUNDS, min_round_s: float = MIN_ROUND_S,
                   pair_with: str | None = None, time_limit: float | None = None
                   ) -> dict[str, dict[str, Any]]:
    """Each of ``loaded`` measured in ``rounds`` rounds, all in turn each round, the order
    varied (:func:`round_order`: a shared machine's slow minute then hits all alike, and
    none always runs right after the copies), each SETTLE_S after one whose threads spin
    (``Parts.spins``): medians over the rounds, or the error.  Both waits are times the
    timing scale (:func:`timing.scale`).

    ``pair_with`` (the plan's name): each other session is measured right beside a
    measurement of it (:func:`paired_order`), which ``beside`` keeps per session, so a
    ratio to the plan pairs figures taken seconds apart, not a round apart: on this
    shared 2-core machine identical copies of small_bert measured 0.87-1.23x apart in
    turn and 0.94-1.03x in adjacent pairs (8 runs each).  Where the plan fails (a part,
    or its node, lost), nothing more is measured: its error alone is returned.

    ``time_limit`` (seconds, times the timing scale): the rounds planned to fit it from
    each session's quicker of its second and third runs (:func:`fit_rounds`), and no round begun once it is spent
    after the first :data:`MIN_ROUNDS`; each summary then says so (``time_limited``)."""
    began = time.perf_counter()
    got: dict[str, list[dict[str, float]]] = {name: [] for name in loaded}
    beside: dict[str, list[dict[str, float]]] = {name: [] for name in loaded}
    out: dict[str, dict[str, Any]] = {}
    per_round: dict[str, int] = {}
    once: dict[str, float] = {}
    for name, parts in loaded.items():  # a round lasts at least min_round_s: a fast model's
        try:                             # rounds then spread over seconds, not milliseconds
            # (a first run can be slow, and any one run on a busy machine: the quicker of
            # the next two plans the rounds; beside two test workers a run planned on one
            # had fitted 29 samples a round of a 0.06 ms model into a minute's limit)
            for k in range(1 if time_limit is None else 3):
                t = time.perf_counter()
                parts.run(feeds)
                took = max(time.perf_counter() - t, 1e-6)
                once[name] = took if k < 2 else min(once[name], took)
        except RunError as e:
            out[name] = {"error": str(e)}
            if name == pair_with:
                return {name: out[name]}
            continue
        per_round[name] = max(1, samples // max(rounds, 1),
                              min(MAX_ROUND_SAMPLES, int(timing.scale() * min_round_s / once[name])))
    names = [name for name in loaded if name not in out]  # (those that ran once)
    keys = ("latency_ms", "throughput_per_s")
    spinning = True  # (whatever ran before this call may have)
    settle_s = SETTLE_S * timing.scale()
    limit = None if time_limit is None else time_limit * timing.scale()
    limited = False
    if limit is not None and names:
        depth = {name: loaded[name].default_depth() for name in names}
        asked = (rounds, warmup, per_round)
        rounds, warmup, per_round = fit_rounds(names, once, depth, per_round, warmup, rounds, pair_with,
                                               limit - (time.perf_counter() - began))
        limited = (rounds, warmup, per_round) != asked
    done = 0
    for r in range(max(rounds, 1)):
        if limit is not None and r >= MIN_ROUNDS and time.perf_counter() - began > limit:
            limited = True  # (the estimate was short: the rounds so far are the figures)
            break
        done = r + 1
        for group in paired_order(names, r, pair_with if pair_with not in out else None):
            if any(name in out for name in group):
                continue
            for name in group:
                if spinning:
                    time.sleep(settle_s)
                # (an engine that does not say, as RayParts' actors do not, counts as spinning)
                spinning = getattr(loaded[name], "spins", True)
                try:
                    got[name].append(measure_pipeline(loaded[name], feeds, per_round[name], warmup))
                except RunError as e:
                    out[name] = {"error": str(e)}
                    if name == pair_with:
                        return {name: out[name]}
                    break
            else:
                if len(group) == 2:  # the plan's measurement beside the other's
                    other = group[1] if group[0] == pair_with else group[0]
                    beside[other].append(got[pair_with][-1])
    for name, runs in got.items():
        if runs and name not in out:
            out[name] = summarised({k: [float(r[k]) for r in runs] for k in keys},
                                   per_round[name] * len(runs))
            if limited:
                out[name]["time_limited"] = {"time_limit_s": time_limit, "rounds": done,
                                             "per_round": per_round[name], "warmup": warmup}
    if pair_with in out and "error" not in out[pair_with]:
        out[pair_with]["beside"] = {
            name: {k: [float(r[k]) for r in runs] for k in keys}
            for name, runs in beside.items() if runs and name in out and "error" not in out[name]}
    return out


def measure_cost(once: float, depth: int, samples: int, warmup: int) -> float:
    """Seconds one :func:`measure_pipeline` of ``samples`` takes at most, from one run's
    time: one after another where one worker runs everything, else a stream at depth 1 for
    the latency and one at ``depth`` for the throughput (each sample no slower than alone)."""
    if depth == 1:
        return once * (warmup + samples)
    return once * (2 * warmup + samples + max(samples, 4 * depth))


def fit_rounds(names: list[str], once: Mapping[str, float], depth: Mapping[str, int],
               per_round: Mapping[str, int], warmup: int, rounds: int, pair_with: str | None,
               budget_s: float) -> tuple[int, int, dict[str, int]]:
    """Rounds, warm-up and samples a round that fit ``budget_s`` by :func:`measure_cost`:
    unchanged where they do; else the warm-up down to one sample (a session warmed in the
    first round stays warm), then each session's samples a round in proportion (at least
    :data:`MIN_SAMPLES`), then the rounds (at least :data:`MIN_ROUNDS`, whose medians and
    paired ratios still stand against one slow moment of the machine)."""
    def total(n: Mapping[str, int], w: int, rs: int) -> float:
        return rs * sum(measure_cost(once[name], depth[name], n[name], w)
                        for group in paired_order(names, 0, pair_with) for name in group)

    n = dict(per_round)
    if total(n, warmup, rounds) <= budget_s:
        return rounds, warmup, n
    warmup = min(warmup, 1)
    spent = total(n, warmup, rounds)
    while spent > budget_s and any(k > MIN_SAMPLES for k in n.values()):
        n = {name: k if k <= MIN_SAMPLES else max(MIN_SAMPLES, min(k - 1, int(k * budget_s / spent)))
             for name, k in n.items()}
        spent = total(n, warmup, rounds)
    if spent > budget_s:
        rounds = max(MIN_ROUNDS, min(rounds, int(rounds * budget_s / spent)))
    return rounds, warmup, n


def paired_order(names: list[str], r: int, pair_with: str | None = None) -> list[tuple[str, ...]]:
    """Round ``r`` as groups run back to back: each session alone in :func:`round_order`,
    or with ``pair_with``, each other session beside a run of it, the two sides taking
    turns at going first (by round and by place in it)."""
    order = round_order(names, r)
    if pair_with is None or pair_with not in names or len(names) < 2:
        return [(name,) for name in order]
    others = [name for name in order if name != pair_with]
    return [(pair_with, name) if (r + i) % 2 == 0 else (name, pair_with)
            for i, name in enumerate(others)]


def summarised(by_round: Mapping[str, list[float]], samples: int) -> dict[str, Any]:
    """A configuration's rounds as one figure: the median of each measure over the rounds."""
    return {**{k: float(np.median(v)) for k, v in by_round.items()}, "samples": samples,
            "rounds": len(next(iter(by_round.values()), [])), "by_round": dict(by_round)}


def round_order(names: list[str], r: int) -> list[str]:
    """Round ``r``'s order: rotated by ``r`` (each goes first once), the rest reversed in
    odd rounds (a plain rotation keeps who follows whom: one session would always run
    right after the copies)."""
    turned = names[r % len(names):] + names[:r % len(names)]
    return turned[:1] + turned[:0:-1] if r % 2 else turned


def _collect_memory_stats(model_path: str | Path, ep: str, feeds: Mapping[str, Any],
                          stats: Path) -> None:
    """One run of the whole model that writes onnxruntime's per-node memory statistics."""
    import onnxruntime as ort

    so = session_options(0, optimize=True)
    so.enable_mem_pattern = False
    so.add_session_config_entry("session.collect_node_memory_stats_to_file", str(stats))
    try:
        ort.InferenceSession(str(model_path), so, providers=_providers(ep)).run(None, dict(feeds))
    except Exception as e:
        raise RunError(f"collecting memory statistics failed: {' '.join(str(e).split())[:200]}") from None


def paired_ratios(measured: Mapping[str, Any], base: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The plan's throughput over each baseline's, and each baseline's latency over the
    plan's (above 1: onnxsplit is faster): the median of the pairs' ratios, each pair the
    baseline's round and the plan's measurement beside it (``beside``) or, without those,
    the plan's round of the same number (a slow minute on a shared machine then slows both
    sides of a ratio, not one); else the ratio of the medians."""
    def paired(name: str, key: str, b: Mapping[str, Any], flip: bool) -> float:
        mine = ((measured.get("beside") or {}).get(name) or measured.get("by_round") or {}).get(key)
        theirs = (b.get("by_round") or {}).get(key)
        if mine and theirs and len(mine) == len(theirs):
            return float(np.median([(y / x) if flip else (x / y) for x, y in zip(mine, theirs)]))
        return b[key] / measured[key] if flip else measured[key] / b[key]

    return {name: {"throughput": paired(name, "throughput_per_s", b, False),
                   "latency": paired(name, "latency_ms", b, True)}
            for name, b in base.items() if "error" not in b}


def run_parts(parts_dir: str | Path, *, model: str | Path | None = None,
              feeds: Mapping[str, Any] | None = None, samples: int = 50, warmup: int = 5,
              measure: bool = True, optimize: bool = False, seed: int = 0,
              fallback_cpu: bool = False, compare: bool = True, loaded=None,
              time_parts: bool = False, time_limit: float | None = TIME_LIMIT_S) -> dict[str, Any]:
    """Verify a parts folder against its original model and (``measure``) time it, and
    (``compare``) onnxruntime's own sessions on the same inputs.  ``loaded``: the folder
    already loaded by another engine (``onnxsplit.running.ray_engine.RayParts``), measured
    beside the threaded runner's own pipeline (``onnxsplit_threads``).  ``time_parts``:
    also each part's own time (:func:`time_calls`, ``part_ms``) where every part runs
    on its own execution provider.  ``time_limit``: the comparison's rounds fit about so
    many seconds (:func:`measure_rounds`; None: as many as asked)."""
    parts = loaded if loaded is not None else Parts(parts_dir, optimize=optimize, fallback_cpu=fallback_cpu)
    model_path = Path(model) if model else Path(parts.manifest["model"]["path"])
    if not model_path.exists():
        raise RunError(f"the original model '{model_path}' is not there: pass it with --model")
    feeds = dict(feeds) if feeds is not None else random_feeds(parts.inputs, seed)
    parts.check_feeds(feeds)
    want, own = verify_outputs.reference(model_path, feeds)
    got = parts.run(feeds)
    verify = compare_outputs(got, {o: want[o] for o in parts.output_names})
    precision = parts.manifest.get("precision")  # (parts OpenVINO ran in bf16: --precision)
    reduced = verify_outputs.reduced_spread(model_path, feeds, want, precision) if precision else None
    verify.update(verify_outputs.tolerance(verify, any(ep != CPU_EP for ep in parts.execution_providers),
                                           own, reduced))
    result: dict[str, Any] = {
        "parts_dir": str(parts.dir),
        "run_as": parts.manifest.get("run_as", "pipeline"),
        "engine": "ray" if loaded is not None else "threads",
        "parts": [p["name"] for p in parts.parts],
        "devices": parts.devices,
        "execution_providers": dict(zip((p["name"] for p in parts.parts), parts.execution_providers)),
        "fell_back": [p["name"] for p, ep in zip(parts.parts, parts.execution_providers)
                      if ep != p["execution_provider"]],
        "verify": verify,
        "predicted": parts.manifest.get("predicted"),
        "precision": precision or "f32",
    }
    at = {t["name"]: list(np.shape(feeds[t["name"]])) for t in parts.inputs}
    if parts.manifest.get("model") and at != {t["name"]: list(t["shape"]) for t in parts.inputs}:
        # another shape of the range: its own promise where the split made one, else none
        result["shapes"] = at
        pred = result["predicted"] or {}
        result["predicted"] = next((dict(p, single_device=None) for p in pred.get("per_shape") or []
                                    if p.get("shapes") == at and p.get("latency_ms")), None)
    if parts.assignment is not None:
        result["assignment"] = parts.assignment
    if time_parts and not result["fell_back"] and verify["ok"]:
        result["part_ms"] = time_calls(parts, feeds)
    if measure and not compare:
        result["measured"] = measure_pipeline(parts, feeds, samples, warmup)
    elif measure:
        from .apart import Apart

        accelerators = [ep for ep in parts.execution_providers if not shares_cpu(ep)]
        budget = (result["predicted"] or {}).get("accelerator_memory")
        # OpenVINO's EP beside parts that compute in bf16 computes so too (its own runtime's
        # hints compute in what OpenVINO picks by default, said beside their figures); the
        # plan is measured in a process of its own, as each baseline is (apart.py), and
        # the threaded runner's pipeline beside another engine's
        with openvino.computing_in(precision or "f32", quiet=True), contextlib.ExitStack() as held:
            recipe = ("parts", str(parts.dir), {"optimize": optimize, "fallback_cpu": fallback_cpu})
            if loaded is None:  # (measured in its own process: not held twice meanwhile)
                parts.release()
            plan = parts if loaded is not None else held.enter_context(Apart(recipe, feeds))
            also = {"onnxsplit_threads": held.enter_context(Apart(recipe, feeds))} if loaded is not None else None
            base = baselines(model_path, feeds, samples=samples, warmup=warmup,
                             accelerators=accelerators,
                             capacity_kb=int(budget / 1024) if budget else None, plan=plan, also=also,
                             time_limit=time_limit)
        result["measured"] = base.pop("onnxsplit")
        if "error" in result["measured"]:  # the plan itself failed while measured (a part, or
            raise RunError(result["measured"]["error"])  # its node, lost): the run fails, in one line
        result["baselines"] = base
        result["ratios"] = paired_ratios(result["measured"], base)
        pred = result["predicted"] or {}
        # the machine's own drift since the split was predicted: a default session (or
        # the copies) measured now against the calibration's figure for it
        drift = {name: _errors(base[name], cal) for name, cal in (pred.get("baselines") or {}).items()
                 if "error" not in base.get(name, {"error": None}) and "shapes" not in result}
        if drift:
            result["drift"] = drift
        if pred.get("throughput_per_s") and pred.get("latency_ms"):
            result["prediction_error"] = _errors(result["measured"], pred)
            relative = _relative_errors(pred, result["ratios"])
            if relative:
                result["relative_error"] = relative
    return result


def _relative_errors(predicted: Mapping[str, Any], ratios: Mapping[str, Mapping[str, float]]
                     ) -> dict[str, dict[str, float]]:
    """The prediction's ratio to each session the calibration measured (``predicted``'s
    ``baselines``) against the ratio this run measured in pairs, less one: what the
    prediction says of the plan beside onnxruntime, with the machine's own drift since
    then cancelled out (it moves both sides of a ratio)."""
    out = {}
    for name, cal in (predicted.get("baselines") or {}).items():
        if name in ratios:
            said = {"throughput": predicted["throughput_per_s"] / cal["throughput_per_s"],
                    "latency": cal["latency_ms"] / predicted["latency_ms"]}
            out[name] = {k: ratios[name][k] / said[k] - 1 for k in said}
    return out


def _errors(measured: Mapping[str, Any], predicted: Mapping[str, Any]) -> dict[str, float]:
    """Measured over predicted, less one: throughput and latency."""
    return {"throughput": measured["throughput_per_s"] / predicted["throughput_per_s"] - 1,
            "latency": measured["latency_ms"] / predicted["latency_ms"] - 1}
