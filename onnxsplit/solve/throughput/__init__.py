"""Throughput (max load of a pipeline): the DP over ideals (``dp``, ``dp_linear``) with its
lattice and preprocessing, ``dp_ring``, the integer program (``ip``) and what it uses:
the pairwise improvement step and its bounds (``bounds``: packing; ``bound_setcover``,
``bound_spread``, ``bound_parts``).  Write-up: docs/throughput.md.
"""
