"""The Ray engine: a parts folder run by one actor per part, on a local Ray and on a
cluster of two nodes with a machine each; outputs against the original model, where each
actor ran, failures named by part, and no Ray process left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from onnx_models import mlp
from ray_processes import gone, ray_processes, sigint_as_in_a_terminal
from onnxsplit.providers import openvino
from onnxsplit.cli import main
from onnxsplit.export import MANIFEST, export
from onnxsplit.graph import OpGraph
from onnxsplit.running.runner import RunError, random_feeds

ray = pytest.importorskip("ray")
from onnxsplit.running.ray_engine import LOCAL_SYSTEM_CONFIG, RayParts  # noqa: E402

CPU = "CPUExecutionProvider"


def two_parts(tmp_path, machines=None) -> tuple[Path, Path]:
    model = mlp(tmp_path / "m.onnx", layers=4, batch=4, width=64)
    g = OpGraph.from_onnx(model)
    names = [n.name for n in g.nodes]
    device_of = {n: "cpu0" if i < len(names) // 2 else "cpu1" for i, n in enumerate(names)}
    e = export(g, device_of, tmp_path / "parts", providers={"cpu0": CPU, "cpu1": CPU},
               threads={"cpu0": 1, "cpu1": 1}, plan={"objective": "throughput"}, machines=machines)
    return model, e.out


def original(model: Path, feeds) -> list:
    return ort.InferenceSession(str(model), providers=[CPU]).run(None, feeds)


@pytest.fixture
def no_ray_left():
    before = ray_processes()
    yield
    if ray.is_initialized():
        ray.shutdown()
    assert gone(since=before), "a Ray process onnxsplit started is still running"


@pytest.fixture
def stale_ray_address(monkeypatch):
    """Ray's address file naming a cluster that is gone, as `ray start` and Ray's test
    clusters leave it behind (in a Ray temp folder of the test's own)."""
    folder = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live under it
    Path(folder, "ray").mkdir()
    Path(folder, "ray", "ray_current_cluster").write_text("127.0.0.1:1")
    monkeypatch.setenv("RAY_TMPDIR", folder)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.least_timing  # (what runs where is checked, not the figures)
def test_run_on_a_local_ray_beside_the_threaded_runner(tmp_path, capsys, stale_ray_address, no_ray_left):
    """Without --address onnxsplit starts a Ray of its own, whatever Ray's address file names."""
    model, parts = two_parts(tmp_path)
    rc = main(["run", str(parts), "--engine", "ray", "--samples", "10", "--warmup", "1", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    r = json.loads(out)
    assert r["engine"] == "ray" and r["verify"]["ok"] and r["verify"]["max_abs_error"] < 1e-5
    assert r["measured"]["throughput_per_s"] > 0 and r["baselines"]["onnxsplit_threads"]["throughput_per_s"] > 0
    assert set(r["placed"]) == {"part0_cpu0", "part1_cpu1"}
    assert not ray.is_initialized()  # the local Ray it started is shut down


def test_stream_keeps_order_and_matches_the_original(tmp_path, no_ray_left):
    model, parts = two_parts(tmp_path)
    manifest = json.loads((parts / MANIFEST).read_text())
    samples = [random_feeds(manifest["model"]["inputs"], seed=s) for s in range(12)]
    for s in samples:
        s["x"] = np.random.default_rng(len(s)).standard_normal(s["x"].shape).astype(np.float32) + s["x"]
    y = manifest["model"]["outputs"][0]["name"]
    with RayParts(parts) as rp:
        got = list(rp.stream(samples, depth=4))
        assert len(got) == 12
        for feeds, out in zip(samples, got):
            np.testing.assert_allclose(out[y], original(model, feeds)[0], atol=1e-5)
        assert all(w["folder"] == str(parts) for w in rp.placed)  # read where they are
        with pytest.raises(RunError, match=r"part part0_cpu0 on cpu0 failed on sample 0: .*"):
            rp.run({"x": np.zeros((3, 3), np.float32)})  # the wrong shape: the part's own error
        assert rp.run(samples[0])[y].shape == got[0][y].shape  # and it still runs


def test_parts_pinned_to_machines_run_on_their_nodes(tmp_path, no_ray_left):
    from ray.cluster_utils import Cluster

    model, parts = two_parts(tmp_path, machines={"cpu0": "m1", "cpu1": "m2"})
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"m1": 1},
                                                          "_system_config": LOCAL_SYSTEM_CONFIG})
    try:
        m2 = cluster.add_node(num_cpus=1, resources={"m2": 1})
        cluster.wait_for_nodes()
        with RayParts(parts, address=cluster.address) as rp:  # shipped through the object store
            shipped = [w["folder"] for w in rp.placed]
            assert all(f != str(parts) and Path(f, "weights.bin").exists() for f in shipped)
            nodes = {p["name"]: w["node"] for p, w in zip(rp.parts, rp.placed)}
            assert nodes["part1_cpu1"] == m2.node_id and nodes["part0_cpu0"] == cluster.head_node.node_id
            feeds = random_feeds(rp.inputs, seed=1)
            np.testing.assert_allclose(rp.run(feeds)[rp.output_names[0]], original(model, feeds)[0], atol=1e-5)
        assert not any(Path(f).exists() for f in shipped)  # removed with the actors (same machine here)
        ray.shutdown()
        (tmp_path / "b").mkdir()
        _, other = two_parts(tmp_path / "b", machines={"cpu0": "m3"})
        with pytest.raises(RunError, match="planned for machine 'm3', but no node of the Ray cluster offers"):
            RayParts(other, address=cluster.address)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        forget_address(cluster.address)


