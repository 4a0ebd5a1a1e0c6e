"""Generation through a decoder-with-past: a prefill over the prompt, then greedy decoding
one token a step, each step's caches fed back as the next step's past.

The model is a decoder in the layouts people export (Optimum's, onnxruntime-genai's
builder): inputs ``input_ids``, ``attention_mask`` (and ``position_ids`` where it takes
them), each layer's ``past_key_values.N.key/value``; outputs ``logits`` and
``present.N.key/value``.  A cache is paired by name (``past_key_values.X`` or ``past.X``
with ``present.X``), and its sequence dimension is the one the model names for the past
(``past_sequence_length``), else the second to last.

Each part's caches are its own inputs and outputs, so each stays with the part that made
it between steps.  Where the attention takes past and present in one buffer
(onnxruntime-genai's layout), each cache is one buffer bound in place on its part's device
(:mod:`kv_cache`); otherwise the parts run as :class:`runner.Parts` runs them, each cache
the array a part's session returned, fed back the next step.  The same loop over the original model, in onnxruntime's
default session, is the baseline (:func:`whole_model_run`), and must give the same tokens.

Write-up: docs/generate.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .. import ranges
from ..errors import RunError
from . import kv_cache

PAST_PREFIXES = ("past_key_values.", "past.")
# the parts' last-position logits may differ from the whole model's by this much, relative
# to the largest (float32 summed in another order: about 1e-6); tokens must be equal
LOGIT_TOL = 1e-4
ROUNDS = 3  # generations of each runner, in turn; medians kept
PRESENT_PREFIX = "present."


@dataclass
class Generated:
    """What one generation made and how long each phase took."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)  # the new tokens, in order
    prefill_s: float = 0.0
    step_s: list[float] = field(default_factory=list)  # each decoding step after the prefill
    logits: list[np.ndarray] = field(default_factory=list)  # each step's last-position logits

    def rates(self) -> dict[str, float | None]:
        """Prefill tokens/s (the prompt over its call), decode tokens/s (tokens after the
        first over the steps that made them), and the time to the first token."""
        decode = sum(self.step_s)
        return {"prefill_tokens_per_s": len(self.prompt) / self.prefill_s if self.prefill_s else None,
                "decode_tokens_per_s": len(self.step_s) / decode if decode else None,
                "first_token_ms": 1e3 * self.prefill_s}


