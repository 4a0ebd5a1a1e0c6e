"""Gather real ONNX models (held out from the tests) and check each imports and runs.

    python tools/fetch_heldout_models.py OUT_DIR fetch     # light zoo + silero-vad
    python tools/fetch_heldout_models.py OUT_DIR report [light,silero,hf]  # import + ORT run

``fetch`` copies the onnx wheel's "light" zoo models (weights made by ConstantOfShape) to
OUT/light and extracts the silero-vad wheel's ONNX files (trained, If subgraphs) to
OUT/silero (``pip download silero-vad``: needs the registry).  The transformers models are
built by ``tools/build_test_models.py OUT/hf``.  ``report`` writes OUT/REPORT.md.
"""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

TEXT = {  # model -> (vocab size, max positions usable)
    "tiny_bert": (128, 64), "bert_base": (30522, 512), "gpt2": (50257, 512),
    "gpt2_large": (50257, 512),
}


def fetch(out: Path) -> None:
    import onnx

    light = Path(onnx.__file__).parent / "backend/test/data/light"
    (out / "light").mkdir(parents=True, exist_ok=True)
    for p in sorted(light.glob("*.onnx")):
        shutil.copy(p, out / "light" / p.name)
    (out / "silero").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "silero-vad", "--no-deps",
                        "-d", d], check=True)
        whl = next(Path(d).glob("silero_vad-*.whl"))
        with zipfile.ZipFile(whl) as z:
            for n in z.namelist():
                if n.endswith(".onnx"):
                    (out / "silero" / Path(n).name).write_bytes(z.read(n))
        print(f"silero from {whl.name}")


def binding(path: Path, model) -> tuple[dict, dict, str]:
    """(input_shapes for OpGraph, ORT feed, note on valid values) for a model."""
    rng = np.random.default_rng(0)
    stem = path.stem
    inits = {i.name for i in model.graph.initializer}
    ins = [i for i in model.graph.input if i.name not in inits]
    if path.parent.name == "light" or stem == "vit":
        name = ins[0].name
        shapes = {name: (1, 3, 224, 224)}
        return shapes, {name: rng.random((1, 3, 224, 224), dtype=np.float32)}, \
            "float32 image; any values"
    if stem in TEXT:
        vocab, maxpos = TEXT[stem]
        shapes = {"input_ids": (1, 32), "attention_mask": (1, 32)}
        feed = {"input_ids": rng.integers(0, vocab, (1, 32), dtype=np.int64),
                "attention_mask": np.ones((1, 32), dtype=np.int64)}
        return shapes, feed, f"int64 token ids in [0, {vocab}); mask 0/1; sequence <= {maxpos}"
    if stem == "silero_vad_16k_sequence":
        shapes = {"input": (8, 576)}
        feed = {"input": rng.standard_normal((8, 576), dtype=np.float32) * 0.1,
                "h": np.zeros((1, 1, 128), np.float32), "c": np.zeros((1, 1, 128), np.float32)}
        return shapes, feed, ("input = N frames of 512 samples + 64 context (576) at 16 kHz; "
                              "h, c LSTM state zeros")
    if stem.startswith("silero"):
        names = [i.name for i in ins]
        shapes = {"input": (1, 576), "state": (2, 1, 128)}
        feed = {"input": rng.standard_normal((1, 576), dtype=np.float32) * 0.1,
                "state": np.zeros((2, 1, 128), np.float32)}
        note = "input = 512 samples + 64 context at 16 kHz (256 + 32 = 288 at 8 kHz); state zeros"
        if "sr" in names:
            shapes["sr"] = ()
            feed["sr"] = np.array(16000, dtype=np.int64)
            note += "; sr scalar int64 16000 (or 8000)"
        return shapes, feed, note
    raise ValueError(f"no binding for {path}")


def ort_run(path: Path, feed: dict):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outs = sess.run(None, feed)
    return [(o.name, tuple(v.shape), str(v.dtype)) for o, v in zip(sess.get_outputs(), outs)]


def count_nodes(graph) -> tuple[int, int, list[str]]:
    total, ctrl = 0, set()
    for n in graph.node:
        total += 1
        if n.op_type in ("If", "Loop", "Scan"):
            ctrl.add(n.op_type)
        for a in n.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                t, _, c = count_nodes(g)
                total += t
                ctrl.update(c)
    return len(graph.node), total, sorted(ctrl)


def describe_inputs(model) -> list[str]:
    from onnx import helper

    inits = {i.name for i in model.graph.initializer}
    out = []
    for v in model.graph.input:
        if v.name in inits:
            continue
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                for d in t.shape.dim]
        out.append(f"{v.name}: {helper.tensor_dtype_to_np_dtype(t.elem_type)}{dims}")
    return out


def report(out: Path, subdirs: list[str] | None = None) -> list[dict]:
    import onnx

    from onnxsplit.graph import OpGraph

    paths = sorted(Path(p) for d in (subdirs or ["*"]) for p in glob.glob(str(out / d / "*.onnx")))
    rows = []
    for path in paths:
        m = onnx.load(str(path), load_external_data=False)
        size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        top, total, ctrl = count_nodes(m.graph)
        shapes, feed, note = binding(path, m)
        row = {"path": str(path), "bytes": size, "nodes": top, "nodes_with_subgraphs": total,
               "control_flow": ctrl, "inputs": describe_inputs(m), "binding": shapes,
               "values": note, "ir": m.ir_version,
               "opset": {o.domain or "ai.onnx": o.version for o in m.opset_import}}
        t = time.perf_counter()
        try:
            g = OpGraph.from_onnx(path, shapes)
            row["opgraph"] = (f"ok: {len(g.nodes)} nodes, {len(g.initializers)} weights "
                              f"({g.weight_bytes / 1e6:.1f} MB), shapes from {g.shapes_from}")
        except Exception as e:  # noqa: BLE001
            row["opgraph"] = f"FAIL {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        row["opgraph_s"] = round(time.perf_counter() - t, 2)
        del m
        t = time.perf_counter()
        try:
            row["ort"] = "ok: " + ", ".join(f"{n}{list(s)}" for n, s, _ in ort_run(path, feed))
        except Exception as e:  # noqa: BLE001
            row["ort"] = f"FAIL {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        row["ort_s"] = round(time.perf_counter() - t, 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    (out / f"report_{'_'.join(subdirs or ['all'])}.json").write_text(json.dumps(rows, indent=1))
    return rows


def main(argv=None) -> int:
    out, what = Path(sys.argv[1]), sys.argv[2]
    if what == "fetch":
        fetch(out)
    else:
        report(out, sys.argv[3].split(",") if len(sys.argv) > 3 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
