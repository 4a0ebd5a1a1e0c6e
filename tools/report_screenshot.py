"""Screenshot an onnxsplit HTML report in headless Chromium (what a user's browser shows).

    onnxsplit compare workload.json --html report.html
    python tools/report_screenshot.py report.html report.png [--size 1300x1700] [--scale 0.9]
    python tools/report_screenshot.py parts/report.html docs/report.png   # the parts folder's

Needs Chromium (Debian: ``apt-get install chromium``); the report itself needs nothing
(inline SVG and CSS, no script, no network).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--size", default="1300x1700", help="window WIDTHxHEIGHT (default 1300x1700)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="pixels per CSS pixel (default 1; 0.9 keeps a screenful under 300 KB)")
    args = ap.parse_args(argv)
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        print("no Chromium found: apt-get install chromium", file=sys.stderr)
        return 2
    if not args.html.is_file():
        print(f"{args.html}: no such file", file=sys.stderr)
        return 2
    w, h = args.size.lower().split("x")
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--force-device-scale-factor={args.scale}", f"--screenshot={args.png.resolve()}", f"--window-size={w},{h}",
                    args.html.resolve().as_uri()], check=True, capture_output=True, timeout=120)
    print(f"{args.png}: {args.png.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
