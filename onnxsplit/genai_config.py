"""A decoder's parts written where onnxruntime-genai runs them: its ``genai_config.json``.

A model that onnxruntime-genai's builder wrote has a ``genai_config.json`` beside it. The
parts folder then gets one too: the original's, with the decoder run as a pipeline of the
parts (``model.type`` ``decoder-pipeline``, ``model.decoder.pipeline``: one stage a part, in
order, each naming its file, inputs and outputs, run on the prompt and on every token), and
the tokenizer files beside it, so that ``og.Model(parts_folder)`` generates through the
split as it does through the original (tests/test_generate.py checks its tokens).  Each
stage's session options carry the part's intra-op threads and, for a part on CUDA, its
provider.  Where a part runs on a provider this config cannot name, none is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

FILE = "genai_config.json"
# the tokenizer's files onnxruntime-genai reads from the model's folder (those present are copied)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model")
_PROVIDERS = {"CPUExecutionProvider": None, "CUDAExecutionProvider": "cuda"}


def pipeline_config(model_path: str | Path, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The parts' ``genai_config.json`` (a dict), or None where the original has none (or
    one without a decoder), or a part's provider cannot be named in it."""
    try:
        config = json.loads((Path(model_path).parent / FILE).read_text())
        decoder = dict(config["model"]["decoder"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    stages = []
    for p in manifest["parts"]:
        if p["execution_provider"] not in _PROVIDERS:
            return None
        options: dict[str, Any] = {"log_id": f"onnxsplit-{p['name']}"}
        if p.get("threads"):
            options["intra_op_num_threads"] = int(p["threads"])
        provider = _PROVIDERS[p["execution_provider"]]
        if provider:
            options["provider_options"] = [{provider: {"device_id": str(p.get("device_id") or 0)}}]
        stages.append({p["name"]: {"filename": p["file"], "inputs": [t["name"] for t in p["inputs"]],
                                   "outputs": [t["name"] for t in p["outputs"]], "session_options": options,
                                   "run_on_prompt": True, "run_on_token_gen": True}})
    decoder = {k: v for k, v in decoder.items() if k != "filename"}
    decoder["pipeline"] = stages
    return {**config, "model": {**config["model"], "type": "decoder-pipeline", "decoder": decoder}}


def tokenizer_files(model_path: str | Path) -> list[Path]:
    """The tokenizer files beside the original model, to be copied beside the parts."""
    folder = Path(model_path).parent
    return [folder / f for f in TOKENIZER_FILES if (folder / f).is_file()]
