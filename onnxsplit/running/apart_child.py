"""The child's side of :class:`.apart.Apart`: the configuration it holds, built from its
recipe (:func:`.runner.build_configuration`), run and measured here, in the child."""

from __future__ import annotations

from typing import Any, Mapping

from .runner import build_configuration, measure_pipeline

_HELD: dict[str, Any] = {}  # the configuration and the inputs it runs


def load(recipe: tuple, feeds: Mapping[str, Any]) -> dict[str, Any]:
    """Build ``recipe`` and keep it with ``feeds``: what the parent reads of it."""
    held = build_configuration(recipe)
    _HELD.update(held=held, feeds=dict(feeds))
    facts = {"depth": held.default_depth(), "spins": getattr(held, "spins", True)}
    for name in ("requests", "precision"):
        if hasattr(held, name):
            facts[name] = getattr(held, name)
    return facts


def once() -> dict[str, Any]:
    """One run of the held configuration: its outputs."""
    return _HELD["held"].run(_HELD["feeds"])


def measure(samples: int, warmup: int, depth: int | None) -> dict[str, float]:
    """:func:`.runner.measure_pipeline` of the held configuration."""
    return measure_pipeline(_HELD["held"], _HELD["feeds"], samples, warmup, depth)
