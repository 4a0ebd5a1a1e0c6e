"""Baselines: the placements the paper compares against, and the ones users get today.

Every baseline here returns a :class:`~onnxsplit.plan.Plan` that has been re-scored by
:mod:`onnxsplit.solve.evaluate` for the requested objective and checked by
:func:`evaluate.check`.  A plan that breaks memory, accelerator support or a colour class
is returned with ``status="infeasible"`` and the problems in ``details["violations"]``
(its ``value`` is still the score, so it can be compared with the paper's numbers, which
ignore memory for these baselines); it is never called feasible.

The paper's baselines (Tarnawski et al., NeurIPS 2020, Section 6):

* :func:`greedy` -- the latency greedy: colour classes (fused where they lie on a cycle)
  become inseparable blocks, taken in topological order; accelerators are filled one
  after the other by memory; a block that fits no accelerator, or comes after the last
  one is full, goes to the CPU.
* :func:`local_search` -- steepest descent over colour-class moves with random
  restarts.  Unlike the reference it moves only between feasible assignments (memory,
  support), may use CPU cores, updates loads incrementally, and breaks ties in the max
  load by the sum of squared loads so that it does not stop on the first plateau.
* :func:`pipedream` -- PipeDream's planner: collapse branches by biconnected components
  of the forward layer graph, then the max-load DP over the prefixes of one topological
  order.
* :func:`graph_partition` (``scotch``, ``metis``) -- partition the communication-weighted
  graph of colour classes into ``k`` parts balanced by accelerator latency.
* :func:`fixed` -- ``one_accelerator``, ``all_cpu``, ``given`` (a split file).

And what users get today:

* ``ort_default`` -- ONNX Runtime's default: every node the accelerator's execution
  provider supports runs on one accelerator, the rest on the CPU.
* ``hetero_greedy`` -- OpenVINO HETERO-style pipeline distribution: nodes in topological
  order go to the highest-priority device that supports them, the accelerators filled in
  priority order by memory.
"""