class Decoder:
    """The names a decoder-with-past is driven by, read from its inputs (the manifest's
    ``model.inputs``: name, dtype, shape, dims) and output names."""

    def __init__(self, inputs: Sequence[Mapping[str, Any]], outputs: Sequence[str], vocab: int | None = None):
        """``vocab``: the logits' last dimension where known (a token id must be below it)."""
        by_name = {s["name"]: s for s in inputs}
        self.vocab = vocab
        if "input_ids" not in by_name:
            raise RunError("not a decoder: the model has no input 'input_ids'")
        self.logits = "logits" if "logits" in outputs else None
        if self.logits is None:
            raise RunError("not a decoder: the model has no output 'logits'")
        self.ids_dtype = by_name["input_ids"].get("dtype", "int64")
        self.mask = by_name.get("attention_mask")
        self.positions = by_name.get("position_ids")
        self.caches: dict[str, str] = {}  # past input -> present output
        for name in by_name:
            prefix = next((p for p in PAST_PREFIXES if name.startswith(p)), None)
            if prefix is None:
                continue
            present = PRESENT_PREFIX + name[len(prefix):]
            if present not in outputs:
                raise RunError(f"cache input '{name}' has no output '{present}' to be fed from")
            self.caches[name] = present
        if not self.caches:
            raise RunError("not a decoder with past: no input 'past_key_values.N.key' (or 'past.N.key')")
        known = {"input_ids", "attention_mask", "position_ids", *self.caches}
        other = [n for n in by_name if n not in known]
        if other:
            raise RunError(f"the decoder takes input '{other[0]}', which generation does not know how to feed")
        self.specs = by_name

    def check_prompt(self, prompt: Sequence[int]) -> None:
        """RunError where a token id is no id of the model's (negative, or past its
        vocabulary), before any call: onnxruntime's own words name a Gather deep inside."""
        for i, t in enumerate(prompt):
            if not 0 <= t < (self.vocab or 2 ** 63):
                past = f"the model's vocabulary of {self.vocab}" if self.vocab else "an int64"
                raise RunError(f"token id {str(t)[:24]} (position {i} of the prompt) is outside {past}")

    def check_call(self, shapes: Mapping[str, Sequence[int]]) -> None:
        """RunError where one call's inputs (their shapes by name: an /infer request's) make
        no step of this decoder: an attention mask longer than the past must span the past
        and the new tokens (no attention takes it: onnxruntime's refused it deep inside, a
        part's failure, a 500).  (One no longer than the past is GroupQueryAttention's
        static cache, a buffer of the whole length, its mask the positions seen.)"""
        if self.mask is None or "attention_mask" not in shapes or "input_ids" not in shapes:
            return
        new, span = shapes["input_ids"][-1], shapes["attention_mask"][-1]
        for name in (c for c in self.caches if c in shapes):
            past = shapes[name][self.seq_axis(name)]
            if past < span != past + new:
                raise RunError(f"input 'attention_mask' spans {span} positions, but '{name}' holds {past} and "
                               f"'input_ids' {new} new: it must span their {past + new}")

    def seq_axis(self, name: str) -> int:
        """The cache's sequence dimension: the one the model names for the past, else -2."""
        dims = self.specs[name].get("dims") or []
        named = [k for k, d in enumerate(dims) if isinstance(d, str) and "past" in d]
        return named[0] if named else len(self.specs[name]["shape"]) - 2

    def empty_past(self) -> dict[str, np.ndarray]:
        """Each cache with no positions yet (its other dims as the planned shape has them)."""
        out = {}
        for name in self.caches:
            shape = list(self.specs[name]["shape"])
            shape[self.seq_axis(name)] = 0
            out[name] = np.zeros(shape, dtype=self.specs[name].get("dtype", "float32"))
        return out

    def feeds(self, ids: Sequence[int], past: Mapping[str, np.ndarray], seen: int) -> dict[str, np.ndarray]:
        """One call's inputs: ``ids`` after ``seen`` tokens whose keys ``past`` holds."""
        f: dict[str, np.ndarray] = {"input_ids": np.array([list(ids)], dtype=self.ids_dtype)}
        total = seen + len(ids)
        if self.mask is not None:
            f["attention_mask"] = np.ones((1, total), dtype=self.mask.get("dtype", "int64"))
        if self.positions is not None:
            f["position_ids"] = np.arange(seen, total, dtype=self.positions.get("dtype", "int64"))[None, :]
        f.update(past)
        return f

    def shapes(self, n_ids: int, seen: int) -> dict[str, tuple[int, ...]]:
        """The input shapes of a call of ``n_ids`` tokens after ``seen``."""
        out = {"input_ids": (1, n_ids)}
        if self.mask is not None:
            out["attention_mask"] = (1, seen + n_ids)
        if self.positions is not None:
            out["position_ids"] = (1, n_ids)
        for name in self.caches:
            shape = list(self.specs[name]["shape"])
            shape[self.seq_axis(name)] = seen
            out[name] = tuple(shape)
        return out


def decoder_of(model: Mapping[str, Any]) -> Decoder | None:
    """The decoder a manifest's ``model`` is, or None where it is not one."""
    try:
        return Decoder(model["inputs"], [o["name"] for o in model["outputs"]], vocab_of(model))
    except (RunError, KeyError, TypeError):
        return None


def vocab_of(model: Mapping[str, Any]) -> int | None:
    """The logits' last dimension in a manifest's ``model`` where it is fixed, else None."""
    for o in model.get("outputs") or []:
        shape = o.get("shape") if isinstance(o, dict) and o.get("name") == "logits" else None
        if isinstance(shape, list) and shape and isinstance(shape[-1], int) and shape[-1] > 0:
            return shape[-1]
    return None


def serve_note(model: Mapping[str, Any]) -> str | None:
    """What ``serve`` says of a decoder's parts (the manifest's ``model``): how it answers
    generation requests.  None for other models."""
    if decoder_of(model) is None:
        return None
    return ("the parts are a decoder with past: POST .../generate with {\"input_ids\": [token ids], "
            "\"max_tokens\": N} answers the greedy continuation's token ids (\"output_ids\"); "
            "/infer answers one forward pass (its caches in, its presents out)")


