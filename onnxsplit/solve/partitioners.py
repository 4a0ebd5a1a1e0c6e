"""The external graph partitioners the paper's baselines call: Scotch and METIS.

Kept light (numpy and the partitioner only): Scotch runs in a child process of its own
(:mod:`.isolated`), which imports this module and nothing heavier.

Write-up: docs/baselines.md (scotch, metis).
"""

from __future__ import annotations

import numpy as np

from ..errors import SolveError


def scotch_parts(nparts: int, xadj, adjncy, vweights, eweights, seed: int) -> np.ndarray:
    import contextlib
    import io

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # pyscotch announces itself on import
            import pyscotch
            from pyscotch import Graph
    except ImportError as e:
        raise SolveError(f"method 'scotch' needs the pyscotch package ({e})") from None
    graph = Graph()
    graph.build(xadj, adjncy, velotab=vweights, edlotab=eweights)
    pyscotch.random_seed(seed)
    pyscotch.random_reset()
    return np.asarray(graph.partition(nparts), dtype=np.int64)


def metis_parts(nparts: int, xadj, adjncy, vweights, eweights, seed: int) -> np.ndarray:
    try:
        import pymetis
    except ImportError as e:
        raise SolveError(f"method 'metis' needs the pymetis package ({e})") from None
    # METIS needs positive edge weights and at least one positive vertex weight
    ew = np.maximum(eweights, 1)
    vw = vweights if vweights.any() else np.ones_like(vweights)
    opts = pymetis.Options(seed=seed)
    result = pymetis.part_graph(nparts, adjacency=pymetis.CSRAdjacency(xadj, adjncy), vweights=vw,
                                eweights=ew, options=opts)
    return np.asarray(result.vertex_part, dtype=np.int64)
