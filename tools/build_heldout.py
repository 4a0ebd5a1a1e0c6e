"""Build the held-out models the speed benchmarks judge onnxsplit on (random weights, static
shapes, batch 1), and move a model's weights to a machine without a network.

    python tools/build_heldout.py OUT_DIR [--models vit_s,gpt2_6,t5_enc,resnet50,bert_base]
    python tools/build_heldout.py OUT_DIR --refill MODEL.onnx   # new random weights

Needs ``pip install torch==2.13.0 onnxscript transformers``.  Each model is a transformers
config with random weights exported by ``torch.onnx.export(..., dynamo=True)``, weights in
``NAME.onnx.data`` beside.  ``--refill`` writes a fresh ``.data`` file for a graph whose
weights were left behind (the graph alone is small enough to carry to an offline GPU
machine): floats drawn from N(0, 0.02), integers zero -- timing and checks need the
shapes, not the trained values.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SEQ = 128
# model -> (input shapes for the onnxsplit command line)
SHAPES = {
    "vit_s": "pixel_values=1x3x224x224",
    "resnet50": "pixel_values=1x3x224x224",
    "gpt2_6": f"input_ids=1x{SEQ} attention_mask=1x{SEQ}",
    "t5_enc": f"input_ids=1x{SEQ} attention_mask=1x{SEQ}",
    "bert_base": f"input_ids=1x{SEQ} attention_mask=1x{SEQ}",
}


class _First:
    """Wraps a transformers model so the export has one plain tensor output."""

    def __new__(cls, model):
        import torch

        class First(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, *args):
                named = {self.m.main_input_name: args[0]} if len(args) == 1 else \
                    {"input_ids": args[0], "attention_mask": args[1]}
                out = self.m(**named)
                return out[0] if isinstance(out, (tuple, list)) else out

        return First()


def _build(kind: str):
    """(module, example inputs, input names)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    text = (torch.ones(1, SEQ, dtype=torch.int64), torch.ones(1, SEQ, dtype=torch.int64))
    image = (torch.rand(1, 3, 224, 224),)
    if kind == "vit_s":  # ViT-Small/16: 22M parameters
        cfg = tf.ViTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                           intermediate_size=1536)
        return tf.ViTModel(cfg, add_pooling_layer=False), image, ["pixel_values"]
    if kind == "resnet50":
        return tf.ResNetModel(tf.ResNetConfig()), image, ["pixel_values"]
    if kind == "gpt2_6":  # GPT-2 small with 6 layers
        return tf.GPT2Model(tf.GPT2Config(n_layer=6, use_cache=False)), text, \
            ["input_ids", "attention_mask"]
    if kind == "t5_enc":  # t5-small's encoder
        cfg = tf.T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8, use_cache=False)
        return tf.T5EncoderModel(cfg), text, ["input_ids", "attention_mask"]
    if kind == "bert_base":
        return tf.BertModel(tf.BertConfig(), add_pooling_layer=False), text, \
            ["input_ids", "attention_mask"]
    raise SystemExit(f"unknown model '{kind}' (known: {', '.join(SHAPES)})")


def build(kind: str, out: Path, dynamic: bool = False) -> Path:
    """``dynamic``: ``KIND_dyn.onnx`` with its batch (and sequence) dimensions left free
    and named, for shape ranges (``--input-shape input_ids=1..8x16..128``)."""
    import torch

    model, args, names = _build(kind)
    model.eval()
    model.config.return_dict = False
    path = out / (f"{kind}_dyn.onnx" if dynamic else f"{kind}.onnx")
    extra = {}
    if dynamic:
        batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("sequence", min=2, max=1024)
        axes = {0: batch, 1: seq} if len(args) == 2 else {0: batch}
        extra["dynamic_shapes"] = (tuple(dict(axes) for _ in args),)  # (forward takes *args)
    with torch.no_grad():
        torch.onnx.export(_First(model), args, str(path), dynamo=True, external_data=True,
                          input_names=names, opset_version=20, optimize=True, verbose=False, **extra)
    return path


def refill(path: Path) -> None:
    """Write random weights for every external tensor of ``path`` at its recorded offset."""
    import numpy as np
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    m = onnx.load(str(path), load_external_data=False)
    rng = np.random.default_rng(0)
    files: dict[str, list] = {}
    for t in m.graph.initializer:
        if uses_external_data(t):
            info = ExternalDataInfo(t)
            files.setdefault(info.location, []).append((info.offset or 0, t))
    for location, tensors in files.items():
        target = path.parent / location
        tmp = target.with_name(target.name + ".tmp")
        with open(tmp, "wb") as f:
            for offset, t in sorted(tensors, key=lambda x: x[0]):
                dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
                n = int(np.prod(t.dims)) if len(t.dims) else 1
                if dtype.kind == "f":
                    arr = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(dtype)
                else:
                    arr = np.zeros(n, dtype=dtype)
                f.seek(offset)
                f.write(arr.tobytes())
        os.replace(tmp, target)
        print(f"{target}: {len(tensors)} tensors refilled", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--models", default="vit_s,gpt2_6,t5_enc,resnet50")
    ap.add_argument("--refill", type=Path, help="refill this model's external weights instead")
    ap.add_argument("--dynamic", action="store_true",
                    help="leave batch and sequence free (KIND_dyn.onnx), for shape ranges")
    args = ap.parse_args(argv)
    if args.refill:
        refill(args.refill)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for kind in args.models.split(","):
        t = time.perf_counter()
        path = build(kind, args.out, args.dynamic)
        size = sum(p.stat().st_size for p in args.out.glob(f"{path.name}*"))
        print(f"{path}: {size / 1e6:.1f} MB in {time.perf_counter() - t:.0f} s; "
              f"shapes {SHAPES[kind]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
