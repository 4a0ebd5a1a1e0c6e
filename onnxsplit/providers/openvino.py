"""OpenVINO's own runtime as a provider: it runs on the host's cores, beside the CPU EP.

Users on a CPU often pick OpenVINO instead of onnxruntime (``compile_model(path, "CPU",
{"PERFORMANCE_HINT": ...})``): per model it can be faster or slower than onnxruntime's
CPU kernels, and per operator too.  Here it is one more way to run a part, named RUNTIME
in a manifest, with the interface the runner uses of an onnxruntime session
(:class:`Session`: ``run``, ``get_inputs``, ``get_outputs``, ``get_providers``):

* a part's ``threads`` are OpenVINO's ``INFERENCE_NUM_THREADS`` (0: its LATENCY hint,
  every core) and its ``replicas`` are streams of one compiled model (the weights held
  once), one infer request per stream, each run by one of the runner's worker threads
  (``infer`` releases the GIL);
* inference runs in what ``--precision`` says (``INFERENCE_PRECISION_HINT``; :func:`precision`:
  the environment variable PRECISION_ENV, so that the calibration's child process
  computes as the parts will).  By default (``auto``) that is OpenVINO's own default,
  as its users get it: bf16 on a CPU with bf16 units, else float32; ``--precision f32``
  holds it to float32.  In bf16 the profiles are kept apart (:func:`hardware_note`), the
  parts' manifest says so, and the check allows what the whole model moves when OpenVINO
  runs it so (:func:`onnxsplit.running.verify.reduced_spread`);
* a model with dynamic input dimensions is compiled for the shapes a part was exported
  with, or for the first shapes it is run on (static shapes compile to faster kernels).

:class:`Hinted` is OpenVINO run the way its documentation tells users to, as a baseline
beside onnxsplit: its LATENCY hint with one request, or its THROUGHPUT hint with
``AsyncInferQueue`` and the optimal number of requests.  :func:`profile_nodes` times every
ONNX node inside whole-model runs (OpenVINO's per-layer counters, each executed layer's
time spread over the ONNX nodes it was made of).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

RUNTIME = "OpenVINORuntime"  # a manifest's execution_provider for a part OpenVINO runs
DEVICE = "CPU"  # OpenVINO's device: the host's cores
# OpenVINO element type -> onnxruntime's type string (what the runner's feeds read)
_TYPES = {"f32": "tensor(float)", "f64": "tensor(double)", "f16": "tensor(float16)",
          "bf16": "tensor(bfloat16)", "i64": "tensor(int64)", "i32": "tensor(int32)",
          "i16": "tensor(int16)", "i8": "tensor(int8)", "u8": "tensor(uint8)",
          "u16": "tensor(uint16)", "u32": "tensor(uint32)", "u64": "tensor(uint64)",
          "boolean": "tensor(bool)", "string": "tensor(string)"}
COMPILED_SHAPES = 4  # shapes a session compiles for (the first seen); others run on the dynamic model
PLUGIN_EP = "OpenVINOExecutionProvider"  # OpenVINO inside onnxruntime (onnxsplit.providers.plugins)
PRECISIONS = ("f32", "bf16")  # what onnxsplit lets OpenVINO compute in (--precision)
AUTO = "auto"  # --precision's default: what OpenVINO computes in by default here (:func:`default_precision`)
PRECISION_ENV = "ONNXSPLIT_OPENVINO_PRECISION"


class OpenVINOError(RuntimeError):
    """OpenVINO refused a model or failed to run it."""


@functools.lru_cache(maxsize=None)
def _core():
    import openvino as ov

    return ov.Core()


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether OpenVINO's runtime is installed and offers the CPU here."""
    try:
        return DEVICE in _core().available_devices
    except Exception:
        return False


def version() -> str:
    try:
        import openvino as ov

        return ov.__version__.split("-")[0]
    except Exception:
        return ""


def device_name() -> str:
    try:
        return str(_core().get_property(DEVICE, "FULL_DEVICE_NAME"))
    except Exception:
        return DEVICE


def precision() -> str:
    """What onnxsplit's OpenVINO parts compute in: float32 unless a command's ``--precision``
    (``auto``, its default: OpenVINO's own, :func:`default_precision`) set PRECISION_ENV
    (bf16 only where the CPU has bf16 units: :func:`bf16_units`)."""
    import os

    value = os.environ.get(PRECISION_ENV, "f32")
    if value not in PRECISIONS:
        from ..errors import OnnxsplitError

        raise OnnxsplitError(f"{PRECISION_ENV}={value!r}: choose one of {', '.join(PRECISIONS)}")
    return value


