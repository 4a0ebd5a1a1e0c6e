"""Build realistic ONNX models (random weights, no download) to exercise the importer.

Needs packages the library itself does not: ``pip install torch==2.13.0 onnxscript
transformers`` (that exact torch: a CPU build; others pull GBs of CUDA).  Models come from a
transformers config with random weights and are exported by ``torch.onnx.export(...,
dynamo=True)`` with dynamic batch and sequence axes, weights in a ``.data`` file beside.

    python tools/build_test_models.py OUT_DIR [--models tiny_bert,bert_base,gpt2,vit]
    python tools/build_test_models.py OUT_DIR --import-only [--verify]  # import, time, check

``tiny_bert`` is small enough (< 1 MB, weights inline) to be committed as test data and
``small_bert`` (3.6 MB, inline) is the demo model shipped in models/;
``gpt2_large`` (36 layers, 3.1 GB) and ``llama_32`` (a Llama-style decoder: 32 layers,
2.37 GB) are not built by default: models over protobuf's 2 GB limit, LLM-sized.

``<llama size>_genai`` (``llama_tiny_genai``, ``llama_8_genai``, ``llama_32_genai``) is the
same decoder as people export it for generation: a Hugging Face folder with random weights
(scaled so that greedy decoding does not repeat one token) and a trivial tokenizer, made
into ``OUT/<kind>/model.onnx`` (+ ``model.onnx.data``, ``genai_config.json``) by
onnxruntime-genai's model builder (fp32, CPU): GroupQueryAttention and
SkipSimplifiedLayerNormalization (com.microsoft), SimplifiedLayerNormalization (default
domain), the KV cache as ``past_key_values.N.key/value`` in and ``present.N.*`` out.  Needs
``pip install onnxruntime-genai onnx-ir transformers tokenizers torch==2.13.0``.  Each is
checked after the build: prefill and greedy decoding in plain onnxruntime give
transformers' tokens (and onnxruntime-genai's).  ``<llama size>_optimum`` is the same model
in Optimum's layout (plain operators, ``position_ids`` in, past and new concatenated), by the
dynamo exporter, checked the same way.  The test decoder (0.5 MB) is rebuilt with

    python tools/build_test_models.py tests/data --models llama_tiny_genai
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _text_model(kind: str):
    import transformers as tf

    if kind == "tiny_bert":
        cfg = tf.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64,
                            max_position_embeddings=64)
        return tf.BertModel(cfg, add_pooling_layer=True), cfg.vocab_size
    if kind == "small_bert":  # models/small_bert.onnx, the demo model: ~1 MParams, 3.6 MB
        cfg = tf.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=4,
                            num_attention_heads=4, intermediate_size=512,
                            max_position_embeddings=128)
        return tf.BertModel(cfg, add_pooling_layer=True), cfg.vocab_size
    if kind == "bert_base":
        cfg = tf.BertConfig()  # bert-base-uncased sizes: 12 layers, 768 hidden, 110M params
        return tf.BertModel(cfg), cfg.vocab_size
    if kind == "gpt2":
        cfg = tf.GPT2Config(use_cache=False)  # gpt2 (small) sizes: 12 layers, 124M params
        return tf.GPT2Model(cfg), cfg.vocab_size
    if kind == "gpt2_large":
        cfg = tf.GPT2Config(n_embd=1280, n_layer=36, n_head=20, use_cache=False)  # 774M: 3.1 GB
        return tf.GPT2Model(cfg), cfg.vocab_size
    if kind.startswith("llama"):  # a modern decoder: RMSNorm, rotary positions, SwiGLU, GQA
        cfg = tf.LlamaConfig(**LLAMA_SIZES[kind], max_position_embeddings=2048, use_cache=False)
        return tf.LlamaModel(cfg), cfg.vocab_size
    raise ValueError(kind)


LLAMA_SIZES = {
    "llama_tiny": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=256),
    # the decoder of issue 45's report: 8 layers, a cache of 4 heads of 32
    "llama_8": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=8,
                    num_attention_heads=8, num_key_value_heads=4, vocab_size=2048),
    # 32 layers, 592M parameters: 2.37 GB of fp32 weights
    "llama_32": dict(hidden_size=1280, intermediate_size=3456, num_hidden_layers=32,
                     num_attention_heads=20, num_key_value_heads=4, vocab_size=32000),
}
GENAI_SUFFIX = "_genai"
# weights drawn this wide make logits that differ by more than float noise, so greedy
# decoding of the tiny decoder moves on (at transformers' 0.02 its top two logits were
# closer and the tokens fragile); the smallest gap between them is printed by the check
GENAI_INIT_RANGE = 0.2
PROMPT = [5, 17, 33, 99, 140, 7, 200, 64]  # token ids the check decodes after


MARKER = ".built-by-build_test_models"  # in each OUT/<kind> folder this tool made


def _ours_or_absent(dest: Path) -> None:
    """Refuse, in one line, a folder OUT/<kind> that this tool did not make."""
    if dest.exists() and not (dest / MARKER).is_file():
        raise SystemExit(f"{dest} exists and is not a model this tool built: not replaced")


def export_genai(kind: str, out: Path) -> Path:
    """A random-weight Llama as onnxruntime-genai's builder writes it: OUT/<kind>/model.onnx."""
    import shutil
    import subprocess
    import tempfile

    import torch
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    size = LLAMA_SIZES[kind[:-len(GENAI_SUFFIX)]]
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(**size, max_position_embeddings=512, initializer_range=GENAI_INIT_RANGE,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    model = tf.LlamaForCausalLM(cfg).eval()
    dest = out / kind
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf"
        model.save_pretrained(hf)
        # a word-level vocabulary t0..tN: the builder copies a tokenizer beside the model
        tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(cfg.vocab_size)}, unk_token="t0"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2",
                                   pad_token="t0", unk_token="t0").save_pretrained(hf)
        built = Path(tmp) / "built"
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf),
                        "-o", str(built), "-p", "fp32", "-e", "cpu", "-c", str(Path(tmp) / "cache")],
                       check=True, stdout=subprocess.DEVNULL)
        # the new build takes dest's place only where dest is absent or an earlier build of
        # this tool (its MARKER; a genai_config.json alone may be a user's own model): a folder
        # of the user's own is never removed
        _ours_or_absent(dest)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.move(str(built), str(dest))
        (dest / MARKER).write_text("built by tools/build_test_models.py\n")
    with torch.no_grad():
        want = model.generate(torch.tensor([PROMPT]), max_new_tokens=24, do_sample=False,
                              pad_token_id=0)[0, len(PROMPT):].tolist()
    check_decoder(dest, want)
    return dest / "model.onnx"


