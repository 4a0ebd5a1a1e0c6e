"""Native calls in a child process of their own, one at a time.

Scotch (through pyscotch) aborts, crashes or hangs on some graphs, and in a thread of
this process that ends the command.  In a child process a crash is an error here (the
next call starts a fresh child), a hang ends at the call's timeout, and the child is
killed on Ctrl-C.  Write-up: docs/baselines.md (scotch, metis).

    with Child() as child:
        parts = child.call("onnxsplit.solve.partitioners:scotch_parts", nparts, xadj, ...)
"""

from __future__ import annotations

import importlib
import os
import pickle
import select
import subprocess
import sys
import time

from .. import interrupt
from ..errors import SolveError


def start(module: str, stderr) -> subprocess.Popen:
    """``python -m module`` with pipes to talk to it, killed should Ctrl-C end this
    process.  It imports what this process imports: its path too (a script may have put
    onnxsplit there itself)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=stderr, env=env)
    interrupt.register(proc)
    return proc


def wait_readable(stream, deadline: float | None) -> bool:
    """Whether ``stream`` has something to read before ``deadline`` (a time.perf_counter()
    value; None: no limit).  Waited for in slices, so Ctrl-C is seen within one."""
    fd = stream.fileno()
    while True:
        left = 0.1 if deadline is None else min(0.1, max(0.0, deadline - time.perf_counter()))
        if select.select([fd], [], [], left)[0]:
            return True
        interrupt.check()
        if deadline is not None and time.perf_counter() >= deadline:
            return False


def end(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if it still runs, and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    interrupt.unregister(proc)


class Child:
    """A child Python process serving ``call(function, *args)`` requests."""

    def __init__(self):
        self.proc = None
        self._start()

    def _start(self) -> None:
        self.proc = start(__spec__.name, subprocess.DEVNULL)

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, function: str, *args, timeout: float | None = None, **kwargs):
        """``function`` ("module:name") called with ``args`` and ``kwargs`` in the child;
        its exception is raised here; SolveError where the child died or ``timeout``
        passed."""
        if self.proc.poll() is not None:  # the last call ended it
            self.close()
            self._start()
        try:
            pickle.dump((function, args, kwargs), self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.flush()
            deadline = None if timeout is None else time.perf_counter() + timeout
            if not wait_readable(self.proc.stdout, deadline):
                raise SolveError(f"{function.rpartition(':')[2]} gave no answer in {timeout:g} s")
            ok, value = pickle.load(self.proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            self.close()
            raise SolveError(f"{function.rpartition(':')[2]} ended its process "
                             f"(exit status {self.proc.returncode})") from None
        except BaseException:  # interrupted, or out of time: it must not answer the next call
            self.close()
            raise
        if not ok:
            raise value
        return value

    def close(self) -> None:
        end(self.proc)


def _serve() -> None:
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            function, args, kwargs = pickle.load(requests)
        except EOFError:
            return
        module, _, name = function.partition(":")
        try:
            reply = (True, getattr(importlib.import_module(module), name)(*args, **kwargs))
        except Exception as e:
            reply = (False, e)
        pickle.dump(reply, replies, protocol=pickle.HIGHEST_PROTOCOL)
        replies.flush()


if __name__ == "__main__":
    _serve()