def forget_address(address: str) -> None:
    """Remove Ray's address file where Ray's test cluster wrote it, so that no later Ray
    (another test's, a user's) takes it for a running cluster."""
    from ray._common.utils import get_ray_address_file

    file = Path(get_ray_address_file(None))
    if file.exists() and file.read_text().strip() == address:
        file.unlink()


@pytest.mark.every_provider
@pytest.mark.skipif(not openvino.available(), reason="OpenVINO's runtime is not installed")
def test_a_part_on_openvino_runs_on_a_ray_actor(tmp_path, no_ray_left):
    """Parts on the CPU EP and on OpenVINO's runtime (a provider on the same cores): each
    actor opens its part on the provider the manifest names."""
    model = mlp(tmp_path / "m.onnx", layers=4, batch=4, width=64)
    g = OpGraph.from_onnx(model)
    names = [n.name for n in g.nodes]
    device_of = {n: "cpu0" if i < len(names) // 2 else "openvino0" for i, n in enumerate(names)}
    parts = export(g, device_of, tmp_path / "parts", providers={"cpu0": CPU, "openvino0": openvino.RUNTIME},
                   threads={"cpu0": 1, "openvino0": 1}, plan={"objective": "throughput"}).out
    with RayParts(parts) as rp:
        assert [w["provider"] for w in rp.placed] == [CPU, openvino.RUNTIME]
        feeds = random_feeds(rp.inputs, seed=2)
        np.testing.assert_allclose(rp.run(feeds)[rp.output_names[0]], original(model, feeds)[0], atol=1e-4)


def test_interrupting_the_ray_engine_leaves_no_ray_behind(tmp_path):
    _, parts = two_parts(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "onnxsplit", "run", str(parts), "--engine", "ray",
                             "--samples", "1000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=sigint_as_in_a_terminal)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not ray_processes(proc.pid):
            time.sleep(0.2)
        assert ray_processes(proc.pid), "the command started no Ray"
        time.sleep(3)  # its actors up and measuring
        assert proc.poll() is None
        began = time.time()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
        assert proc.returncode == 130 and time.time() - began < 3
    finally:
        if proc.poll() is None:  # failed: leave no command nor its Ray behind
            daemons = ray_processes(proc.pid)
            proc.kill()
            for pid in daemons:
                os.kill(pid, signal.SIGKILL)
    assert gone(proc.pid)


def test_a_cluster_address_that_does_not_answer_is_one_line_at_once():
    """--address HOST:PORT where nothing listens: a one-line RunError within seconds (Ray
    itself would retry for minutes, printing warnings); a listening port passes; a port
    that is no number is said; Ray's own forms (ray://, auto) are left to Ray."""
    import socket

    from onnxsplit.running.ray_engine import RunError, reachable

    began = time.monotonic()
    with pytest.raises(RunError, match="cannot reach a Ray cluster at 127.0.0.1:1 within") as e:
        reachable("127.0.0.1:1", seconds=2)
    assert time.monotonic() - began < 3 and "\n" not in str(e.value)
    with pytest.raises(RunError, match="the port must be a number"):
        reachable("localhost:http")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        reachable(f"127.0.0.1:{listening.getsockname()[1]}")
    reachable("ray://10.255.255.1:10001")
    reachable("auto")
