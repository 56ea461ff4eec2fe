"""The errors of :mod:`hiergraph.ops.hsa.inputs` for the shapes a newcomer passes first."""

import pytest
import torch

from hiergraph.data import from_nested
from hiergraph.ops import causal_hierarchical_attention, hierarchical_attention

DOC = from_nested([[0, 1, 2], [3, 4], [[5, 6], 7]])  # 8 leaves, 13 nodes


@pytest.mark.parametrize("op", [hierarchical_attention, causal_hierarchical_attention])
@pytest.mark.parametrize(
    "shape, match",
    [
        ((4, 8, 16), r"q has 4 rows.*8 leaves.*not \[heads, leaves, dim\] \(q.transpose\(0, 1\)\)"),
        ((13, 4, 16), r"q has 13 rows.*8 leaves.*13 is its node count: the inner nodes"),
        ((9, 4, 16), r"q has 9 rows but the hierarchy has 8 leaves; .* in leaf order$"),
        ((1, 8, 4, 16), r"got shape \(1, 8, 4, 16\) \(a batch dimension\?.*Batch.from_data_list"),
    ],
    ids=["heads-first", "one-row-per-node", "wrong-count", "batch-dimension"],
)
def test_wrong_shapes_say_what_to_pass(op, shape, match):
    q = torch.randn(shape)
    with pytest.raises(ValueError, match=match):
        op(q, q, q, DOC)


@pytest.mark.parametrize("op", [hierarchical_attention, causal_hierarchical_attention])
def test_a_hierarchy_on_another_device_than_q_says_to_move_it(op):
    q = torch.randn(8, 2, 4, device="meta")
    moved = r"on cpu but q is on meta; move the hierarchy \(hierarchy.to\('meta'\)"
    with pytest.raises(ValueError, match=moved):
        op(q, q, q, DOC)
