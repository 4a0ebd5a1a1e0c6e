"""Run a parts folder on Ray: one actor per part (per copy) holding its onnxruntime session.

:class:`RayParts` has the interface of :class:`onnxsplit.running.runner.Parts`, so ``onnxsplit run
--engine ray`` verifies and measures it as the threaded runner does.  Each actor asks for
its device's resources (:func:`actor_plans`: CPUs, one GPU, the custom resource of the
machine the plan put it on).  A part's call takes its producers' output refs, so tensors
move through Ray's object store and the actors pipeline, ``depth`` samples in flight.
Without an address a local Ray is started and shut down at the end (and on Ctrl-C); with
one, a running cluster is joined and the part files are shipped to the actors.

Write-up: docs/machine.md (Running on Ray and serving).
"""

from __future__ import annotations

import collections
import logging
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from .. import interrupt
from ..profile.devices import CPU_EP, shares_cpu
from .runner import RunError, read_manifest, session_spec

GPU_EPS = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider")
MACHINE_SHARE = 0.001  # of a machine's custom resource per actor: any number fit on it
WAIT_S = 600.0  # the longest one sample may take before the run is called stuck
PLACE_S = 120.0  # the longest the actors may take to be placed and load their sessions
REACH_S = 5.0  # a cluster address must answer on its port within this, before Ray is asked to join it


def ray_module():
    """Ray, or a one-line error saying how to get it (an optional extra)."""
    try:
        import ray
    except ImportError:
        raise RunError("the Ray engine needs Ray: pip install 'onnxsplit[ray]'") from None
    return ray


# what a local Ray started here is configured with (see start)
LOCAL_SYSTEM_CONFIG = {"worker_niceness": 0}


class _Started:
    """A local Ray this process started: shut down at the end, or killed on Ctrl-C."""

    def kill(self) -> None:
        ray = ray_module()
        if ray.is_initialized():
            ray.shutdown()


def start(address: str | None = None, *, num_cpus: int | None = None) -> _Started | None:
    """Join the Ray cluster at ``address``, or start a local one (returned, to be shut
    down by its caller); None where this process already runs Ray."""
    ray = ray_module()
    if ray.is_initialized():
        return None
    logging.getLogger("ray").setLevel(logging.ERROR)  # its start-up notes are not the user's business
    local = address is None
    if not local:
        reachable(address)
    try:
        # "local", not None: given None, Ray joins the cluster its address file last named
        # (written by `ray start` and by Ray's test clusters, and left behind when they stop),
        # and fails on a cluster that is gone or joins one that is not the user's.
        # worker_niceness 0: Ray starts its workers (the parts' actors, Serve's replicas,
        # proxy and controller) at nice 15 by default, so beside any process at the usual
        # priority they ran on what it left (a Ray Serve server took over 330 s to start
        # beside three CPU-bound processes on 2 cores, 31 s alone); a cluster the user
        # started keeps its own setting (RAY_worker_niceness)
        ray.init(address="local" if local else address, num_cpus=num_cpus if local else None,
                 include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}} if local else None,
                 _system_config=LOCAL_SYSTEM_CONFIG if local else None)
    except Exception as e:
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise RunError(f"cannot start {where}: {' '.join(str(e).split())[:300]}") from None
    started = _Started()
    interrupt.register(started)
    return started


def reachable(address: str, seconds: float = REACH_S) -> None:
    """A cluster named as HOST:PORT answers on its port within ``seconds``, else RunError
    (``ray.init`` would retry for minutes, printing its warnings); a ``ray://`` client
    address or ``auto`` is left to Ray."""
    import socket

    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not host:
        return
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise RunError(f"--address {address}: the port must be a number from 1 to 65535")
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
    except OSError as e:
        raise RunError(f"cannot reach a Ray cluster at {address} within {seconds:g} s "
                       f"({e.strerror or e}): is `ray start --head` running there?") from None


def stop(started: _Started | None) -> None:
    if started is not None:
        interrupt.unregister(started)
        started.kill()


