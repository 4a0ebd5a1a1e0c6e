"""A parts folder's manifest, read as untrusted input.

``run``, ``serve`` and the Ray engine take a folder a user may have edited, copied from
elsewhere or damaged.  Before anything is loaded or allocated, :func:`read_manifest`
checks every field the runner uses: its types (:func:`field_problem`), and against the
parts it names (:func:`parts_problem`: each part file is there and is an ONNX model whose
inputs and outputs carry the names, element types and fixed dimensions the manifest
says; the model's inputs are some part's, their byte counts add up, and one sample of
them fits the memory limit).  A problem is one line naming the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from .. import limits, ranges
from ..errors import RunError
from ..files import loads
from ..export import ANNOTATED, FORMAT, MANIFEST

# element type name -> bytes per element (the dtypes a manifest spells as onnx does)
_ITEMSIZE = {"float": 4, "float32": 4, "double": 8, "float64": 8, "float16": 2, "bfloat16": 2,
             "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint64": 8, "uint32": 4,
             "uint16": 2, "uint8": 1, "bool": 1}


def read_manifest(parts_dir: str | Path) -> dict[str, Any]:
    """The folder's manifest, checked field by field and against its parts; RunError with
    one line naming the first problem."""
    path = Path(parts_dir) / MANIFEST
    if not Path(parts_dir).is_dir():
        raise RunError(f"'{parts_dir}' is not a folder of parts")
    try:
        if not path.is_file():  # (a pipe or a device there would block or never end)
            raise FileNotFoundError(path)
        manifest = loads(path.read_text())
    except OSError:
        raise RunError(f"'{parts_dir}' has no {MANIFEST}: not a folder written by onnxsplit") from None
    except json.JSONDecodeError as e:
        raise RunError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except UnicodeDecodeError:
        raise RunError(f"{path}: not a JSON text file") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise RunError(f"{path}: not an onnxsplit manifest (format is not '{FORMAT}')")
    problem = field_problem(manifest) or parts_problem(Path(parts_dir), manifest)
    if problem:
        raise RunError(f"{path}: {problem}")
    return manifest


def field_problem(m: Mapping[str, Any]) -> str | None:
    """The first field of a manifest the runner cannot use (missing or of the wrong type),
    or None."""
    def tensors(x, where: str) -> str | None:
        if not isinstance(x, list):
            return f"{where} must be a list"
        for i, t in enumerate(x):
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                return f"{where}[{i}] must be an object with a 'name'"
        return None

    model = m.get("model")
    if not isinstance(model, dict):
        return "'model' must be an object"
    if not isinstance(model.get("path"), str) or not model["path"]:
        return "model.path must name the original model file"
    for key in ("inputs", "outputs"):
        if (why := tensors(model.get(key), f"model.{key}")):
            return why
    for i, t in enumerate(model["inputs"]):
        if not isinstance(t.get("shape"), list) or not isinstance(t.get("dtype"), str) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in t["shape"]):
            return f"model.inputs[{i}] needs a 'dtype' and a 'shape' of integers >= 0"
    for i, t in enumerate(model["inputs"]):
        for key in ("index_below", "index_rows"):
            below = t.get(key)
            if below is not None and (isinstance(below, bool) or not isinstance(below, int) or below < 1):
                return f"model.inputs[{i}].{key} must be an integer of at least 1"
        dims = t.get("dims")
        if dims is not None and (not isinstance(dims, list) or not all(d is None or isinstance(d, str)
                                                                      for d in dims)):
            return f"model.inputs[{i}].dims must be a list of dimension names (or null)"
    if (why := _range_problem(model)):
        return why
    parts = m.get("parts")
    if not isinstance(parts, list) or not parts:
        return "'parts' must be a non-empty list"
    for i, p in enumerate(parts):
        if not isinstance(p, dict):
            return f"parts[{i}] must be an object"
        for key in ("name", "file", "device", "execution_provider"):
            if not isinstance(p.get(key), str) or not p[key]:
                return f"parts[{i}].{key} must be a non-empty string"
        if Path(p["file"]).name != p["file"]:
            return f"parts[{i}].file must name a file in the folder, got '{p['file']}'"
        for key in ("inputs", "outputs"):
            if (why := tensors(p.get(key), f"parts[{i}].{key}")):
                return why
        for key in ("threads", "replicas", "device_id"):
            v = p.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= limits.MAX_COPIES):
                return f"parts[{i}].{key} must be an integer from 0 to {limits.MAX_COPIES}"
        if p.get("optimization") not in (None, "all", "disabled"):
            return f"parts[{i}].optimization must be 'all' or 'disabled'"
    if m.get("run_as", "pipeline") not in ("pipeline", "session"):
        return "'run_as' must be 'pipeline' or 'session'"
    if not model["outputs"]:
        return "model.outputs must name at least one output (a check of none confirms nothing)"
    if m.get("run_as", "pipeline") == "pipeline":
        made = {t["name"] for p in parts for t in p["outputs"]}
        given = {t["name"] for t in model["inputs"]}
        for k, t in enumerate(model["outputs"]):
            if t["name"] not in made:
                return f"model.outputs[{k}] '{t['name']}' is made by no part"
        earlier: set[str] = set()  # (the pipeline runs the parts in the manifest's order)
        for i, p in enumerate(parts):
            for k, t in enumerate(p["inputs"]):
                if t["name"] not in earlier and t["name"] not in given:
                    return (f"parts[{i}].inputs[{k}] '{t['name']}' is neither an input of the model "
                            "nor made by an earlier part")
            earlier |= {t["name"] for t in p["outputs"]}
    return _predicted_problem(m.get("predicted"))


def _predicted_problem(predicted) -> str | None:
    """What is wrong with a manifest's ``predicted`` figures (``run`` sets what it measures
    beside them): an object whose rates and latencies, where given, are positive numbers."""
    if predicted is None:
        return None
    if not isinstance(predicted, dict):
        return "'predicted' must be an object"
    rows = [("predicted", predicted)]
    baselines = predicted.get("baselines", {})
    if not isinstance(baselines, dict) or not all(isinstance(v, dict) for v in baselines.values()):
        return "predicted.baselines must map names to objects"
    rows += [(f"predicted.baselines.{k}", v) for k, v in baselines.items()]
    for where, row in rows:
        for key in ("latency_ms", "throughput_per_s"):
            v = row.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf):
                return f"{where}.{key} must be a positive number, got {json.dumps(v)[:40]}"
    return None


def _range_problem(model: Mapping[str, Any]) -> str | None:
    """What is wrong with ``model.shape_range`` (inputs it names, the planned shapes in it)."""
    try:
        r = ranges.from_json(model.get("shape_range"))
    except ValueError as e:
        return f"model.shape_range: {e}"
    if r is None:
        return None
    names = {t["name"] for t in model["inputs"]}
    for k in r:
        if k not in names:
            return f"model.shape_range names '{k}', which is not an input of the model"
    why = ranges.outside(r, {t["name"]: t["shape"] for t in model["inputs"]})
    return f"model.inputs do not lie in model.shape_range:{why}" if why else None


def shape_range(m: Mapping[str, Any]) -> ranges.Range | None:
    """The shapes a (checked) manifest's parts are made for, or None: its one shape."""
    return ranges.from_json(m["model"].get("shape_range"))


