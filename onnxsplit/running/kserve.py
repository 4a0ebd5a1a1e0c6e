"""The Open Inference Protocol (KServe v2, as Triton speaks it) over HTTP: requests to
feeds, outputs to responses.  Pure functions of bytes and arrays, so the server
(:mod:`onnxsplit.running.serve`) stays a thin layer and the protocol is tested without it.

Tensors travel as JSON (``"data"``: the values, row-major) or, with Triton's binary
tensor extension (what ``tritonclient.http`` sends by default), as raw little-endian
bytes after the JSON header, whose length the ``Inference-Header-Content-Length`` HTTP
header gives; each such tensor says its ``binary_data_size``.  A request that breaks the
protocol raises :class:`ProtocolError` with one line for the 400 answer.

Write-up: docs/machine.md (Serving).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np

from .. import ranges
from ..files import loads

HEADER_LENGTH = "Inference-Header-Content-Length"

DATATYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
             "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
             "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
ONNX_TYPES = {"tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
              "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(int8)": "INT8",
              "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
              "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64"}


class ProtocolError(ValueError):
    """The request breaks the protocol or does not fit the model (a 400 answer)."""


def datatype_of(dtype: Any) -> str:
    """The protocol's datatype of a numpy dtype or an ONNX type string ("tensor(float)")."""
    if isinstance(dtype, str) and dtype in ONNX_TYPES:
        return ONNX_TYPES[dtype]
    kind = np.dtype(dtype)
    for name, np_type in DATATYPES.items():
        if np.dtype(np_type) == kind:
            return name
    raise ProtocolError(f"type {dtype} has no datatype in the protocol")


def model_metadata(name: str, inputs, outputs, shape_range=None) -> dict[str, Any]:
    """GET /v2/models/NAME: the tensors as the manifest lists them ({name, dtype, shape});
    with a ``shape_range``, -1 for a size that varies (as Triton says it), the range itself
    in the tensor's ``parameters``."""
    varying = {d for t in list(inputs) for d, (a, b) in zip(t.get("dims") or [], (shape_range or {}).get(
        t["name"], [])) if d and a != b}

    def shape_of(t) -> list[int]:
        dims = (shape_range or {}).get(t["name"])
        if dims is not None:
            return [n if a == b else -1 for n, (a, b) in zip(t["shape"], dims)]
        return [-1 if d in varying else n for n, d in zip(t["shape"], t.get("dims") or [None] * len(t["shape"]))]

    def tensors(specs):
        out = []
        for t in specs:
            entry = {"name": t["name"], "datatype": datatype_of(t["dtype"]), "shape": shape_of(t)}
            if (shape_range or {}).get(t["name"]):
                entry["parameters"] = {"shape_range": ranges.text(shape_range[t["name"]])}
            out.append(entry)
        return out

    return {"name": name, "versions": ["1"], "platform": "onnxruntime_onnx",
            "inputs": tensors(inputs), "outputs": tensors(outputs)}


