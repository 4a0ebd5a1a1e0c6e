"""``onnxsplit serve PARTS --engine ray``: the parts as a Ray Serve application behind an HTTP
endpoint that speaks the Open Inference Protocol (:mod:`onnxsplit.running.kserve`), so standard
clients such as ``tritonclient.http`` work unchanged.  The gateway (the protocol, the batcher,
the queue's limits) is the local engine's too (:mod:`onnxsplit.running.serve_local`: the parts
in the server's process).

One deployment per part (resources as :func:`onnxsplit.running.ray_engine.actor_plans` gives
them) and a gateway that answers the protocol's routes and composes the parts through
their handles.  The gateway works on ``max_ongoing`` requests and queues ``max_queued``;
beyond that it answers 503 at once, with the protocol's JSON error body (Serve's own
back-pressure answers in plain text, which tritonclient cannot read: its limits are set
above the gateway's, a backstop).  A bad request gets a 400 with one line, a failing part
a 500 naming it, a request past ``--request-timeout-ms`` (queued time included) a 504.  A request
takes the parts' shape, or any shape of their range (``model.shape_range``).

Where the range lets dimension 0 vary (the batch dimension), the gateway batches
concurrent requests (:mod:`onnxsplit.running.batching`: Triton's dynamic batcher options;
``--no-batching`` turns it off), so the parts run fewer, larger calls.
``GET /v2/models/NAME/stats`` reports what ran, as Triton's statistics extension does,
with the requests each execution carried.

Parts that make a decoder with past also answer generation requests, as Triton's generate
extension has them (``POST /v2/models/NAME/generate``: token ids in, the greedy
continuation's token ids out): a decoder in one part generates in its replica, whose
caches stay there (in place, one buffer each, where the part allows: :mod:`.kv_cache`);
across parts the gateway runs :mod:`onnxsplit.running.generate`'s loop, a forward pass of
the parts a token, each part keeping its caches between a generation's calls in its replica
(:class:`.kv_cache.KeptCaches`, in place where the part allows); where a part runs as
several copies (a call may reach any of them) the caches are handed back to the parts each
step, through Ray's object store.

Write-up: docs/machine.md (Running on Ray and serving).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .. import interrupt, ranges
from . import kv_cache
from .batching import Batcher, Options, Stats, Timeout, batch_dimension
from .batching import options as batch_options
from .generate import check_lengths, decoder_of, generate_async, serve_note
from .kserve import (HEADER_LENGTH, ProtocolError, decode_generate, decode_request, encode_generate, encode_response,
                     model_metadata, request_id)
from .ray_engine import PartActor, actor_plans, ray_module, ship_parts, start, stop
from .runner import RunError, read_manifest, session_spec

MAX_ONGOING = 16  # requests the gateway works on at once
MAX_QUEUED = 64  # requests waiting beyond those; more are answered 503
BODY_S = 60.0  # a request's body must have come within this (or its request timeout), else 408
# requests the gateway's replica takes beyond those it holds, only to answer them 503 (at
# once); Serve queues as many more at its proxy before it answers 503 itself, in plain text
REFUSING = 64
# Ray Serve kills its HTTP proxy when it is not ready within 5 s (healthy within 10 s),
# and serve.start then fails at once: on a busy machine the proxy takes longer to start
# (2 cores kept busy by other processes: killed by `ray.kill` in 3 of 3 starts).  A Ray
# this command starts gives it PROXY_WAIT_S, in the Serve controller's environment (which
# runs those checks), and serve.start waits as long (its own wait, 60 s, is a constant of
# Ray's: set here where Ray has it): with both cores kept busy by two other processes the
# proxy was ready only after 66 s of its controller starting and 65 s of its own, about
# 150 s in all.  A value the user set, or a cluster joined at an address, keeps its own
PROXY_WAIT_S = 300
PROXY_ENV = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": str(PROXY_WAIT_S),
             "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": str(PROXY_WAIT_S)}


class Gateway:
    """The protocol's routes; infer runs the parts in order through their handles."""

    def __init__(self, name: str, manifest: dict, deps: list[list[int]], final: list[int], *parts,
                 batching: Options | None = None, why: str = "", timeout_s: float | None = None,
                 in_flight: int = 1, max_ongoing: int = MAX_ONGOING, max_queued: int = MAX_QUEUED):
        """``batching``: the batcher's options (None: each request runs alone, ``why``);
        ``timeout_s``: a request's longest stay in the gateway; ``in_flight``: batches
        run at once; ``max_ongoing``, ``max_queued``: requests worked on at once, and
        waiting for their turn (more are answered 503)."""
        self.name, self.parts, self.deps, self.final = name, parts, deps, final
        self.inputs = manifest["model"]["inputs"]
        self.outputs = manifest["model"]["outputs"]
        self.shape_range = ranges.from_json(manifest["model"].get("shape_range"))
        self.decoder = decoder_of(manifest["model"])
        # across several parts, whether each keeps its caches between a generation's calls
        self.kept_why = "one part" if self.decoder is None or len(parts) < 2 else \
            kv_cache.kept_why(manifest.get("parts") or [], self.decoder.caches)
        self.has_rows = batch_dimension(manifest["model"])[0] is not None
        self.timeout_s = timeout_s
        self.stats = Stats()
        self.batcher = None if batching is None else Batcher(
            self._infer, batching, [t["name"] for t in self.inputs], max_in_flight=in_flight, stats=self.stats)
        self.why = why
        self.served = 0
        self.max_ongoing, self.max_queued = max_ongoing, max_queued
        self.held = 0  # inference requests working or waiting for their turn
        self._turns = None  # asyncio.Semaphore(max_ongoing), made in the replica's event loop

    def _batching(self) -> dict[str, Any]:
        """The batcher's settings for the stats route (or why there is none)."""
        if self.batcher is None:
            return {"enabled": False, "why_not": self.why}
        o = self.batcher.options
        info = {"enabled": self.batcher.off is None, "max_batch_size": o.max_batch_size,
                "max_queue_delay_microseconds": o.max_queue_delay_microseconds,
                "preferred_batch_size": list(o.preferred_batch_size), "max_in_flight": self.batcher.max_in_flight,
                "pad_dimension": o.pad.name if o.pad else None,
                "pad_allowance": o.pad.allowance if o.pad else None}
        if self.batcher.off:
            info["why_not"] = self.batcher.off
        return info

    def _late(self) -> Timeout:
        return Timeout(f"no answer within the request timeout of {self.timeout_s * 1000:g} ms")

    async def _answer(self, feeds: dict, left: float | None) -> dict:
        """The request's outputs: through the batcher, or alone; :class:`Timeout` where
        none came within ``left`` seconds."""
        import asyncio

        if self.batcher is not None:
            return await self.batcher.submit(feeds, left)

        async def alone():
            begin = time.perf_counter_ns()
            out = await self._infer(feeds)
            rows = next(iter(feeds.values())).shape[0] if self.has_rows else 1
            self.stats.execution(int(rows), 1, time.perf_counter_ns() - begin)
            return out

        try:
            return await asyncio.wait_for(alone(), left)
        except asyncio.TimeoutError:
            raise self._late() from None

    async def __call__(self, request):
        from starlette.responses import JSONResponse

        path = request.url.path.rstrip("/")
        model = f"/v2/models/{self.name}"
        try:
            if request.method in ("GET", "HEAD"):  # (HEAD: the same answer, its body left out)
                if path in ("/v2/health/ready", "/v2/health/live", f"{model}/ready"):
                    return JSONResponse({})
                if path == "/v2":
                    return JSONResponse({"name": "onnxsplit", "version": "1", "extensions": [
                        "binary_tensor_data", "statistics", *(["generate"] if self.decoder else [])]})
                if path in (model, f"{model}/versions/1"):
                    return JSONResponse(model_metadata(self.name, self.inputs, self.outputs, self.shape_range))
                if path in ("/v2/models/stats", f"{model}/stats", f"{model}/versions/1/stats"):
                    return JSONResponse(self.stats.triton(self.name, self._batching()))
            elif request.method == "POST" and path in (f"{model}/infer", f"{model}/versions/1/infer",
                                                       f"{model}/generate", f"{model}/versions/1/generate"):
                if path.endswith("/generate") and self.decoder is None:
                    raise ProtocolError(f"'{self.name}' is not a decoder with past (inputs input_ids and "
                                        "past_key_values.N.key/value, outputs logits and present.N.key/value): "
                                        "it answers /infer, not /generate")
                # the body read before the request is held: a client slow to send it (or one that
                # never does) had held a turn as long, and 16 such connections had stalled the server
                import asyncio

                within = self.timeout_s or BODY_S
                try:
                    await asyncio.wait_for(request.body(), within)  # (kept by the request for its handler)
                except asyncio.TimeoutError:
                    return JSONResponse({"error": f"the request's body did not come within {within:g} s"}, 408)
                if self.held >= self.max_ongoing + self.max_queued:
                    return JSONResponse({"error": f"the server is full ({self.max_ongoing} requests in "
                                                  f"progress, {self.max_queued} waiting): try again later"},
                                        503, headers={"Retry-After": "1"})
                self.held += 1
                try:
                    how = self._generate if path.endswith("/generate") else self._infer_one
                    return await self._in_turn(request, how)
                finally:
                    self.held -= 1
            if path.startswith("/v2/models/") and not path.startswith(model + "/") and path != model:
                return JSONResponse({"error": f"unknown model (this server serves '{self.name}')"}, 404)
            return JSONResponse({"error": f"no route {request.method} {' '.join(path.split())[:200]}"}, 404)
        except ProtocolError as e:
            return JSONResponse({"error": str(e)}, 400)
        except Timeout as e:
            return JSONResponse({"error": str(e)}, 504)
        except Exception as e:  # a part failed: its own error, one line
            return JSONResponse({"error": _one_line(e)}, 500)

    async def _in_turn(self, request, how):
        """A request held by the gateway: its turn (at most ``timeout_s`` of waiting), then
        ``how(request, left)``'s answer (within what is left of ``timeout_s``)."""
        import asyncio

        if self._turns is None:
            self._turns = asyncio.Semaphore(self.max_ongoing)
        begin = time.perf_counter_ns()
        try:
            await asyncio.wait_for(self._turns.acquire(), self.timeout_s)
        except asyncio.TimeoutError:
            raise self._late() from None
        ok = False
        try:
            answer = await how(request, lambda: None if self.timeout_s is None else
                               max(0.0, self.timeout_s - (time.perf_counter_ns() - begin) / 1e9))
            ok = True
        finally:
            self._turns.release()
            self.stats.request(ok, time.perf_counter_ns() - begin)
        self.served += 1
        return answer

    async def _infer_one(self, request, left):
        """One forward pass of the request's inputs (batched with others where it can be)."""
        from starlette.responses import Response

        body = await request.body()
        length = request.headers.get(HEADER_LENGTH)
        feeds, answer = decode_request(body, length, self.inputs, self.shape_range)
        if self.decoder is not None:
            try:
                self.decoder.check_call({k: v.shape for k, v in feeds.items()})
            except RunError as e:
                raise ProtocolError(str(e)) from None
        try:
            outputs = await self._answer(feeds, left())
        except Timeout:
            raise self._late() from None
        data, headers = encode_response(self.name, outputs, answer, request_id(body, length))
        return Response(data, headers=headers)

    async def _generate(self, request, left):
        """Greedy generation from the request's token ids: the prefill, then a forward pass
        of every part a token, the caches handed back to the parts each step (not batched)."""
        import asyncio

        from starlette.responses import Response

        asked = decode_generate(await request.body())
        try:
            self.decoder.check_prompt(asked["prompt"])
            chunk = check_lengths(self.decoder, self.shape_range, len(asked["prompt"]), asked["max_tokens"])
        except RunError as e:
            raise ProtocolError(str(e)) from None
        try:
            seconds = left()
            made = await asyncio.wait_for(self._generation(asked["prompt"], asked["max_tokens"], asked["eos"], chunk,
                                                           seconds), seconds)
        except asyncio.TimeoutError:
            raise self._late() from None
        self.stats.execution(1, 1, int(1e9 * (made.prefill_s + sum(made.step_s))))
        return Response(encode_generate(self.name, made, asked["id"]), headers={"Content-Type": "application/json"})

    async def _generation(self, prompt: list[int], max_tokens: int, eos: int | None, chunk: int | None,
                          seconds: float | None = None):
        """The greedy loop: in the part's own replica where the decoder is one part (its
        caches stay there); in the first part's replica where each part keeps its caches
        between calls (``PartActor.drive``); else here, a forward pass of the parts a
        token, the caches handed back to the parts each step (:meth:`_infer`).  ``seconds``:
        the request's time left, after which a replica's loop stops too."""
        if len(self.parts) == 1 and hasattr(self.parts[0], "generate"):
            return await self.parts[0].generate.remote(self.decoder, prompt, max_tokens, eos, chunk, seconds)
        if self.kept_why is None:  # driven from the first part's replica (PartActor.drive)
            import uuid

            return await self.parts[0].drive.remote(uuid.uuid4().hex, list(self.parts), 0, self.deps, self.final,
                                                    [o["name"] for o in self.outputs], self.decoder, prompt,
                                                    max_tokens, eos, chunk, seconds)
        return await generate_async(self._infer, self.decoder, prompt, max_tokens, eos, chunk)

    async def _infer(self, feeds: dict) -> dict:
        merged = await self._composed(lambda part, deps: part.run.remote(0, feeds, *deps))
        return {o["name"]: merged[o["name"]] for o in self.outputs}

    async def _composed(self, call) -> dict:
        """The parts called in order, ``call(handle, its producers' responses)`` each (Ray
        hands a response on without waiting for it here); the final parts' outputs merged."""
        responses: list[Any] = []
        for i, part in enumerate(self.parts):
            responses.append(call(part, [responses[d] for d in self.deps[i]]))
        merged: dict = {}
        for i in self.final:
            merged.update(await responses[i])
        return merged


