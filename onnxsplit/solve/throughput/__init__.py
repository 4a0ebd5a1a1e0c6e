"""Throughput (max load of a pipeline): the DP over ideals (``dp``, ``dp_linear``) on its
``lattice``, ``dp_ring``, and the integer program (``ip``) with what it uses: the pairwise
improvement step (``improve_pairs``) and its bounds (``bounds``: average work and packing;
``bound_setcover``, ``bound_spread``, ``bound_parts``).  The DP's preprocessing is
``solve/preprocess.py``.  Write-up: docs/throughput.md.
"""
