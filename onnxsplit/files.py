"""Files written whole or not at all: an interrupted or failed write leaves the previous
file as it was (a temporary sibling renamed over it at the end)."""

from __future__ import annotations

import os
from pathlib import Path

from . import interrupt
from .errors import OnnxsplitError


def check_output(path: str | Path | None, inputs=()) -> None:
    """A file a command writes must not be one it reads (the model, the workload, a split,
    a profile, a cluster file): onnxsplit never writes over what the user gave it."""
    if not path:
        return
    for given in inputs:
        try:
            same = given is not None and os.path.samefile(path, given)
        except OSError:  # either is absent
            same = False
        if same:
            raise OnnxsplitError(f"output '{path}' is the input '{given}' itself: choose another file")


def check_replaceable(path: str | Path | None, ours, what: str) -> None:
    """An existing file at ``path`` is replaced only where it is a ``what`` onnxsplit writes
    (``ours(path)`` says so, reading it): a file the user made is never written over.  A
    folder or an unreadable file is left to the write, which fails with the OS's words."""
    if not path or not Path(path).is_file():
        return
    try:
        mine = bool(ours(Path(path)))
    except (OSError, ValueError, UnicodeDecodeError):
        mine = False
    if not mine:
        raise OnnxsplitError(f"'{path}' exists and is not a {what} onnxsplit wrote: choose another file "
                             "(it is left as it is)")


def loads(text: str | bytes):
    """``json.loads``, where text nested deeper than Python's parser can follow (a
    RecursionError, and a traceback) is one more ``json.JSONDecodeError``."""
    import json

    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text if isinstance(text, str) else "", 0) from None


def json_with(*keys: str):
    """``ours`` for :func:`check_replaceable`: a JSON object holding every one of ``keys``."""
    def ours(path: Path) -> bool:
        d = loads(path.read_text(encoding="utf-8"))
        return isinstance(d, dict) and all(k in d for k in keys)
    return ours


def html_with(marker: str):
    """``ours`` for :func:`check_replaceable`: a page whose head holds ``marker``."""
    def ours(path: Path) -> bool:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return marker in fh.read(4096)
    return ours


def write_atomic(path: str | Path, data: str | bytes, inputs=()) -> Path:
    """Write ``data`` to ``path`` in one step (never over one of ``inputs``: see
    :func:`check_output`); the folder must exist."""
    check_output(path, inputs)
    path = Path(path)
    try:
        fd, tmp = interrupt.fresh_file(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:  # named as the file the user asked for, not the temporary
        raise OSError(e.errno, e.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 is for the temporary only
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        interrupt.unregister(tmp)
    return path