class PartActor:
    """One part's session on the node Ray placed it on."""

    def __init__(self, spec: Mapping[str, Any], folder: str, shipped, providers: list, threads: int | None,
                 optimize: bool, device_id: int | None = None, served: bool = False, alone: bool = False):
        """``alone``: the plan's only part, whose intra-op threads may spin on between runs
        as the threaded runner's and onnxruntime's default session's do (a decoder's small
        steps ran at less than half the speed with them sleeping); where parts share the
        cores, an idle one's threads must not spin on a core another needs."""
        from ..providers.sessions import SessionError, open_sessions, part_session_config

        self.spec = dict(spec)
        self._shared: bool | None = None  # its caches share past and present (:meth:`_in_place`)
        self._one: _OnePart | None = None  # this part as kv_cache reads a parts folder (:meth:`_view`)
        self._kept = None  # generations' caches kept across calls (:meth:`step`)
        self.made = None  # the folder this actor made for shipped files (removed by cleanup)
        if shipped is not None:  # the files came along (Ray resolved the ref): written out here
            files = shipped if isinstance(shipped, dict) else ray_module().get(shipped)
            folder = self.made = tempfile.mkdtemp(prefix="onnxsplit-part-")
            for name, data in files.items():
                Path(folder, name).write_bytes(data)
        self.folder = folder
        path = Path(folder) / spec["file"]
        config = part_session_config(spec.get("config"), spec["execution_provider"], providers[0], threads,
                                     not alone)
        shapes = {t["name"]: t["shape"] for t in spec.get("inputs") or []
                  if isinstance(t.get("shape"), list)} or None
        try:
            self.session = open_sessions(path, providers, threads=threads, optimize=optimize,
                                         config=config, device_id=device_id, shapes=shapes, served=served)[0]
        except SessionError as e:
            raise RunError(f"part {spec['name']} ({spec['file']}) cannot be loaded on {providers[0]}: "
                           f"{e}") from None
        self.inputs = [i["name"] for i in spec["inputs"]] if spec.get("inputs") is not None \
            else [i.name for i in self.session.get_inputs()]
        self.outputs = [o["name"] for o in spec["outputs"]] if spec.get("outputs") is not None \
            else [o.name for o in self.session.get_outputs()]

    def cleanup(self) -> None:
        """The session closed and the shipped files' folder (made by this actor) removed."""
        import shutil

        self.session = None
        if self.made:
            shutil.rmtree(self.made, ignore_errors=True)
            self.made = None

    def where(self) -> dict[str, Any]:
        """The Ray node this actor runs on, and the provider its session uses."""
        return {"node": ray_module().get_runtime_context().get_node_id(),
                "provider": self.session.get_providers()[0], "folder": self.folder}

    def run(self, sample: int, *values: Mapping[str, Any]) -> dict[str, Any]:
        """The part on one sample: its inputs from the model's feeds and its producers'
        outputs (``values``, resolved by Ray from their refs)."""
        merged: dict[str, Any] = {}
        for v in values:
            merged.update(v)
        try:
            got = self.session.run(self.outputs, {t: merged[t] for t in self.inputs})
        except Exception as e:
            raise RunError(f"part {self.spec['name']} on {self.spec['device']} failed on sample {sample}: "
                           f"{' '.join(str(e).split())[:300]}") from None
        return dict(zip(self.outputs, got))

    def generate(self, decoder, prompt: list[int], max_tokens: int, eos: int | None, chunk: int | None,
                 seconds: float | None = None):
        """A whole greedy generation on this part alone (a decoder kept in one part): each
        step's caches stay in this actor, not one round trip through Ray a token, and in
        place where the part allows (:mod:`.kv_cache`: one buffer a cache, bound as past
        and present, as ``onnxsplit generate`` and the local engine run it; handed from
        step to step here where it does not)."""
        from . import kv_cache
        from .generate import generate

        if self._in_place(decoder):
            step = kv_cache.SharedCaches(self._view(), decoder.caches, decoder.specs,
                                         {c: decoder.seq_axis(c) for c in decoder.caches},
                                         len(prompt) + max_tokens).run
        else:
            def step(feeds):
                return self.run(0, feeds)
        return generate(_within(step, seconds), decoder, prompt, max_tokens, eos, chunk=chunk)

    def drive(self, generation: str, parts: list, me: int, deps: list[list[int]], final: list[int],
              outputs: list[str], decoder, prompt: list[int], max_tokens: int, eos: int | None, chunk: int | None,
              seconds: float | None = None):
        """A whole greedy generation across several parts that keep their caches (:meth:`step`),
        run from this part's replica (part ``me`` of ``parts``, the others' Serve handles):
        each token calls this part in process and the others through their handles, each
        response handed on as it is (``deps``: each part's producers), so a token costs
        one hop a part fewer than from the gateway.  ``final``: the parts that make the
        model's ``outputs``; ``seconds``: the request's time left (:func:`_within`)."""
        from .generate import generate

        length, calls = len(prompt) + max_tokens, 0
        presents = dict.fromkeys(decoder.caches.values())  # (kept by the parts: not handed back)

        def resolved(value):
            return value.result() if hasattr(value, "result") else value

        def step(feeds):
            nonlocal calls
            first, calls = calls == 0, calls + 1
            sent = {k: v for k, v in feeds.items() if v is not None}
            told = decoder if first else None
            responses: list[Any] = []
            for i, part in enumerate(parts):
                producers = [responses[d] for d in deps[i]]
                if i == me:
                    responses.append(self.step(generation, first, length, told, sent,
                                               *[resolved(v) for v in producers]))
                else:
                    responses.append(part.step.remote(generation, first, length, told, sent, *producers))
            merged: dict[str, Any] = {}
            for i in final:
                merged.update(resolved(responses[i]))
            return {**{o: merged[o] for o in outputs if o in merged}, **presents}

        try:
            return generate(_within(step, seconds), decoder, prompt, max_tokens, eos, chunk=chunk)
        finally:
            for i, part in enumerate(parts):
                if i == me:
                    self.end(generation)
                else:
                    part.end.remote(generation)

    def step(self, generation: str, first: bool, length: int, decoder, feeds: Mapping[str, Any],
             *values: Mapping[str, Any]) -> dict[str, Any]:
        """One call of a generation across several parts whose caches this part keeps
        between calls (:class:`.kv_cache.KeptCaches`): its inputs from the feeds and its
        producers' outputs (``values``), its past from its own; what it makes but its
        presents.  ``decoder`` comes with the first call of the first generation."""
        from . import kv_cache

        if self._kept is None:
            if decoder is None:
                raise RunError(f"part {self.spec['name']} holds no caches for this generation "
                               "(its replica restarted)")
            self._kept = kv_cache.KeptCaches(self._view(), decoder, self._in_place(decoder),
                                             lambda feeds: self.run(0, feeds))
        merged = dict(feeds)
        for v in values:
            merged.update(v)
        return self._kept.run(generation, first, length, merged)

    def end(self, generation: str) -> None:
        """The generation's caches let go."""
        if self._kept is not None:
            self._kept.end(generation)

    def _view(self) -> "_OnePart":
        if self._one is None:
            self._one = _OnePart(self)
        return self._one

    def _in_place(self, decoder) -> bool:
        """Whether this part's caches share past and present (``kv_cache.shared_caches``,
        read once: it opens the part's graph), on an onnxruntime session."""
        if self._shared is None:
            from . import kv_cache

            self._shared = hasattr(self.session, "io_binding") and \
                kv_cache.shared_caches(self._view(), decoder.caches) is None
        return self._shared


