"""The Ray daemons a process started (what test_ray.py and test_served.py check is gone),
and how a test starts a command that Ctrl-C reaches."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def sigint_as_in_a_terminal() -> None:
    """A child's ``preexec_fn``: Ctrl-C reaches it as in a terminal, even where the tests
    run in the background (whose children inherit an ignored SIGINT, and Python then
    installs no handler for it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ray_processes(driver: int | None = None) -> set[int]:
    """Pids of the Ray daemons (raylet, GCS) of the Ray that process ``driver`` started
    (default: this one): their session is named after it, so another Ray on the machine
    does not count."""
    driver = os.getpid() if driver is None else driver
    mark = f"_{driver}/".encode()
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if (b"raylet" in cmd or b"gcs_server" in cmd) and mark in cmd:
                out.add(int(pid))
    return out


# how long Ray's daemons may take to go once their driver shut Ray down or died: on a busy
# 2-core machine they took longer than the 10 s first allowed (the suite failed while
# another process used part of a core); what is checked is that they go, not how fast
GONE_S = 60.0


def gone(driver: int | None = None, since: set[int] = frozenset(), within: float = GONE_S) -> bool:
    """Wait until no Ray daemon of ``driver`` (beyond ``since``) runs, at most ``within``
    seconds; whether none is left."""
    import time

    deadline = time.monotonic() + within
    while ray_processes(driver) - set(since):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def descendants(root: int) -> dict[int, str]:
    """The processes under ``root`` (pid -> its command line, as Ray's workers retitle
    theirs: ``ray::ServeReplica:APP:DEPLOYMENT``, ``ray::ProxyActor``, ...)."""
    parent: dict[int, int] = {}
    title: dict[int, str] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            ppid = next((line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), "0")
            parent[int(pid)], title[int(pid)] = int(ppid), " ".join(cmd.decode(errors="replace").split("\0")).strip()
    out: dict[int, str] = {}
    for pid in parent:
        p = parent[pid]
        while p and p != root and p in parent:
            p = parent[p]
        if p == root and pid != root:
            out[pid] = title[pid]
    return out


def label(title: str) -> str:
    """A process's short name: Ray's own title (ray::...), a Python program's script or
    module, else the program."""
    words = title.split()
    if not words:
        return "?"
    if words[0].startswith("ray::"):
        return words[0]
    if not Path(words[0]).name.startswith("python"):
        return Path(words[0]).name
    if "-m" in words:
        return " ".join(words[words.index("-m") + 1:][:2])
    return Path(next((w for w in words[1:] if w.endswith(".py")), words[0])).name


def rss_mib(pid: int) -> float | None:
    """A process's resident memory (VmRSS) in MiB; None where it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def serve_in_background(parts_dir, ready_file, *args: str, name: str = "mlp", wait_s: float = 330.0):
    """``onnxsplit serve PARTS`` started as a user's terminal would (Ctrl-C reaches it),
    waited for until it answers: (the process, its host:port).  A server not up within
    ``wait_s`` is stopped and the test fails with the end of its stderr."""
    import socket
    import subprocess
    import sys
    import time

    import pytest

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "onnxsplit", "serve", str(parts_dir), "--port", str(port),
                             "--name", name, "--ready-file", str(ready_file), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=sigint_as_in_a_terminal)
    deadline = time.time() + wait_s
    while not Path(ready_file).exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    if not Path(ready_file).exists():  # (its stderr ends only once it has: stop it first)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        pytest.fail(f"not serving within {wait_s:g} s: {err.decode()[-2000:]}")
    return proc, f"127.0.0.1:{port}"


def stop_server(proc, wait_s: float = 20.0) -> str:
    """Ctrl-C a server from :func:`serve_in_background`, as a user stops it (killed where
    it has not ended within ``wait_s``): what went wrong, '' where it exited 130 and left
    no Ray process."""
    import subprocess

    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.returncode != 130:
        return f"the server exited {proc.returncode}, not 130"
    return "" if gone(proc.pid) else "a Ray process the server started is still running"


def ask_concurrently(url: str, session, shape_of, clients: int, requests: int, *, rtol: float, atol: float,
                     join_s: float, name: str = "mlp", binary: bool | None = None) -> tuple[list[str], list[int]]:
    """``clients`` tritonclient clients at once, each sending ``requests`` requests of
    random floats (client k's j-th of shape ``shape_of(k, j)``; ``binary``: the tensors
    binary, or JSON, or None: in turn), each answer checked against ``session``
    (onnxruntime on the original model):
    (what went wrong, the rows of each request answered right)."""
    import threading

    import numpy as np
    from tritonclient.http import InferenceServerClient, InferInput

    x_name, y_name = session.get_inputs()[0].name, session.get_outputs()[0].name
    errors: list[str] = []
    rows: list[int] = []

    def one_client(k: int) -> None:
        c = InferenceServerClient(url)
        rng = np.random.default_rng(k)
        for j in range(requests):
            x = rng.standard_normal(shape_of(k, j)).astype(np.float32)
            inp = InferInput(x_name, list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=(j % 2 == 0) if binary is None else binary)
            try:
                got = c.infer(name, [inp]).as_numpy(y_name)
                np.testing.assert_allclose(got, session.run(None, {x_name: x})[0], rtol=rtol, atol=atol)
                rows.append(x.shape[0])
            except Exception as e:  # noqa: BLE001 (collected, asserted by the caller)
                errors.append(f"client {k} request {j}: {' '.join(str(e).split())[:300]}")

    threads = [threading.Thread(target=one_client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=join_s)
    return errors, rows
