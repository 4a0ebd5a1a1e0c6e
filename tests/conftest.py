"""Shared fixtures: where the paper's workloads are (skipped when absent)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def paper_data_dir() -> Path | None:
    env = os.environ.get("ONNXSPLIT_PAPER_DATA")
    for cand in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "paper-workloads"]:
        if (cand / "expected.json").is_file():
            return cand
    return None


PAPER = paper_data_dir()
needs_paper = pytest.mark.skipif(PAPER is None, reason="paper workloads absent (../shared or ONNXSPLIT_PAPER_DATA)")


@pytest.fixture(scope="session")
def expected() -> dict:
    if PAPER is None:
        pytest.skip("paper workloads absent")
    return json.loads((PAPER / "expected.json").read_text())
