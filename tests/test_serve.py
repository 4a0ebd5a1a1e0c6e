"""``onnxsplit serve``'s Open Inference Protocol, against tritonclient's own encoder and
decoder (the server itself, under load: test_served.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from onnxsplit.running.kserve import (HEADER_LENGTH, MAX_TOKENS, ProtocolError, decode_generate, decode_request,
                                      encode_response, model_metadata)

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.http import InferInput, InferRequestedOutput, InferResult  # noqa: E402
from tritonclient.http._utils import _get_inference_request  # noqa: E402

INPUTS = [{"name": "x", "dtype": "tensor(float)", "shape": [2, 3]},
          {"name": "ids", "dtype": "tensor(int64)", "shape": [2]}]


def triton_request(x, ids, binary: bool, outputs=None) -> tuple[bytes, str | None]:
    """The body tritonclient.http sends, and its header length (None: JSON only)."""
    a, b = InferInput("x", list(x.shape), "FP32"), InferInput("ids", list(ids.shape), "INT64")
    a.set_data_from_numpy(x, binary_data=binary)
    b.set_data_from_numpy(ids, binary_data=binary)
    body, json_size = _get_inference_request([a, b], "r7", outputs, 0, False, False, 0, None, None)
    return body, (str(json_size) if json_size is not None else None)


@pytest.mark.parametrize("binary", [True, False])
def test_requests_as_tritonclient_sends_them(binary):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    ids = np.array([5, -3], dtype=np.int64)
    body, length = triton_request(x, ids, binary)
    feeds, answer = decode_request(body, length, INPUTS)
    np.testing.assert_array_equal(feeds["x"], x)
    np.testing.assert_array_equal(feeds["ids"], ids)
    assert feeds["x"].dtype == np.float32 and feeds["ids"].dtype == np.int64
    # no outputs named: tritonclient asks for every output in binary
    assert answer == {"outputs": None, "binary": {}, "default": True}


@pytest.mark.parametrize("binary", [True, False])
def test_responses_as_tritonclient_reads_them(binary):
    outs = {"y": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "n": np.array([1, 2], np.int64)}
    body, length = triton_request(np.zeros((2, 3), np.float32), np.zeros(2, np.int64), True,
                                  outputs=[InferRequestedOutput("y", binary_data=binary), InferRequestedOutput("n")])
    _, answer = decode_request(body, length, INPUTS)
    data, headers = encode_response("m", outs, answer, "r7")
    got = InferResult.from_response_body(data, header_length=int(headers[HEADER_LENGTH])
                                         if HEADER_LENGTH in headers else None)
    np.testing.assert_array_equal(got.as_numpy("y"), outs["y"])
    np.testing.assert_array_equal(got.as_numpy("n"), outs["n"])
    assert got.get_response()["id"] == "r7" and got.get_response()["model_name"] == "m"
    assert (HEADER_LENGTH in headers) == True  # noqa: E712  ("n" is binary by default)


@pytest.mark.parametrize("body, words", [
    (b"not json", "not JSON"),
    (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not JSON: nested too deeply"),  # (not a 500)
    (b'{"inputs": 3}', "list 'inputs'"),
    (b'{"inputs": [{"name": "z", "shape": [1], "datatype": "FP32", "data": [1]}]}', "unknown input 'z'"),
    (b'{"inputs": [{"name": "x", "shape": [3, 2], "datatype": "FP32", "data": [1,2,3,4,5,6]}]}',
     r"shape \[3, 2\], the model takes \[2, 3\]"),
    (b'{"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP64", "data": [1,2,3,4,5,6]}]}',
     "datatype 'FP64', the model takes FP32"),
    (b'{"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1,2,3]}]}', "3 values"),
    (b'{"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1,2,3,4,5,6]}]}',
     "input 'ids' is not given"),
    (b'{"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": ["a",2,3,4,5,6]}]}', "not a list"),
])
def test_a_bad_request_is_one_line(body, words):
    with pytest.raises(ProtocolError, match=words) as e:
        decode_request(body, None, INPUTS)
    assert "\n" not in str(e.value)


X = '{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1,2,3,4,5,6]}'
IDS = '{"name": "ids", "shape": [2], "datatype": "INT64", "data": [1,2]}'


def test_the_local_engine_answers_a_request_as_soon_as_its_outputs_are_out(tmp_path, monkeypatch):
    """Two streams of one part: a request submitted after one that is still running is
    answered when its own run ends (it had waited for the earlier one's: a batch of 1 row
    behind a batch of 6 on the other stream, and batching served fewer requests than none)."""
    import threading

    import onnxruntime as ort

    from onnx_models import mlp
    from onnxsplit.export import export
    from onnxsplit.graph import OpGraph
    from onnxsplit.running.runner import Parts
    from onnxsplit.running.serve_local import PartsService

    model = mlp(tmp_path / "m.onnx", layers=2, width=16, dynamic_batch=True)
    g = OpGraph.from_onnx(str(model), {"x": [2, 16]})
    out = export(g, {n.name: "cpu0" for n in g.nodes}, tmp_path / "p",
                 providers={"cpu0": "CPUExecutionProvider"}, threads={"cpu0": 1}, replicas={"cpu0": 2},
                 shape_range={"x": [[1, 8], [16, 16]]}).out
    parts = Parts(out, served=True)
    assert parts.default_depth() >= 2
    release, started = threading.Event(), threading.Event()
    real = parts._call

    def slow_first(i, values, copy=0):
        if float(values["x"][0, 0]) == 777.0:
            started.set()
            assert release.wait(timeout=60)
        return real(i, values, copy)

    monkeypatch.setattr(parts, "_call", slow_first)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    service = PartsService(parts)
    try:
        first = np.full((6, 16), 777.0, np.float32)
        later = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)
        a = service.submit({"x": first})
        assert started.wait(timeout=30)
        b = service.submit({"x": later})
        got = b.result(timeout=30)  # (the first still running on the other stream)
        assert not a.done()
        np.testing.assert_allclose(got[session.get_outputs()[0].name], session.run(None, {"x": later})[0],
                                   rtol=1e-5, atol=1e-6)
        release.set()
        np.testing.assert_allclose(a.result(timeout=30)[session.get_outputs()[0].name],
                                   session.run(None, {"x": first})[0], rtol=1e-5, atol=1e-6)
    finally:
        release.set()
        service.close()


@pytest.mark.parametrize("body, words", [
    # each of these had been a 500 (a Python error's words, or a part failing on what it was given)
    ('{"inputs": [%s, %s], "parameters": [1]}' % (X, IDS), "'parameters' must be an object"),
    ('{"inputs": [%s, %s], "parameters": "x"}' % (X, IDS), "'parameters' must be an object"),
    ('{"inputs": [%s, %s], "outputs": [{"name": "y", "parameters": 5}]}' % (X, IDS),
     "output 'y': 'parameters' must be an object"),
    ('{"inputs": [%s, {"name": "ids", "shape": [2], "datatype": "INT64", "data": [1,2], "parameters": [1]}]}' % X,
     "input 'ids': 'parameters' must be an object"),
    ('{"inputs": [%s, {"name": "ids", "shape": [2], "datatype": "INT64", "data": [1, %d]}]}' % (X, 2 ** 70),
     "'data' is not a list of INT64 values"),
    ('{"inputs": [%s, {"name": "ids", "shape": [2], "datatype": "INT64", "data": [1, Infinity]}]}' % X,
     "'data' is not a list of INT64 values"),
    ('{"inputs": [%s, {"name": "ids", "shape": [2], "datatype": "INT64", "data": [1, %s]}]}' % (X, "9" * 5000),
     "not JSON"),
    ('{"inputs": [{"name": "x", "shape": [true, 3], "datatype": "FP32", "data": [1,2,3]}, %s]}' % IDS,
     "'shape' must be a list of sizes"),
    ('{"inputs": [%s, %s, %s]}' % (X, IDS, IDS), "input 'ids' is given twice"),
    # a string for a flag had been taken as true (binary outputs the client did not ask for)
    ('{"inputs": [%s, %s], "outputs": [{"name": "y", "parameters": {"binary_data": "no"}}]}' % (X, IDS),
     "output 'y': 'binary_data' must be true or false, got \"no\""),
    ('{"inputs": [%s, %s], "parameters": {"binary_data_output": 0}}' % (X, IDS),
     "'binary_data_output' must be true or false, got 0"),
])
def test_a_bad_request_of_odd_types_is_a_400_not_a_500(body, words):
    with pytest.raises(ProtocolError, match=words) as e:
        decode_request(body.encode(), None, INPUTS)
    assert "\n" not in str(e.value)


def test_inputs_that_name_a_dimension_alike_must_agree_on_it():
    """input_ids 2x16 beside an attention_mask 2x17 reached the parts: OpenVINO failed the
    call (a 500 for the client's mistake) or answered it as if both were 16 long."""
    specs = [{"name": n, "dtype": "tensor(int64)", "shape": [2, 16], "dims": ["batch", "sequence"]}
             for n in ("input_ids", "attention_mask")]
    rng = {n: [(1, 4), (8, 64)] for n in ("input_ids", "attention_mask")}

    def body(seq_mask):
        return json.dumps({"inputs": [
            {"name": "input_ids", "shape": [2, 16], "datatype": "INT64", "data": [1] * 32},
            {"name": "attention_mask", "shape": [2, seq_mask], "datatype": "INT64", "data": [1] * 2 * seq_mask}]})

    feeds, _ = decode_request(body(16).encode(), None, specs, rng)
    assert feeds["attention_mask"].shape == (2, 16)
    with pytest.raises(ProtocolError, match="input 'attention_mask' has 17 along dimension 'sequence' but input "
                                            "'input_ids' has 16: they must agree"):
        decode_request(body(17).encode(), None, specs, rng)


def test_every_method_and_path_is_answered_in_the_protocols_json():
    """Through the local engine's ASGI application: a PUT had been Starlette's plain-text
    405, a path holding a newline its plain-text 404; HEAD answers as GET does."""
    import asyncio

    from test_batching import FakeParts, gateway

    from onnxsplit.running.serve_local import app_of

    app = app_of(gateway(FakeParts()))

    async def ask(method: str, path: str):
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        await app({"type": "http", "method": method, "path": path, "raw_path": path.encode(), "headers": [],
                   "query_string": b"", "scheme": "http", "server": ("127.0.0.1", 8000), "root_path": "",
                   "http_version": "1.1"}, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    for method, path in [("PUT", "/v2/models/m/infer"), ("DELETE", "/v2"), ("GET", "/v2/models/a\nb/ready")]:
        status, body = asyncio.run(ask(method, path))
        error = json.loads(body)["error"]
        assert status == 404 and "\n" not in error and ("no route" in error or "unknown model" in error), body
    assert asyncio.run(ask("HEAD", "/v2/health/ready"))[0] == 200
    assert asyncio.run(ask("GET", "/v2/health/ready")) == (200, b"{}")


def test_binary_sizes_are_checked():
    body, length = triton_request(np.zeros((2, 3), np.float32), np.zeros(2, np.int64), True)
    with pytest.raises(ProtocolError, match="ends before"):
        decode_request(body[:-4], length, INPUTS)
    with pytest.raises(ProtocolError, match="bytes after the last tensor"):
        decode_request(body + b"xx", length, INPUTS)
    with pytest.raises(ProtocolError, match="outside the body"):
        decode_request(body, str(len(body) + 1), INPUTS)


def test_metadata_names_the_tensors():
    meta = model_metadata("m", INPUTS, [{"name": "y", "dtype": "tensor(float16)", "shape": [1]}])
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [2, 3]},
                              {"name": "ids", "datatype": "INT64", "shape": [2]}]
    assert meta["outputs"][0]["datatype"] == "FP16"


