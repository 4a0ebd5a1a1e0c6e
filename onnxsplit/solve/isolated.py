"""Native calls in a child process of their own, one at a time.

Scotch (through pyscotch) aborts, crashes or hangs on some graphs (a 6,000-node
transformer-like workload, one run in two), and in a thread of this process that ends the
command.  In a child process a crash is an error here (the next call starts a fresh
child), a hang ends at the call's timeout, and the child is killed on Ctrl-C.

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


class Child:
    """A child Python process serving ``call(function, *args)`` requests."""

    def __init__(self):
        self.proc = None
        self._start()

    def _start(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
        self.proc = subprocess.Popen([sys.executable, "-m", __spec__.name], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        interrupt.register(self.proc)

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, function: str, *args, timeout: float | None = None):
        """``function`` ("module:name") called with ``args`` in the child; its exception is
        raised here; SolveError where the child died or ``timeout`` passed."""
        if self.proc.poll() is not None:  # the last call ended it
            self.close()
            self._start()
        try:
            pickle.dump((function, args), self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.flush()
            deadline = None if timeout is None else time.perf_counter() + timeout
            fd = self.proc.stdout.fileno()
            while not select.select([fd], [], [], 0.1)[0]:  # in slices: Ctrl-C is seen within one
                interrupt.check()
                if deadline is not None and time.perf_counter() > deadline:
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
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        interrupt.unregister(self.proc)


def _serve() -> None:
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            function, args = pickle.load(requests)
        except EOFError:
            return
        module, _, name = function.partition(":")
        try:
            reply = (True, getattr(importlib.import_module(module), name)(*args))
        except Exception as e:
            reply = (False, e)
        pickle.dump(reply, replies, protocol=pickle.HIGHEST_PROTOCOL)
        replies.flush()


if __name__ == "__main__":
    _serve()
