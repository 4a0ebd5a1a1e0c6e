"""The Ray daemons a process started (what test_ray.py and test_serve.py check is gone),
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