@functools.lru_cache(maxsize=None)
def bf16_units() -> bool:
    """Whether OpenVINO computes bf16 on this CPU's own units (it says BF16 among its
    optimisation capabilities); elsewhere it would compute in float32 anyway."""
    try:
        return "BF16" in list(_core().get_property(DEVICE, "OPTIMIZATION_CAPABILITIES"))
    except Exception:
        return False


def default_precision() -> str:
    """What OpenVINO computes in on this CPU unless told otherwise, as its users get it:
    bf16 where the CPU has bf16 units and OpenVINO is installed, else float32."""
    return "bf16" if available() and bf16_units() else "f32"


@contextlib.contextmanager
def computing_in(value: str | None, quiet: bool = False) -> Iterator[str]:
    """``--precision``: OpenVINO's parts, profiles and calibration compute in ``value``
    within the block (PRECISION_ENV, which child processes inherit); the value in force is
    yielded.  ``auto`` (the default): OpenVINO's own default here (:func:`default_precision`).
    bf16 asked for needs OpenVINO installed (else OnnxsplitError); on a CPU without bf16
    units it is float32, said in a note."""
    import os
    import sys

    from ..errors import OnnxsplitError

    value = value or "f32"
    if value == AUTO:
        value = default_precision()
    if value not in PRECISIONS:
        raise OnnxsplitError(f"unknown precision '{value}' (choose {' or '.join(PRECISIONS)})")
    if value != "f32" and not available():
        raise OnnxsplitError(f"--precision {value} is what OpenVINO's parts compute in, and OpenVINO is not "
                             "installed here (pip install 'onnxsplit[openvino]')")
    if value != "f32" and not bf16_units():
        if not quiet:
            print("onnxsplit: note: this CPU has no bf16 units (OpenVINO does not list BF16): "
                  "OpenVINO computes in f32 here", file=sys.stderr, flush=True)
        value = "f32"
    before = os.environ.get(PRECISION_ENV)
    os.environ[PRECISION_ENV] = value
    try:
        yield value
    finally:
        if before is None:
            os.environ.pop(PRECISION_ENV, None)
        else:
            os.environ[PRECISION_ENV] = before


PRECISION_NOTE = ", computing in "  # (how hardware_note begins)


def hardware_note(p: str | None = None) -> str:
    """What a profile's hardware key adds for OpenVINO's precision ``p`` (default: the one
    in force; '' in float32), so that profiles and calibrations measured in bf16 are kept
    apart from float32's."""
    p = p or precision()
    return "" if p == "f32" else f"{PRECISION_NOTE}{p}"


def properties(threads: int | None, replicas: int, config: Mapping[str, Any] | None = None
               ) -> dict[str, str]:
    """How onnxsplit compiles a part: ``threads`` per stream (0 or None: OpenVINO's own
    choice, every core), ``replicas`` streams, in :func:`precision`; ``config`` (OpenVINO
    property -> value, a manifest part's: its precision among them) on top."""
    props: dict[str, str] = {}
    if replicas > 1:
        props["NUM_STREAMS"] = str(replicas)
        if threads:
            props["INFERENCE_NUM_THREADS"] = str(threads * replicas)
        props["PERFORMANCE_HINT"] = "THROUGHPUT"
    else:
        props["PERFORMANCE_HINT"] = "LATENCY"
        if threads:
            props["INFERENCE_NUM_THREADS"] = str(threads)
    props["INFERENCE_PRECISION_HINT"] = precision()
    props.update({k: str(v) for k, v in (config or {}).items()})
    return props


class _Port:
    """An input or output as onnxruntime's NodeArg shows it (name, type, shape)."""

    def __init__(self, port):
        self.name = port.get_any_name()
        self.type = _TYPES.get(port.get_element_type().get_type_name(), "tensor(float)")
        shape = port.get_partial_shape()
        self.shape = [d.get_length() if d.is_static else f"d{i}" for i, d in enumerate(shape)]


