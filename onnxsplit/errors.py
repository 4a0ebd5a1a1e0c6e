"""Errors that reach the user as one line, never as a traceback."""


class OnnxsplitError(Exception):
    """Base class: the CLI prints ``str(error)`` on one line and exits non-zero."""


class WorkloadError(OnnxsplitError):
    """The workload file or object is malformed (names the offending node or edge)."""


class SplitError(OnnxsplitError):
    """A split / assignment does not fit the workload (unknown node or device, ...)."""


class SolveError(OnnxsplitError):
    """A solver could not produce a plan (infeasible, too large, ...)."""


class TooManyIdeals(SolveError):
    """The graph's lattice of ideals is too large for the exact DP (a linearized DP is not)."""


class ModelError(OnnxsplitError):
    """An ONNX model cannot be imported (unreadable, malformed, unbound shape, unrunnable op)."""


class ProfileError(OnnxsplitError):
    """Profiling failed, or a profile file is malformed or does not match the model."""


class ClusterError(OnnxsplitError):
    """A cluster spec is malformed (names the offending field) or cannot describe a workload."""


class MemoryLimit(OnnxsplitError):
    """A step would take more memory than the limit allows (``--memory-limit``)."""


class CheckFailed(OnnxsplitError):
    """The parts do not reproduce the model: they are not written (the CLI exits 1, as a
    failed check of `run` does)."""


class RunError(OnnxsplitError):
    """A part failed, or a parts folder cannot be loaded or run."""