def inputs_at(m: Mapping[str, Any], given: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The model's input specs at the shapes ``given`` (input -> sizes; the others follow
    by dimension names, :func:`onnxsplit.ranges.follow_names`), checked: in the manifest's
    range (its one shape where it has none) and one sample within the memory limit.
    RunError with one line."""
    from ..shapes import bytes_text

    specs = m["model"]["inputs"]
    unknown = [k for k in given if k not in {t["name"] for t in specs}]
    if unknown:
        raise RunError(f"--shape names '{unknown[0]}', which is not an input of the model "
                       f"(inputs: {', '.join(t['name'] for t in specs)})")
    shapes = ranges.follow_names({k: tuple(v) for k, v in given.items()}, specs)
    r = shape_range(m) or {t["name"]: [(n, n) for n in t["shape"]] for t in specs}
    why = ranges.outside(r, shapes)
    if why:
        made = "made for" if is_range(m) else "made for the one shape"
        raise RunError(f"shape outside what the parts are {made}:{why}")
    out = [dict(t, shape=list(shapes[t["name"]]),
                bytes=int(math.prod(shapes[t["name"]]) * _ITEMSIZE.get(_dtype(t["dtype"]), 0)))
           for t in specs]
    total = sum(t["bytes"] for t in out)
    if total > limits.limit_bytes():
        raise RunError(f"one sample at that shape takes {bytes_text(total)}, above the memory limit of "
                       f"{bytes_text(limits.limit_bytes())} (--memory-limit)")
    return out


def is_range(m: Mapping[str, Any]) -> bool:
    return ranges.is_range(shape_range(m))


def _graph_io(path: Path) -> tuple[dict[str, tuple[str, list]], dict[str, tuple[str, list]]] | str:
    """(inputs, outputs) of the ONNX model at ``path``, name -> (element type, dims: an
    int where fixed, None where not), read without its weights; or why it cannot be."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        return f"is not an ONNX model ({' '.join(str(e).split())[:120]})"
    weights = {t.name for t in model.graph.initializer}

    def io(values) -> dict[str, tuple[str, list]]:
        out = {}
        for v in values:
            if v.name in weights or not v.type.HasField("tensor_type"):
                continue
            tt = v.type.tensor_type
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else ""
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim] \
                if tt.HasField("shape") else None
            out[v.name] = (dtype, dims)
        return out

    return io(model.graph.input), io(model.graph.output)


