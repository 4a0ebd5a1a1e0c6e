"""Stress as well as faults: the gateway's queue flooded beyond its limits (503s in the
protocol's JSON, every request it took answered with that request's own output), and the
Ray engine losing a node of its cluster mid-run (the server itself flooded and soaked:
test_served.py)."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_batching import FakeParts, gateway, http, infer_body, model, within

CPU = "CPUExecutionProvider"


def split_mlp(tmp_path, batch: int, width: int):
    """A small MLP and its parts on two CPU devices, one thread each."""
    from onnx_models import mlp
    from onnxsplit.export import export
    from onnxsplit.graph import OpGraph

    model_path = mlp(tmp_path / "m.onnx", layers=4, batch=batch, width=width)
    g = OpGraph.from_onnx(model_path)
    names = [n.name for n in g.nodes]
    parts = export(g, {n: "cpu0" if i < len(names) // 2 else "cpu1" for i, n in enumerate(names)},
                   tmp_path / "parts", providers={"cpu0": CPU, "cpu1": CPU}, threads={"cpu0": 1, "cpu1": 1},
                   plan={"objective": "throughput"}).out
    return model_path, parts


def reference(model_path):
    """onnxruntime on the original model, one thread (the server has the other core)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(model_path), so, providers=[CPU])


# ---- the gateway's own queue (no Ray: the parts' handles are fakes) ---------------------------------

@pytest.mark.parametrize("batching", [True, False])
def test_the_gateway_holds_what_its_limits_allow_and_answers_503_beyond(batching):
    """Beyond max_ongoing + max_queued a request is answered 503 at once, in the protocol's
    JSON (Serve's own 503 is plain text, which tritonclient cannot read); every request
    it took gets its own answer, and its room is given back."""
    parts = FakeParts(delay=0.05)
    xs = [np.random.default_rng(k).standard_normal((1, 4)).astype(np.float32) for k in range(10)]

    async def go():
        g = gateway(parts, batching, max_ongoing=2, max_queued=3)
        answers = await asyncio.gather(*(g(http("POST", "/v2/models/m/infer", infer_body(x))) for x in xs))
        after = await g(http("POST", "/v2/models/m/infer", infer_body(xs[0])))
        return g, answers, after

    g, answers, after = within(go())
    codes = [a.status_code for a in answers]
    assert codes == [200] * 5 + [503] * 5  # the first five held (two working, three waiting)
    for x, a in zip(xs, answers):
        if a.status_code == 200:
            out = json.loads(a.body)["outputs"]
            np.testing.assert_allclose(np.array(out[0]["data"], np.float32).reshape(out[0]["shape"]),
                                       model({"x": x})["y"], rtol=1e-5)
        else:
            assert a.headers["content-type"] == "application/json" and a.headers["retry-after"] == "1"
            assert json.loads(a.body) == {"error": "the server is full (2 requests in progress, 3 waiting): "
                                                   "try again later"}
    assert parts.most_running <= 2 or batching  # (a batch carries several requests in one run)
    assert after.status_code == 200 and g.held == 0


@settings(max_examples=30, deadline=None, derandomize=True)  # the same cases in CI
@given(ongoing=st.integers(1, 4), queued=st.integers(0, 4), burst=st.integers(1, 14), batching=st.booleans(),
       delay=st.sampled_from([0.0, 0.002, 0.01]))
def test_any_burst_is_taken_up_to_the_limits_and_each_taken_request_gets_its_own_answer(
        ongoing, queued, burst, batching, delay):
    """Property: a burst arriving at once is taken up to max_ongoing + max_queued, the
    rest answered 503 (none lost, none answered twice); each request taken gets its own
    rows; the gateway ends holding nothing and serves the next."""
    parts = FakeParts(delay=delay)
    xs = [np.random.default_rng(k).standard_normal((1 + k % 3, 4)).astype(np.float32) for k in range(burst)]

    async def go():
        g = gateway(parts, batching, max_ongoing=ongoing, max_queued=queued)
        answers = await asyncio.gather(*(g(http("POST", "/v2/models/m/infer", infer_body(x))) for x in xs))
        return g, answers, await g(http("POST", "/v2/models/m/infer", infer_body(xs[0])))

    g, answers, after = within(go())
    taken = min(burst, ongoing + queued)
    assert [a.status_code for a in answers] == [200] * taken + [503] * (burst - taken)
    for x, a in zip(xs, answers[:taken]):
        out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in json.loads(a.body)["outputs"]}
        np.testing.assert_allclose(out["y"], model({"x": x})["y"], rtol=1e-5)
    assert g.held == 0 and after.status_code == 200