def _within(step, seconds: float | None):
    """``step`` refused once ``seconds`` have passed (None: no limit): a generation run in a
    replica, whose gateway gave up on it at the request's timeout, stops at its next token
    there too (a sync method is not interrupted), letting its caches go."""
    if seconds is None:
        return step
    deadline = time.monotonic() + seconds

    def bounded(feeds):
        if time.monotonic() > deadline:
            raise RunError(f"the generation ran past its request's timeout ({seconds * 1000:.0f} ms left when it began)")
        return step(feeds)
    return bounded


class _OnePart:
    """A :class:`PartActor`'s part as ``kv_cache`` reads a loaded parts folder."""

    def __init__(self, actor: PartActor):
        self.parts, self.sessions, self.dir = [actor.spec], [[actor.session]], Path(actor.folder)
        self.execution_providers = [actor.session.get_providers()[0]]
        self.output_names, self._io = actor.outputs, (actor.inputs, actor.outputs)

    def io(self, i: int) -> tuple[list[str], list[str]]:
        return self._io


class RayParts:
    """A parts folder loaded as Ray actors; see the module docstring."""

    def __init__(self, parts_dir: str | Path, *, address: str | None = None, optimize: bool = False,
                 cpu_threads: int | None = 1, fallback_cpu: bool = False, ship: bool | None = None):
        """``ship``: send the part files to the actors through the object store (default:
        where joining a cluster at ``address``, whose nodes may not see this folder)."""
        self.dir = Path(parts_dir).resolve()
        self.manifest = read_manifest(self.dir)
        self.assignment = None
        specs = [session_spec(self.dir, self.manifest)] if self.manifest.get("run_as") == "session" \
            else list(self.manifest["parts"])
        self.parts = specs
        self.devices = list(dict.fromkeys(p["device"] for p in specs))
        self._started = start(address)
        try:
            self._load(specs, optimize, cpu_threads, fallback_cpu, address is not None if ship is None else ship)
        except BaseException:
            self.close()
            raise

    def _load(self, specs, optimize: bool, cpu_threads: int | None, fallback_cpu: bool, ship: bool) -> None:
        ray = ray_module()
        actor = ray.remote(PartActor)
        have = ray.cluster_resources()
        shipped = ship_parts(self.dir, specs) if ship else {}
        self.actors: list[list[Any]] = []
        self.execution_providers = []
        self._part_of: dict[str, Mapping[str, Any]] = {}  # actor id (hex) -> its part's spec
        for p, (providers, threads, opts, ep, device_id) in zip(
                specs, actor_plans(specs, have, cpu_threads, fallback_cpu)):
            level = p.get("optimization")
            copies = [actor.options(**opts, max_concurrency=1).remote(
                p, str(self.dir), shipped.get(p["file"]), providers, threads,
                optimize if level is None else level == "all", device_id, alone=len(specs) == 1)
                      for _ in range(max(1, int(p.get("replicas") or 1)))]
            self.actors.append(copies)
            self.execution_providers.append(ep)
            self._part_of.update({a._actor_id.hex(): p for a in copies})
        try:  # every actor up (its session made) before the first sample
            self.placed = ray.get([a.where.remote() for copies in self.actors for a in copies], timeout=PLACE_S)
        except ray.exceptions.GetTimeoutError:
            raise RunError(f"the parts' actors were not all placed within {PLACE_S:g} s: the Ray cluster "
                           f"lacks what they ask for (its resources: "
                           f"{', '.join(f'{k} {v:g}' for k, v in sorted(have.items()) if not k.startswith('node:'))})"
                           ) from None
        except Exception as e:
            raise RunError(self._why(e)) from None
        self.output_names = [o["name"] for o in self.manifest["model"]["outputs"]]
        ins = [[i["name"] for i in p["inputs"]] for p in specs]
        outs = [[o["name"] for o in p["outputs"]] for p in specs]
        producer = {o: i for i, names in enumerate(outs) for o in names}
        self._deps = [sorted({producer[t] for t in names if t in producer}) for names in ins]
        self._final = sorted({producer[o] for o in self.output_names if o in producer})

    @property
    def inputs(self) -> list[dict[str, Any]]:
        return self.manifest["model"]["inputs"]

    def default_depth(self) -> int:
        """Two samples in flight per actor (one where a single actor runs everything)."""
        actors = sum(len(c) for c in self.actors)
        return 1 if actors == 1 else 2 * actors

    def _submit(self, sample: int, feeds_ref) -> list:
        refs: list[Any] = []
        for i, copies in enumerate(self.actors):
            actor = copies[sample % len(copies)]
            refs.append(actor.run.remote(sample, feeds_ref, *[refs[d] for d in self._deps[i]]))
        return [refs[i] for i in self._final]

    def _collect(self, refs) -> dict[str, Any]:
        ray = ray_module()
        try:
            parts = ray.get(refs, timeout=WAIT_S)
        except ray.exceptions.GetTimeoutError:
            raise RunError(f"no answer from the parts' actors within {WAIT_S:g} s") from None
        except Exception as e:
            raise RunError(self._why(e)) from None
        merged: dict[str, Any] = {}
        for p in parts:
            merged.update(p)
        return {o: merged[o] for o in self.output_names}

    def _why(self, e: BaseException) -> str:
        """One line: a part whose actor is gone (its process or its node died) named with
        its device and machine; anything else as :func:`_reason` says it."""
        part = self._part_of.get(getattr(e, "actor_id", None) or "")
        if part is None or getattr(e, "actor_init_failed", False):  # (its own error, as it raised it)
            return _reason(e)
        where = f"{part['device']}" + (f" (machine '{part['machine']}')" if part.get("machine") else "")
        # Ray's text: a first line, "\tkey: value" lines, then why it died
        why = [line.strip() for line in str(e).splitlines()[1:] if line.strip() and not line.startswith("\t")]
        return f"part {part['name']} on {where} was lost: {' '.join(' '.join(why).split())[:200] or 'its actor died'}"

    def check_feeds(self, feeds: Mapping[str, Any]) -> None:
        missing = [s["name"] for s in self.inputs if s["name"] not in feeds]
        if missing:
            raise RunError(f"input '{missing[0]}' is not given")

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """One sample through every part; the model's outputs by name."""
        self.check_feeds(feeds)
        return self._collect(self._submit(0, ray_module().put(dict(feeds))))

    def stream(self, samples: Iterable[Mapping[str, Any]], depth: int | None = None,
               timeout_s: float | None = None) -> Iterator[dict[str, Any]]:
        """Pipelined: yields each sample's outputs in order, ``depth`` samples in flight."""
        ray = ray_module()
        depth = depth or self.default_depth()
        flying: collections.deque = collections.deque()
        for n, feeds in enumerate(samples):
            interrupt.check()
            if len(flying) >= depth:
                yield self._collect(flying.popleft())
            flying.append(self._submit(n, ray.put(dict(feeds))))
        while flying:
            yield self._collect(flying.popleft())

    def close(self) -> None:
        """Actors ended; a Ray this object started, shut down."""
        ray = ray_module()
        actors = [a for copies in getattr(self, "actors", []) for a in copies]
        try:  # shipped files removed where they were written, before the actors end (each
            # awaited: one whose actor is gone fails at once, and must not cut the others short)
            refs = [a.cleanup.remote() for a in actors]
            ray.wait(refs, num_returns=len(refs), timeout=10)
        except Exception:
            pass
        for a in actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        self.actors = []
        stop(self._started)
        self._started = None

    def __enter__(self) -> "RayParts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def ship_parts(folder: Path, specs) -> dict[str, Any]:
    """part file -> object ref of {file: bytes} for it and the weights it reads: what an
    actor on a machine that does not see ``folder`` writes out and opens."""
    ray = ray_module()
    weights = {name: (folder / name).read_bytes() for name in ("weights.bin",) if (folder / name).exists()}
    return {p["file"]: ray.put({p["file"]: (folder / p["file"]).read_bytes(), **weights}) for p in specs}