def _one_line(e: BaseException) -> str:
    text = str(getattr(e, "cause", None) or e)
    for line in text.splitlines()[::-1]:
        if "RunError:" in line:
            return line.split("RunError:", 1)[1].strip()
    return " ".join(text.split())[:300]


def application(parts_dir: str | Path, name: str | None = None, *, fallback_cpu: bool = False,
                max_ongoing: int | None = None, max_queued: int = MAX_QUEUED, ship: bool = False,
                batching: bool = True, max_batch_size: int | None = None,
                max_queue_delay_microseconds: int | None = None, preferred_batch_size=(),
                pad_dimension: str | None = None, request_timeout_ms: int | None = None):
    """The Serve application of a parts folder (Ray must be running: it reads the
    cluster's resources to size each part's deployment).  ``ship``: the part files go
    to the replicas through the object store (a cluster whose nodes do not see them).
    ``batching`` and the batcher's options: :func:`onnxsplit.running.batching.options`;
    with batching the gateway holds enough requests to fill every batch in flight and
    the next one."""
    from ray import serve

    ray = ray_module()
    folder = Path(parts_dir).resolve()
    manifest, batched, why, _ = prepared(folder, batching=batching, max_batch_size=max_batch_size,
                                         max_queue_delay_microseconds=max_queue_delay_microseconds,
                                         preferred_batch_size=preferred_batch_size, pad_dimension=pad_dimension,
                                         request_timeout_ms=request_timeout_ms)
    specs = [session_spec(folder, manifest)] if manifest.get("run_as") == "session" else list(manifest["parts"])
    name = name or Path(manifest["model"]["path"]).stem
    outs = [[o["name"] for o in p["outputs"]] for p in specs]
    producer = {o: i for i, names in enumerate(outs) for o in names}
    deps = [sorted({producer[t["name"]] for t in p["inputs"] if t["name"] in producer}) for p in specs]
    final = sorted({producer[o["name"]] for o in manifest["model"]["outputs"] if o["name"] in producer})
    shipped = ship_parts(folder, specs) if ship else {}
    bound = []
    in_flight, max_ongoing = gateway_limits(specs, batched, max_ongoing)
    decoder = decoder_of(manifest["model"])
    # the first part drives each generation whose parts keep their caches (PartActor.drive),
    # one request as long as the generation: the gateway's own limit bounds them
    drives = decoder is not None and len(specs) > 1 and kv_cache.kept_why(specs, decoder.caches) is None
    for i, (p, (providers, threads, opts, _, device_id)) in enumerate(zip(
            specs, actor_plans(specs, ray.cluster_resources(), 1, fallback_cpu))):
        level = p.get("optimization")
        part = serve.deployment(PartActor, name=p["name"], num_replicas=max(1, int(p.get("replicas") or 1)),
                                ray_actor_options=opts,
                                max_ongoing_requests=2 + (max_ongoing if drives and i == 0 else 0))
        bound.append(part.bind(p, str(folder), shipped.get(p["file"]), providers, threads, level == "all",
                               device_id, True, alone=len(specs) == 1))
    # the gateway itself holds what it takes and answers 503 beyond (Serve's own limits are
    # a backstop above its own: Serve's 503 is plain text)
    gateway = serve.deployment(Gateway, name="gateway", max_ongoing_requests=max_ongoing + max_queued + REFUSING,
                               max_queued_requests=REFUSING, ray_actor_options={"num_cpus": 0})
    timeout_s = request_timeout_ms / 1000 if request_timeout_ms else None
    return gateway.bind(name, manifest, deps, final, *bound, batching=batched, why=why, timeout_s=timeout_s,
                        in_flight=in_flight, max_ongoing=max_ongoing, max_queued=max_queued), name


