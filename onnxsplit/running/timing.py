"""How long onnxsplit's measurements last: ONNXSPLIT_TIMING_SCALE=F (0 < F <= 1).

Every timed stretch -- a calibration's warm-up and rounds, the runner's costs, ``run``'s
rounds and the pauses between them -- lasts F times its usual length (rounds keep their
count).  Shorter is noisier: the test suite runs at a fifth (a tiny model's main command
spent 36 s of its 42 s calibrating), and a user in a hurry may too.  A calibration records
the scale it was made at, and one made at a smaller scale than a later command's is
measured again (``calibrate.stale``).
"""

from __future__ import annotations

import os

SCALE_ENV = "ONNXSPLIT_TIMING_SCALE"


def scale() -> float:
    """The timing scale (SCALE_ENV; 1 where unset), or one line naming a bad value."""
    from ..errors import ProfileError

    raw = os.environ.get(SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        f = float(raw)
    except ValueError:
        f = float("nan")
    if not 0 < f <= 1:
        raise ProfileError(f"{SCALE_ENV} must be a number above 0 and at most 1, not {raw!r}")
    return f