class _Compiled:
    """One model compiled for each input signature it is run with, shared by the streams
    (sessions) of one part: ``requests`` infer requests per compiled model, each with a
    lock: one infer request runs one inference at a time, and a session may be called
    from several threads at once (a Serve replica takes concurrent calls: two batches of
    one shape on one request gave each other's answers)."""

    def __init__(self, path: str | Path, props: Mapping[str, str], requests: int,
                 shapes: Mapping[str, Iterable[int]] | None = None, served: bool = False):
        self.path = str(path)
        self.props = dict(props)
        self.requests = max(1, requests)
        self.lock = threading.Lock()
        self.by_shape: dict[tuple, tuple[Any, list[Any]]] = {}
        self.dynamic: tuple[Any, list[Any]] | None | bool = None  # any other shape (False: none compiles)
        try:
            self.model = _core().read_model(self.path)
        except Exception as e:
            raise OpenVINOError(_one_line(e)) from None
        self.inputs = [_Port(p) for p in self.model.inputs]
        self.outputs = [_Port(p) for p in self.model.outputs]
        self.static = all(p.get_partial_shape().is_static for p in self.model.inputs)
        if self.static:
            self._compile(None, None)
        elif shapes and all(i.name in shapes for i in self.inputs):
            self._compile(self._signature(shapes), shapes)
        # a server compiles nothing while it answers (a shape's compile is a request's tail)
        self.compiles = 0 if served else COMPILED_SHAPES
        if served and not self.static:
            self._dynamic()

    @staticmethod
    def _signature(shapes: Mapping[str, Iterable[int]]) -> tuple:
        return tuple(sorted((k, tuple(int(d) for d in v)) for k, v in shapes.items()))

    def _compile(self, key, shapes, keep: bool = True):
        model = self.model
        if shapes is not None:
            model = model.clone()
            try:
                model.reshape({k: list(map(int, v)) for k, v in shapes.items()})
            except Exception as e:
                raise OpenVINOError(f"cannot take inputs of shapes {dict(shapes)}: {_one_line(e)}") from None
        try:
            compiled = _core().compile_model(model, DEVICE, self.props)
        except Exception as e:
            raise OpenVINOError(_one_line(e)) from None
        got = (compiled, [(compiled.create_infer_request(), threading.Lock()) for _ in range(self.requests)])
        if keep:
            self.by_shape[key] = got
        return got

    def request(self, feeds: Mapping[str, Any], copy: int):
        """An infer request for inputs of these shapes: compiled for them (the first
        COMPILED_SHAPES shapes seen, kept), else the model compiled once with its dynamic
        dimensions.  Compiling a shape takes 70-85 ms on models/small_bert, where a call
        takes 0.3-5 ms: a server batching requests of many shapes had recompiled on nearly
        every call (100 requests/s where 1,300 came through the dynamic model) while the
        dynamic model runs 5-25% slower than a compiled shape."""
        return self.entry(feeds)[1][copy]

    def entry(self, feeds: Mapping[str, Any]) -> tuple[Any, list[Any]]:
        """(compiled model, its infer requests with their locks) for inputs of these
        shapes (:meth:`request`)."""
        if self.static:
            return self.by_shape[None]
        shapes = {k: np.shape(v) for k, v in feeds.items()}
        key = self._signature(shapes)
        with self.lock:
            got = self.by_shape.get(key)
            if got is None and len(self.by_shape) < self.compiles:
                got = self._compile(key, shapes)
            elif got is None:
                got = self._dynamic()
                if not got:  # the oldest compiled shape makes room
                    if self.by_shape:
                        self.by_shape.pop(next(iter(self.by_shape)))
                    got = self._compile(key, shapes)
        return got

    def renew(self, feeds: Mapping[str, Any]) -> None:
        """The model that ran ``feeds`` compiled afresh, after a run of it failed: a failed
        inference (models/small_bert compiled with its dynamic dimensions, inputs whose
        sequence lengths disagree) left the compiled model failing later runs of the shapes
        it had run, with that failure's words, fresh infer requests of it too (a server
        answered half its good requests 500 from then on)."""
        key = None if self.static else self._signature({k: np.shape(v) for k, v in feeds.items()})
        with self.lock:
            if key in self.by_shape:
                self.by_shape[key] = self._compile(key, None if key is None else dict(key), keep=False)
            elif self.dynamic:
                self.dynamic = None
                self._dynamic()

    def _dynamic(self):
        """The model compiled with its dynamic dimensions (once), or False where OpenVINO
        compiles it only for static shapes."""
        if self.dynamic is None:
            try:
                self.dynamic = self._compile(None, None, keep=False)
            except OpenVINOError:
                self.dynamic = False
        return self.dynamic

    def first(self):
        return next(iter(self.by_shape.values()))[0] if self.by_shape else None


