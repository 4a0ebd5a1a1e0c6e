"""Progress on a terminal: a long step (profiling, calibrating, solving, exporting,
measuring) shows how far it is on stderr, where stderr is a terminal, and nothing with
``--json`` or ``--quiet`` (the caller's ``quiet``) or in a pipe or a log file, where a
redrawn bar would only litter the text.  The one-line steps a command narrates
(``importing ...``, ``solving ...``) are not progress: they stay as they are."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

QUIET_S = 1.0  # a step shorter than this draws nothing (no flicker)


def say(quiet: bool, text: str) -> None:
    """One line of what a command is doing, on stderr (nothing where ``quiet``; a line
    break inside it, as a path may hold, written as \\n)."""
    if not quiet:
        print(escaped(text), file=sys.stderr, flush=True)


def escaped(text: str) -> str:
    """``text`` on one line: a line break inside it written as \\n (a path may hold one),
    so that it cannot forge another line of the command's."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def shown(quiet: bool = False) -> bool:
    """Whether progress is drawn: not ``quiet``, and stderr is a terminal."""
    if quiet:
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # (closed, or replaced by an object without it)
        return False


class _NoBar:
    total = None

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: int | None, desc: str, quiet: bool = False, unit: str = "step"):
    """A tqdm bar on stderr where :func:`shown`, else one that draws nothing; close it."""
    if not shown(quiet):
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                dynamic_ncols=True, mininterval=0.2, delay=0.5)


def solve_line(method: str, seconds: float, best: float | None, bound: float | None) -> None:
    """One line on stderr every few seconds of a long solve: best plan, bound, gap."""
    gap = f", gap {(best - bound) / best:.2%}" if best and bound is not None else ""
    print(f"  {method} {seconds:5.0f} s: best {best:.6g}" if best is not None else
          f"  {method} {seconds:5.0f} s: no plan yet", end="", file=sys.stderr)
    print((f", bound {bound:.6g}" if bound is not None else "") + gap, file=sys.stderr, flush=True)


@contextmanager
def solving(quiet: bool = False) -> Iterator[None]:
    """A long solve inside says where it stands (:func:`solve_line`) where :func:`shown`."""
    from .solve import anytime

    before = anytime.report
    if shown(quiet):
        anytime.report = solve_line
    try:
        yield
    finally:
        anytime.report = before


@contextmanager
def ticking(desc: str, quiet: bool = False) -> Iterator[None]:
    """A step whose length is not known ahead (a calibration in a child process, a run
    measured in rounds) shows its time so far, where :func:`shown`."""
    if not shown(quiet):
        yield
        return
    import threading

    from tqdm import tqdm

    line = tqdm(total=None, desc=desc, bar_format="{desc}: {elapsed}", file=sys.stderr, leave=False,
                delay=QUIET_S)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.5):
            line.refresh()

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        line.close()