def check_lengths(decoder: Decoder, shape_range: Mapping[str, Any] | None, prompt_len: int,
                  new_tokens: int) -> int:
    """The most tokens one call takes (the prompt is prefilled in calls of at most this
    many: one where the parts were made for decoding steps alone), after refusing, before
    any call, a generation the parts were not made for: its first call's shapes and its
    last's must lie in the parts' range."""
    if not shape_range:
        raise RunError("the parts were made for one shape; generation needs a range of them "
                       "(split with --context N, or --input-shape ranges)")
    r = {k: [tuple(span) for span in v] for k, v in shape_range.items()}
    ids = r.get("input_ids")
    chunk = max(1, min(prompt_len, ids[-1][1])) if ids else prompt_len
    calls = [("the prefill", decoder.shapes(chunk, 0))]
    last = prompt_len % chunk or chunk
    if last != chunk:
        calls.append(("the prefill's last call", decoder.shapes(last, prompt_len - last)))
    if new_tokens > 1:
        calls.append((f"step {new_tokens - 1} of decoding", decoder.shapes(1, prompt_len + new_tokens - 2)))
    for what, shapes in calls:
        why = ranges.outside(r, {k: v for k, v in shapes.items() if k in r})
        if why:
            raise RunError(f"a prompt of {prompt_len} tokens and {new_tokens} new: {what} is outside the "
                           f"range the parts were made for:{why}")
    return chunk


def generate(run, decoder: Decoder, prompt: Sequence[int], max_new_tokens: int,
             eos: int | None = None, keep_logits: bool = False, chunk: int | None = None) -> Generated:
    """Greedy generation: ``run(feeds) -> outputs by name`` (a :class:`runner.Parts`'s
    ``run``, or a session's); the prompt prefilled in calls of at most ``chunk`` tokens
    (all at once by default), then one call a token."""
    steps = _steps(decoder, prompt, max_new_tokens, eos, keep_logits, chunk)
    try:
        feeds = next(steps)
        while True:
            feeds = steps.send(run(feeds))
    except StopIteration as done:
        return done.value


async def generate_async(run, decoder: Decoder, prompt: Sequence[int], max_new_tokens: int,
                         eos: int | None = None, chunk: int | None = None) -> Generated:
    """:func:`generate` where ``run(feeds)`` is awaited (``serve``'s gateway, whose parts
    answer through Ray)."""
    steps = _steps(decoder, prompt, max_new_tokens, eos, False, chunk)
    try:
        feeds = next(steps)
        while True:
            feeds = steps.send(await run(feeds))
    except StopIteration as done:
        return done.value


def _steps(decoder: Decoder, prompt: Sequence[int], max_new_tokens: int, eos: int | None,
           keep_logits: bool, chunk: int | None):
    """The loop of greedy generation, as a generator: it yields each call's feeds and is
    sent that call's outputs; it returns the :class:`Generated` (one loop, however the
    calls are made)."""
    if not prompt:
        raise RunError("the prompt is empty: give at least one token id")
    if max_new_tokens < 1:
        raise RunError("--max-new-tokens must be at least 1")
    decoder.check_prompt(prompt)
    out = Generated(list(prompt))
    past = decoder.empty_past()
    chunk = chunk or len(prompt)
    pending: list[int] = list(prompt)
    seen = 0
    t = time.perf_counter()
    while True:
        ids, pending = pending[:chunk], pending[chunk:]
        got = yield decoder.feeds(ids, past, seen)
        seen += len(ids)
        past = {name: got[present] for name, present in decoder.caches.items()}
        if pending:
            continue  # (the prompt's next call)
        took = time.perf_counter() - t
        if len(out.tokens) == 0:
            out.prefill_s = took
        else:
            out.step_s.append(took)
        last = np.asarray(got[decoder.logits])[0, -1]
        if not np.all(np.isfinite(last)):
            raise RunError(f"the logits after {len(out.tokens)} new token(s) are not finite")
        if keep_logits:
            out.logits.append(last.copy())
        token = int(np.argmax(last))
        out.tokens.append(token)
        if len(out.tokens) >= max_new_tokens or (eos is not None and token == eos):
            return out
        pending = [token]
        t = time.perf_counter()


