"""onnxsplit: place an ONNX model's operators across devices, write and run the parts.

From Python, the calls a serving pipeline needs (imports stay lazy: ``import onnxsplit``
costs nothing)::

    import onnxsplit
    result = onnxsplit.split("model.onnx", "parts/", input_shapes={"input_ids": (1, 128)})
    report = onnxsplit.run("parts/")        # verify + measure, as 'onnxsplit run' prints
    pipe = onnxsplit.load("parts/")         # Parts: .run(feeds), .stream(samples)

Write-up: README.md (use), docs/README.md (how it works).
"""

from __future__ import annotations

__all__ = ["split", "run", "load"]


def split(model, out, **options):
    """Profile, plan, export and verify: ``onnxsplit MODEL --out OUT`` (see
    :func:`onnxsplit.workflow.split` for the options); returns the --json object."""
    from .workflow import split as _split

    return _split(model, out, **options)


def run(parts_dir, engine: str = "threads", **options):
    """Verify a parts folder against its original model and measure the pipeline (see
    :func:`onnxsplit.running.compare.run_parts`; ``engine="ray"``: on Ray actors, ``address=`` a
    cluster's); a failing part raises ``RunError``, never hangs."""
    if engine == "ray":
        from .running.ray_engine import run_parts as on_ray

        return on_ray(parts_dir, **options)
    from .running.compare import run_parts

    return run_parts(parts_dir, **options)


def load(parts_dir, engine: str = "threads", **options):
    """The parts, loaded on their execution providers, to run samples through:
    ``engine="threads"`` (this process) or ``"ray"`` (one actor per part; ``address=``
    a running cluster's, and ``close()`` it when done)."""
    if engine == "ray":
        from .running.ray_engine import RayParts

        return RayParts(parts_dir, **options)
    from .running.runner import Parts

    return Parts(parts_dir, **options)
