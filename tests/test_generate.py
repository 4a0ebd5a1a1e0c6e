"""Generation through a decoder's parts (onnxsplit/running/generate.py, `onnxsplit generate`).

The model: tests/onnx_models.decoder_with_past (Optimum's layout, plain operators), split by
layers over two CPU devices for a range of shapes (a prefill of up to 16 tokens, up to 80 in
all).  The reference is this file's own loop over the original model in onnxruntime."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

from onnx_models import decoder_with_past
from onnxsplit.cli import main
from onnxsplit.export import export
from onnxsplit.graph import OpGraph
from onnxsplit.running import generate as gen

LAYERS, HEADS, DIM = 4, 2, 16
PLANNED = {"input_ids": (1, 1), "attention_mask": (1, 33), **{
    f"past_key_values.{i}.{kv}": (1, HEADS, 32, DIM) for i in range(LAYERS) for kv in ("key", "value")}}
RANGE = {"input_ids": [(1, 1), (1, 16)], "attention_mask": [(1, 1), (1, 80)],
         "past_key_values.0.key": [(1, 1), (HEADS, HEADS), (0, 64), (DIM, DIM)]}
PROMPT = [3, 7, 11, 5]


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """The decoder and its parts: layers 0-1 (and the mask's computation) on cpu0, the
    rest on cpu1."""
    tmp = tmp_path_factory.mktemp("generate")
    model = decoder_with_past(tmp / "decoder.onnx", layers=LAYERS, hidden=HEADS * DIM, heads=HEADS)
    g = OpGraph.from_onnx(model, PLANNED)
    second = [n.name for n in g.nodes if n.name.startswith(("layer2", "layer3", "present.2", "present.3"))
              or n.name == "logits"]
    place = {n.name: "cpu1" if n.name in second else "cpu0" for n in g.nodes}
    cpu = "CPUExecutionProvider"
    out = export(g, place, tmp / "parts", providers={"cpu0": cpu, "cpu1": cpu}, threads={"cpu0": 1, "cpu1": 1},
                 plan={"objective": "latency"}, shape_range=RANGE).out
    return model, out


def reference(model, prompt, n, dim=DIM):
    """Greedy decoding of the original model with its caches, written out here."""
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    past = {f"past_key_values.{i}.{kv}": np.zeros((1, HEADS, 0, dim), np.float32)
            for i in range(LAYERS) for kv in ("key", "value")}
    ids, tokens = list(prompt), []
    seen = 0
    while len(tokens) < n:
        got = dict(zip(names, sess.run(None, {"input_ids": np.array([ids], np.int64),
                                              "attention_mask": np.ones((1, seen + len(ids)), np.int64),
                                              **past})))
        seen += len(ids)
        tokens.append(int(got["logits"][0, -1].argmax()))
        ids = tokens[-1:]
        past = {k: got[k.replace("past_key_values", "present")] for k in past}
    return tokens


def test_the_parts_generate_what_the_model_does(split, capsys):
    model, parts = split
    want = reference(model, PROMPT, 40)
    assert len(set(want)) >= 20  # (a decoder whose tokens depend on its context, not one token)
    assert main(["generate", str(parts), "--prompt", ",".join(map(str, PROMPT)), "--max-new-tokens", "40",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tokens"] == want
    assert r["check"]["ok"] and r["check"]["max_rel_logit_error"] <= gen.LOGIT_TOL
    assert r["caches"] == ("handed from step to step (cache 'past_key_values.0.key' is not read by a "
                           "GroupQueryAttention)")  # (Optimum's layout: past and present apart)
    assert not (parts / "genai_config.json").exists()  # (no onnxruntime-genai config beside the model)
    for who in ("onnxsplit", "onnxruntime"):
        rates = r["rates"][who]
        assert rates["prefill_tokens_per_s"] > 0 and rates["decode_tokens_per_s"] > 0
    # each part feeds itself the caches of its own layers: a part's past inputs are exactly
    # the presents it makes (nothing of a cache crosses between parts)
    manifest = json.loads((parts / "manifest.json").read_text())
    for p in manifest["parts"]:
        pasts = {t["name"].replace("past_key_values", "present") for t in p["inputs"]
                 if t["name"].startswith("past_key_values") and t["name"].endswith((".value",))}
        presents = {t["name"] for t in p["outputs"] if t["name"].startswith("present") and
                    t["name"].endswith(".value")}
        assert pasts == presents and presents
    # a prompt longer than the parts take in one call (16 tokens): prefilled in calls of 16
    long = [(7 * i) % 64 for i in range(21)]
    assert main(["generate", str(parts), "--prompt", ",".join(map(str, long)), "--max-new-tokens", "5",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["prefill_chunk"] == 16 and r["tokens"] == reference(model, long, 5) and r["check"]["ok"]
    # the table: the same tokens, and both rows of figures
    assert main(["generate", str(parts), "--prompt", "1,2", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert f"generated 8 token(s): {' '.join(map(str, reference(model, [1, 2], 8)))}" in out
    assert "check: the same tokens as the original model" in out
    assert "onnxsplit's parts" in out and "onnxruntime, the whole model" in out


def test_a_generation_the_parts_were_not_made_for_is_one_line(split, capsys):
    model, parts = split
    cases = [(["--prompt", ",".join(["1"] * 70), "--max-new-tokens", "20"],
              "a prompt of 70 tokens and 20 new: step 19 of decoding is outside the range the parts were "
              "made for: input 'attention_mask': shape [1, 89]"),
             (["--prompt", "1,2", "--max-new-tokens", "80"], "step 79 of decoding is outside the range"),
             (["--prompt", "1,x"], "--prompt takes token ids separated by commas, not '1,x'"),
             (["--prompt", "1,-2"], "--prompt: token ids are not negative"),
             (["--prompt", "1,640"], "token id 640 (position 1 of the prompt) is outside the model's vocabulary of "),
             (["--prompt", "99999999999999999999999"], "token id 99999999999999999999999 (position 0 of the "
                                                     "prompt) is outside")]
    for args, message in cases:
        assert main(["generate", str(parts), *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("onnxsplit: error: ") and message in err and err.count("\n") == 1, err


def test_parts_that_generate_otherwise_fail_the_check(split, tmp_path, capsys):
    """One weight of the parts' shared file scaled by 1.5 (the original untouched): the
    tokens or the logits part from the model's, and the command exits 1 saying so."""
    import shutil

    model, parts = split
    bad = tmp_path / "parts"
    shutil.copytree(parts, bad)
    data = np.fromfile(bad / "weights.bin", dtype=np.float32)
    data[len(data) // 2: len(data) // 2 + 64] *= 1.5
    data.tofile(bad / "weights.bin")
    assert main(["generate", str(bad), "--prompt", "3,7,11,5", "--max-new-tokens", "6"]) == 1
    captured = capsys.readouterr()
    assert "onnxsplit: check failed: the parts do not generate as the original model does" in captured.err
    assert "NOT the same tokens" in captured.out or "logits off by" in captured.err


def test_a_model_that_is_not_a_decoder_with_past_is_refused():
    specs = [{"name": "input_ids", "shape": [1, 4], "dtype": "int64"}]
    with pytest.raises(gen.RunError, match="no output 'logits'"):
        gen.Decoder(specs, ["last_hidden_state"])
    with pytest.raises(gen.RunError, match="no input 'past_key_values.N.key'"):
        gen.Decoder(specs, ["logits"])
    specs.append({"name": "past_key_values.0.key", "shape": [1, 2, 3, 4], "dims": ["batch", None, "past_len", None]})
    with pytest.raises(gen.RunError, match="cache input 'past_key_values.0.key' has no output 'present.0.key'"):
        gen.Decoder(specs, ["logits"])
    d = gen.Decoder(specs, ["logits", "present.0.key"])
    assert d.seq_axis("past_key_values.0.key") == 2 and d.empty_past()["past_key_values.0.key"].shape == (1, 2, 0, 4)
    assert d.shapes(1, 9)["past_key_values.0.key"] == (1, 2, 9, 4)


def test_one_cache_given_binds_every_cache_by_its_dimension_names(tmp_path):
    """A decoder of 4 layers has 8 caches: the past's length given for one, the others take
    it by the name the model gives that dimension; one never named stays an error."""
    model = decoder_with_past(tmp_path / "d.onnx", layers=LAYERS, hidden=HEADS * DIM, heads=HEADS)
    g = OpGraph.from_onnx(model, {"input_ids": (1, 1), "attention_mask": (1, 9),
                                  "past_key_values.0.key": (1, HEADS, 8, DIM)})
    assert {t: g.input_shapes[t] for t in g.input_shapes if t.startswith("past")} == {
        f"past_key_values.{i}.{kv}": (1, HEADS, 8, DIM) for i in range(LAYERS) for kv in ("key", "value")}
    from onnxsplit.errors import ModelError

    # ('batch' follows the mask; the new tokens' and the past's lengths are named by no input given)
    with pytest.raises(ModelError, match=r"input 'input_ids' has an unbound dimension 1 \('sequence_length'\): "
                                         r"bind it with --input-shape input_ids=1xN \(also unbound: past_key_values.0.key"):
        OpGraph.from_onnx(model, {"attention_mask": (1, 9)})


def test_a_decoders_caches_are_written_once_and_run_is_told_only_what_it_needs(split):
    """Printed shapes group inputs numbered alike with one shape (a 32-layer decoder's 64
    caches were 64 entries on every line); the suggested `run --shape` leaves out an input
    whose shape follows by dimension names from those before it."""
    from onnxsplit.cli import _given_for_run, _shapes_text

    _, parts = split
    shapes = {k: (1, 2, 9, 16) for k in PLANNED if k.startswith("past")}
    shapes = {"input_ids": (1, 1), "attention_mask": (1, 10), **shapes}
    assert _shapes_text(shapes) == ("input_ids=1x1 attention_mask=1x10 past_key_values.N.key=1x2x9x16 (4 inputs) "
                                    "past_key_values.N.value=1x2x9x16 (4 inputs)")
    assert _shapes_text({"past_key_values.0.key": (1, 2, 9, 16), "past_key_values.1.key": (1, 2, 8, 16)}) == \
        "past_key_values.0.key=1x2x9x16 past_key_values.1.key=1x2x8x16"
    # (input_ids at 1x1 is the planned shape, which run takes where none is given)
    assert _given_for_run(shapes, parts) == {"attention_mask": (1, 10), "past_key_values.0.key": (1, 2, 9, 16)}
    odd = dict(shapes, **{"past_key_values.3.value": (1, 2, 5, 16)})  # (follows no name: kept)
    assert "past_key_values.3.value" in _given_for_run(odd, parts)


def test_context_plans_a_decoding_step_with_its_kv_cache_against_memory(tmp_path, capsys):
    """--context N: one decoding step at N tokens planned for latency, the caches counted
    at their full length on their part's device.  A fast (estimated) accelerator of 16 MiB
    takes the decoder (8.1 MiB of weights, hidden 256) and its caches at a context of 64 (1 MiB);
    at 8192 the caches are 64 MiB, and most stay on the CPU -- and the parts still generate
    the model's tokens (the accelerator's parts checked on the CPU).  The IP's plan is taken
    as it is (--method ip): whether this machine's CPU beats an estimated accelerator is not
    what is tested."""
    model = decoder_with_past(tmp_path / "d.onnx", layers=LAYERS, hidden=256, heads=HEADS)
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({
        "devices": [{"name": "cpu", "class": "cpu", "count": 1, "memory": "8GiB",
                     "execution_provider": "CPUExecutionProvider"},
                    {"name": "gpu", "class": "gpu", "count": 1, "memory": "16MiB", "peak_flops": 1e14,
                     "memory_bandwidth": "2TB/s", "call_overhead": "1us"}],
        "links": [{"between": ["cpu", "gpu"], "bandwidth": "64GB/s", "latency": "1us"}]}))
    caches = sorted(f"present.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value"))
    on_cpu = {}
    for context in (64, 8192):
        out = tmp_path / f"p{context}"
        assert main([str(model), "--context", str(context), "--devices", str(cluster), "--out", str(out),
                     "--method", "ip", "--json"]) == 0
        r = json.loads(capsys.readouterr().out)
        assert r["plan"]["objective"] == "latency"
        assert r["model"]["input_shapes"]["past_key_values.3.value"] == [1, HEADS, context - 1, 128]
        # (a prompt of up to 128 tokens a call, after as many as N - 1: gen.PREFILL)
        assert r["model"]["shape_range"]["input_ids"] == [[1, 1], [1, min(gen.PREFILL, context)]]
        assert r["model"]["shape_range"]["attention_mask"] == [[1, 1], [1, context + min(gen.PREFILL, context) - 1]]
        plan = json.loads((out / "plan.json").read_text())["assignment"]
        on_cpu[context] = sorted(k for k in caches if plan[k] == "cpu0")
        assert sum(d == "acc0" for d in plan.values()) > 0, (context, r["plan"]["details"].get("why"), r["plan"]["details"].get("candidates"))
    # (at 64 the IP may keep a layer's small caches by the CPU's nodes: speed, not memory;
    # at 8192 the accelerator holds what its 16 MiB hold beside its nodes: which caches, if
    # any, depends on how fast this machine's CPU measured, as a busy machine showed)
    cache_bytes = HEADS * 8192 * 128 * 4
    assert len(on_cpu[64]) <= len(caches) // 4 and len(on_cpu[8192]) > len(caches) // 2
    assert (len(caches) - len(on_cpu[8192])) * cache_bytes <= 16 * 2**20 and len(on_cpu[8192]) > len(on_cpu[64])
    assert main(["generate", str(tmp_path / "p8192"), "--prompt", "3,7,11,5", "--max-new-tokens", "8",
                 "--fallback-cpu", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tokens"] == reference(model, PROMPT, 8, dim=128) and r["check"]["ok"] and r["prefill_chunk"] == 4
    # --context with shapes, --prefill without --context, or on a model without caches: one line
    assert main([str(model), "--context", "8", "--input-shape", "input_ids=1x1", "--out", str(tmp_path / "x")]) == 2
    assert "give --context or --input-shape, not both" in capsys.readouterr().err
    assert main([str(model), "--prefill", "4", "--input-shape", "input_ids=1x1", "--out", str(tmp_path / "x")]) == 2
    assert "--prefill goes with --context" in capsys.readouterr().err
    from onnx_models import mlp

    assert main([str(mlp(tmp_path / "m.onnx", layers=1, batch=2, width=8)), "--context", "8",
                 "--out", str(tmp_path / "y")]) == 2
    assert "--context needs a decoder with past: not a decoder: the model has no input 'input_ids'" in \
        capsys.readouterr().err


def test_an_onnxruntime_genai_model_split_in_two_generates_beside_onnxruntime_genai(tmp_path, capsys):
    """The builder's decoder (tests/data/llama_tiny_genai: GroupQueryAttention, caches whose
    last dimension genai_config.json gives) planned by --context's shapes, its two layers on
    two devices: the parts' tokens are onnxruntime's, and onnxruntime-genai, where installed,
    is timed beside them."""
    from pathlib import Path

    model = Path(__file__).parent / "data" / "llama_tiny_genai" / "model.onnx"
    planned, span = gen.decode_step(model, 96, prefill=8)
    assert planned["past_key_values.1.value"] == (1, 2, 95, 16) and span["attention_mask"] == [(1, 1), (1, 103)]
    assert span["input_ids"] == [(1, 1), (1, 8)] and span["past_key_values.1.value"][2] == (0, 95)
    # the model's 512 positions (genai_config.json): a context of 512 leaves room for one
    # token a call after 511; beyond them, one line
    assert gen.decode_step(model, 512)[1]["input_ids"] == [(1, 1), (1, 1)]
    assert gen.decode_step(model, 500)[1]["attention_mask"] == [(1, 1), (1, 512)]
    from onnxsplit.errors import ModelError

    with pytest.raises(ModelError, match="--context 600 is longer than the model's 512 positions"):
        gen.decode_step(model, 600)
    g = OpGraph.from_onnx(model, planned)
    names = [n.name for n in g.nodes]
    second = names.index(next(n for n in names if "layers.1" in n))
    place = {n: "cpu0" if i < second else "cpu1" for i, n in enumerate(names)}
    cpu = "CPUExecutionProvider"
    parts = export(g, place, tmp_path / "parts", providers={"cpu0": cpu, "cpu1": cpu},
                   threads={"cpu0": 1, "cpu1": 1}, plan={"objective": "latency"}, shape_range=span).out
    assert main(["generate", str(parts), "--prompt", "5,17,33,99", "--max-new-tokens", "12", "--rounds", "1",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["parts"] == 2 and r["check"]["ok"] and r["prefill_chunk"] == 4 and len(r["tokens"]) == 12
    import importlib.util
    # a prompt longer than the 8 tokens a call the parts were made for: in calls of 8
    prompt = ",".join(str(3 + (5 * i) % 200) for i in range(19))
    assert main(["generate", str(parts), "--prompt", prompt, "--max-new-tokens", "6", "--rounds", "1",
                 "--json"]) == 0
    long = json.loads(capsys.readouterr().out)
    assert long["prefill_chunk"] == 8 and long["check"]["ok"] and long["check"]["first_difference"] is None
    assert r["caches"].startswith("in place")  # (GroupQueryAttention: one buffer a cache, kv_cache)
    # the parts are also where onnxruntime-genai runs them: a pipeline of the two parts,
    # and the tokenizer beside it; it generates the whole model's tokens through them
    config = json.loads((parts / "genai_config.json").read_text())["model"]
    assert config["type"] == "decoder-pipeline" and (parts / "tokenizer.json").is_file()
    assert [list(stage)[0] for stage in config["decoder"]["pipeline"]] == ["part0_cpu0", "part1_cpu1"]
    export(g, place, parts, providers={"cpu0": cpu, "cpu1": cpu}, force=True,  # (its own files: replaced)
           threads={"cpu0": 1, "cpu1": 1}, plan={"objective": "latency"}, shape_range=span)
    if importlib.util.find_spec("onnxruntime_genai") is not None:
        import onnxruntime_genai as og

        def genai_tokens(folder, prompt, n):
            m = og.Model(str(folder))
            params = og.GeneratorParams(m)
            params.set_search_options(do_sample=False, max_length=len(prompt) + n, min_length=len(prompt) + n)
            g = og.Generator(m, params)
            g.append_tokens([prompt])
            out = []
            while not g.is_done():
                g.generate_next_token()
                out.append(int(g.get_next_tokens()[0]))
            return out

        assert genai_tokens(parts, [5, 17, 33, 99], 12) == r["tokens"] == genai_tokens(model.parent, [5, 17, 33, 99], 12)
    # the same parts with each cache bound in place, the prompt in one call and then 30
    # steps: the whole model's tokens, each step's logits within LOGIT_TOL of its own
    from onnxsplit.running import kv_cache
    from onnxsplit.running.runner import Parts

    p = Parts(parts)
    decoder = gen.Decoder(p.manifest["model"]["inputs"], p.output_names)
    prompt = [5, 17, 33, 99, 2, 71]
    shared = kv_cache.SharedCaches(p, decoder.caches, decoder.specs,
                                   {c: decoder.seq_axis(c) for c in decoder.caches}, len(prompt) + 30)
    mine = gen.generate(shared.run, decoder, prompt, 30, keep_logits=True)
    theirs = gen.generate(gen.whole_model_run(model), decoder, prompt, 30, keep_logits=True)
    assert mine.tokens == theirs.tokens and len(set(theirs.tokens)) > 5
    for a, b in zip(mine.logits, theirs.logits):
        assert np.max(np.abs(a - b)) <= gen.LOGIT_TOL * np.max(np.abs(b))
    again = gen.generate(shared.run, decoder, prompt[:3], 10)  # (the buffers reused: what is past them unread)
    assert again.tokens == gen.generate(gen.whole_model_run(model), decoder, prompt[:3], 10).tokens
    # `serve`'s local engine: two generations at once, each with buffers of its own
    import asyncio

    from onnxsplit.running.serve_local import LocalGateway, PartsService

    g = LocalGateway("decoder", p.manifest, service := PartsService(p))
    try:
        assert g.shared_why is None

        async def both():
            return await asyncio.gather(g._generation(prompt, 30, None, None), g._generation(prompt[:3], 10, None, None))

        served = asyncio.run(both())
    finally:
        service.close()
    assert [m.tokens for m in served] == [theirs.tokens, again.tokens]
    if importlib.util.find_spec("onnxruntime_genai") is None:
        assert r["genai"] == "onnxruntime-genai is not installed"
    else:
        assert r["rates"]["onnxruntime_genai"]["decode_tokens_per_s"] > 0 and r["genai_tokens_equal"]


@pytest.mark.parametrize("engine", ["handles", "local"])
def test_the_gateway_generates_what_the_model_does_and_refuses_in_one_line(split, engine):
    """`serve`'s gateway answers POST .../generate (Triton's generate extension) with the
    reference's tokens, the parts composed as its handles (here the parts folder's runner,
    awaited as a Ray handle is) or, on the local engine, run in this process with their
    caches in place; a prompt longer than the range, bad fields and a model that is no
    decoder get a 400 with one line."""
    from test_batching import FakeHandle, FakeParts, gateway, http, within

    from onnxsplit.running.runner import Parts
    from onnxsplit.running.serve import Gateway
    from onnxsplit.running.serve_local import LocalGateway, PartsService

    model, parts = split
    manifest = json.loads((parts / "manifest.json").read_text())
    if engine == "local":
        g = LocalGateway("decoder", manifest, service := PartsService(Parts(parts)))  # (caches handed on)
    else:
        g = Gateway("decoder", manifest, [[]], [0], FakeHandle(FakeParts(0.0, compute=Parts(parts).run)))
    asks = [{"input_ids": PROMPT, "max_tokens": 12, "id": "a"},
            {"input_ids": [PROMPT[:2]], "parameters": {"max_tokens": 5}},
            {"input_ids": list(range(20)), "max_tokens": 2},  # (a prefill over 16 tokens: two calls)
            {"input_ids": PROMPT, "max_tokens": 80},  # (past the range's 80 positions)
            {"input_ids": [], "max_tokens": 3},
            {"input_ids": PROMPT, "max_tokens": "many"},
            {"input_ids": [1, 640], "max_tokens": 2}]

    async def go():
        answers = [await g(http("POST", "/v2/models/decoder/generate", json.dumps(a).encode())) for a in asks]
        meta = await g(http("GET", "/v2"))
        other = await gateway(FakeParts())(http("POST", "/v2/models/m/generate", json.dumps(asks[0]).encode()))
        return answers, meta, other

    answers, meta, other = within(go())
    if engine == "local":  # a generation past its request's timeout: a 504, and its loop ends then,
        import time       # not 60 steps of 50 ms later

        assert g.shared_why is not None  # (this decoder's caches are handed on: each step is parts.run)
        real = service.parts.run
        service.parts.run = lambda feeds: (time.sleep(0.05), real(feeds))[1]
        g.timeout_s = 0.2
        began = time.monotonic()  # (asyncio.run waits for the loop's thread before it returns)
        late = within(g(http("POST", "/v2/models/decoder/generate",
                             json.dumps({"input_ids": PROMPT, "max_tokens": 60}).encode())))
        assert late.status_code == 504, late.body
        assert time.monotonic() - began < 1.5 and g.generating == 0
        service.close()
    for a, ask in zip(answers[:3], asks):
        assert a.status_code == 200, a.body
        body = json.loads(a.body)
        prompt = ask["input_ids"][0] if isinstance(ask["input_ids"][0], list) else ask["input_ids"]
        n = ask.get("max_tokens") or ask["parameters"]["max_tokens"]
        assert body["output_ids"] == reference(model, prompt, n) and len(body["output_ids"]) == n
        assert body["parameters"]["first_token_ms"] > 0 and body.get("id") == ask.get("id")
    words = ["outside the range the parts were made for", "'input_ids' must be a non-empty list",
             "'max_tokens' must be an integer of at least 0, got \"many\"",
             "token id 640 (position 1 of the prompt) is outside the model's vocabulary"]
    for a, w in zip(answers[3:], words):
        error = json.loads(a.body)["error"]
        assert a.status_code == 400 and w in error and "\n" not in error, error
    assert "generate" in json.loads(meta.body)["extensions"] and g.held == 0
    assert other.status_code == 400 and "not a decoder with past" in json.loads(other.body)["error"]
    note = gen.serve_note(manifest["model"])
    assert note is not None and "POST .../generate" in note
    assert gen.serve_note({"inputs": [{"name": "x"}], "outputs": [{"name": "y"}]}) is None


def test_an_infer_call_whose_mask_is_no_step_of_the_decoder_is_a_400(split):
    """/infer on a decoder's parts: an attention mask that does not span the past and the
    new tokens is the client's error, one line and a 400 (a part's failure deep in the
    attention had answered it 500); a right call after it is answered right, and a mask
    no longer than the past (GroupQueryAttention's static cache) is left to the parts."""
    from test_batching import http, within

    from onnxsplit.running.runner import Parts
    from onnxsplit.running.serve_local import LocalGateway, PartsService

    model, parts = split
    manifest = json.loads((parts / "manifest.json").read_text())
    g = LocalGateway("decoder", manifest, service := PartsService(Parts(parts)))

    def call(ids, past, mask):
        inputs = [{"name": "input_ids", "shape": [1, len(ids)], "datatype": "INT64", "data": ids},
                  {"name": "attention_mask", "shape": [1, mask], "datatype": "INT64", "data": [1] * mask}]
        inputs += [{"name": f"past_key_values.{i}.{kv}", "shape": [1, HEADS, past, DIM], "datatype": "FP32",
                    "data": [0.0] * (HEADS * past * DIM)} for i in range(LAYERS) for kv in ("key", "value")]
        body = json.dumps({"inputs": inputs, "outputs": [{"name": "logits"}]}).encode()
        return within(g(http("POST", "/v2/models/decoder/infer", body)))

    try:
        for past, mask in ((0, 6), (0, 2), (3, 5)):
            a = call(PROMPT, past, mask)
            error = json.loads(a.body)["error"]
            assert a.status_code == 400 and "input 'attention_mask' spans" in error and "\n" not in error, a.body
        right = call(PROMPT, 0, len(PROMPT))
        assert right.status_code == 200, right.body
        logits = np.array(json.loads(right.body)["outputs"][0]["data"]).reshape(1, len(PROMPT), -1)
        assert int(np.argmax(logits[0, -1])) == reference(model, PROMPT, 1)[0]
    finally:
        service.close()
    decoder = gen.decoder_of(manifest["model"])
    decoder.check_call({"input_ids": (1, 1), "attention_mask": (1, 5), "past_key_values.0.key": (1, 2, 10, 16)})


def _one_part(model, planned, span, folder, threads: int = 1):
    """The decoder exported whole as one CPU part: (its folder's manifest, its part's spec)."""
    manifest = _exported(model, planned, span, folder, threads=threads)
    return manifest, manifest["parts"][0]


def _exported(model, planned, span, folder, threads: int = 1, second=lambda name: False) -> dict:
    """The decoder exported on the CPU, the nodes ``second`` names in a second part: its
    folder's manifest."""
    g = OpGraph.from_onnx(model, planned)
    cpu = "CPUExecutionProvider"
    place = {n.name: "cpu1" if second(n.name) else "cpu0" for n in g.nodes}
    out = export(g, place, folder, providers={"cpu0": cpu, "cpu1": cpu}, threads={"cpu0": threads, "cpu1": threads},
                 plan={"objective": "latency"}, shape_range=span).out
    return json.loads((out / "manifest.json").read_text())


class _Handle:
    """A :class:`PartActor` called as serve's gateway calls a part's deployment handle:
    ``handle.method.remote(*args)`` gives an awaitable, the awaitables among its arguments
    resolved first, as Serve resolves the responses passed to a call (a call without them
    runs at once, as Serve dispatches it)."""

    def __init__(self, actor, calls: list):
        self.actor, self.calls = actor, calls

    def __getattr__(self, name: str):
        import asyncio

        method, calls = getattr(self.actor, name), self.calls

        class Method:
            @staticmethod
            def remote(*args):
                calls.append((name, args))
                if not any(isinstance(a, asyncio.Future) for a in args):
                    done = asyncio.get_running_loop().create_future()
                    try:
                        done.set_result(method(*args))
                    except Exception as e:
                        done.set_exception(e)
                    return done

                async def call():
                    return method(*[await a if isinstance(a, asyncio.Future) else a for a in args])
                return asyncio.ensure_future(call())
        return Method()


@pytest.mark.parametrize("layout", ["concatenating", "genai"])
def test_ray_parts_keep_a_generations_caches_between_its_steps(split, tmp_path, layout):
    """serve --engine ray, a decoder across two parts: the first part's replica drives each
    generation, and each part's replica keeps its caches between a generation's calls (kv_cache.KeptCaches: in place for onnxruntime-genai's
    layout, handed from call to call inside the replica for one that concatenates), so a
    step after the first sends no cache; two generations at once keep theirs apart and give
    the reference's tokens; each part lets them go at the end; a replica that lost them
    (restarted) answers a 500 with one line, not a wrong token."""
    import asyncio
    from pathlib import Path

    from test_batching import http, within

    from onnxsplit.running.ray_engine import PartActor
    from onnxsplit.running.serve import Gateway

    cpu = "CPUExecutionProvider"
    if layout == "genai":
        model = Path(__file__).parent / "data" / "llama_tiny_genai" / "model.onnx"
        planned, span = gen.decode_step(model, 64, prefill=8)
        manifest = _exported(model, planned, span, tmp_path / "two",
                             second=lambda name: name.startswith(("/model/layers.1/", "/model/layers.2/", "/lm_head")))
        folder = tmp_path / "two"
    else:
        model, folder = split
        manifest = json.loads((folder / "manifest.json").read_text())
    assert len(manifest["parts"]) == 2
    actors = [PartActor(p, str(folder), None, [cpu], 1, True) for p in manifest["parts"]]
    calls: list = []
    g = Gateway("decoder", manifest, [[], [0]], [0, 1], *[_Handle(a, calls) for a in actors])
    assert g.kept_why is None
    decoder = gen.decoder_of(manifest["model"])
    prompts = [[5, 17, 33, 2], [9, 4]]
    asks = [json.dumps({"input_ids": p, "max_tokens": n}).encode() for p, n in zip(prompts, (12, 7))]

    async def both():
        return await asyncio.gather(*(g(http("POST", "/v2/models/decoder/generate", a)) for a in asks))

    answers = within(both())
    for a, prompt, n in zip(answers, prompts, (12, 7)):
        assert a.status_code == 200, a.body
        assert json.loads(a.body)["output_ids"] == gen.generate(gen.whole_model_run(model), decoder, prompt, n).tokens
    # each generation driven from the first part's replica (PartActor.drive): the first part
    # in process, the second through its handle, one call a token (each prompt in one call)
    assert [name for name, _ in calls].count("drive") == 2
    steps = [args for name, args in calls if name == "step"]
    assert len(steps) == 12 + 7
    later = [args[4] for args in steps if not args[1]]
    assert later and not any(set(feeds) & set(decoder.caches) for feeds in later)
    assert all(a._kept.open == {} for a in actors)
    assert all(a._kept.shared == (layout == "genai") for a in actors if a._kept.caches)

    real = actors[1]._kept.run

    def restarted(generation, first, length, feeds):  # (its caches gone after the first call)
        if not first:
            actors[1]._kept.end(generation)
        return real(generation, first, length, feeds)

    actors[1]._kept.run = restarted
    lost = within(g(http("POST", "/v2/models/decoder/generate", asks[0])))
    error = json.loads(lost.body)["error"]
    assert lost.status_code == 500 and "holds no caches for this generation" in error and "\n" not in error


def test_a_ray_part_holding_the_whole_decoder_generates_in_its_replica(split, tmp_path):
    """serve --engine ray, a decoder in one part: the gateway hands the whole generation to
    the part's replica (ray_engine.PartActor.generate, here called as the replica would
    run it), whose caches stay there between steps: the reference's tokens."""
    from onnxsplit.running.ray_engine import PartActor

    model, _ = split
    cpu = "CPUExecutionProvider"
    manifest, spec = _one_part(model, PLANNED, RANGE, tmp_path / "one")
    actor = PartActor(spec, str(tmp_path / "one"), None, [cpu], 1, True)
    decoder = gen.decoder_of(manifest["model"])
    made = actor.generate(decoder, PROMPT, 12, None, None)
    assert made.tokens == reference(model, PROMPT, 12)
    assert not actor._in_place(decoder)  # (this decoder's attention concatenates: handed on)
    assert actor.generate(decoder, PROMPT, 12, None, None, 60.0).tokens == made.tokens
    # the gateway gave up at the request's timeout: the replica's loop stops at its next token
    with pytest.raises(gen.RunError, match="ran past its request's timeout"):
        actor.generate(decoder, PROMPT, 12, None, None, 0.0)


def test_a_ray_part_alone_lets_its_threads_spin_as_the_runner_does(split, tmp_path):
    """A plan's only part in a Ray actor (a decoder kept whole, served by --engine ray): its
    intra-op threads spin between runs, as in the threaded runner and onnxruntime's default
    session (an 8-layer decoder's decoding ran 2.3x slower with them sleeping); a part beside
    others keeps them from spinning on a core another part needs."""
    from onnxsplit.running.ray_engine import PartActor

    model, _ = split
    cpu, out = "CPUExecutionProvider", str(tmp_path / "one")
    _, spec = _one_part(model, PLANNED, RANGE, tmp_path / "one", threads=0)
    key = "session.intra_op.allow_spinning"
    alone = PartActor(spec, out, None, [cpu], 0, True, alone=True).session
    beside = PartActor(spec, out, None, [cpu], 0, True).session

    def spinning(sess) -> str:
        try:
            return sess.get_session_options().get_session_config_entry(key)
        except RuntimeError:  # (not set: onnxruntime's default, spinning)
            return "default"

    assert spinning(alone) == "default" and spinning(beside) == "0"


def test_a_ray_replica_keeps_a_genai_decoders_caches_in_place(tmp_path, monkeypatch):
    """serve --engine ray on onnxruntime-genai's builder's decoder in one part: the replica
    generates with each cache one buffer bound as past and present (kv_cache.SharedCaches),
    as `onnxsplit generate` does, and gives the tokens of the loop over the original model."""
    from pathlib import Path

    from onnxsplit.running import kv_cache
    from onnxsplit.running.ray_engine import PartActor

    model = Path(__file__).parent / "data" / "llama_tiny_genai" / "model.onnx"
    planned, span = gen.decode_step(model, 64, prefill=8)
    cpu = "CPUExecutionProvider"
    manifest, spec = _one_part(model, planned, span, tmp_path / "one")
    made = []
    real = kv_cache.SharedCaches

    def counted(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(kv_cache, "SharedCaches", counted)
    actor = PartActor(spec, str(tmp_path / "one"), None, [cpu], 1, True)
    decoder = gen.decoder_of(manifest["model"])
    prompt = [5, 17, 33, 99]
    got = actor.generate(decoder, prompt, 10, None, None)
    assert len(made) == 1 and actor._in_place(decoder)
    want = gen.generate(gen.whole_model_run(model), decoder, prompt, 10)
    assert got.tokens == want.tokens and len(got.tokens) == 10