def genai_peer(model_path, prompt: Sequence[int]):
    """``generate(n) -> Generated``: onnxruntime-genai running the original model greedily
    (the peer a user would pick), where it is installed and the model's folder has its
    ``genai_config.json``; else why not (a string)."""
    from pathlib import Path

    folder = Path(model_path).parent
    if not (folder / "genai_config.json").is_file():
        return "the model's folder has no genai_config.json"
    try:
        import onnxruntime_genai as og
    except ImportError:
        return "onnxruntime-genai is not installed"
    model = og.Model(str(folder))

    def once(n: int) -> Generated:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + n, min_length=len(prompt) + n)
        gen = og.Generator(model, params)
        out = Generated(list(prompt))
        t = time.perf_counter()
        gen.append_tokens([list(prompt)])  # (the prefill)
        gen.generate_next_token()  # (for APIs where the prefill runs on the first token)
        out.prefill_s = time.perf_counter() - t
        out.tokens.append(int(gen.get_next_tokens()[0]))
        while len(out.tokens) < n and not gen.is_done():
            t = time.perf_counter()
            gen.generate_next_token()
            out.step_s.append(time.perf_counter() - t)
            out.tokens.append(int(gen.get_next_tokens()[0]))
        return out

    once(1)  # (untimed: the first call allocates)
    return once


def run_generation(parts_dir, prompt: Sequence[int], max_new_tokens: int, *, eos: int | None = None,
                   baseline: bool = True, fallback_cpu: bool = False, rounds: int = ROUNDS) -> dict[str, Any]:
    """``onnxsplit generate``: the parts generate from ``prompt``; beside them, the same
    loop over the original model in onnxruntime's default session (``baseline``), whose
    tokens the parts' must equal (``check``), and onnxruntime-genai where it can run it.
    Each generates ``rounds`` times, in turn, and the median of each rate is kept (a shared
    machine's slow second then hits all alike)."""
    from .runner import Parts

    parts = Parts(parts_dir, fallback_cpu=fallback_cpu)
    model = parts.manifest["model"]
    decoder = Decoder(model["inputs"], [o["name"] for o in model["outputs"]], vocab_of(model))
    decoder.check_prompt(prompt)
    chunk = check_lengths(decoder, model.get("shape_range"), len(prompt), max_new_tokens)
    why = kv_cache.shared_caches(parts, decoder.caches)
    if why is None:  # (each cache one buffer, in place: kv_cache)
        run = kv_cache.SharedCaches(parts, decoder.caches, decoder.specs,
                                    {c: decoder.seq_axis(c) for c in decoder.caches},
                                    len(prompt) + max_new_tokens).run
        caches = "in place: one buffer each, past and present (IOBinding)"
    else:
        run, caches = parts.run, f"handed from step to step ({why})"
    runners: dict[str, tuple[Any, int | None]] = {"onnxsplit": (run, chunk)}
    result: dict[str, Any] = {"parts_dir": str(parts_dir), "prompt": list(prompt), "parts": len(parts.parts),
                              "devices": parts.devices, "prefill_chunk": chunk, "rounds": rounds,
                              "caches": caches}
    if baseline:
        runners["onnxruntime"] = (whole_model_run(model["path"]), None)
    for run, c in runners.values():
        generate(run, decoder, prompt, 1, chunk=c)  # (untimed: a session's first calls allocate)
    runs = {name: (lambda keep, run=run, c=c: generate(run, decoder, prompt, max_new_tokens, eos, keep, c))
            for name, (run, c) in runners.items()}
    if baseline:
        peer = genai_peer(model["path"], prompt)
        if isinstance(peer, str):
            result["genai"] = peer
        else:
            runs["onnxruntime_genai"] = lambda keep: peer(max_new_tokens)
    got: dict[str, list[Generated]] = {name: [] for name in runs}
    for r in range(max(1, rounds)):
        for name, go in runs.items():
            got[name].append(go(r == 0))
    result["tokens"] = got["onnxsplit"][0].tokens
    result["rates"] = {name: _median_rates([g.rates() for g in gens]) for name, gens in got.items()}
    if baseline:
        mine, theirs = got["onnxsplit"][0], got["onnxruntime"][0]
        same = next((k for k, (a, b) in enumerate(zip(mine.tokens, theirs.tokens)) if a != b), None)
        if same is None and len(mine.tokens) != len(theirs.tokens):
            same = min(len(mine.tokens), len(theirs.tokens))
        worst = max(float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))
                    for a, b in zip(mine.logits, theirs.logits))
        result["check"] = {"ok": same is None and worst <= LOGIT_TOL, "first_difference": same,
                           "max_rel_logit_error": worst, "tolerance": LOGIT_TOL}
        if "onnxruntime_genai" in got:
            result["genai_tokens_equal"] = got["onnxruntime_genai"][0].tokens == theirs.tokens
    return result