def actor_plans(specs, have: Mapping[str, float], cpu_threads: int | None, fallback_cpu: bool) -> list[tuple]:
    """Per part: (the providers its session opens, its intra-op threads, the Ray options
    its actors ask with, the provider it runs on, the device id it addresses); a one-line
    error where the cluster cannot give a part what it needs.  A provider that runs on
    the host's cores (OpenVINO's runtime) is a CPU part, as the CPU EP's are."""
    out = []
    for p, share in zip(specs, _cpu_shares(specs, have, cpu_threads)):
        ep = p["execution_provider"]
        on_gpu = ep in GPU_EPS and have.get("GPU", 0) >= 1
        absent = not (shares_cpu(ep) or on_gpu)
        if absent and not fallback_cpu:  # (Ray offers CPUs and GPUs; other kinds are not found)
            raise RunError(f"part {p['name']} needs {ep}, which no node of the Ray cluster offers "
                           f"(its resources: {', '.join(sorted(have))}); --fallback-cpu runs it on a CPU")
        eps = p.get("execution_providers") or [ep]
        providers: list = [CPU_EP] if absent else list(dict.fromkeys(list(eps) + [CPU_EP]))
        threads = p.get("threads")
        if threads is None and ep == CPU_EP:
            threads = cpu_threads
        opts: dict[str, Any] = {"num_cpus": share}
        if on_gpu:
            opts["num_gpus"] = 1
        if p.get("machine"):
            if p["machine"] not in have:
                raise RunError(f"part {p['name']} is planned for machine '{p['machine']}', but no node of "
                               f"the Ray cluster offers a resource of that name (start its node with "
                               f"--resources '{{\"{p['machine']}\": 1}}')")
            opts["resources"] = {p["machine"]: MACHINE_SHARE}
        # (on a GPU, Ray shows the actor only the one it was given: device 0)
        out.append((providers, threads, opts, CPU_EP if absent else ep, 0 if on_gpu else None))
    return out


