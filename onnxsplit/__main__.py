"""``python -m onnxsplit``: the command line (:mod:`onnxsplit.cli`).  Write-up: README.md."""

from .cli import entry

entry()
