"""Ctrl-C ends any command within 2 s, leaving no output folder and no child process.

A long native call in the main thread (a MIP solve, a numba kernel, an onnxruntime run)
would keep Python's signal handler waiting, so the command's body runs in a worker
thread (:func:`run`) while the main thread only waits.  On SIGINT it sets :data:`CANCEL`,
which the solvers' loops see through :func:`check` / :func:`past` (and :func:`stopped`),
gives the worker GRACE_S to unwind, removes what is still registered (:func:`fresh_dir`,
:func:`fresh_file`, :func:`register`: staging folders, temporary files, child processes)
and exits with status 130.  Used as a library (no :func:`run`), KeyboardInterrupt behaves as usual.

Write-up: docs/README.md (Limits).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

GRACE_S = 1.2  # for the worker to unwind by itself before the process is ended
HOLD_S = 0.4  # for a step the process must not end in the middle of (:func:`held`) to finish
CANCEL = threading.Event()

_lock = threading.Lock()
_registered: dict[int, Any] = {}
_hold = threading.Lock()  # held by a step in progress that must end whole (:func:`held`)


class Interrupted(KeyboardInterrupt):
    """Raised in the worker once the command has been interrupted (or, in a thread that
    :func:`adopt` gave a stop event, once that is set)."""


_local = threading.local()


def adopt(stop: threading.Event) -> None:
    """From now on :func:`check` in this thread also raises once ``stop`` is set (a solve
    whose caller has stopped waiting for it: solve/anytime.py)."""
    _local.stop = stop


def stop_event() -> threading.Event | None:
    """This thread's stop event (for callbacks that run elsewhere: see :func:`stopped`)."""
    return getattr(_local, "stop", None)


def stopped(stop: threading.Event | None = None) -> bool:
    """Whether the command was interrupted or ``stop`` (default: this thread's) is set."""
    stop = stop if stop is not None else getattr(_local, "stop", None)
    return CANCEL.is_set() or (stop is not None and stop.is_set())


def check() -> None:
    """Raise :class:`Interrupted` once the command was interrupted (cheap: call it in loops)."""
    if stopped():
        raise Interrupted()


def past(deadline: float) -> bool:
    """Whether ``deadline`` (a time.perf_counter() value) has passed; raises
    :class:`Interrupted` once the command was interrupted."""
    check()
    return time.perf_counter() > deadline


@contextmanager
def held() -> Iterator[None]:
    """A short step the process is not ended in the middle of (a finished folder swapped
    into place and the one it replaced removed): an interrupt that comes during it ends the
    process after it (waiting at most HOLD_S); one that came before it raises
    :class:`Interrupted` instead of starting it.  (Beside a CPU-bound process, Ctrl-C
    while exporting once left a folder under its staging name: a process ended between
    the swap and the removal leaves the replaced folder so.)"""
    with _hold:
        check()
        yield


def register(thing: Any) -> None:
    """Remove or kill ``thing`` (a path, or a process with ``kill``) should the process be
    ended by an interrupt before :func:`unregister`.  A path: only one this process created
    under a fresh name (and rather by :func:`fresh_dir` / :func:`fresh_file`)."""
    with _lock:
        _registered[id(thing)] = thing


def fresh_dir(**mkdtemp: Any) -> Path:
    """``tempfile.mkdtemp(**mkdtemp)``, registered (as :func:`register`) in the same step:
    once Ctrl-C came, none is made (:class:`Interrupted`), and one made before is removed at
    the process's end.  (Made first and registered after, a folder made while the main thread
    was removing what was registered outlived the process, beside a CPU-bound process.)"""
    with _lock:
        check()
        path = Path(tempfile.mkdtemp(**mkdtemp))
        _registered[id(path)] = path
    return path


def fresh_file(**mkstemp: Any) -> tuple[int, str]:
    """``tempfile.mkstemp(**mkstemp)`` as :func:`fresh_dir` makes a folder; unregister the
    name it returns once the file is renamed or removed."""
    with _lock:
        check()
        fd, name = tempfile.mkstemp(**mkstemp)
        _registered[id(name)] = name
    return fd, name


def unregister(thing: Any) -> None:
    with _lock:
        _registered.pop(id(thing), None)


def _remove_registered() -> None:
    with _lock:
        things = list(_registered.values())
        _registered.clear()
    for thing in things:
        try:
            if hasattr(thing, "kill"):
                thing.kill()
            elif isinstance(thing, (str, Path)):
                # only what onnxsplit made under a fresh name (mkdtemp, mkstemp) is registered
                p = Path(thing)
                if p.is_dir() and not p.is_symlink():
                    try:  # (renamed first: a worker still writing by its path adds nothing more to it)
                        p = p.rename(p.with_name(p.name + ".removing"))
                    except OSError:
                        pass
                    for _ in range(5):  # the worker may still be writing into it
                        shutil.rmtree(p, ignore_errors=True)
                        if not p.exists():
                            break
                else:
                    p.unlink(missing_ok=True)
        except OSError:
            pass


_abandoned: list[threading.Thread] = []


def abandon(thread: threading.Thread) -> None:
    """``thread`` was told to stop (its caller went on without it) but may still run."""
    _abandoned.append(thread)


def finish(code: int) -> None:
    """End the process with ``code``.  Where a stopped solve still runs (a native call
    that takes a while to see the stop, gigabytes it would free one object at a time),
    the process ends at once, its output flushed, instead of waiting for it."""
    if any(t.is_alive() for t in _abandoned):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        _remove_registered()
        os._exit(code)
    sys.exit(code)


def run(body: Callable[[], int]) -> int:
    """``body()`` in a worker thread, the main thread watching for Ctrl-C (see above)."""
    if threading.current_thread() is not threading.main_thread():
        return body()  # signals reach only the main thread: nothing to watch for here
    CANCEL.clear()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = body()
        except BaseException as e:  # handed to the main thread
            outcome["error"] = e

    worker = threading.Thread(target=work, name="onnxsplit command", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.05)
    except KeyboardInterrupt:
        CANCEL.set()
        end = time.monotonic() + GRACE_S
        while worker.is_alive() and time.monotonic() < end:
            try:
                worker.join(0.05)
            except KeyboardInterrupt:  # a second Ctrl-C: end now
                break
        # ended here, whether the worker unwound or is stuck in a native call: threads it
        # started may still run inside onnxruntime, whose teardown at a normal exit aborts;
        # a step that must end whole (held) first ends, and none starts after
        _hold.acquire(timeout=HOLD_S)
        _remove_registered()
        print("onnxsplit: interrupted", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(130)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
