"""Baselines: the placements the paper compares against, and the ones users get today.

The paper's (Tarnawski et al., NeurIPS 2020, Section 6): ``greedy`` (:mod:`.greedy`),
``local_search`` (:mod:`.local_search`), ``pipedream`` (:mod:`.pipedream`), ``scotch``
and ``metis`` (:mod:`.partition`), ``one_accelerator``, ``all_cpu`` and ``given``
(:mod:`.fixed`).  Today's: ``ort_default`` (:mod:`.fixed`) and ``hetero_greedy``
(:mod:`.greedy`).  Every plan is re-scored and checked by
:mod:`onnxsplit.solve.evaluate`; one that breaks memory, support or a colour class comes
back ``infeasible``, its problems in ``details["violations"]`` and its value still
scored, to compare with the paper's numbers (which ignore memory for baselines).

Write-up: docs/baselines.md.
"""