OPTIMUM_SUFFIX = "_optimum"


def export_optimum(kind: str, out: Path) -> Path:
    """The same random-weight Llama in Optimum's decoder-with-past layout (what
    ``optimum-cli export onnx --task text-generation-with-past`` writes): plain operators,
    inputs ``input_ids``, ``attention_mask``, ``position_ids`` and each layer's
    ``past_key_values.N.key/value`` [batch, kv heads, past_sequence_length, head size],
    outputs ``logits`` and ``present.N.key/value`` (past and new, concatenated), weights in
    ``model.onnx.data`` beside OUT/<kind>/model.onnx (so a model over 2 GB is written too).
    Exported by ``torch.onnx.export(dynamo=True)`` through a module that takes the caches
    as tensors; checked as the builder's decoder is (:func:`check_decoder`)."""
    import torch
    import transformers as tf

    size = LLAMA_SIZES[kind[:-len(OPTIMUM_SUFFIX)]]
    layers, kv = size["num_hidden_layers"], size["num_key_value_heads"]
    head = size["hidden_size"] // size["num_attention_heads"]
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(**size, max_position_embeddings=512, initializer_range=GENAI_INIT_RANGE,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                         attn_implementation="eager")
    model = tf.LlamaForCausalLM(cfg).eval()

    class WithPast(torch.nn.Module):
        """The caches as tensors in and out, in Optimum's order."""

        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = tf.DynamicCache(config=self.lm.config)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            got = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          past_key_values=cache, use_cache=True, return_dict=True)
            presents = []
            for layer in got.past_key_values.layers:
                presents += [layer.keys, layer.values]
            return (got.logits, *presents)

    names = [f"past_key_values.{i}.{w}" for i in range(layers) for w in ("key", "value")]
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("sequence_length", max=512)
    past_len = torch.export.Dim("past_sequence_length", max=511)
    past, new = 4, 3
    args = (torch.randint(3, cfg.vocab_size, (1, new)), torch.ones(1, past + new, dtype=torch.int64),
            torch.arange(past, past + new)[None], *[torch.zeros(1, kv, past, head) for _ in names])
    total = torch.export.Dim("total_sequence_length", max=1023)
    dynamic = [{0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq},
               tuple({0: batch, 2: past_len} for _ in names)]  # (*past: one entry, a tuple)
    dest = out / kind
    _ours_or_absent(dest)  # (its model.onnx and .data are written over)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MARKER).write_text("built by tools/build_test_models.py\n")
    path = dest / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(WithPast(model), args, str(path), dynamo=True, external_data=True,
                          input_names=["input_ids", "attention_mask", "position_ids", *names],
                          output_names=["logits", *[n.replace("past_key_values", "present") for n in names]],
                          dynamic_shapes=dynamic, optimize=True, verbose=False)
        want = model.generate(torch.tensor([PROMPT]), max_new_tokens=24, do_sample=False,
                              pad_token_id=0)[0, len(PROMPT):].tolist()
    check_decoder(dest, want, heads=(kv, head))
    return path


