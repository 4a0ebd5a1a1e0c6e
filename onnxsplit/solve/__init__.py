"""The solvers: from a Workload to a placement (a Plan the evaluator has scored).

Start at ``methods.py``, the registry of every method (``api.solve`` and the CLI go
through it).  ``evaluate.py`` judges every plan; ``anytime.py`` makes every solve return
by its time limit.  Shared pieces: ``classes.py``, ``finish.py``, ``orders.py``,
``preprocess.py``, ``milp.py``, ``warm_starts.py``, ``isolated.py``, ``partitioners.py``.
The methods: ``throughput/`` (max load of a pipeline), ``latency/`` (single-stream
latency), ``baselines/`` (the paper's baselines and today's default placements).

Write-up: docs/throughput.md, docs/latency.md, docs/baselines.md, the model in
docs/README.md; a map of the files: README.md (Layout).
"""