def gateway_limits(specs, batched: Options | None, max_ongoing: int | None) -> tuple[int, int]:
    """(batches run at once, requests worked on at once): one batch per part copy keeps
    every part busy and one more hides the hand-over between them; with batching the
    gateway holds enough requests to fill them and the next one."""
    in_flight = sum(max(1, int(p.get("replicas") or 1)) for p in specs) + 1
    ongoing = MAX_ONGOING if max_ongoing is None else max_ongoing
    if batched is not None:
        ongoing = max(ongoing, (in_flight + 1) * batched.max_batch_size)
    return in_flight, ongoing


def prepared(parts_dir, *, batching: bool, max_batch_size: int | None, max_queue_delay_microseconds: int | None,
             preferred_batch_size, pad_dimension: str | None, request_timeout_ms: int | None):
    """What either engine checks before it starts anything: (the manifest, the batcher's
    options or None, why not, a note on the model for the user or None); a bad folder, a
    batching it cannot do or a bad timeout raise :class:`RunError`."""
    manifest = read_manifest(parts_dir)
    batched, why = batch_options(manifest["model"], enabled=batching, max_batch_size=max_batch_size,
                                 max_queue_delay_microseconds=max_queue_delay_microseconds,
                                 preferred_batch_size=tuple(preferred_batch_size or ()), pad_dimension=pad_dimension,
                                 per_shape=(manifest.get("predicted") or {}).get("per_shape"))
    if request_timeout_ms is not None and request_timeout_ms <= 0:
        raise RunError(f"--request-timeout-ms must be at least 1, got {request_timeout_ms}")
    return manifest, batched, why, serve_note(manifest["model"])


