"""A page as a user's browser shows it: headless Chromium's screenshot and DOM, and the
screenshot's pixels (a PNG decoded with zlib and numpy, so the tests need no imaging
library)."""

from __future__ import annotations

import functools
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np

CHROMIUM = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
NO_CHROMIUM = "no Chromium here (Debian: apt-get install chromium; make test installs it where it can)"
SCREEN_H = 900  # one screen


@functools.cache
def unusable() -> str | None:
    """Why the tests cannot look at a page here (None: they can): no Chromium, or one that
    does not run headless (a snap's wrapper in a container, say)."""
    if CHROMIUM is None:
        return NO_CHROMIUM
    try:
        _run("--dump-dom", "about:blank")
    except (OSError, subprocess.SubprocessError) as e:
        said = (getattr(e, "stderr", None) or str(e)).strip().splitlines()
        return f"{CHROMIUM} does not run headless here: {said[-1] if said else e}"
    return None


def _run(*args: str) -> str:
    got = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          *args], capture_output=True, text=True, timeout=120, check=True)
    return got.stdout


def screenshot(page: Path, png: Path, width: int = 1300, height: int = 4 * SCREEN_H) -> Path:
    _run(f"--screenshot={png.resolve()}", f"--window-size={width},{height}", page.resolve().as_uri())
    return png


def dump_dom(page: Path) -> str:
    return _run("--dump-dom", page.resolve().as_uri())


def pixels(png: Path) -> np.ndarray:
    """(height, width, channels) uint8 of an 8-bit, non-interlaced RGB or RGBA PNG."""
    data = png.read_bytes()
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I", data[pos:pos + 4])[0], data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
        elif kind == b"IDAT":
            idat += body
    bpp = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, w * bpp + 1)
    out = np.zeros((h, w * bpp), dtype=np.uint8)
    prev = np.zeros(w * bpp, dtype=np.int64)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int64)
        if f == 0:
            cur = line
        elif f == 1:  # Sub: a running sum per channel
            cur = np.cumsum(line.reshape(w, bpp), axis=0).reshape(-1) % 256
        elif f == 2:
            cur = (line + prev) % 256
        else:  # Average, Paeth: each byte needs the one to its left
            cur = _sequential(f, line.tolist(), prev.tolist(), bpp)
        out[y] = cur
        prev = np.asarray(cur, dtype=np.int64)
    return out.reshape(h, w, bpp)


def _sequential(f: int, line: list[int], up: list[int], bpp: int) -> np.ndarray:
    cur = [0] * len(line)
    for i, x in enumerate(line):
        a = cur[i - bpp] if i >= bpp else 0
        b = up[i]
        if f == 3:
            cur[i] = (x + (a + b) // 2) & 255
            continue
        c = up[i - bpp] if i >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        cur[i] = (x + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    return np.array(cur, dtype=np.int64)


def content_height(png: Path) -> int:
    """Pixels from the top to the last row that is not the page's white background."""
    img = pixels(png)[:, :, :3]
    busy = np.flatnonzero((img < 250).any(axis=(1, 2)))
    return int(busy[-1]) + 1 if busy.size else 0