def decode_request(body: bytes, header_length: str | None, inputs,
                   shape_range=None) -> tuple[dict[str, np.ndarray], dict]:
    """(feeds by name, how to answer) from an infer request; ``inputs``: the model's input
    specs ({name, dtype, shape}), every one required, with exactly its type and its shape
    (a shape inside ``shape_range``, input -> (lo, hi) per dimension, where given)."""
    try:
        size = int(header_length) if header_length is not None else len(body)
    except ValueError:
        raise ProtocolError(f"{HEADER_LENGTH} must be a number, got {header_length!r}") from None
    if not 0 <= size <= len(body):
        raise ProtocolError(f"{HEADER_LENGTH} {size} is outside the body's {len(body)} bytes")
    try:
        request = loads(body[:size])
    except ValueError as e:  # (a UnicodeDecodeError, or an integer of more digits than Python reads)
        raise ProtocolError(f"the request is not JSON: {e}") from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise ProtocolError("the request must be a JSON object with a list 'inputs'")
    want = {t["name"]: t for t in inputs}
    feeds: dict[str, np.ndarray] = {}
    offset = size
    for t in request["inputs"]:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ProtocolError("each input must be an object with a 'name'")
        name = t["name"]
        if name not in want:
            raise ProtocolError(f"unknown input '{name}' (inputs: {', '.join(want)})")
        if name in feeds:
            raise ProtocolError(f"input '{name}' is given twice")
        spec = want[name]
        shape, datatype = t.get("shape"), t.get("datatype")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                  and d >= 0 for d in shape):
            raise ProtocolError(f"input '{name}': 'shape' must be a list of sizes")
        if shape_range and name in shape_range:
            if (why := ranges.outside({name: shape_range[name]}, {name: shape})):
                raise ProtocolError(why.strip())
        elif list(shape) != list(spec["shape"]):
            raise ProtocolError(f"input '{name}': shape {shape}, the model takes {list(spec['shape'])}")
        if datatype != datatype_of(spec["dtype"]):
            raise ProtocolError(f"input '{name}': datatype {datatype!r}, the model takes "
                                f"{datatype_of(spec['dtype'])}")
        np_type = DATATYPES[datatype]
        count = int(np.prod(shape))
        binary = _parameters(t, f"input '{name}': ").get("binary_data_size")
        if binary is not None:
            if not isinstance(binary, int) or binary != count * np.dtype(np_type).itemsize:
                raise ProtocolError(f"input '{name}': binary_data_size {binary!r} is not "
                                    f"{count} x {np.dtype(np_type).itemsize} bytes")
            if offset + binary > len(body):
                raise ProtocolError(f"input '{name}': the body ends before its {binary} bytes")
            array = np.frombuffer(body[offset:offset + binary], dtype=np.dtype(np_type).newbyteorder("<"))
            offset += binary
        else:
            try:
                array = np.asarray(t.get("data"), dtype=np_type).reshape(-1)
            except (TypeError, ValueError, OverflowError):  # (OverflowError: a value outside the type)
                raise ProtocolError(f"input '{name}': 'data' is not a list of {datatype} values") from None
            if array.size != count:
                raise ProtocolError(f"input '{name}': {array.size} values for shape {shape}")
        rows = spec.get("index_rows")
        if rows and array.size:
            low, high = int(array.min()), int(array.max())
            if low < -rows or high >= rows:
                raise ProtocolError(f"input '{name}': index {low if low < -rows else high} is outside the {rows} "
                                    f"rows of the table it reads (from {-rows} to {rows - 1})")
        feeds[name] = array.astype(np_type, copy=False).reshape(shape)
    missing = [n for n in want if n not in feeds]
    if missing:
        raise ProtocolError(f"input '{missing[0]}' is not given")
    _check_named_dims(feeds, want)
    if offset != len(body):
        raise ProtocolError(f"{len(body) - offset} bytes after the last tensor")
    return feeds, _answer_format(request)


def _parameters(item: Mapping[str, Any], what: str = "") -> Mapping[str, Any]:
    """``item``'s ``parameters`` (an object, or absent)."""
    params = item.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ProtocolError(f"{what}'parameters' must be an object, got {json.dumps(params)[:40]}")
    return params


def _check_named_dims(feeds: Mapping[str, np.ndarray], want: Mapping[str, Any]) -> None:
    """Inputs whose dimensions the model names alike (``dims``: "sequence" of input_ids and
    attention_mask) must agree on them: the parts are not asked what the model does not
    define (OpenVINO failed such a call, or answered it wrong).  (The batch dimension the
    batcher checks too, for requests it takes from elsewhere.)"""
    seen: dict[str, tuple[str, int]] = {}
    for name, array in feeds.items():
        for d, n in zip(want[name].get("dims") or [], array.shape):
            if isinstance(d, str):
                first, size = seen.setdefault(d, (name, n))
                if size != n:
                    raise ProtocolError(f"input '{name}' has {n} along dimension '{d}' but input '{first}' has "
                                        f"{size}: they must agree")


def _answer_format(request: Mapping[str, Any]) -> dict:
    """Which outputs, and which of them in binary: per requested output its
    ``binary_data`` parameter, else the request's ``binary_data_output``."""
    default = _flag(_parameters(request), "binary_data_output", False)
    wanted = request.get("outputs")
    if wanted is None:
        return {"outputs": None, "binary": {}, "default": default}
    if not isinstance(wanted, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                               for o in wanted):
        raise ProtocolError("'outputs' must be a list of objects with a 'name'")
    return {"outputs": [o["name"] for o in wanted], "default": default,
            "binary": {o["name"]: _flag(_parameters(o, f"output '{o['name']}': "), "binary_data", default,
                                        f"output '{o['name']}': ") for o in wanted}}