def serve_parts(parts_dir: str | Path, *, port: int = 8000, host: str = "127.0.0.1", name: str | None = None,
                address: str | None = None, fallback_cpu: bool = False, quiet: bool = False,
                ready_file: str | Path | None = None, batching: bool = True, max_batch_size: int | None = None,
                max_queue_delay_microseconds: int | None = None, preferred_batch_size=(),
                pad_dimension: str | None = None, request_timeout_ms: int | None = None,
                max_ongoing: int | None = None,
                max_queued: int | None = None) -> int:
    """Serve until interrupted (Ctrl-C); a Ray this started is shut down at the end.
    ``ready_file``: written (with the URL) once the endpoint answers.  ``batching`` and
    the batcher's options: :func:`onnxsplit.running.batching.options` (checked before Ray
    starts); ``request_timeout_ms``: a request's longest stay (None: no limit)."""
    import sys

    from ray import serve

    import logging

    batch = {"batching": batching, "max_batch_size": max_batch_size,
             "max_queue_delay_microseconds": max_queue_delay_microseconds,
             "preferred_batch_size": tuple(preferred_batch_size or ()), "pad_dimension": pad_dimension}
    # a bad folder, or batching it cannot do, is said before Ray starts
    _, batched, why, note = prepared(parts_dir, request_timeout_ms=request_timeout_ms, **batch)
    if note and not quiet:
        print(f"onnxsplit: note: {note}", file=sys.stderr, flush=True)
    proxy_env = {k: v for k, v in PROXY_ENV.items() if k not in os.environ} if address is None else {}
    started = start(address)
    logging.getLogger("ray.serve").setLevel(logging.ERROR)  # its progress notes are not the user's
    if address is None:
        from ray.serve._private import api as serve_api

        if isinstance(getattr(serve_api, "HTTP_PROXY_TIMEOUT", None), (int, float)):
            serve_api.HTTP_PROXY_TIMEOUT = max(serve_api.HTTP_PROXY_TIMEOUT, PROXY_WAIT_S)
    try:
        serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": "ERROR"},
                    controller_options={"runtime_env": {"env_vars": proxy_env}} if proxy_env else None)
        app, name = application(parts_dir, name, fallback_cpu=fallback_cpu, ship=address is not None,
                                request_timeout_ms=request_timeout_ms, max_ongoing=max_ongoing,
                                max_queued=MAX_QUEUED if max_queued is None else max_queued, **batch)
        serve.run(app, name=name, route_prefix="/", blocking=False)
        url = f"http://{host}:{port}/v2/models/{name}"
        if not quiet:
            how = batched.describe() if batched is not None else f"not batched: {why}"
            print(f"serving '{name}' at {url} (Open Inference Protocol v2; {how}; Ctrl-C stops it)",
                  file=sys.stderr, flush=True)
        if ready_file:
            Path(ready_file).write_text(json.dumps({"url": url, "name": name}))
        while True:
            interrupt.check()
            time.sleep(0.2)
    except RunError:
        raise
    except interrupt.Interrupted:
        raise
    except Exception as e:
        raise RunError(f"serving failed: {' '.join(str(e).split())[:300]}") from None
    finally:
        try:
            serve.shutdown()
        except Exception:
            pass
        stop(started)
