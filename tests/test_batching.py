"""``onnxsplit serve``'s dynamic batcher: the batcher on a fake model (no Ray: grouping,
dispatch on size, on a preferred size and on the delay, splitting back, failures,
timeouts), the gateway's answers around it, and one end-to-end run of the server with
concurrent tritonclient clients."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

from onnxsplit.errors import OnnxsplitError, RunError
from onnxsplit.running.batching import Batcher, Options, Timeout, batch_dimension, options, pad_allowance
from onnxsplit.running.kserve import ProtocolError

W = np.random.default_rng(7).standard_normal((6, 6)).astype(np.float32)


def model(feeds):
    """What the fake parts compute: per row, so a batch's rows are its requests' rows."""
    x = feeds["x"]
    return {"y": np.tanh(x @ W[: x.shape[1], : x.shape[1]]), "s": x.sum(axis=1)}


class FakeParts:
    """The parts as the batcher sees them: an awaitable run, recording each call's rows."""

    def __init__(self, delay: float = 0.01, fail: str | None = None, compute=model):
        self.delay, self.fail, self.compute = delay, fail, compute
        self.calls: list[dict[str, tuple]] = []
        self.running = self.most_running = 0

    async def __call__(self, feeds):
        self.calls.append({n: a.shape for n, a in feeds.items()})
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.running -= 1
        if self.fail:
            raise RunError(self.fail)
        return self.compute(feeds)

    def rows(self) -> list[int]:
        return [c["x"][0] for c in self.calls]


def batcher(parts, max_batch_size=8, delay_us=20_000, preferred=(), in_flight=1, inputs=("x",)):
    return Batcher(parts, Options(max_batch_size, delay_us, tuple(preferred)), list(inputs), max_in_flight=in_flight)


def request(rows: int, width: int = 4, seed: int = 0):
    return {"x": np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)}


def assert_alone(feeds, got):
    """The answer equals the request run alone."""
    want = model(feeds)
    assert set(got) == set(want)
    for n in want:
        assert got[n].shape == want[n].shape
        np.testing.assert_allclose(got[n], want[n], rtol=1e-5)


def within(coro, seconds: float = 10):
    """Run ``coro`` to its end, failing (not hanging) where a request is never answered."""
    return asyncio.run(asyncio.wait_for(coro, seconds))


async def submit_all(b, feeds_list, timeout_s=None):
    return await asyncio.gather(*(b.submit(f, timeout_s) for f in feeds_list), return_exceptions=True)


# ---- the options --------------------------------------------------------------------------------------

def manifest_model(range_=((1, 8), (16, 16)), in_dims=("batch", None), out_dims=("batch", None),
                   extra_input=None):
    inputs = [{"name": "x", "dtype": "float32", "shape": [3, 16], "dims": list(in_dims)}]
    r = {"x": [list(d) for d in range_]}
    if extra_input:
        inputs.append(extra_input[0])
        r[extra_input[0]["name"]] = extra_input[1]
    return {"inputs": inputs, "outputs": [{"name": "y", "dtype": "float32", "shape": [3, 8], "dims": list(out_dims)}],
            "shape_range": r}


def test_options_follow_the_range_of_the_batch_dimension():
    got, why = options(manifest_model())
    assert got == Options(8, 0, ()) and why == ""
    got, _ = options(manifest_model(), max_batch_size=4, max_queue_delay_microseconds=0, preferred_batch_size=[4, 2, 2])
    assert got == Options(4, 0, (2, 4))
    assert options(manifest_model(), enabled=False) == (None, "--no-batching")
    assert options(manifest_model(), max_batch_size=1)[0] is None


