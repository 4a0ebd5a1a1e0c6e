"""Progress shows on a terminal and nowhere else: stderr on a pseudo-terminal gets it;
--json and a pipe do not (onnxsplit.progress)."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from onnx_models import mlp
from onnxsplit import progress

ONNXSPLIT = [sys.executable, "-m", "onnxsplit"]


def _on_a_terminal(argv: list[str], timeout: float = 120) -> tuple[int, str]:
    """The command run with stderr on a pseudo-terminal: its exit status and what it drew."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # (a fresh one is 0 x 0)
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    drawn = b""
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            p.kill()
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    return p.wait(timeout=timeout), drawn.decode(errors="replace")


def test_only_a_terminal_is_shown_progress(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    assert progress.shown() and not progress.shown(quiet=True)
    with progress.ticking("waiting"):
        time.sleep(0.6)  # (past the first tick)
    assert "waiting: 00:00" in sys.stderr.getvalue()
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not progress.shown()
    with progress.ticking("waiting"):
        pass
    b = progress.bar(3, "nothing")
    b.update()
    b.close()
    assert sys.stderr.getvalue() == ""


@pytest.mark.least_timing  # (what is drawn is checked here, not what is measured)
def test_the_main_command_shows_its_progress_on_a_terminal_only(tmp_path):
    model = mlp(tmp_path / "m.onnx", layers=2, batch=4, width=32)
    split = [*ONNXSPLIT, str(model), "--out", str(tmp_path / "parts"), "--force"]
    rc, drawn = _on_a_terminal(split + ["--recalibrate"])
    assert rc == 0 and "calibrating on CPU: 00:0" in drawn and "\r" in drawn
    assert "importing" in drawn  # (the steps it narrates, as before)
    rc, drawn = _on_a_terminal(split + ["--recalibrate", "--json"])
    assert rc == 0 and "calibrating" not in drawn and "\r" not in drawn.replace("\r\n", "")
    piped = subprocess.run(split, capture_output=True, text=True)  # (calibrated: quick)
    assert piped.returncode == 0 and "importing" in piped.stderr and "\r" not in piped.stderr