def check_decoder(folder: Path, want: list[int], heads: tuple[int, int] | None = None) -> None:
    """Prefill and greedy decoding of PROMPT in plain onnxruntime (one InferenceSession, the
    cache fed back), against transformers' tokens ``want`` and onnxruntime-genai's."""
    import json

    import numpy as np
    import onnxruntime as ort

    if heads is None:  # (the builder's: its genai_config.json)
        dec = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
        heads = (dec["num_key_value_heads"], dec["head_size"])
    sess = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    inputs = {i.name for i in sess.get_inputs()}
    caches = [i.name for i in sess.get_inputs() if i.name.startswith("past_key_values.")]
    state = {c.replace("past_key_values.", "present."): np.zeros((1, *heads[:1], 0, heads[1]), np.float32)
             for c in caches}
    got, gaps, ids = [], [], PROMPT
    for _ in want:
        past = state["present.0.key"].shape[2]
        feed = {"input_ids": np.array([ids], np.int64),
                "attention_mask": np.ones((1, past + len(ids)), np.int64)}
        if "position_ids" in inputs:  # (Optimum's layout)
            feed["position_ids"] = np.arange(past, past + len(ids), dtype=np.int64)[None]
        feed.update({c: state[c.replace("past_key_values.", "present.")] for c in caches})
        state = dict(zip(names, sess.run(names, feed)))
        logits = state["logits"][0, -1]
        top2 = np.sort(logits)[-2:]
        gaps.append(float(top2[1] - top2[0]))
        got.append(int(logits.argmax()))
        ids = got[-1:]
    print(f"{folder}: prefill of {len(PROMPT)} tokens and {len(got)} decode steps in "
          f"onnxruntime: {len(set(got))} distinct tokens, smallest top-2 logit gap "
          f"{min(gaps):.3g}; transformers' tokens: {'equal' if got == want else 'DIFFER'}",
          flush=True)
    if not (folder / "genai_config.json").is_file():
        if got != want:
            raise SystemExit(f"{folder}: onnxruntime {got}, transformers {want}")
        return
    try:
        import onnxruntime_genai as og
    except ImportError:
        return
    m = og.Model(str(folder))
    params = og.GeneratorParams(m)
    params.set_search_options(max_length=len(PROMPT) + len(want), do_sample=False)
    gen = og.Generator(m, params)
    gen.append_tokens(PROMPT)
    theirs = []
    while not gen.is_done():
        gen.generate_next_token()
        theirs.append(int(gen.get_next_tokens()[0]))
    print(f"  onnxruntime-genai's tokens: {'equal' if theirs == got else 'DIFFER'}", flush=True)
    if got != want or theirs != got:
        raise SystemExit(f"{folder}: onnxruntime {got}, transformers {want}, genai {theirs}")


def export_text(kind: str, out: Path, external: bool) -> Path:
    import torch

    torch.manual_seed(0)
    model, vocab = _text_model(kind)
    model.eval()
    model.config.return_dict = False
    ids = torch.randint(0, vocab, (2, 16), dtype=torch.int64)
    mask = torch.ones(2, 16, dtype=torch.int64)
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("sequence", max=512)
    path = out / f"{kind}.onnx"
    torch.onnx.export(
        model, (), str(path), kwargs={"input_ids": ids, "attention_mask": mask},
        dynamo=True, external_data=external,
        input_names=["input_ids", "attention_mask"],
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
        optimize=True, verbose=False,
    )
    return path


def export_vit(out: Path) -> Path:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.ViTConfig()  # vit-base-patch16-224 sizes: 86M params
    model = tf.ViTModel(cfg, add_pooling_layer=True).eval()
    model.config.return_dict = False
    pixels = torch.rand(1, 3, 224, 224)
    path = out / "vit.onnx"
    torch.onnx.export(
        model, (pixels,), str(path), dynamo=True, external_data=True,
        input_names=["pixel_values"],
        dynamic_shapes={"pixel_values": {0: torch.export.Dim("batch", max=64)}},
        optimize=True, verbose=False,
    )
    return path


SHAPES = {  # the input binding each model is imported with
    "vit": {"pixel_values": (1, 3, 224, 224)},
    "tiny_bert": {"input_ids": (1, 32), "attention_mask": (1, 32)},  # 64 positions at most
}
PAST = 16  # a genai decoder is imported at one decode step after this many tokens