@pytest.mark.parametrize("edit, words", [
    (lambda m: m.pop("shape_range"), "take one shape"),
    (lambda m: m["shape_range"].update(x=[[1, 1], [16, 16]]), "does not vary in the range (it is 1)"),
    (lambda m: m["shape_range"].update(x=[[4, 4], [1, 16]]), "does not vary"),
    (lambda m: m["outputs"][0].update(dims=["classes", None]),
     "output 'y' does not have the batch dimension 'batch' first"),
    (lambda m: m["outputs"][0].update(dims=[None, None], shape=[1, 8]), "its dimension 0 is 1"),
    (lambda m: m["outputs"][0].update(dims=None, shape=[10]), "output 'y' does not have the batch dimension first"),
    (lambda m: (m["inputs"].append({"name": "z", "dtype": "float32", "shape": [3], "dims": ["n"]}),
                m["shape_range"].update(z=[[1, 8]])), "name their dimension 0 differently (batch, n)"),
    (lambda m: (m["inputs"].append({"name": "z", "dtype": "float32", "shape": [3], "dims": ["batch"]}),
                m["shape_range"].update(z=[[1, 4]])), "dimension 0 ranges differ (1..4, 1..8)"),
    (lambda m: m["inputs"].append({"name": "z", "dtype": "float32", "shape": [3], "dims": [None]}),
     "input 'z' has no batch dimension"),
])
def test_batching_is_off_where_the_parts_cannot_batch(edit, words):
    m = manifest_model()
    edit(m)
    span, why = batch_dimension(m)
    assert span is None and words in why
    assert options(m) == (None, why)
    with pytest.raises(OnnxsplitError, match="--max-batch-size: these parts cannot be batched"):
        options(m, max_batch_size=4)


@pytest.mark.parametrize("kwargs, words", [
    ({"max_batch_size": 9}, r"--max-batch-size 9 is outside the batch dimension's range 1..8"),
    ({"max_batch_size": 0}, "--max-batch-size 0 is outside"),
    ({"max_queue_delay_microseconds": -1}, "must be at least 0, got -1"),
    ({"max_batch_size": 4, "preferred_batch_size": [2, 6]},
     "--preferred-batch-size 6 is not between 1 and the largest batch, 4"),
    ({"enabled": False, "preferred_batch_size": [2]}, "--preferred-batch-size sets up batching, which --no-batching"),
])
def test_bad_options_are_one_line(kwargs, words):
    with pytest.raises(OnnxsplitError, match=words) as e:
        options(manifest_model(), **kwargs)
    assert "\n" not in str(e.value)


# ---- the batcher ---------------------------------------------------------------------------------------

def test_concurrent_requests_run_as_one_batch_and_each_gets_its_own_rows():
    parts = FakeParts()
    feeds = [request(r, seed=k) for k, r in enumerate([1, 2, 1, 3])]

    async def go():
        b = batcher(parts)
        return b, await submit_all(b, feeds)

    b, got = within(go())
    assert parts.rows() == [7]  # one call, the rows in arrival order
    for f, g in zip(feeds, got):
        assert_alone(f, g)
    stats = b.stats.triton("m", {})["model_stats"][0]
    assert stats["execution_count"] == 1 and stats["inference_count"] == 7
    assert stats["batching"]["requests_per_execution"] == [{"requests": 4, "count": 1}]
    assert stats["batch_stats"][0]["batch_size"] == 7 and stats["inference_stats"]["queue"]["count"] == 4


def test_requests_are_grouped_by_their_other_dimensions():
    parts = FakeParts()
    feeds = [request(1 + k % 2, width=4 if k % 3 else 6, seed=k) for k in range(9)]

    async def go():
        return await submit_all(batcher(parts, max_batch_size=16), feeds)

    got = within(go())
    widths = sorted(c["x"][1] for c in parts.calls)
    assert widths == [4, 6]  # one batch per width, none mixed
    by_width = {c["x"][1]: c["x"][0] for c in parts.calls}
    assert by_width == {w: sum(f["x"].shape[0] for f in feeds if f["x"].shape[1] == w) for w in (4, 6)}
    for f, g in zip(feeds, got):
        assert_alone(f, g)


