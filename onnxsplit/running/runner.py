"""Run an exported parts folder: load its parts on their providers, run samples through them, and time them.

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

What ``onnxsplit run`` prints -- the outputs verified, the plan measured beside what a
user would run instead -- is :mod:`onnxsplit.running.compare`'s.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from ..providers import openvino
from . import verify as verify_outputs
from ..errors import OnnxsplitError, RunError
from .manifest import read_manifest
from ..export import level_fields, part_deps
from ..files import loads
from ..profile.devices import CPU_EP

POLL_S = 0.05  # how often a waiting thread looks for a stop
# A session plan is refused when onnxruntime moves more than this share of the annotated
# nodes elsewhere (a few moves are its own rules: the CUDA EP leaves shape computations on
# the CPU); fewer are reported with the run
MOVED_SHARE = 0.1


def session_providers(ep: str, fallback_cpu: bool = False) -> list[str]:
    """The providers a session for ``ep`` is given (the CPU EP behind any other, for what it
    cannot run), or a RunError naming what is here; only the CPU EP where ``ep`` is absent
    and ``fallback_cpu``."""
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
            providers = [CPU_EP] if p["name"] in absent else session_providers(eps[0], fallback_cpu)
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
