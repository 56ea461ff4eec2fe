import math

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import window_hierarchy
from hiergraph.data.restructure import lift_leaves
from hiergraph.ops import hierarchical_attention
from hiergraph.ops.hsa.lifted import lifted_uniform_attention, runs_lifted


def forest(trees, branching):
    n = math.prod(branching)
    return Batch.from_data_list([window_hierarchy(n, branching) for _ in range(trees)])


def reference(q, k, v, batch, lifted, pos_emb, **options):
    """HSA over the tree rebuilt by ``lift_leaves``, embeddings carried, the hubs' zero."""
    tree, node = lift_leaves(batch, lifted)
    index = tree.tree_index()
    if pos_emb is not None:
        pos_emb = pos_emb.index_select(0, node).clone()
        pos_emb[index.leaf_node[lifted]] = 0.0
    return hierarchical_attention(q, k, v, index, pos_emb=pos_emb, **options)


def inputs(length, seed, heads=2, grad=False):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(length, heads, d, generator=gen, dtype=torch.float64).requires_grad_(grad)
        for d in (4, 4, 3)
    ]


# trees, branching, hubs per tree (row: tree; None: random), masked leaves per tree
CASES = [
    (3, (2, 4), [[0, 5], [], [1, 2, 3, 4, 6, 7]], None),  # none, some, all but one
    (2, (3, 2, 2), [list(range(12)), [0, 11]], None),  # a tree lifted whole
    (2, (2, 2), [[1], [2, 3]], [[0, 3], [0, 1, 2]]),  # masks: one valid leaf, a hub alone
    (4, (4, 2), None, [[7], [], [0, 1, 2, 3, 4, 5, 6, 7], [2]]),  # a tree fully masked
]


@pytest.mark.parametrize("trees, branching, hubs, masked", CASES)
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("size_bias", [True, False])
@pytest.mark.parametrize("pos_heads", [None, 1, 2])
def test_equals_hsa_over_the_lifted_tree(trees, branching, hubs, masked, include_self,
                                         size_bias, pos_heads):  # fmt: skip
    batch = forest(trees, branching)
    index = batch.tree_index()
    n = math.prod(branching)
    q, k, v = inputs(trees * n, seed=len(branching))
    assert runs_lifted(index, q)
    mask = None
    if masked is not None:
        mask = torch.ones(trees, n, dtype=torch.bool)
        for t, rows in enumerate(masked):
            mask[t, rows] = False
        mask = mask.view(-1)
    if hubs is None:  # random hubs among the valid leaves
        gen = torch.Generator().manual_seed(7)
        lifted = torch.rand(trees * n, generator=gen) < 0.3
    else:
        lifted = torch.zeros(trees, n, dtype=torch.bool)
        for t, rows in enumerate(hubs):
            lifted[t, rows] = True
        lifted = lifted.view(-1)
    if mask is not None:
        lifted &= mask
    slots = int(lifted.view(trees, n).sum(1).max()) + 1  # more slots than hubs
    pos = None
    if pos_heads is not None:
        gen = torch.Generator().manual_seed(3)
        pos = torch.randn(batch.num_nodes, pos_heads, 2, generator=gen, dtype=torch.float64)
    options = dict(include_self=include_self, leaf_mask=mask, size_bias=size_bias)
    want = reference(q, k, v, batch, lifted, pos, scale=0.3, **options)
    got = lifted_uniform_attention(q, k, v, index, lifted, slots, pos_emb=pos, tau=0.3, **options)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    if mask is not None:
        assert (got[~mask] == 0).all()


def test_gradients_equal_those_over_the_lifted_tree():
    batch = forest(3, (2, 3, 2))
    index = batch.tree_index()
    q, k, v = inputs(36, seed=4, grad=True)
    lifted = torch.zeros(36, dtype=torch.bool)
    lifted[[0, 5, 13, 30, 31, 35]] = True
    mask = torch.ones(36, dtype=torch.bool)
    mask[[1, 14, 33]] = False
    pos = torch.randn(batch.num_nodes, 2, 3, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(36, 2, 3, dtype=torch.float64)
    options = dict(include_self=True, leaf_mask=mask, size_bias=True)
    want = reference(q, k, v, batch, lifted, pos, scale=0.3, **options)
    got = lifted_uniform_attention(q, k, v, index, lifted, 4, pos_emb=pos, tau=0.3, **options)
    assert (got - reference(q, k, v, batch, lifted, pos, **options)).abs().max() > 1e-6  # tau
    for a, b in zip(
        torch.autograd.grad((want * upstream).sum(), (q, k, v, pos)),
        torch.autograd.grad((got * upstream).sum(), (q, k, v, pos)),
        strict=True,
    ):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12)


def test_runs_only_on_equal_fanout_forests_below_depth_one():
    q = torch.randn(8, 2, 4)
    assert not runs_lifted(Batch.from_data_list([window_hierarchy(8, (8,))]).tree_index(), q)
    assert not runs_lifted(Batch.from_data_list([window_hierarchy(7, (2, 4))]).tree_index(), q)
    assert runs_lifted(Batch.from_data_list([window_hierarchy(8, (2, 4))]).tree_index(), q)
