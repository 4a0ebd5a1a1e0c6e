"""Dynamic batching for ``onnxsplit serve``: requests that arrive close together run
through the parts once, concatenated along the batch dimension, and each gets its own
rows back.

Why: every call through the parts pays a fixed cost whatever its size (the gateway's
handle calls, Ray's object store, onnxruntime's launch of each operator), so many small
concurrent requests leave the parts busy with overhead; one call on eight rows costs
little more than one on one row.

The options carry the names of Triton's dynamic batcher, whose users know them:
``max_batch_size`` (rows in one call; default the upper end of the batch dimension's
range, which it may not exceed), ``max_queue_delay_microseconds`` (how long the oldest
waiting request may wait for others) and ``preferred_batch_size`` (sizes sent as soon as
they are reached).  The batch dimension is dim 0 of every input: it must vary in the
parts' range (``model.shape_range``), have one range and, where the manifest names the
model's dimensions, one name across the inputs; every output must have it first.  A
model that breaks this is served unbatched (:func:`batch_dimension` says why).

A request joins the queue of the requests whose inputs agree with it on every other
dimension, in arrival order -- or, where the user allows padding of a named dimension
(``pad_dimension``, e.g. ``sequence``; :func:`padding`), on every other dimension but that
one: a batch's requests are then padded with zeros to its longest along that dimension (an
attention mask over it, padded with zeros too, keeps the model from reading the padding;
a request with a row masked whole, which attends to whatever is there, is batched only
with requests of its own length), and each request's outputs along it are cut back to
its own length; a queue's oldest requests are sent together (as many as
fit under ``max_batch_size`` rows, each request's own dim-0 size counted) when they fill
a batch or a preferred size, or when the oldest has waited the delay.  At most
``max_in_flight`` batches run at once (enough to keep every part busy); requests go on
queuing meanwhile, which is where batches grow under load.  Each request's outputs are
its rows of the batch's outputs (checked: every output's dim 0 is the batch's rows; where
one is not, those requests run again one by one and batching stops).  A failing batch
fails each of its requests with the part's error.  A request that waits past its timeout
(:class:`Timeout`) leaves the queue, or gives up its rows of a batch already running.

Write-up: docs/machine.md (Running on Ray and serving).
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Mapping

import numpy as np

from .. import ranges
from ..errors import OnnxsplitError
from .kserve import ProtocolError

# Triton's default: a batch goes as soon as a slot for it is free (batches still grow while
# the slots are busy).  A millisecond's wait had cost every request that millisecond:
# models/small_bert served whole, one client, p50 2.75 ms against 1.08 ms at 0, and at 16
# clients 1098 against 1124 requests/s (tools/bench_serve.py --max-queue-delay-microseconds)
DEFAULT_DELAY_US = 0


class Timeout(Exception):
    """A request got no answer within its timeout (a 504 answer)."""


@dataclass(frozen=True)
class Padding:
    """A dimension requests may be padded along (:func:`padding`): its name, its axis in
    each input and output that has it, and the inputs among those that mask it."""

    name: str
    inputs: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[str, int], ...]
    masks: tuple[str, ...]
    # the padding (rows x positions along it) a request may add to a batch: what one call
    # less is worth (:func:`pad_allowance`); None: any
    allowance: float | None = None


@dataclass(frozen=True)
class Options:
    """Triton's dynamic batcher options (see the module docstring), and the dimension
    requests may be padded along (None: none)."""

    max_batch_size: int
    max_queue_delay_microseconds: int = DEFAULT_DELAY_US
    preferred_batch_size: tuple[int, ...] = ()
    pad: Padding | None = None

    def describe(self) -> str:
        preferred = f", preferred {'/'.join(map(str, self.preferred_batch_size))}" \
            if self.preferred_batch_size else ""
        pad = f", padding '{self.pad.name}' to a batch's longest" if self.pad else ""
        if self.pad and self.pad.allowance is not None:
            pad += f" where that costs less than a call (at most {self.pad.allowance:.0f} padded rows x positions a request)"
        return (f"batching up to {self.max_batch_size} rows, waiting at most "
                f"{self.max_queue_delay_microseconds} us{preferred}{pad}")


def padding(model: Mapping[str, Any], name: str) -> Padding:
    """The dimension ``name`` of a manifest's ``model`` as requests may be padded along it
    (``--pad-dimension``); a one-line :class:`OnnxsplitError` where it cannot be: the
    manifest must name it (each input's and output's ``dims``), not as dimension 0, at
    most once a tensor, varying in the range, and an input named as an attention mask
    (``*mask*``) must have it, so that the padding is masked."""
    r = ranges.from_json(model.get("shape_range")) or {}
    inputs, outputs = [], []
    for kind, tensors, into in (("input", model["inputs"], inputs), ("output", model["outputs"], outputs)):
        for t in tensors:
            dims = list(t.get("dims") or [])
            at = [k for k, d in enumerate(dims) if d == name]
            if len(at) > 1:
                raise OnnxsplitError(f"--pad-dimension {name}: {kind} '{t['name']}' has it {len(at)} times")
            if at and at[0] == 0:
                raise OnnxsplitError(f"--pad-dimension {name}: it is the batch dimension of {kind} '{t['name']}'")
            if at:
                into.append((t["name"], at[0]))
    if not inputs:
        known = sorted({d for t in model["inputs"] for d in (t.get("dims") or [])[1:] if d})
        raise OnnxsplitError(f"--pad-dimension {name}: no input has a dimension of that name "
                             f"(the inputs name: {', '.join(known) or 'none'})")
    if not any(lo != hi for t, axis in inputs for lo, hi in [tuple(r.get(t, [])[axis])] if r.get(t)):
        raise OnnxsplitError(f"--pad-dimension {name}: it does not vary in the parts' range")
    masks = tuple(t for t, _ in inputs if "mask" in t.lower())
    if not masks:
        raise OnnxsplitError(f"--pad-dimension {name}: no attention mask over it among the inputs "
                             f"({', '.join(t for t, _ in inputs)}): the model would read the padding")
    return Padding(name, tuple(inputs), tuple(outputs), masks)


def pad_allowance(per_shape: Any, pad: Padding) -> float | None:
    """How much padding (rows x positions along the padded dimension) one call less is
    worth: a call's fixed cost over its cost a position, fitted (least squares, a line in
    rows x positions) on the plan's predicted latency at the range's shapes (the manifest's
    ``predicted.per_shape``); None where fewer than two sizes were predicted (any padding).
    Why: padding is work; the held-out T5-small encoder (a call's fixed cost about 3
    positions' worth) served requests of 32 to 128 tokens slower padded than unbatched,
    where models/small_bert (about 31) gained by it."""
    name, axis = pad.inputs[0]
    points = []
    for p in per_shape if isinstance(per_shape, list) else []:
        shapes = p.get("shapes") if isinstance(p, dict) else None
        shape = shapes.get(name) if isinstance(shapes, dict) else None
        ms = p.get("latency_ms") if shape is not None else None
        if isinstance(shape, list) and len(shape) > axis and isinstance(ms, (int, float)) and np.isfinite(ms):
            points.append((float(shape[0]) * float(shape[axis]), float(ms)))
    if len({x for x, _ in points}) < 2:
        return None
    slope, fixed = np.polyfit([x for x, _ in points], [y for _, y in points], 1)
    if not slope > 0:
        return None
    return max(0.0, float(fixed / slope))


def batch_dimension(model: Mapping[str, Any]) -> tuple[tuple[int, int] | None, str]:
    """The range (lo, hi) of the batch dimension of a manifest's ``model``, or (None, why
    the parts cannot be batched)."""
    try:
        r = ranges.from_json(model.get("shape_range"))
    except ValueError as e:
        return None, f"model.shape_range {e}"
    if not r:
        return None, "the parts take one shape (export them for a range with dimension 0 varying)"
    spans, names = set(), set()
    for t in model["inputs"]:
        dims = r.get(t["name"])
        if not dims:
            return None, f"input '{t['name']}' has no batch dimension in the range"
        spans.add(tuple(dims[0]))
        first = (t.get("dims") or [None])[0]
        if first:
            names.add(first)
    if len(spans) > 1:
        return None, f"the inputs' dimension 0 ranges differ ({', '.join(ranges.text([s]) for s in sorted(spans))})"
    lo, hi = spans.pop()
    if lo == hi or hi <= 1:
        return None, f"dimension 0 does not vary in the range (it is {ranges.text([(lo, hi)])})"
    if len(names) > 1:
        return None, f"the inputs name their dimension 0 differently ({', '.join(sorted(names))})"
    name = names.pop() if names else None
    planned = model["inputs"][0]["shape"][0]
    for o in model["outputs"]:
        dims = o.get("dims")
        if not o["shape"]:
            return None, f"output '{o['name']}' is a scalar"
        if name and dims is not None:
            if dims[0] != name:
                return None, (f"output '{o['name']}' does not have the batch dimension '{name}' first "
                              f"(its dimension 0 is {dims[0] or o['shape'][0]})")
        elif o["shape"][0] != planned:
            return None, f"output '{o['name']}' does not have the batch dimension first"
    return (lo, hi), ""


def options(model: Mapping[str, Any], *, enabled: bool = True, max_batch_size: int | None = None,
            max_queue_delay_microseconds: int | None = None,
            preferred_batch_size=(), pad_dimension: str | None = None,
            per_shape: Any = None) -> tuple[Options | None, str]:
    """(the batcher's options for a manifest's ``model``, "") or (None, why it is off); a
    one-line :class:`OnnxsplitError` for values that do not fit it.  ``per_shape``: the
    manifest's predictions at the range's shapes (what padding is worth: :func:`pad_allowance`)."""
    given = [flag for flag, v in (("--max-batch-size", max_batch_size),
                                  ("--max-queue-delay-microseconds", max_queue_delay_microseconds),
                                  ("--preferred-batch-size", list(preferred_batch_size) or None),
                                  ("--pad-dimension", pad_dimension))
             if v is not None]
    if not enabled:
        if given:
            raise OnnxsplitError(f"{given[0]} sets up batching, which --no-batching turns off")
        return None, "--no-batching"
    span, why = batch_dimension(model)
    if span is None:
        if given:
            raise OnnxsplitError(f"{given[0]}: these parts cannot be batched: {why}")
        return None, why
    lo, hi = span
    size = hi if max_batch_size is None else int(max_batch_size)
    if not 1 <= size <= hi:
        raise OnnxsplitError(f"--max-batch-size {size} is outside the batch dimension's range "
                             f"{ranges.text([span])} (the parts take at most {hi} rows)")
    delay = DEFAULT_DELAY_US if max_queue_delay_microseconds is None else int(max_queue_delay_microseconds)
    if delay < 0:
        raise OnnxsplitError(f"--max-queue-delay-microseconds must be at least 0, got {delay}")
    preferred = tuple(sorted({int(p) for p in preferred_batch_size}))
    bad = [p for p in preferred if not 1 <= p <= size]
    if bad:
        raise OnnxsplitError(f"--preferred-batch-size {bad[0]} is not between 1 and the largest batch, {size}")
    pad = padding(model, pad_dimension) if pad_dimension is not None else None
    if pad is not None:
        pad = replace(pad, allowance=pad_allowance(per_shape, pad))
    if size == 1:
        return None, "--max-batch-size 1"
    return Options(size, delay, preferred, pad), ""


class Stats:
    """What the server did, in the shape of Triton's statistics extension
    (``GET /v2/models/NAME/stats``), so its tools read it; ``batching`` adds how many
    requests each execution carried, the one figure that shows batches being formed."""

    def __init__(self):
        self.success = [0, 0]  # [count, ns] of requests answered
        self.fail = [0, 0]
        self.queue = [0, 0]  # time requests waited for their batch
        self.infer = [0, 0]  # per request, its execution's time
        self.batches: dict[int, list[int]] = {}  # rows -> [executions, ns]
        self.requests: dict[int, int] = {}  # requests in one execution -> executions
        self.last_ms = 0

    def request(self, ok: bool, ns: int) -> None:
        slot = self.success if ok else self.fail
        slot[0] += 1
        slot[1] += ns
        self.last_ms = int(time.time() * 1000)

    def queued(self, ns: int) -> None:
        self.queue[0] += 1
        self.queue[1] += ns

    def execution(self, rows: int, requests: int, ns: int) -> None:
        slot = self.batches.setdefault(rows, [0, 0])
        slot[0] += 1
        slot[1] += ns
        self.requests[requests] = self.requests.get(requests, 0) + 1
        self.infer[0] += requests
        self.infer[1] += ns * requests

    def triton(self, name: str, batching: Mapping[str, Any]) -> dict[str, Any]:
        def pair(slot):
            return {"count": slot[0], "ns": slot[1]}

        zero = pair([0, 0])
        return {"model_stats": [{
            "name": name, "version": "1", "last_inference": self.last_ms,
            "inference_count": sum(rows * n for rows, (n, _) in self.batches.items()),
            "execution_count": sum(n for n, _ in self.batches.values()),
            "inference_stats": {"success": pair(self.success), "fail": pair(self.fail), "queue": pair(self.queue),
                                "compute_input": zero, "compute_infer": pair(self.infer),
                                "compute_output": zero, "cache_hit": zero, "cache_miss": zero},
            "batch_stats": [{"batch_size": rows, "compute_input": zero, "compute_infer": pair(slot),
                             "compute_output": zero} for rows, slot in sorted(self.batches.items())],
            "batching": {**batching, "requests_per_execution": [
                {"requests": k, "count": n} for k, n in sorted(self.requests.items())]},
        }]}


@dataclass(eq=False)
class _Waiting:
    feeds: dict[str, np.ndarray]
    rows: int
    since: float  # the loop's clock when it arrived
    future: asyncio.Future


Run = Callable[[dict[str, np.ndarray]], Awaitable[Mapping[str, np.ndarray]]]


class Batcher:
    """The queues and the dispatch (see the module docstring).  ``run``: the parts on
    feeds, awaitable, giving the outputs by name; used from one event loop."""

    def __init__(self, run: Run, options: Options, inputs: list[str], *, max_in_flight: int = 1,
                 stats: Stats | None = None):
        self.run, self.options, self.inputs = run, options, list(inputs)
        self.max_in_flight = max(1, int(max_in_flight))
        self.stats = stats if stats is not None else Stats()
        self.off: str | None = None  # why batching stopped (an output without the batch first)
        self._queues: dict[tuple, collections.deque[_Waiting]] = {}
        self._in_flight = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        pad = options.pad  # (each padded input's and output's axis, by name)
        self._pad_in, self._pad_out = (dict(pad.inputs), dict(pad.outputs)) if pad else ({}, {})

    def key(self, feeds: Mapping[str, np.ndarray]) -> tuple[int, tuple]:
        """(rows, the shape every other dimension has): a request whose inputs disagree on
        dim 0 is refused here, before it can spoil a batch."""
        rows = None
        for name in self.inputs:
            a = feeds[name]
            if a.ndim == 0:
                raise ProtocolError(f"input '{name}' is a scalar: it has no batch dimension")
            if rows is None:
                rows, first = a.shape[0], name
            elif a.shape[0] != rows:
                raise ProtocolError(f"input '{name}' has {a.shape[0]} rows (dimension 0) but input "
                                    f"'{first}' has {rows}: the batch dimension must agree")
        padded = {n: axis for n, axis in self._pad_in.items() if n in feeds and feeds[n].ndim > axis}
        lengths = {feeds[n].shape[axis] for n, axis in padded.items()}
        if len(lengths) > 1:
            raise ProtocolError(f"the inputs disagree on the length of dimension '{self.options.pad.name}' "
                                f"({', '.join(map(str, sorted(lengths)))})")
        if padded and any(np.any(np.sum(feeds[n], axis=padded[n]) == 0) for n in self.options.pad.masks
                          if n in padded):
            padded = {}  # (a row masked whole attends to whatever is there: padding would move it)
        return int(rows or 0), tuple((name, feeds[name].dtype.str, tuple(
            None if k == padded.get(name) else n for k, n in enumerate(feeds[name].shape) if k > 0))
            for name in self.inputs)

    async def submit(self, feeds: Mapping[str, np.ndarray], timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """The request's outputs, run in a batch with others; :class:`Timeout` where none
        came within ``timeout_s``; the part's error where its batch failed."""
        rows, key = self.key(feeds)
        loop = asyncio.get_running_loop()
        if self.off or rows > self.options.max_batch_size:  # (a request larger than a batch runs alone)
            try:
                return await asyncio.wait_for(self._timed(dict(feeds), rows, 1), timeout_s)
            except asyncio.TimeoutError:
                raise Timeout(f"no answer within the request timeout of {timeout_s * 1000:g} ms") from None
        item = _Waiting(dict(feeds), rows, loop.time(), loop.create_future())
        self._queues.setdefault(key, collections.deque()).append(item)
        self._schedule()
        try:
            return await asyncio.wait_for(asyncio.shield(item.future), timeout_s)
        except asyncio.TimeoutError:
            raise Timeout(f"no answer within the request timeout of {timeout_s * 1000:g} ms") from None
        finally:
            if not item.future.done():  # timed out or cancelled (the client went): withdrawn
                item.future.cancel()
                queue = self._queues.get(key)
                if queue is not None and item in queue:
                    queue.remove(item)
                    if not queue:
                        del self._queues[key]

    async def _timed(self, feeds, rows: int, requests: int) -> dict[str, np.ndarray]:
        """The parts on ``feeds``, counted as one execution of ``rows`` rows."""
        begin = time.perf_counter_ns()
        out = dict(await self.run(feeds))
        self.stats.execution(rows, requests, time.perf_counter_ns() - begin)
        return out

    def _cut(self, queue) -> tuple[list[int], bool, list[int]]:
        """(the requests of one batch, oldest first, by their places in the queue; whether
        they fill it; those of them making the largest preferred size met on the way ([]:
        none)).  The oldest is always in; under a padded dimension with an allowance
        (:func:`pad_allowance`) a later one joins only where the padding it adds (to itself,
        or to those in already where it is longer) is worth less than the call it saves, and
        one that is not waits for a batch nearer its length."""
        allow = self.options.pad.allowance if self.options.pad else None
        total = longest = 0
        taken: list[int] = []
        pref: list[int] = []
        for k, item in enumerate(queue):
            if total + item.rows > self.options.max_batch_size:
                return taken, True, pref
            length = self._length(item) if allow is not None else 0
            if taken and allow is not None and \
                    (total + item.rows) * max(longest, length) - total * longest - item.rows * length > allow:
                continue
            taken.append(k)
            total += item.rows
            longest = max(longest, length)
            if total in self.options.preferred_batch_size:
                pref = list(taken)
        return taken, total == self.options.max_batch_size, pref

    def _ready(self, now: float) -> tuple[tuple, list[int]] | None:
        """The queue to send from now and which of its requests (places in it, oldest
        first); None while every queue may still wait."""
        delay = self.options.max_queue_delay_microseconds / 1e6 - 1e-6  # (a timer may fire that early)
        top = max(self.options.preferred_batch_size, default=None)
        best = None
        for key, queue in self._queues.items():
            taken, full, pref = self._cut(queue)
            if pref and sum(queue[k].rows for k in pref) == top:
                take = pref
            elif full or now - queue[0].since >= delay:
                take = pref or taken
            else:
                continue
            if best is None or queue[0].since < self._queues[best[0]][0].since:
                best = (key, take)
        return best

    def _schedule(self) -> None:
        """Send what is ready while batches may start; else wake when the oldest is due."""
        loop = asyncio.get_running_loop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._in_flight < self.max_in_flight:
            pick = self._ready(loop.time())
            if pick is None:
                break
            key, take = pick
            queue = self._queues[key]
            batch = [queue[k] for k in take]
            chosen = set(take)
            left = [item for k, item in enumerate(queue) if k not in chosen]
            if left:
                self._queues[key] = collections.deque(left)
            else:
                del self._queues[key]
            self._in_flight += 1
            task = loop.create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._in_flight < self.max_in_flight and self._queues:
            due = min(q[0].since for q in self._queues.values()) + self.options.max_queue_delay_microseconds / 1e6
            self._timer = loop.call_at(due, self._schedule)

    async def _send(self, batch: list[_Waiting]) -> None:
        loop = asyncio.get_running_loop()
        try:
            start = loop.time()
            for item in batch:
                self.stats.queued(int((start - item.since) * 1e9))
            await self._execute(batch)
        except BaseException as e:  # (cancelled with the loop: its requests are told)
            error = e if isinstance(e, Exception) else RuntimeError("the server stopped before the batch ran")
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(error)
            if not isinstance(e, Exception):
                raise
        finally:
            self._in_flight -= 1
            self._schedule()

    async def _execute(self, batch: list[_Waiting]) -> None:
        total = sum(item.rows for item in batch)
        lengths = self._lengths(batch)
        if len(batch) == 1:
            feeds = batch[0].feeds
        else:
            feeds = {n: np.concatenate([self._padded(item.feeds[n], n, max(lengths)) for item in batch], axis=0)
                     for n in self.inputs}
        out = await self._timed(feeds, total, len(batch))
        if len(batch) == 1:
            _answer(batch[0], out)
            return
        wrong = [n for n, a in out.items() if np.ndim(a) == 0 or np.shape(a)[0] != total]
        if wrong:  # the outputs cannot be split: each request again on its own, and no more batches
            a = out[wrong[0]]
            self.off = (f"output '{wrong[0]}' has shape {list(np.shape(a))} for a batch of {total} rows: "
                        f"its dimension 0 is not the batch")
            results = await asyncio.gather(*(self._timed(item.feeds, item.rows, 1) for item in batch),
                                           return_exceptions=True)
            for item, got in zip(batch, results):
                if not isinstance(got, BaseException):
                    _answer(item, got)
                elif not item.future.done():
                    item.future.set_exception(got)
            return
        at = 0
        for item, length in zip(batch, lengths):
            _answer(item, {n: _cut_to(a[at:at + item.rows], self._pad_out.get(n), length) for n, a in out.items()})
            at += item.rows

    def _lengths(self, batch: list[_Waiting]) -> list[int]:
        """Each request's length along the padded dimension (0 each where none is)."""
        return [self._length(item) for item in batch]

    def _length(self, item: _Waiting) -> int:
        if not self.options.pad:
            return 0
        name, axis = self.options.pad.inputs[0]
        return int(item.feeds[name].shape[axis])

    def _padded(self, a: np.ndarray, name: str, length: int) -> np.ndarray:
        """Input ``name`` of one request padded with zeros to ``length`` along the padded
        dimension (as it is where it has none, or is that long)."""
        axis = self._pad_in.get(name)
        if axis is None or a.shape[axis] == length:
            return a
        widths = [(0, 0)] * a.ndim
        widths[axis] = (0, length - a.shape[axis])
        return np.pad(a, widths)


def _cut_to(a: np.ndarray, axis: int | None, length: int) -> np.ndarray:
    """An output's rows cut back to a request's own length along the padded dimension."""
    if axis is None or np.ndim(a) <= axis:
        return a
    index = [slice(None)] * np.ndim(a)
    index[axis] = slice(0, length)
    return a[tuple(index)]


def _answer(item: _Waiting, outputs: dict) -> None:
    if not item.future.done():
        item.future.set_result(outputs)
