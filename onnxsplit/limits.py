"""How much memory one command may take: estimated before a large table is allocated.

The limit is ``--memory-limit`` (or ``ONNXSPLIT_MEMORY_LIMIT``, in GB), by default half of
the memory available when the command starts.  A step that would need more either falls
back (the exact DP to its linearized plan) or ends with one line naming what and how much.

Write-up: docs/README.md (Limits).
"""

from __future__ import annotations

import os

from .errors import MemoryLimit, OnnxsplitError

DEFAULT_SHARE = 0.5  # of the memory available at start
# the most copies (or threads) of one part a plan file or manifest may ask for: each copy
# loads a session of its own, and a damaged file asking for a billion took memory until the
# machine ran out
MAX_COPIES = 1024
_limit: float | None = None


def host_bytes(field: str = "MemTotal") -> int:
    """The host's memory (Linux /proc/meminfo's ``field``: MemTotal, MemAvailable), else its
    physical memory; 0 where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def available_bytes() -> float:
    """Memory available now (8 GB where the system does not say)."""
    return float(host_bytes("MemAvailable") or 8e9)


def set_limit(gb: float | None) -> None:
    """Set the limit in GB (None: the environment's or the default)."""
    global _limit
    if gb is not None and not gb > 0:
        raise OnnxsplitError(f"--memory-limit must be a positive number of GB, not {gb}")
    _limit = None if gb is None else gb * 1e9


def limit_bytes() -> float:
    if _limit is not None:
        return _limit
    env = os.environ.get("ONNXSPLIT_MEMORY_LIMIT")
    if env:
        try:
            gb = float(env)
        except ValueError:
            gb = 0.0
        if not gb > 0:
            raise OnnxsplitError(f"ONNXSPLIT_MEMORY_LIMIT must be a positive number of GB, not '{env}'")
        return gb * 1e9
    return DEFAULT_SHARE * available_bytes()


def fits(nbytes: float) -> bool:
    return nbytes <= limit_bytes()


def need(nbytes: float, what: str) -> None:
    """Raise a one-line error unless ``nbytes`` for ``what`` fit the limit."""
    if not fits(nbytes):
        raise MemoryLimit(f"{what} would need {nbytes / 1e9:.1f} GB, over the memory limit of "
                          f"{limit_bytes() / 1e9:.1f} GB (--memory-limit GB sets it)")

