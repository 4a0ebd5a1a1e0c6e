"""The solvers: from a Workload to a placement (a Plan the evaluator has scored).

Where things live:

* ``methods.py`` -- the registry: every method, its objectives, options and how it runs.
  Start here; ``api.solve`` and the CLI go through it.
* ``evaluate.py`` -- the one judge of every plan (max load, latency, checks).
* ``anytime.py`` -- every solve returns by its time limit with its best plan so far.
* shared pieces: ``classes.py`` (colour classes, blocks, the class graph), ``finish.py``
  (an assignment scored, checked and wrapped as a Plan), ``orders.py`` (topological
  orders), ``preprocess.py`` (the paper's contraction passes), ``milp.py`` (python-mip
  helpers), ``warm_starts.py`` (the integer programs' starts), ``isolated.py`` and
  ``partitioners.py`` (native partitioners in a child process).
* ``throughput/`` -- max-load (pipelined) methods and their bounds.
* ``latency/`` -- single-stream latency methods and their bounds.
* ``baselines/`` -- the paper's baselines and the placements users get today.

Write-ups of the methods: docs/throughput.md, docs/latency.md, docs/baselines.md.
"""
