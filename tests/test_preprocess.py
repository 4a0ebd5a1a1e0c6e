"""Each preprocessing pass of the DP, on its own."""

from __future__ import annotations

import numpy as np

from onnxsplit.solve import preprocess as pp
from onnxsplit.workload import Workload
from workloads import edge, node, workload


def _w(nodes, edges):
    return Workload.from_paper_json(workload(nodes, edges))


def test_contract_color_classes_separates_forward_and_backward():
    w = _w([node(1, 1, 1, cc=5), node(2, 2, 2, cc=5), node(3, 4, 4, backward=True, cc=5), node(4, 8, 8)],
           [edge(1, 2), edge(2, 3), edge(2, 4)])
    c = pp.contract_color_classes(pp.initial(w))
    assert c.size == 3
    fwd5 = c.group[0]
    assert c.group[1] == fwd5 and c.group[2] != fwd5
    assert c.acc_latency[fwd5] == 3 and c.acc_latency[c.group[2]] == 4
    assert not c.backward[fwd5] and c.backward[c.group[2]]
    assert (c.group[0], c.group[2]) in c.true_edges and (c.group[0], c.group[0]) not in c.true_edges


def test_orphan_backward_class_gets_mirrored_standin():
    # forward 1 (class 1); backward 2 (class 1); orphan backward 3 (class 9) feeds 2
    w = _w([node(1, cc=1), node(2, backward=True, cc=1), node(3, 5, 5, backward=True, cc=9)],
           [edge(1, 2), edge(3, 2)])
    c = pp.add_orphan_standins(pp.contract_color_classes(pp.initial(w)))
    standins = [i for i in range(c.size) if not c.backward[i] and len(c.members[i]) == 0]
    assert len(standins) == 1
    s = standins[0]
    assert c.acc_latency[s] == 0 and c.label[s] == c.label[c.group[2]]
    # backward edge 3 -> 2 mirrors to forward edge fwd(2) -> fwd(3) = node 1 -> stand-in
    assert c.artificial == frozenset({(int(c.group[0]), s)})


def test_forward_cycle_through_standin_is_fused():
    # forward 1 -> 2; backward b1 -> b9 -> b2 with b9 an orphan: mirrors give s9 -> 1 and 2 -> s9
    w = _w([node(1, cc=1), node(2, cc=2), node(11, backward=True, cc=1), node(12, backward=True, cc=2),
            node(19, backward=True, cc=9)],
           [edge(1, 2), edge(2, 12), edge(11, 19), edge(19, 12)])
    c = pp.fuse_forward_sccs(pp.add_orphan_standins(pp.contract_color_classes(pp.initial(w))))
    forward = [i for i in range(c.size) if not c.backward[i]]
    backward = [i for i in range(c.size) if c.backward[i]]
    assert len(forward) == 1 and len(backward) == 1  # classes 1, 2, 9 fused
    assert c.group[0] == c.group[1] and c.group[2] == c.group[3] == c.group[4]


def test_zero_latency_node_with_one_neighbour_is_merged():
    # 1 (zero latency, input) -> 2 -> 3; 4 (zero latency) sits between 2 and 3 as well
    w = _w([node(1, 0, 0), node(2), node(3), node(4, 0, 0)],
           [edge(1, 2), edge(2, 3), edge(2, 4), edge(4, 3)])
    c = pp.merge_zero_latency(pp.contract_color_classes(pp.initial(w)))
    assert c.group[0] == c.group[1]  # merged into its only neighbour
    assert len({c.group[1], c.group[2], c.group[3]}) == 3  # node 4 has two neighbours: kept


def test_zero_latency_node_with_backward_work_is_kept():
    w = _w([node(1, 0, 0, cc=1), node(2, cc=2), node(3, 1, 1, backward=True, cc=1)],
           [edge(1, 2)])
    c = pp.merge_zero_latency(pp.contract_color_classes(pp.initial(w)))
    assert c.group[0] != c.group[1]


def test_for_dp_keeps_every_node():
    w = _w([node(1, 0, 0), node(2), node(3, backward=True, cc=2), node(4, backward=True, cc=77)],
           [edge(1, 2), edge(2, 3), edge(4, 3)])
    c = pp.for_dp(w)
    assert sorted(np.concatenate(c.members).tolist()) == [0, 1, 2, 3]