def test_time_waiting_for_a_turn_counts_toward_the_request_timeout():
    """A request queued behind a slow one is answered 504 by its timeout, not after the
    slow one's end."""
    async def go():
        g = gateway(FakeParts(delay=1.0), False, timeout_s=0.1, max_ongoing=1, max_queued=1)
        begin = time.perf_counter()
        answers = await asyncio.gather(*(g(http("POST", "/v2/models/m/infer",
                                                infer_body(np.ones((1, 4), np.float32)))) for _ in range(2)))
        return answers, time.perf_counter() - begin

    answers, took = within(go())
    for a in answers:
        assert a.status_code == 504
        assert json.loads(a.body) == {"error": "no answer within the request timeout of 100 ms"}
    assert took < 0.8  # (the parts take 1 s)


def test_clients_that_never_send_their_bodies_hold_no_turn():
    """Connections that declare a body and send none (or send it a byte a second) are not
    held while it comes: as many as the gateway holds had each kept a turn, and a good
    request behind them waited (forever, with no request timeout) or was answered 503."""
    from starlette.requests import Request

    never = asyncio.Event()

    def stalled():
        async def receive():
            await never.wait()
            return {"type": "http.disconnect"}

        return Request({"type": "http", "method": "POST", "path": "/v2/models/m/infer", "headers": [],
                        "query_string": b"", "scheme": "http", "server": ("127.0.0.1", 8000), "root_path": ""},
                       receive)

    async def go():
        g = gateway(FakeParts(), False, max_ongoing=2, max_queued=1)
        waiting = [asyncio.ensure_future(g(stalled())) for _ in range(6)]
        await asyncio.sleep(0.05)
        x = np.ones((1, 4), np.float32)
        answer = await asyncio.wait_for(g(http("POST", "/v2/models/m/infer", infer_body(x))), 5)
        held = g.held
        for w in waiting:
            w.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return answer, held

    answer, held = within(go())
    assert answer.status_code == 200, answer.body
    np.testing.assert_allclose(json.loads(answer.body)["outputs"][0]["data"],
                               model({"x": np.ones((1, 4), np.float32)})["y"].ravel(), rtol=1e-5)
    assert held == 0


def test_a_body_that_never_comes_is_answered_408_by_the_request_timeout():
    """A connection that declares a body and never sends it holds its connection no longer
    than the request timeout (none before: only a turn was spared)."""
    from starlette.requests import Request

    async def receive():
        await asyncio.Event().wait()

    async def go():
        g = gateway(FakeParts(), False, timeout_s=0.2)
        begin = time.perf_counter()
        answer = await g(Request({"type": "http", "method": "POST", "path": "/v2/models/m/infer", "headers": [],
                                  "query_string": b"", "scheme": "http", "server": ("127.0.0.1", 8000),
                                  "root_path": ""}, receive))
        return answer, time.perf_counter() - begin

    answer, took = within(go())
    assert answer.status_code == 408 and "did not come within 0.2 s" in json.loads(answer.body)["error"]
    assert took < 2


ray = pytest.importorskip("ray")
from test_ray import forget_address, two_parts  # noqa: E402


# ---- a node of a Ray cluster lost mid-run ------------------------------------------------------------