def _cpu_shares(specs, have: Mapping[str, float], cpu_threads: int | None) -> list[float]:
    """The CPUs each part's actors ask Ray for: a CPU part its intra-op threads (0: one),
    anything else one; scaled down together where they want more than the cluster has
    (a share above one rounded down to whole CPUs, as Ray asks)."""
    want = []
    for p in specs:
        threads = p.get("threads")
        if threads is None and p["execution_provider"] == CPU_EP:
            threads = cpu_threads
        want.append(max(1, int(threads or 1)) if shares_cpu(p["execution_provider"]) else 1)
    copies = [max(1, int(p.get("replicas") or 1)) for p in specs]
    total = sum(w * c for w, c in zip(want, copies))
    scale = min(1.0, float(have.get("CPU", 1.0)) / total) if total else 1.0
    out = []
    for w in want:
        x = w * scale
        out.append(float(int(x)) if x >= 1 else max(0.01, round(x, 2)))
    return out


def run_parts(parts_dir: str | Path, *, address: str | None = None, fallback_cpu: bool = False,
              optimize: bool = False, **options) -> dict[str, Any]:
    """``onnxsplit run --engine ray``: :func:`onnxsplit.running.compare.run_parts` on the actors,
    beside the threaded runner; where the actors ran, in ``placed``."""
    from .compare import run_parts as run_loaded

    with RayParts(parts_dir, address=address, fallback_cpu=fallback_cpu, optimize=optimize) as parts:
        result = run_loaded(parts_dir, loaded=parts, fallback_cpu=fallback_cpu, optimize=optimize, **options)
        result["placed"] = {p["name"]: where for p, where in
                            zip((p for p, copies in zip(parts.parts, parts.actors) for _ in copies), parts.placed)}
    return result


def _reason(e: BaseException) -> str:
    """The part's own error out of Ray's wrapping (one line)."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, RunError):
        return str(cause)
    text = " ".join(str(cause or e).split())
    for line in str(cause or e).splitlines()[::-1]:
        if "RunError:" in line:
            return line.split("RunError:", 1)[1].strip()
    return f"the Ray engine failed: {text[:300]}"