def test_the_local_engine_fails_only_what_a_failing_part_held(tmp_path, monkeypatch):
    """serve's local engine (serve_local.PartsService): requests from several threads each
    get their own outputs; a part that fails fails the request it ran with the part's
    error, and the next requests are answered by a new pipeline."""
    import threading

    import onnxruntime as ort

    from onnx_models import mlp
    from onnxsplit.errors import RunError
    from onnxsplit.export import export
    from onnxsplit.graph import OpGraph
    from onnxsplit.running.runner import Parts
    from onnxsplit.running.serve_local import PartsService

    model = mlp(tmp_path / "m.onnx", layers=4, width=32, dynamic_batch=True)
    g = OpGraph.from_onnx(str(model), {"x": [2, 32]})
    names = [n.name for n in g.nodes]
    out = export(g, {n: "cpu0" if i < len(names) // 2 else "cpu1" for i, n in enumerate(names)}, tmp_path / "p",
                 providers={"cpu0": "CPUExecutionProvider", "cpu1": "CPUExecutionProvider"},
                 threads={"cpu0": 1, "cpu1": 1}, shape_range={"x": [[1, 8], [32, 32]]}).out
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    parts = Parts(out, served=True)
    service = PartsService(parts)
    try:
        xs = [np.random.default_rng(k).standard_normal((1 + k % 8, 32)).astype(np.float32) for k in range(40)]
        got = [None] * 40

        def ask(k):
            got[k] = service.submit({"x": xs[k]}).result(timeout=60)

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(40)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        for k in range(40):
            np.testing.assert_allclose(got[k][session.get_outputs()[0].name], session.run(None, {"x": xs[k]})[0],
                                       rtol=1e-5, atol=1e-6)
        real = parts._call

        def failing(i, values, copy=0):
            if i == 1 and float(values["x"][0, 0]) == 999.0:
                raise RunError("part part1_cpu1 on cpu1 failed: out of luck")
            return real(i, values, copy)

        monkeypatch.setattr(parts, "_call", failing)
        bad = np.full((2, 32), 999.0, np.float32)
        with pytest.raises(RunError, match="out of luck"):
            service.submit({"x": bad}).result(timeout=60)
        after = service.submit({"x": xs[3]}).result(timeout=60)
        np.testing.assert_allclose(after[session.get_outputs()[0].name], session.run(None, {"x": xs[3]})[0],
                                   rtol=1e-5, atol=1e-6)
    finally:
        service.close()
    with pytest.raises(RunError, match="stopping"):
        service.submit({"x": xs[0]})


@pytest.mark.parametrize("body, words", [
    # each of these had been a 500 ('>' between None and an int, in the length check) or taken
    ({"input_ids": [3], "parameters": 0}, "'parameters' must be an object, got 0"),
    ({"input_ids": [3], "parameters": ""}, "'parameters' must be an object"),
    ({"input_ids": [3], "parameters": []}, "'parameters' must be an object"),
    ({"input_ids": [3], "max_tokens": 0}, "'max_tokens' must be at least 1"),
    ({"input_ids": [3], "max_tokens": 2.5}, "'max_tokens' must be an integer"),
    ({"input_ids": [3], "eos_token_id": "2"}, "'eos_token_id' must be an integer"),
])
def test_a_bad_generate_request_is_one_line(body, words):
    with pytest.raises(ProtocolError, match=words) as e:
        decode_generate(json.dumps(body).encode())
    assert "\n" not in str(e.value)


def test_a_generate_field_given_as_null_is_not_given():
    """null for max_tokens is its default (it had reached the length check as None, a 500);
    one at the top that is null leaves the one in 'parameters'."""
    assert decode_generate(b'{"input_ids": [3], "max_tokens": null}')["max_tokens"] == MAX_TOKENS
    asked = decode_generate(b'{"input_ids": [3], "max_tokens": null, "eos_token_id": null, '
                            b'"parameters": {"max_tokens": 4, "eos_token_id": 2}}')
    assert (asked["max_tokens"], asked["eos"]) == (4, 2)
    assert decode_generate(b'{"input_ids": [3], "parameters": null}')["max_tokens"] == MAX_TOKENS