def test_a_plan_lost_while_measured_ends_the_run_in_one_line(tmp_path):
    """`run` measures the plan beside onnxruntime's sessions round after round: a part
    lost in a later round (its node gone) fails the run with that part's one line, as a
    failure while verifying does (it ended in a KeyError's traceback)."""
    from onnxsplit.running.runner import Parts, RunError
    from onnxsplit.running.compare import run_parts

    lost = "part part1_cpu1 on cpu1 (machine 'm2') was lost: The actor died because its node has died."

    class LostLater(Parts):
        """The parts, lost after the check and the first timed run."""
        calls = 0

        def run(self, feeds):
            self.calls += 1
            if self.calls > 2:
                raise RunError(lost)
            return super().run(feeds)

        def stream(self, samples, depth=None, timeout_s=None):
            raise RunError(lost)

    model_path, parts = split_mlp(tmp_path, 4, 16)
    with pytest.raises(RunError) as e:
        run_parts(parts, loaded=LostLater(parts), samples=20, warmup=1)
    assert str(e.value) == lost


def test_a_node_lost_mid_run_ends_in_one_line_naming_the_part(tmp_path):
    """Parts pinned to two nodes of a Ray test cluster, samples streaming; the second node
    removed mid-run: every sample answered before is the original model's, and the run
    ends promptly in one RunError naming the part, its device and machine (it cannot be
    recovered: no other node offers that machine), not in Ray's traceback or a hang."""
    from ray.cluster_utils import Cluster
    from ray_processes import gone, ray_processes

    from onnxsplit.running.ray_engine import LOCAL_SYSTEM_CONFIG, RayParts
    from onnxsplit.running.runner import RunError, random_feeds

    model_path, parts = two_parts(tmp_path, machines={"cpu0": "m1", "cpu1": "m2"})
    session = reference(model_path)
    before, lost, remover = ray_processes(), None, None
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"m1": 1},
                                                          "_system_config": LOCAL_SYSTEM_CONFIG})
    try:
        m2 = cluster.add_node(num_cpus=1, resources={"m2": 1})
        cluster.wait_for_nodes()
        remover = threading.Thread(target=cluster.remove_node, args=(m2,), daemon=True)
        with RayParts(parts, address=cluster.address) as rp:
            survivor = next(w["folder"] for p, w in zip(rp.parts, rp.placed) if p["name"] == "part0_cpu0")
            lost = next(w["folder"] for p, w in zip(rp.parts, rp.placed) if p["name"] == "part1_cpu1")
            inputs, y = rp.inputs, rp.output_names[0]
            sent, got, outcome, removed = [], [], {}, []

            def samples():
                for s in range(100_000):  # until the loss stops the run
                    if s == 40:
                        removed.append(time.monotonic())
                        remover.start()
                    sent.append(random_feeds(inputs, seed=s))
                    yield sent[-1]

            def run():
                try:
                    got.extend(out[y] for out in rp.stream(samples(), depth=4))
                    outcome["ended"] = "without an error"
                except RunError as e:
                    outcome["error"] = e
                except BaseException as e:  # noqa: BLE001 (asserted below: not this)
                    outcome["ended"] = f"in {type(e).__name__}: {e}"

            runner = threading.Thread(target=run, daemon=True)
            runner.start()
            runner.join(timeout=120)
            assert not runner.is_alive(), "the run hangs after its node was lost"
            assert "error" in outcome, f"the run ended {outcome.get('ended')}"
            ended = time.monotonic() - removed[0]
            message = str(outcome["error"])
            print(f"node lost after {len(got)} samples; the run ended {ended:.1f} s later: {message}")
            assert "\n" not in message and message.startswith("part part1_cpu1 on cpu1 (machine 'm2') was lost:")
            assert ended < 60
            assert len(got) >= 36  # (those answered before sample 40 was sent: depth 4)
            for feeds, out in zip(sent, got):  # each answered sample is its own input's output
                np.testing.assert_allclose(out, session.run(None, feeds)[0], rtol=1e-5, atol=1e-5)
        assert not Path(survivor).exists()  # the surviving node's copy of its files removed
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if remover is not None and remover.ident is not None:
            # (the node's removal may still wait on its processes on a busy machine: the
            # cluster's shutdown would remove it a second time, a KeyError inside Ray)
            remover.join(timeout=60)
        cluster.shutdown()
        forget_address(cluster.address)
        if lost:  # (the lost node's copy of its files: one machine here)
            shutil.rmtree(lost, ignore_errors=True)
    assert gone(since=before), "a Ray process of the test cluster is still running"