def _flag(params: Mapping[str, Any], key: str, default: bool, what: str = "") -> bool:
    """A boolean parameter (a string such as "false" had been taken as true)."""
    value = params.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ProtocolError(f"{what}'{key}' must be true or false, got {json.dumps(value)[:40]}")
    return value


def encode_response(model: str, outputs: Mapping[str, np.ndarray], answer: Mapping[str, Any],
                    request_id: str | None = None) -> tuple[bytes, dict[str, str]]:
    """(body, HTTP headers) answering with ``outputs`` as ``answer`` (decode_request's) asks."""
    names = answer["outputs"] if answer["outputs"] is not None else list(outputs)
    unknown = [n for n in names if n not in outputs]
    if unknown:
        raise ProtocolError(f"unknown output '{unknown[0]}' (outputs: {', '.join(outputs)})")
    tensors, blobs = [], []
    for n in names:
        array = np.ascontiguousarray(outputs[n])
        entry: dict[str, Any] = {"name": n, "datatype": datatype_of(array.dtype), "shape": list(array.shape)}
        if answer["binary"].get(n, answer["default"]):
            raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = array.reshape(-1).tolist()
        tensors.append(entry)
    head: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": tensors}
    if request_id:
        head["id"] = request_id
    text = json.dumps(head).encode()
    if not blobs:
        return text, {"Content-Type": "application/json"}
    return text + b"".join(blobs), {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(text))}


def request_id(body: bytes, header_length: str | None) -> str | None:
    """The request's ``id``, to echo (None where it has none or cannot be read)."""
    try:
        size = int(header_length) if header_length is not None else len(body)
        value = json.loads(body[:size]).get("id")
    except Exception:
        return None
    return value if isinstance(value, str) else None


# ---- generation (Triton's generate extension: POST v2/models/NAME/generate) -------------------------

MAX_TOKENS = 16  # new tokens where a generation request does not say (as vLLM and Triton's examples)


def decode_generate(body: bytes) -> dict[str, Any]:
    """A generation request as Triton's generate extension takes one (a JSON object, its
    inputs by name and its ``parameters``): ``input_ids`` (the prompt's token ids, a list
    or a list of one list), ``max_tokens`` and ``eos_token_id`` at the top or among its
    ``parameters``; ``id`` echoed.  Returns {prompt, max_tokens, eos, id}."""
    try:
        request = loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError("the request body is not JSON") from None
    if not isinstance(request, dict):
        raise ProtocolError("the request body must be a JSON object")
    params = _parameters(request)  # (0, "" or [] is no object either)
    ids = request.get("input_ids")
    if isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], list):
        ids = ids[0]  # (a batch of one prompt)
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                       for t in ids):
        raise ProtocolError("'input_ids' must be a non-empty list of token ids (integers of at least 0)")

    def number(key: str, default: int | None) -> int | None:
        value = request.get(key)
        if value is None:  # (null is not given: it had reached the loop, a 500)
            value = params.get(key)
        if value is None:
            value = default
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ProtocolError(f"'{key}' must be an integer of at least 0, got {json.dumps(value)[:40]}")
        return value

    max_tokens = number("max_tokens", MAX_TOKENS)
    if max_tokens == 0:
        raise ProtocolError("'max_tokens' must be at least 1")
    rid = request.get("id")
    return {"prompt": ids, "max_tokens": max_tokens, "eos": number("eos_token_id", None),
            "id": rid if isinstance(rid, str) else None}


def encode_generate(model: str, generated, request_id: str | None = None) -> bytes:
    """The answer to a generation request: the new tokens (``output_ids``) and how long
    the prefill and the decoding took (``generated``: :class:`generate.Generated`)."""
    rates = generated.rates()
    head: dict[str, Any] = {"model_name": model, "model_version": "1", "output_ids": list(generated.tokens),
                            "parameters": {"first_token_ms": round(rates["first_token_ms"], 3),
                                           "decode_tokens_per_s": None if rates["decode_tokens_per_s"] is None
                                           else round(rates["decode_tokens_per_s"], 3)}}
    if request_id:
        head["id"] = request_id
    return json.dumps(head).encode()
