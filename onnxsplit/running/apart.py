"""Each configuration that `run` compares, held and measured in a process of its own.

In one process, of two identical sessions the one created first ran slower: T5's latency
parts loaded twice measured 0.958, 0.993 and 0.976x the second (1.005 and 1.032 the other
way round; GPT-2's throughput likewise), and `run` loads the plan first, so the bias of
about 2-3% fell on onnxsplit.  In processes of their own the configurations share no
allocator, arena, thread pool or OpenVINO core; the parent still takes the rounds in turn,
paired in time (:func:`.compare.measure_rounds`), and each measurement runs whole in its
child, so no pipe is timed.

    held = Apart(("whole", model, "CPUExecutionProvider", {"threads": 0}), feeds)
    held.measure_pipeline(feeds, samples=50, warmup=5)   # what runner.measure_pipeline gives
    held.close()

Write-up: docs/machine.md (Running and measuring).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..errors import RunError, SolveError
from ..solve.isolated import Child

CHILD = "onnxsplit.running.apart_child"  # what the child runs (it imports the runner, which imports this)


class Apart:
    """A configuration built in a child process from ``recipe`` (as
    :func:`.runner.build_configuration` takes it), running ``feeds``: what
    :func:`.compare.measure_rounds` asks of a loaded configuration, answered there.  The
    child inherits this process's environment (OpenVINO's precision, the timing scale);
    an error there is a :class:`RunError` here, and Ctrl-C ends it."""

    def __init__(self, recipe: tuple, feeds: Mapping[str, Any]):
        self.recipe = recipe
        self._child = Child()
        try:
            facts = self._call("load", recipe, dict(feeds))
        except BaseException:
            self.close()
            raise
        self.depth = facts["depth"]
        self.spins = facts["spins"]
        for name in ("requests", "precision"):
            if name in facts:
                setattr(self, name, facts[name])

    def _call(self, function: str, *args):
        proc = self._child.proc
        if function != "load" and proc.poll() is not None:  # (a fresh child would hold nothing)
            raise RunError(f"{self._name()}: its process ended (exit status {proc.returncode})")
        try:
            return self._child.call(f"{CHILD}:{function}", *args)
        except SolveError as e:  # (the child died: a crash in a session)
            raise RunError(f"{self._name()}: {e}") from None

    def _name(self) -> str:
        return Path(str(self.recipe[1])).name

    def default_depth(self) -> int:
        return self.depth

    def run(self, feeds: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One run of the inputs it was given (``feeds`` is not sent again): its outputs."""
        return self._call("once")

    def measure_pipeline(self, feeds: Mapping[str, Any], samples: int, warmup: int,
                         depth: int | None = None) -> dict[str, float]:
        return self._call("measure", samples, warmup, depth)

    def close(self) -> None:
        self._child.close()

    def __enter__(self) -> "Apart":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