def test_a_full_batch_goes_at_once_and_a_partial_one_after_the_delay():
    async def full():
        parts = FakeParts()
        b = batcher(parts, max_batch_size=4, delay_us=10_000_000)  # 10 s: only a full batch goes
        t = time.perf_counter()
        got = await asyncio.wait_for(submit_all(b, [request(1, seed=k) for k in range(4)]), 5)
        return parts, got, time.perf_counter() - t

    parts, got, took = within(full())
    assert parts.rows() == [4] and took < 2 and not any(isinstance(g, Exception) for g in got)

    async def partial():
        parts = FakeParts(delay=0)
        b = batcher(parts, max_batch_size=8, delay_us=300_000)
        t = time.perf_counter()
        tasks = [asyncio.ensure_future(b.submit(request(1, seed=k))) for k in range(2)]
        await asyncio.sleep(0.1)
        before = list(parts.calls)
        await asyncio.gather(*tasks)
        return before, parts, time.perf_counter() - t

    before, parts, took = within(partial())
    assert before == [] and parts.rows() == [2] and took >= 0.29


def test_a_preferred_size_goes_at_once():
    async def go():
        parts = FakeParts()
        b = batcher(parts, max_batch_size=8, delay_us=10_000_000, preferred=[2])
        got = await asyncio.wait_for(submit_all(b, [request(1, seed=k) for k in range(4)]), 5)
        return parts, got

    parts, got = within(go())
    assert parts.rows() == [2, 2]


def test_batches_never_exceed_max_batch_size_and_no_request_is_lost():
    rng = np.random.default_rng(3)
    feeds = [request(int(rng.integers(1, 4)), seed=k) for k in range(40)]

    async def go():
        parts = FakeParts(delay=0.01)
        b = batcher(parts, max_batch_size=5, delay_us=2000, in_flight=2)

        async def client(k):  # arrivals spread over a few milliseconds
            await asyncio.sleep(0.001 * (k % 7))
            return await b.submit(feeds[k])

        return parts, b, await asyncio.gather(*(client(k) for k in range(len(feeds))))

    parts, b, got = within(go())
    assert max(parts.rows()) <= 5 and sum(parts.rows()) == sum(f["x"].shape[0] for f in feeds)
    assert len(parts.calls) < len(feeds)  # batches were formed
    assert parts.most_running <= 2  # at most max_in_flight batches at once
    for f, g in zip(feeds, got):
        assert_alone(f, g)
    per = b.stats.triton("m", {})["model_stats"][0]["batching"]["requests_per_execution"]
    assert sum(e["requests"] * e["count"] for e in per) == len(feeds)


def test_a_request_larger_than_a_batch_runs_alone():
    async def go():
        parts = FakeParts()
        b = batcher(parts, max_batch_size=4)
        return parts, await submit_all(b, [request(6, seed=1), request(1, seed=2)])

    parts, got = within(go())
    assert sorted(parts.rows()) == [1, 6]
    assert_alone(request(6, seed=1), got[0])


def test_a_failing_batch_fails_each_of_its_requests_with_the_parts_error():
    message = "part part1_cpu1 on cpu1 failed on sample 0: [ONNXRuntimeError] boom"

    async def go():
        parts = FakeParts(fail=message)
        b = batcher(parts)
        got = await submit_all(b, [request(1, seed=k) for k in range(3)])
        parts.fail = None  # the batcher goes on after a failure
        after = await b.submit(request(2, seed=9))
        return parts, got, after

    parts, got, after = within(go())
    assert parts.rows()[0] == 3
    assert all(isinstance(g, RunError) and str(g) == message for g in got)
    assert_alone(request(2, seed=9), after)


def test_a_request_past_its_timeout_is_answered_and_leaves_the_queue():
    async def go():
        parts = FakeParts(delay=0.3)
        b = batcher(parts, delay_us=0, in_flight=1)
        first = asyncio.ensure_future(b.submit(request(1, seed=1)))  # runs 0.3 s, holding the one slot
        await asyncio.sleep(0.01)
        t = time.perf_counter()
        with pytest.raises(Timeout, match="no answer within the request timeout of 50 ms"):
            await b.submit(request(2, seed=2), timeout_s=0.05)  # waits in the queue, then gives up
        waited = time.perf_counter() - t
        third = await b.submit(request(3, seed=3))  # queued behind the first only
        return parts, waited, await first, third

    parts, waited, first, third = within(go())
    assert waited > 0.04  # (and it never ran: below)
    assert parts.rows() == [1, 3]  # the request that timed out never ran
    assert_alone(request(1, seed=1), first)
    assert_alone(request(3, seed=3), third)


