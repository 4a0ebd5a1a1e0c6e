"""Single-stream latency: ``latency_dp`` (``dp``), ``latency_series`` (``series``, on the
``blocks`` between cut vertices), the integer program (``ip``) with its bounds (``bounds``:
the path bound and its ``call_times``; ``bound_series`` on ``cpsat``) and the ``polish``
step.  Nothing here is imported by ``__init__``: the CP-SAT worker imports its module
alone.  Write-up: docs/latency.md.
"""
