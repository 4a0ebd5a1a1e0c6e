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


def run(parts_dir, **options):
    """Verify a parts folder against its original model and measure the pipeline (see
    :func:`onnxsplit.runner.run_parts`); a failing part raises ``RunError``, never hangs."""
    from .runner import run_parts

    return run_parts(parts_dir, **options)


def load(parts_dir, **options):
    """The parts, loaded on their execution providers, to run samples through."""
    from .runner import Parts

    return Parts(parts_dir, **options)