class Session:
    """One stream of a compiled part, behind the interface the runner uses of an
    onnxruntime session."""

    def __init__(self, compiled: _Compiled, copy: int):
        self._c = compiled
        self._copy = copy

    def get_inputs(self) -> list[_Port]:
        return list(self._c.inputs)

    def get_outputs(self) -> list[_Port]:
        return list(self._c.outputs)

    def get_providers(self) -> list[str]:
        return [RUNTIME]

    def stream(self, samples: Iterable[Mapping[str, Any]], jobs: int) -> Iterator[dict[str, np.ndarray]]:
        """Samples through OpenVINO's own queue of ``jobs`` infer requests on this part's
        compiled model (:func:`queued`; a sample of other shapes runs on the model
        compiled for them), each sample's outputs by name in the samples' order: how
        OpenVINO runs its streams, with no Python thread per stream."""
        yield from queued(lambda feeds: self._c.entry(feeds)[0], samples, jobs,
                          [o.name for o in self._c.outputs])

    def run(self, output_names: list[str] | None, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        request, lock = self._c.request(feeds, self._copy)
        names = [o.name for o in self._c.outputs]
        with lock:  # (the request's inputs, its run and its outputs are one caller's at a time)
            try:
                got = request.infer(dict(feeds))  # (outputs copied out: the request reuses its own)
            except Exception as e:  # (its message, without the source locations it stacks)
                self._c.renew(feeds)
                raise OpenVINOError(_one_line(e)) from None
            values = list(got.values())
            if output_names is None:
                return values
            out = []
            for name in output_names:
                if name in names:
                    out.append(values[names.index(name)])
                else:
                    out.append(request.get_tensor(name).data.copy())
        return out


def open_sessions(path: str | Path, *, threads: int | None = 0, replicas: int = 1,
                  config: Mapping[str, Any] | None = None,
                  shapes: Mapping[str, Iterable[int]] | None = None, served: bool = False) -> list[Session]:
    """A part (or a whole model) compiled once for ``replicas`` streams: one
    :class:`Session` per stream (``shapes``, ``served``: :class:`_Compiled`'s).
    OpenVINOError where OpenVINO refuses it."""
    if not available():
        raise OpenVINOError("OpenVINO's runtime is not installed here (pip install openvino)")
    replicas = max(1, int(replicas or 1))
    compiled = _Compiled(path, properties(threads, replicas, config), replicas, shapes, served)
    return [Session(compiled, k) for k in range(replicas)]


# ------------------------------------------------------------- OpenVINO as users run it


HINTS = ("LATENCY", "THROUGHPUT")


class Hinted:
    """A whole model compiled with one of OpenVINO's performance hints and run as its
    documentation shows (a baseline, measured by ``compare.measure_rounds`` like a loaded
    plan): one request in a loop for LATENCY; for THROUGHPUT an ``AsyncInferQueue`` of
    the compiled model's optimal number of requests.  Precision is OpenVINO's default
    (bf16 on a CPU with bf16 units: ``precision`` says which)."""

    spins = True  # its threads (TBB's) may spin on after a run, as onnxruntime's do

    def __init__(self, path: str | Path, hint: str):
        if hint not in HINTS:
            raise ValueError(f"unknown OpenVINO hint {hint!r}")
        if not available():
            raise OpenVINOError("OpenVINO's runtime is not installed here")
        self.hint = hint
        try:
            self.compiled = _core().compile_model(str(path), DEVICE, {"PERFORMANCE_HINT": hint})
            self.requests = int(self.compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")) \
                if hint == "THROUGHPUT" else 1
            self.request = self.compiled.create_infer_request()
            # what it computes in: float32, or bf16 on a CPU with bf16 units (said beside its figures)
            self.precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        except Exception as e:
            raise OpenVINOError(_one_line(e)) from None
        self.output_names = [o.get_any_name() for o in self.compiled.outputs]
        self.execution_providers = [RUNTIME]

    def default_depth(self) -> int:
        return 1 if self.requests == 1 else 2 * self.requests

    def run(self, feeds: Mapping[str, Any], took=None) -> dict[str, Any]:
        got = self.request.infer(dict(feeds))
        return dict(zip(self.output_names, got.values()))

    def stream(self, samples: Iterable[Mapping[str, Any]], depth: int | None = None,
               timeout_s: float | None = None) -> Iterator[dict[str, Any]]:
        """Samples through an AsyncInferQueue of at most ``depth`` requests (one in flight
        measures a sample's latency); each sample's outputs in order."""
        yield from queued(lambda _: self.compiled, samples, min(self.requests, depth or self.requests),
                          self.output_names)


def queued(compiled_for, samples: Iterable[Mapping[str, Any]], jobs: int,
           names: list[str]) -> Iterator[dict[str, np.ndarray]]:
    """Samples through an AsyncInferQueue of ``jobs`` infer requests (one in flight
    measures a sample's latency), as OpenVINO's documentation runs its THROUGHPUT hint, on
    the compiled model ``compiled_for(sample)`` gives (where it changes, the queue drains
    and one on the next begins); each sample's outputs, named in order by ``names`` (a
    compiled model's output may answer to another of its tensor's names than the model
    read had: GPT-2's did), in the samples' order, as they come.  OpenVINOError where an
    inference fails."""
    import openvino as ov

    from ..errors import OnnxsplitError

    done: dict[int, dict[str, Any]] = {}
    cond = threading.Condition()
    on = queue = None
    nxt = sent = 0

    def ready() -> list[dict[str, Any]]:
        nonlocal nxt
        out = []
        with cond:
            while nxt in done:
                got = done.pop(nxt)
                if isinstance(got, Exception):
                    raise OpenVINOError(f"sample {nxt}: {_one_line(got)}")
                out.append(got)
                nxt += 1
        return out

    def finished(request, i):
        try:
            got = {n: request.get_output_tensor(k).data.copy() for k, n in enumerate(names)}
        except Exception as e:  # (raised where the sample's outputs are taken)
            got = e
        with cond:
            done[i] = got
            cond.notify_all()

    try:
        for i, s in enumerate(samples):
            model = compiled_for(s)
            if model is not on:
                if queue is not None:
                    queue.wait_all()
                on = model
                queue = ov.AsyncInferQueue(model, max(1, int(jobs)))
                queue.set_callback(finished)
            queue.start_async(dict(s), i)  # (waits for an idle request)
            sent = i + 1
            for out in ready():  # (yielded outside the lock: the callbacks go on)
                yield out
        if queue is not None:
            queue.wait_all()
        last = ready()
    except (OpenVINOError, OnnxsplitError):  # (a sample the caller refused is its own error)
        raise
    except Exception as e:  # (its message, without the source locations it stacks)
        raise OpenVINOError(_one_line(e)) from None
    finally:  # (a queue let go with requests in flight, a sample refused while earlier ones
        if queue is not None:  # ran, aborted or crashed the process half the time: 2-core AMD, AVX2)
            try:
                queue.wait_all()
            except Exception:
                pass
    yield from last
    if nxt < sent:
        raise OpenVINOError(f"sample {nxt} gave no outputs")


# ----------------------------------------------------------------- per-node profiling


def profile_nodes(path: str | Path, feeds: Mapping[str, Any], node_names: Iterable[str],
                  weights: Mapping[str, float] | None = None, *, threads: int = 1,
                  runs: int = 10, warmup: int = 2,
                  consumers: Mapping[str, Iterable[str]] | None = None
                  ) -> tuple[dict[str, float], dict[str, float]]:
    """Every ONNX node's time (ms) inside whole-model runs on ``threads`` threads, from
    OpenVINO's per-layer counters: each executed layer's time (median over ``runs``) is
    spread over the ONNX nodes it was made of (its ``originalLayersNames``), in
    proportion to ``weights`` (e.g. its FLOPs) where given, else evenly; a layer made of
    no ONNX node (OpenVINO's own: the MVN a LayerNormalization becomes) is charged to the
    nodes of the nearest layer that was (:func:`_nearest`), and an ONNX node that no layer
    names joins the layer of the node that reads it (``consumers``: node -> the nodes
    reading its outputs; :func:`_adopt_fused`).  Returns (node -> ms, the whole model's
    {"median", "p10", "p90"} ms over plain runs beside the counted ones)."""
    names = list(node_names)
    known = set(names)
    props = properties(threads, 1)
    try:
        model = _core().read_model(str(path))
        model.reshape({p.get_any_name(): list(np.shape(feeds[p.get_any_name()])) for p in model.inputs})
        plain = _core().compile_model(model, DEVICE, props)
        counted = _core().compile_model(model, DEVICE, dict(props, PERF_COUNT="YES"))
    except Exception as e:
        raise OpenVINOError(_one_line(e)) from None
    origins, near = {}, {}
    for op in counted.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        layers = str(info["originalLayersNames"].astype(str)).split(",") \
            if "originalLayersNames" in info else [op.get_friendly_name()]
        # (a layer OpenVINO split off a node is named after it: 'node_Gemm_664/WithoutBiases')
        origins[op.get_friendly_name()] = list(dict.fromkeys(
            n if n in known else n.split("/")[0] for n in layers
            if n in known or n.split("/")[0] in known))
        near[op.get_friendly_name()] = (
            [i.get_source_output().get_node().get_friendly_name() for i in op.inputs()]
            + [t.get_node().get_friendly_name() for o in op.outputs() for t in o.get_target_inputs()])
    request, plain_request = counted.create_infer_request(), plain.create_infer_request()
    for _ in range(max(warmup, 1)):
        request.infer(dict(feeds))
        plain_request.infer(dict(feeds))
    per_layer: dict[str, list[float]] = {}
    whole: list[float] = []
    for _ in range(max(runs, 1)):
        request.infer(dict(feeds))
        for p in request.get_profiling_info():
            per_layer.setdefault(p.node_name, []).append(p.real_time.total_seconds() * 1e3)
        t = time.perf_counter()
        plain_request.infer(dict(feeds))
        whole.append((time.perf_counter() - t) * 1e3)
    ran = {layer for layer, times in per_layer.items() if np.median(times) > 0}
    origins = {layer: into or _nearest(layer, origins, near) for layer, into in origins.items()}
    _adopt_fused(origins, names, consumers or {}, ran)
    out = dict.fromkeys(names, 0.0)
    for layer, times in per_layer.items():
        into = origins.get(layer) or ([layer] if layer in known else [])
        if not into:
            continue
        ms = float(np.median(times))
        w = np.array([max((weights or {}).get(n, 1.0), 1e-9) for n in into], dtype=float) \
            if weights else np.ones(len(into))
        for n, share in zip(into, w / w.sum()):
            out[n] += ms * float(share)
    p10, med, p90 = np.percentile(whole, [10, 50, 90])
    return out, {"median": float(med), "p10": float(p10), "p90": float(p90), "runs": len(whole)}


def _adopt_fused(origins: dict[str, list[str]], names: list[str],
                 consumers: Mapping[str, Iterable[str]], ran: set[str]) -> None:
    """ONNX nodes that no layer which ``ran`` names (OpenVINO fused a MatMul into the
    FullyConnected it named after the Add that follows; the MatMul's name is left on a
    weight transpose folded away) join the layer of the node that reads their output,
    last first so that chains of them follow."""
    layer_of = {n: layer for layer, into in origins.items() if layer in ran for n in into}
    for name in reversed(names):
        if name in layer_of:
            continue
        layer = next((layer_of[c] for c in consumers.get(name, ()) if c in layer_of), None)
        if layer is not None:
            origins[layer] = origins[layer] + [name]
            layer_of[name] = layer


def _nearest(layer: str, origins: Mapping[str, list[str]], near: Mapping[str, list[str]],
             most: int = 64) -> list[str]:
    """The ONNX nodes of the layer nearest to ``layer`` (producers first, then consumers,
    breadth first) that was made of any: where a layer OpenVINO made up (the MVN of a
    decomposed LayerNormalization) is charged, rather than nowhere."""
    seen, todo = {layer}, list(near.get(layer, ()))
    while todo and len(seen) < most:
        nxt = todo.pop(0)
        if nxt in seen:
            continue
        seen.add(nxt)
        if origins.get(nxt):
            return origins[nxt]
        todo += near.get(nxt, ())
    return []


def _one_line(e: BaseException) -> str:
    """OpenVINO's message without the source locations it stacks before it."""
    lines = [line.strip() for line in str(e).splitlines()
             if line.strip() and not line.startswith(("Exception from ", "Check '"))]
    return " ".join(" ".join(lines or [str(e)]).split())[:300]
