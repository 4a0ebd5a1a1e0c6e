"""``onnxsplit serve PARTS`` on this machine alone (``--engine local``, the default without
``--address``): the same protocol, batcher, queue limits and generation as the Ray Serve
application (:class:`onnxsplit.running.serve.Gateway`), with the parts loaded in this
process and run by the runner's pipeline (each device's parts on their own threads, as
``onnxsplit run`` measures them), and the HTTP endpoint answered by uvicorn.

Why a second engine: through Ray Serve a request crosses the HTTP proxy, the gateway's
replica and a replica a part, each a process of its own, and every tensor goes through
the object store; on a small model that path is most of a request's time (see
``tools/bench_serve.py``).  Here a request is parsed and batched in the event loop and
its batch handed to the pipeline's threads; nothing is copied between processes.  Ray
Serve stays the engine for a cluster (``--address``) and for replicas on other nodes.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Iterator, Mapping

from .. import interrupt
from . import kv_cache
from .generate import generate
from .runner import Parts, Pipeline, RunError
from .serve import MAX_QUEUED, Gateway, gateway_limits, prepared

POLL_S = 0.05  # how often the pipeline's feeder looks whether it should stop
STOP_S = 0.8  # for uvicorn to close its connections at Ctrl-C (the command ends within 2 s)


class PartsService:
    """The loaded parts behind one long-lived pipeline: :meth:`submit` a request's (or a
    batch's) inputs from any thread and get a future of its outputs, answered as soon as
    they are out (not in the order submitted).  A part that fails fails the requests the
    pipeline held (each with the part's one-line error) and a new pipeline takes the next
    ones."""

    def __init__(self, parts: Parts):
        self.parts = parts
        self._inbox: queue.Queue = queue.Queue()  # (feeds, future), in the order submitted
        self._pending: set[Future] = set()  # submitted, not answered
        self._lock = threading.Lock()
        self._closed = False
        self._pipeline: Pipeline | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True, name="onnxsplit-serve")
        self._thread.start()

    def submit(self, feeds: Mapping[str, Any]) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RunError("the server is stopping")
            self._pending.add(future)
            self._inbox.put((feeds, future))
        return future

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._fail_waiting(RunError("the server is stopping"))
        if self._pipeline is not None:
            self._pipeline.stop.set()
        self._thread.join(timeout=2)

    def _samples(self, pipeline: Pipeline, taken: dict[int, Future]) -> Iterator[Mapping[str, Any]]:
        """The inbox's feeds, each future kept under the number the pipeline gives its sample."""
        n = 0
        while not (pipeline.stop.is_set() or self._closed):
            try:
                feeds, future = self._inbox.get(timeout=POLL_S)
            except queue.Empty:
                continue
            taken[n] = future
            n += 1
            yield feeds

    def _serve(self) -> None:
        while not self._closed:
            self._pipeline = pipeline = Pipeline(self.parts, self.parts.default_depth(), None)
            taken: dict[int, Future] = {}
            try:
                for s, outputs in pipeline.run(self._samples(pipeline, taken), ordered=False):
                    future = taken.pop(s)
                    with self._lock:
                        self._pending.discard(future)
                    if not future.done():
                        future.set_result(outputs)
            except BaseException as e:  # a part failed: what the pipeline held fails with it
                with self._lock:
                    self._fail_waiting(e if isinstance(e, RunError) else RunError(str(e)))

    def _fail_waiting(self, error: BaseException) -> None:
        """(under the lock) every request not answered, the inbox emptied with them."""
        while True:
            try:
                self._inbox.get_nowait()
            except queue.Empty:
                break
        for future in self._pending:
            if not future.done():
                future.set_exception(error)
        self._pending.clear()


class LocalGateway(Gateway):
    """The protocol's routes over a :class:`PartsService` in this process."""

    def __init__(self, name: str, manifest: dict, service: PartsService, **kwargs):
        super().__init__(name, manifest, [], [], **kwargs)
        self.service = service
        self.generating = 0  # generation loops running (each on a thread of its own)
        self._counting = threading.Lock()
        self.shared_why = None if self.decoder is None else kv_cache.shared_caches(service.parts, self.decoder.caches)

    async def _infer(self, feeds: dict) -> dict:
        outputs = await asyncio.wrap_future(self.service.submit(feeds))
        return {o["name"]: outputs[o["name"]] for o in self.outputs}

    async def _generation(self, prompt: list[int], max_tokens: int, eos: int | None, chunk: int | None,
                          seconds: float | None = None):
        """The whole loop on a thread of its own, the caches in place where the parts allow
        (:mod:`.kv_cache`, buffers of this generation's length: as ``onnxsplit generate``
        runs), else handed from step to step in this process; generations run side by side.
        (``seconds`` is not needed here: the loop ends at its next step once the request
        is given up.)"""
        parts, decoder = self.service.parts, self.decoder
        given_up = threading.Event()  # the request timed out (or its client left): the loop ends at its next step

        def loop():
            run = parts.run
            if self.shared_why is None:
                run = kv_cache.SharedCaches(parts, decoder.caches, decoder.specs,
                                            {c: decoder.seq_axis(c) for c in decoder.caches},
                                            len(prompt) + max_tokens).run

            def step(feeds):
                if given_up.is_set():
                    raise RunError("the generation's request was given up")
                return run(feeds)

            with self._counting:
                self.generating += 1
            try:
                return generate(step, decoder, prompt, max_tokens, eos, chunk=chunk)
            finally:
                with self._counting:
                    self.generating -= 1

        try:
            return await asyncio.to_thread(loop)
        except asyncio.CancelledError:
            given_up.set()
            raise


def app_of(gateway: Gateway):
    """An ASGI application answering every request with ``gateway`` (as Serve's ingress
    does): any method and any path, so that each answer is the protocol's JSON (Starlette's
    routes had answered a PUT 405 and a path holding a newline 404 in plain text)."""
    from starlette.requests import Request

    async def every(scope, receive, send):
        if scope["type"] != "http":  # (lifespan is off; a websocket is refused)
            return
        response = await gateway(Request(scope, receive))
        await response(scope, receive, send)

    return every


def _check_address(host: str, port: int) -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise RunError(f"cannot serve at {host}:{port}: {e.strerror or e}") from None


def serve_here(parts_dir: str | Path, *, port: int = 8000, host: str = "127.0.0.1", name: str | None = None,
               fallback_cpu: bool = False, quiet: bool = False, ready_file: str | Path | None = None,
               batching: bool = True, max_batch_size: int | None = None,
               max_queue_delay_microseconds: int | None = None, preferred_batch_size=(),
               pad_dimension: str | None = None, request_timeout_ms: int | None = None,
               max_ongoing: int | None = None, max_queued: int | None = None) -> int:
    """Serve until interrupted (Ctrl-C), as :func:`onnxsplit.running.serve.serve_parts`
    does on Ray Serve, with the parts in this process."""
    try:
        import uvicorn
    except ImportError:
        raise RunError("serving needs uvicorn and starlette: pip install 'onnxsplit[serve]' "
                       "(or serve on Ray Serve: --engine ray, with onnxsplit[ray])") from None
    manifest, batched, why, note = prepared(parts_dir, batching=batching, max_batch_size=max_batch_size,
                                            max_queue_delay_microseconds=max_queue_delay_microseconds,
                                            preferred_batch_size=preferred_batch_size,
                                            pad_dimension=pad_dimension, request_timeout_ms=request_timeout_ms)
    _check_address(host, port)  # (before the parts load: a large model takes a while)
    if note and not quiet:
        print(f"onnxsplit: note: {note}", file=sys.stderr, flush=True)
    parts = Parts(parts_dir, fallback_cpu=fallback_cpu, served=True)
    name = name or Path(manifest["model"]["path"]).stem
    in_flight, ongoing = gateway_limits(parts.parts, batched, max_ongoing)
    gateway = LocalGateway(name, manifest, service := PartsService(parts), batching=batched, why=why,
                           timeout_s=request_timeout_ms / 1000 if request_timeout_ms else None,
                           in_flight=in_flight, max_ongoing=ongoing,
                           max_queued=MAX_QUEUED if max_queued is None else max_queued)
    server = uvicorn.Server(uvicorn.Config(app_of(gateway), host=host, port=port, log_level="critical",
                                           lifespan="off", access_log=False))
    failed: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except BaseException as e:  # (a port in use ends uvicorn with SystemExit)
            failed.append(e)

    thread = threading.Thread(target=run, daemon=True, name="onnxsplit-http")
    thread.start()
    try:
        while not server.started:
            interrupt.check()
            if not thread.is_alive():
                raise RunError(f"cannot serve at {host}:{port}: the address is in use or not this machine's")
            time.sleep(0.05)
        url = f"http://{host}:{port}/v2/models/{name}"
        if not quiet:
            how = batched.describe() if batched is not None else f"not batched: {why}"
            print(f"serving '{name}' at {url} (Open Inference Protocol v2; {how}; parts in this process; "
                  "Ctrl-C stops it)", file=sys.stderr, flush=True)
        if ready_file:
            Path(ready_file).write_text(json.dumps({"url": url, "name": name}))
        while thread.is_alive():
            interrupt.check()
            time.sleep(0.1)
        raise RunError(f"serving failed: {' '.join(str(failed[0] if failed else 'the HTTP server ended').split())[:300]}")
    finally:
        server.should_exit = True
        thread.join(timeout=STOP_S)
        service.close()