def test_a_timeout_during_the_batch_leaves_the_others_their_answers():
    async def go():
        parts = FakeParts(delay=0.2)
        b = batcher(parts, delay_us=5000)
        return parts, await asyncio.gather(b.submit(request(1, seed=1), 0.05), b.submit(request(2, seed=2)),
                                           return_exceptions=True)

    parts, (late, ok) = within(go())
    assert isinstance(late, Timeout) and parts.rows() == [3]
    assert_alone(request(2, seed=2), ok)


def test_a_cancelled_request_leaves_the_queue():
    async def go():
        parts = FakeParts(delay=0.2)
        b = batcher(parts, delay_us=0, in_flight=1)
        first = asyncio.ensure_future(b.submit(request(1, seed=1)))
        await asyncio.sleep(0.01)
        gone = asyncio.ensure_future(b.submit(request(2, seed=2)))  # its client disconnects
        await asyncio.sleep(0.01)
        gone.cancel()
        await asyncio.gather(first, b.submit(request(1, seed=3)))
        return parts

    assert within(go()).rows() == [1, 1]


def test_a_request_whose_inputs_disagree_on_the_batch_is_refused_before_it_joins():
    parts = FakeParts()

    async def go():
        b = batcher(parts, inputs=("x", "z"))
        with pytest.raises(ProtocolError, match="input 'z' has 3 rows .* but input 'x' has 2"):
            await b.submit({"x": np.zeros((2, 4), np.float32), "z": np.zeros((3,), np.float32)})
        with pytest.raises(ProtocolError, match="scalar"):
            await b.submit({"x": np.zeros((2, 4), np.float32), "z": np.float32(1)})

    within(go())
    assert parts.calls == []


def test_outputs_without_the_batch_first_are_not_split_and_batching_stops():
    def pooled(feeds):  # "c" does not have the batch on dim 0
        out = model(feeds)
        out["c"] = np.array([feeds["x"].shape[0], 1.0, 2.0], np.float32)
        return out

    feeds = [request(r, seed=k) for k, r in enumerate([1, 2, 2])]

    async def go():
        parts = FakeParts(compute=pooled)
        b = batcher(parts)
        got = await submit_all(b, feeds)
        later = await b.submit(request(2, seed=5))
        return parts, b, got, later

    parts, b, got, later = within(go())
    assert parts.rows() == [5, 1, 2, 2, 2]  # the batch, each request again alone, then alone
    assert "output 'c' has shape [3] for a batch of 5 rows" in b.off
    for f, g in zip(feeds, got):
        np.testing.assert_allclose(g["y"], model(f)["y"], rtol=1e-5)
        np.testing.assert_array_equal(g["c"], [f["x"].shape[0], 1, 2])


# ---- the gateway around it (no Ray: the parts' handles are fakes) -----------------------------------

class FakeHandle:
    """A part's deployment handle: ``run.remote(sample, feeds)`` gives an awaitable."""

    def __init__(self, parts: FakeParts):
        class Run:
            @staticmethod
            def remote(sample, feeds, *deps):
                return asyncio.ensure_future(parts(feeds))

        self.run = Run()


def http(method: str, path: str, body: bytes = b""):
    from starlette.requests import Request

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    return Request({"type": "http", "method": method, "path": path, "headers": [], "query_string": b"",
                    "scheme": "http", "server": ("127.0.0.1", 8000), "root_path": ""}, receive)


def infer_body(x: np.ndarray) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()


def gateway(parts: FakeParts, batching=True, timeout_s=None, **limits):
    """A gateway over ``parts`` (``limits``: max_ongoing, max_queued)."""
    from onnxsplit.running.serve import Gateway

    m = {"inputs": [{"name": "x", "dtype": "float32", "shape": [2, 4], "dims": ["batch", None]}],
         "outputs": [{"name": "y", "dtype": "float32", "shape": [2, 4], "dims": ["batch", None]},
                     {"name": "s", "dtype": "float32", "shape": [2], "dims": ["batch"]}],
         "shape_range": {"x": [[1, 8], [4, 4]]}}
    opts, why = options(m, enabled=batching, max_queue_delay_microseconds=20_000 if batching else None)
    return Gateway("m", {"model": m}, [[]], [0], FakeHandle(parts), batching=opts, why=why, timeout_s=timeout_s,
                   in_flight=2, **limits)