def model_path(out: Path, kind: str) -> Path:
    return out / kind / "model.onnx" if kind.endswith((GENAI_SUFFIX, OPTIMUM_SUFFIX)) else out / f"{kind}.onnx"


def shapes_of(kind: str) -> dict:
    if not kind.endswith((GENAI_SUFFIX, OPTIMUM_SUFFIX)):
        return SHAPES.get(kind, {"input_ids": (1, 128), "attention_mask": (1, 128)})
    size = LLAMA_SIZES[kind.rsplit("_", 1)[0]]
    kv = size["num_key_value_heads"]
    cache = (1, kv, PAST, size["hidden_size"] // size["num_attention_heads"])
    out = {"input_ids": (1, 1), "attention_mask": (1, PAST + 1)}
    if kind.endswith(OPTIMUM_SUFFIX):
        out["position_ids"] = (1, 1)
    out.update({f"past_key_values.{i}.{w}": cache
                for i in range(size["num_hidden_layers"]) for w in ("key", "value")})
    return out


def measured_sizes(path: Path, shapes: dict) -> dict[str, int]:
    """Bytes of every node output when onnxruntime runs the real model (real weights)."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from onnxsplit.shapes import with_all_outputs

    m = with_all_outputs(onnx.load(str(path), load_external_data=False))
    m.ir_version = min(m.ir_version, 10)
    so = ort.SessionOptions()
    so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                str(path.parent))
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feed = {i.name: (rng.random(shapes[i.name], dtype=np.float32) if "float" in i.type
                     else np.ones(shapes[i.name], dtype=np.int64)) for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    return {n: v.nbytes for n, v in zip(names, sess.run(names, feed))}


def import_report(out: Path, kinds: list[str], verify: bool = False) -> None:
    """Import each model with onnxsplit and print its size and the time it took."""
    import onnxruntime  # noqa: F401  (loaded once, outside the timings)

    from onnxsplit.graph import OpGraph

    for kind in kinds:
        path, shapes = model_path(out, kind), shapes_of(kind)
        t = time.perf_counter()
        g = OpGraph.from_onnx(path, shapes)
        dt = time.perf_counter() - t
        acts = [x for x in g.tensors.values() if x.kind == "activation"]
        print(f"{path.relative_to(out)}: {len(g.nodes)} nodes, {len(g.edges)} edges, {len(acts)} "
              f"activations ({sum(x.bytes for x in acts) / 1e6:.1f} MB), "
              f"{len(g.initializers)} weights ({g.weight_bytes / 1e6:.1f} MB), "
              f"sizes from {g.shapes_from}, imported in {dt:.2f} s", flush=True)
        if verify:
            real = measured_sizes(path, shapes)
            wrong = [x.name for x in acts if x.bytes != real[x.name]]
            print(f"  verify: {len(acts) - len(wrong)}/{len(acts)} activation sizes equal "
                  f"onnxruntime's with the real weights{'; wrong: ' + str(wrong[:5]) if wrong else ''}",
                  flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--models", default="tiny_bert,bert_base,gpt2,vit")
    ap.add_argument("--import-only", action="store_true",
                    help="do not build; import the models already in OUT and report")
    ap.add_argument("--verify", action="store_true",
                    help="also run each real model and compare every tensor size")
    args = ap.parse_args(argv)
    kinds = args.models.split(",")
    if args.import_only:
        import_report(args.out, kinds, args.verify)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    genai = any(k.endswith(GENAI_SUFFIX) for k in kinds)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        if genai:
            import onnx_ir  # noqa: F401  (the builder needs it)
            import onnxruntime_genai  # noqa: F401
            import tokenizers  # noqa: F401
        if not all(k.endswith(GENAI_SUFFIX) for k in kinds):  # (the dynamo exporter's)
            import onnxscript  # noqa: F401  (the dynamo exporter needs it)
    except ImportError as e:
        print(f"cannot build models: {e}; pip install torch==2.13.0 onnxscript transformers"
              + (" onnxruntime-genai onnx-ir tokenizers" if genai else ""), file=sys.stderr)
        return 2
    for kind in kinds:
        t = time.perf_counter()
        if kind == "vit":
            path = export_vit(args.out)
        elif kind.endswith(GENAI_SUFFIX):
            path = export_genai(kind, args.out)
        elif kind.endswith(OPTIMUM_SUFFIX):
            path = export_optimum(kind, args.out)
        else:
            path = export_text(kind, args.out, external=kind not in ("tiny_bert", "small_bert"))
        size = sum(p.stat().st_size for p in path.parent.glob(f"{path.name}*"))
        print(f"{path}: {size / 1e6:.1f} MB in {time.perf_counter() - t:.0f} s", flush=True)
    import_report(args.out, kinds, args.verify)
    return 0


if __name__ == "__main__":
    sys.exit(main())