def _dtype(name: str) -> str:
    """'tensor(float)' or 'float32' -> numpy's name ('float32')."""
    name = name[7:-1] if name.startswith("tensor(") and name.endswith(")") else name
    return {"float": "float32", "double": "float64"}.get(name, name)


def _tensor_problem(t: Mapping[str, Any], where: str, declared: tuple[str, list] | None) -> str | None:
    """What the manifest says of a tensor against what the part file declares."""
    if declared is None:
        return None
    dtype, dims = declared
    if isinstance(t.get("dtype"), str) and dtype and _dtype(t["dtype"]) != dtype:
        return f"{where} says dtype {t['dtype']}, the part file {dtype}"
    shape = t.get("shape")
    if isinstance(shape, list) and dims is not None:
        if len(shape) != len(dims):
            return f"{where}.shape {shape} has {len(shape)} dimensions, the part file {len(dims)}"
        for k, (a, b) in enumerate(zip(shape, dims)):
            if b is not None and b > 0 and a != b:
                return f"{where}.shape {shape}: dimension {k} is {b} in the part file"
    return None


def parts_problem(folder: Path, m: Mapping[str, Any]) -> str | None:
    """The first thing a manifest says that its part files contradict (names, element
    types, fixed dimensions, byte counts), or a sample of the model's inputs that would
    not fit the memory limit; None where all holds."""
    from ..shapes import bytes_text

    declared_in: dict[str, tuple[str, list]] = {}
    files = [(f"parts[{i}]", p) for i, p in enumerate(m["parts"])]
    if m.get("run_as") == "session":
        files = [("annotated model", {"file": ANNOTATED, "inputs": m["model"]["inputs"],
                                      "outputs": m["model"]["outputs"]})]
    for where, p in files:
        path = folder / p["file"]
        if not path.is_file():
            return f"{where}.file '{p['file']}' is not in the folder"
        got = _graph_io(path)
        if isinstance(got, str):
            return f"{where}.file '{p['file']}' {got}"
        ins, outs = got
        declared_in.update(ins)
        for key, have in (("inputs", ins), ("outputs", outs)):
            for k, t in enumerate(p.get(key) or []):
                if t["name"] not in have:
                    return f"{where}.{key}[{k}] '{t['name']}' is not an {key[:-1]} of {p['file']}"
                if (why := _tensor_problem(t, f"{where}.{key}[{k}]", have[t["name"]])):
                    return why
    total = 0.0
    r = shape_range(m)
    largest = ranges.corners(r)[1] if r else {}  # (the largest sample the range lets in)
    for i, t in enumerate(m["model"]["inputs"]):
        where = f"model.inputs[{i}]"
        if (why := _tensor_problem(t, where, declared_in.get(t["name"]))):
            return why
        size = _ITEMSIZE.get(_dtype(t["dtype"]))
        if size is None:
            continue  # (a string or other input: its values are given, not made)
        nbytes = float(math.prod(t["shape"])) * size
        if isinstance(t.get("bytes"), int) and not isinstance(t["bytes"], bool) and t["bytes"] != nbytes:
            return f"{where}.bytes is {t['bytes']}, but {t['dtype']} of shape {t['shape']} is {int(nbytes)}"
        total += float(math.prod(largest.get(t["name"], t["shape"]))) * size
    if total > limits.limit_bytes():
        shapes = ", ".join(str(list(largest.get(t["name"], t["shape"]))) for t in m["model"]["inputs"])
        return (f"model.inputs: one sample of shape {shapes} takes {bytes_text(total)}, "
                f"above the memory limit of {bytes_text(limits.limit_bytes())} (--memory-limit)")
    return None