@pytest.mark.parametrize("batching", [True, False])
def test_the_gateway_answers_batched_requests_and_reports_them(batching):
    parts = FakeParts()
    xs = [request(1 + k % 2, seed=k)["x"] for k in range(5)]

    async def go():
        g = gateway(parts, batching)
        answers = await asyncio.gather(*(g(http("POST", "/v2/models/m/infer", infer_body(x))) for x in xs))
        return answers, await g(http("GET", "/v2/models/m/stats"))

    answers, stats = within(go())
    for x, a in zip(xs, answers):
        assert a.status_code == 200
        out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in json.loads(a.body)["outputs"]}
        assert_alone({"x": x}, out)
    s = json.loads(stats.body)["model_stats"][0]
    assert s["inference_stats"]["success"]["count"] == 5 and s["inference_count"] == 7
    assert s["batching"]["enabled"] is batching
    per = {e["requests"]: e["count"] for e in s["batching"]["requests_per_execution"]}
    assert per == ({5: 1} if batching else {1: 5})
    if not batching:
        assert s["batching"]["why_not"] == "--no-batching"


def test_the_gateway_answers_504_past_the_timeout_and_500_for_a_failing_batch():
    async def go():
        slow = gateway(FakeParts(delay=0.5), timeout_s=0.05)
        late = await slow(http("POST", "/v2/models/m/infer", infer_body(np.ones((1, 4), np.float32))))
        failing = gateway(FakeParts(fail="part p0 on cpu0 failed on sample 0: bad\nsecond line"))
        failed = await asyncio.gather(*(
            failing(http("POST", "/v2/models/m/infer", infer_body(np.ones((r, 4), np.float32)))) for r in (1, 2)))
        bad = await failing(http("POST", "/v2/models/m/infer", infer_body(np.ones((9, 4), np.float32))))
        return late, failed, bad

    late, failed, bad = within(go())
    assert late.status_code == 504
    assert json.loads(late.body) == {"error": "no answer within the request timeout of 50 ms"}
    for f in failed:
        assert f.status_code == 500
        assert json.loads(f.body)["error"] == "part p0 on cpu0 failed on sample 0: bad second line"
    assert bad.status_code == 400 and "dimension 0 is 9, outside 1..8x4" in json.loads(bad.body)["error"]


# ---- padding a named dimension (--pad-dimension) -------------------------------------------------------

def tokens_model() -> dict:
    """A manifest's model of token ids and their mask over (batch, sequence) of 1..8 x 1..16,
    an output per token and one per row."""
    seq = {"dtype": "int64", "shape": [2, 4], "dims": ["batch", "sequence"]}
    return {"inputs": [dict(seq, name="ids"), dict(seq, name="mask")],
            "outputs": [{"name": "h", "dtype": "float32", "shape": [2, 4, 3], "dims": ["batch", "sequence", None]},
                        {"name": "pooled", "dtype": "float32", "shape": [2, 3], "dims": ["batch", None]}],
            "shape_range": {"ids": [[1, 8], [1, 16]], "mask": [[1, 8], [1, 16]]}}


def tokens(feeds):
    """Per token a vector of its id; per row the masked sum of them (what padding must not move)."""
    ids, mask = feeds["ids"], feeds["mask"]
    h = np.stack([ids * 1.0, ids * 2.0, mask * 1.0], axis=-1).astype(np.float32)
    return {"h": h, "pooled": (h * mask[..., None]).sum(axis=1).astype(np.float32)}


def token_request(length: int, seed: int) -> dict:
    ids = np.random.default_rng(seed).integers(1, 100, (1, length))
    return {"ids": ids, "mask": np.ones_like(ids)}