def _median_rates(rates: list[dict[str, float | None]]) -> dict[str, float | None]:
    return {k: (float(np.median([r[k] for r in rates])) if all(r[k] is not None for r in rates) else None)
            for k in rates[0]}


def whole_model_run(model_path):
    """``run(feeds)`` over the original model in onnxruntime's default session on the CPU."""
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    except Exception as e:
        from ..shapes import one_line

        raise RunError(f"the original model '{model_path}' cannot be loaded: {one_line(e)}") from None
    names = [o.name for o in sess.get_outputs()]
    return lambda feeds: dict(zip(names, sess.run(None, feeds)))


PREFILL = 128  # --context's parts take a prompt of up to this many tokens in one call


def _genai_config(model_path, *keys: str) -> int | None:
    """A number from the ``genai_config.json`` beside the model (onnxruntime-genai's
    builder writes it), e.g. ``model.decoder.head_size``: the caches' last dimension, which
    the builder leaves unfixed; None where there is none."""
    import json
    from pathlib import Path

    try:
        value: Any = json.loads((Path(model_path).parent / "genai_config.json").read_text())
        for k in keys:
            value = value[k]
        return int(value)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def decode_step(model_path, context: int, prefill: int | None = None
                ) -> tuple[dict[str, tuple[int, ...]], dict[str, list[tuple[int, int]]]]:
    """``--context N``: the shapes of one decoding step at a context of N tokens (batch 1,
    one new token, N - 1 in the caches), where the plan is made -- each part's caches are
    then counted at their full length on its device -- and the range the parts are made and
    checked for: from the first step (an empty past) to that one, with up to ``prefill``
    tokens a call (``--prefill``; PREFILL by default, at most N).  The range's largest
    corner is then ``prefill`` tokens after N - 1 (its mask N + prefill - 1 long), a shape
    a generation could reach; where the model's positions end before it (onnxruntime-genai's
    ``context_length``), fewer tokens a call.  A prompt longer than ``prefill`` is
    prefilled in calls of that many (:func:`check_lengths`)."""
    import onnx

    from ..errors import ModelError
    from ..shapes import dtype_name

    if context < 1:
        raise ModelError("--context must be at least 1 token")
    if prefill is not None and prefill < 1:
        raise ModelError("--prefill must be at least 1 token")
    positions = _genai_config(model_path, "model", "context_length")
    if positions is not None and context > positions:
        raise ModelError(f"--context {context} is longer than the model's {positions} positions "
                         "(genai_config.json's context_length)")
    chunk = min(prefill or PREFILL, context)
    if positions is not None:
        chunk = max(1, min(chunk, positions - context + 1))
    m = onnx.load(str(model_path), load_external_data=False)
    weights = {t.name for t in m.graph.initializer}
    specs = []
    for vi in m.graph.input:
        if vi.name in weights:
            continue
        dims = list(vi.type.tensor_type.shape.dim)
        specs.append({"name": vi.name, "dims": [d.dim_param or None for d in dims],
                      "shape": [d.dim_value if d.HasField("dim_value") else 1 for d in dims],
                      "dtype": dtype_name(vi.type.tensor_type.elem_type)})
    try:
        decoder = Decoder(specs, [o.name for o in m.graph.output])
    except RunError as e:
        raise ModelError(f"--context needs a decoder with past: {e}") from None
    head = _genai_config(model_path, "model", "decoder", "head_size")
    for name in decoder.caches:
        spec = decoder.specs[name]
        axis = decoder.seq_axis(name)
        free = [k for k, d in enumerate(spec["dims"]) if d and k not in (0, axis)]
        if free == [len(spec["dims"]) - 1] and head:  # (onnxruntime-genai's builder: 'kv_cache_dim')
            spec["shape"][-1] = head
            free = []
        if free:
            raise ModelError(f"--context: cache '{name}' has a dimension {free[0]} ('{spec['dims'][free[0]]}') "
                             f"the model does not fix; give the caches' shapes with --input-shape instead")
    planned = decoder.shapes(1, context - 1)
    first = decoder.shapes(1, 0)
    last = decoder.shapes(chunk, context - 1)
    span = {k: [(a, b) for a, b in zip(first[k], last[k])] for k in planned}
    return planned, span