def test_requests_of_other_lengths_are_padded_into_one_batch_and_cut_back():
    """With the sequence padded: requests of 3, 7 and 5 tokens run as one call of 3 x 7,
    each answer equal to its request run alone (its tokens' outputs cut back to its
    length, its masked sum unmoved); without, each length is a batch of its own."""
    reqs = [token_request(n, seed) for seed, n in enumerate((3, 7, 5))]
    for pad, calls in (("sequence", [(3, 7)]), (None, [(1, 3), (1, 7), (1, 5)])):
        parts = FakeParts(compute=tokens)
        opts, _ = options(tokens_model(), max_queue_delay_microseconds=20_000, pad_dimension=pad)
        b = Batcher(parts, opts, ["ids", "mask"])
        got = within(submit_all(b, reqs))
        assert sorted(c["ids"] for c in parts.calls) == sorted(calls)
        for r, g in zip(reqs, got):
            want = tokens(r)
            assert set(g) == set(want)
            for n in want:
                np.testing.assert_array_equal(g[n], want[n])


def predicted(points) -> list[dict]:
    """A manifest's ``predicted.per_shape`` for (rows, tokens, ms) points."""
    return [{"shapes": {"ids": [r, n], "mask": [r, n]}, "latency_ms": ms} for r, n, ms in points]


def test_padding_is_allowed_what_a_call_costs_beyond_its_tokens():
    """The allowance is the predicted latency's fixed part over its part a token (rows x
    positions): on exact lines, that ratio; unknown (any padding) from fewer than two sizes,
    none where a call has no fixed part."""
    pad = options(tokens_model(), pad_dimension="sequence")[0].pad
    # 2 ms + 0.25 ms a token, at 1x4, 2x8 and 8x16
    line = predicted([(1, 4, 2 + 0.25 * 4), (2, 8, 2 + 0.25 * 16), (8, 16, 2 + 0.25 * 128)])
    assert pad_allowance(line, pad) == pytest.approx(8.0)
    assert pad_allowance(predicted([(1, 4, 3.0), (1, 8, 5.0)]), pad) == pytest.approx(2.0)  # (1 ms + 0.5 a token)
    assert pad_allowance(predicted([(1, 4, 1.0), (2, 8, 4.0)]), pad) == 0.0  # (no fixed cost: fitted below 0)
    assert pad_allowance(predicted([(2, 8, 3.0)]), pad) is None
    assert pad_allowance(None, pad) is None and pad_allowance("junk", pad) is None
    assert pad_allowance([{"shapes": [1]}, "x", *predicted([(2, 8, 3.0)])], pad) is None  # (a hand-edited manifest)
    assert pad_allowance(predicted([(1, 4, float("nan")), (2, 8, 4.0)]), pad) is None
    opts, _ = options(tokens_model(), pad_dimension="sequence", per_shape=line)
    assert opts.pad.allowance == pytest.approx(8.0) and "costs less than a call" in opts.describe()


def test_a_request_joins_a_padded_batch_only_where_its_padding_costs_less_than_a_call():
    """Allowance 6: of requests of 3, 16, 4, 2 and 15 tokens (in that order) the first batch
    takes 3, 4 and 2 (padding 1 + 0 + 2), the 16 and 15 wait and go together (padding 1);
    the 16 would have added 13 alone.  Each answer is still its own; with no allowance
    all five go as one call, as before."""
    lengths = (3, 16, 4, 2, 15)
    reqs = [token_request(n, seed) for seed, n in enumerate(lengths)]
    line = predicted([(1, 1, 1.5 + 0.25), (1, 9, 1.5 + 0.25 * 9)])  # (1.5 ms a call, 0.25 a token: 6)
    for per_shape, calls in ((line, [(2, 16), (3, 4)]), (None, [(5, 16)])):
        opts, _ = options(tokens_model(), max_queue_delay_microseconds=20_000, pad_dimension="sequence",
                          per_shape=per_shape)
        parts = FakeParts(compute=tokens)
        b = Batcher(parts, opts, ["ids", "mask"], max_in_flight=2)
        got = within(submit_all(b, reqs))
        assert sorted(c["ids"] for c in parts.calls) == calls
        for r, g in zip(reqs, got):
            for n, want in tokens(r).items():
                np.testing.assert_array_equal(g[n], want)


def test_padding_refuses_inputs_that_disagree_on_the_length():
    opts, _ = options(tokens_model(), pad_dimension="sequence")
    b = Batcher(FakeParts(compute=tokens), opts, ["ids", "mask"])
    bad = {"ids": np.ones((1, 4), np.int64), "mask": np.ones((1, 5), np.int64)}
    with pytest.raises(ProtocolError, match="disagree on the length of dimension 'sequence' .4, 5."):
        b.key(bad)


@pytest.mark.parametrize("edit, name, words", [
    (lambda m: None, "tokens", "no input has a dimension of that name (the inputs name: sequence)"),
    (lambda m: None, "batch", "it is the batch dimension of input 'ids'"),
    (lambda m: (m["inputs"][1].update(name="types"), m["shape_range"].update(types=m["shape_range"].pop("mask"))),
     "sequence", "no attention mask over it"),
    (lambda m: m["shape_range"].update(ids=[[1, 8], [4, 4]], mask=[[1, 8], [4, 4]]), "sequence",
     "does not vary in the parts' range"),
])
def test_a_dimension_that_cannot_be_padded_is_one_line(edit, name, words):
    m = tokens_model()
    edit(m)
    with pytest.raises(OnnxsplitError) as e:
        options(m, pad_dimension=name)
    assert words in str(e.value)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"--pad-dimension {name}")


def test_a_bert_split_answers_padded_requests_as_it_answers_each_alone(tmp_path):
    """models/small_bert split in two for batches of 1..4 and 4..32 tokens: requests of
    5, 9 and 16 tokens padded into one call give each its own answer, equal to the parts
    on that request alone up to float rounding (the mask keeps the padding unread)."""
    from onnxsplit.export import export
    from onnxsplit.graph import OpGraph
    from onnxsplit.running.runner import Parts

    g = OpGraph.from_onnx("models/small_bert.onnx", {"input_ids": (2, 16), "attention_mask": (2, 16)})
    half = len(g.nodes) // 2
    cpu = "CPUExecutionProvider"
    out = export(g, {n.name: f"cpu{int(i >= half)}" for i, n in enumerate(g.nodes)}, tmp_path / "parts",
                 providers={"cpu0": cpu, "cpu1": cpu}, threads={"cpu0": 1, "cpu1": 1},
                 shape_range={"input_ids": [[1, 4], [4, 32]], "attention_mask": [[1, 4], [4, 32]]}).out
    parts = Parts(out)
    model = json.loads((out / "manifest.json").read_text())["model"]
    opts, why = options(model, max_queue_delay_microseconds=50_000, pad_dimension="sequence")
    assert opts is not None and opts.pad.outputs == (("layer_norm_8", 1),), why
    fake = FakeParts(0.0, compute=parts.run)
    b = Batcher(fake, opts, ["input_ids", "attention_mask"])
    rng = np.random.default_rng(3)
    reqs = [{"input_ids": rng.integers(1, 1000, (1, n)), "attention_mask": np.ones((1, n), np.int64)}
            for n in (5, 9, 16)]
    got = within(submit_all(b, reqs), 60)
    assert [c["input_ids"] for c in fake.calls] == [(3, 16)]
    for r, answer in zip(reqs, got):
        alone = parts.run(r)
        for name, want in alone.items():
            assert answer[name].shape == want.shape
            np.testing.assert_allclose(answer[name], want, rtol=1e-4, atol=1e-5)


def test_a_request_masked_whole_is_batched_only_with_its_own_length():
    """A row whose mask is all zeros attends to whatever is there, padding included: such a
    request joins only requests of its own length, and its answer is its own."""
    opts, _ = options(tokens_model(), max_queue_delay_microseconds=20_000, pad_dimension="sequence")
    parts = FakeParts(compute=tokens)
    b = Batcher(parts, opts, ["ids", "mask"])
    masked = token_request(3, 9)
    masked["mask"] = np.zeros_like(masked["mask"])
    reqs = [token_request(5, 1), masked, token_request(4, 2)]
    assert b.key(masked)[1] != b.key(token_request(5, 1))[1] == b.key(token_request(4, 2))[1]
    got = within(submit_all(b, reqs))
    assert sorted(c["ids"] for c in parts.calls) == [(1, 3), (2, 5)]
    for r, g in zip(reqs, got):
        for n, want in tokens(r).items():
            np.testing.assert_array_equal(g[n], want)
