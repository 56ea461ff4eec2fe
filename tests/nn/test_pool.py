import pytest
import torch
from torch_geometric.data import Batch

import hiergraph.nn.pool as pool_module
from hiergraph.data import from_nested, window_forest, window_hierarchy
from hiergraph.data.restructure import tree_of_nodes
from hiergraph.nn import coarsen_leaves, global_leaf_mean_pool, select_leaf
from hiergraph.ops import hierarchical_attention
from tests.conftest import spy_calls


def _batch():
    trees = [
        from_nested([[0, 1], [2, [3, 4]], 5], x=torch.randn(6, 3)),
        window_hierarchy(5, (2,), x=torch.randn(5, 3)),
    ]
    return trees, Batch.from_data_list(trees)


def test_global_mean_and_select():
    trees, b = _batch()
    pooled = global_leaf_mean_pool(b.x, b)
    assert torch.allclose(pooled, torch.stack([t.x.mean(0) for t in trees]))
    assert torch.equal(select_leaf(b.x, b, 0), torch.stack([t.x[0] for t in trees]))
    assert torch.equal(select_leaf(b.x, b, -1), torch.stack([t.x[-1] for t in trees]))
    mask = torch.ones(11, dtype=torch.bool)
    mask[0] = False
    assert torch.allclose(global_leaf_mean_pool(b.x, b, mask)[0], trees[0].x[1:].mean(0))
    with pytest.raises(ValueError, match="bool tensor of shape"):  # not indices
        global_leaf_mean_pool(b.x, b, mask.long())
    with pytest.raises(ValueError, match=r"shape \[11\]"):
        global_leaf_mean_pool(b.x, b, mask[:5])
    with pytest.raises(ValueError, match=r"position out of range: \[5, 5\] for trees with"):
        select_leaf(b.x, b, 5)
    with pytest.raises(ValueError, match=r"position out of range: \[-9, -9\]"):  # as given
        select_leaf(b.x, b, -9)
    with pytest.raises(TypeError, match="position must be an int, got 1.5"):  # (was leaf 1)
        select_leaf(b.x, b, 1.5)
    with pytest.raises(TypeError, match="position must hold integers"):
        select_leaf(b.x, b, torch.tensor([1.0, 0.0]))
    for pool in (global_leaf_mean_pool, select_leaf, coarsen_leaves):  # (PyG scatter errors)
        with pytest.raises(ValueError, match=r"x must have one row per leaf, \[11, ...\]"):
            pool(b.x[:8], b)
    with pytest.raises(ValueError, match=r"position must be an int or a \[num_trees=2\]"):
        select_leaf(b.x, b, torch.tensor([0, 1, 2]))


def test_a_batch_of_forests_pools_every_tree():
    """A PyG batch of forests (:func:`window_forest`, whose ``batch`` numbers its
    sequences) pools and selects per sequence: the collated ``batch`` numbers the forests,
    so the trees come from the structure (the batch had 2 means for 5 sequences)."""
    forests = [window_forest([8, 4], (2, 2)), window_forest([4, 6, 2], (2, 2))]
    b = Batch.from_data_list(forests)
    x = torch.randn(b.tree_index().leaf_node.numel(), 3)
    sequences = [8, 4, 4, 6, 2]
    parts = x.split(sequences)
    torch.testing.assert_close(global_leaf_mean_pool(x, b), torch.stack([p.mean(0) for p in parts]))
    assert torch.equal(select_leaf(x, b, -1), torch.stack([p[-1] for p in parts]))
    own = [f.batch + offset for f, offset in zip(forests, (0, 2), strict=True)]
    assert torch.equal(tree_of_nodes(b), torch.cat(own))  # the forests' own, in leaf order
    assert torch.equal(tree_of_nodes(forests[1]), forests[1].batch)


@pytest.mark.parametrize("dtype", [torch.float16])  # CPU scatters already sum bf16 in float32
def test_half_precision_means_are_summed_in_float32(dtype):
    # 70,000 leaves: an fp16 sum of ones overflows (inf, a NaN mean)
    tree = window_hierarchy(70_000, (70_000,))
    x = torch.ones(70_000, 2, dtype=dtype)
    pooled = global_leaf_mean_pool(x, tree)
    assert pooled.dtype == dtype and pooled.tolist() == [[1.0, 1.0]]
    ramp = (torch.arange(70_000) % 7).to(dtype)[:, None]  # mean 3 exactly (70,000 = 7 * 10^4)
    assert global_leaf_mean_pool(ramp, tree).item() == 3.0


def test_coarsen_pools_leaf_families_into_parents():
    trees, b = _batch()
    x, coarse, cluster = coarsen_leaves(b.x, b)
    # tree 0: leaves 2 and 5 stay, (0 1) and (3 4) collapse; tree 1: windows (0 1) (2 3) (4)
    assert cluster.tolist() == [2, 2, 0, 3, 3, 1, 4, 4, 5, 5, 6]
    t0, t1 = trees[0].x, trees[1].x
    expected = torch.stack(
        [t0[2], t0[5], t0[:2].mean(0), t0[3:5].mean(0), t1[:2].mean(0), t1[2:4].mean(0), t1[4]]
    )
    assert torch.allclose(x, expected)
    assert coarse.num_leaves == 7 and coarse.num_trees == 2
    out = hierarchical_attention(x.unsqueeze(1), x.unsqueeze(1), x.unsqueeze(1), coarse)
    assert out.shape == (7, 1, 3) and torch.isfinite(out).all()
    x2, coarser, _ = coarsen_leaves(x, coarse)  # climbing again
    # tree 0 keeps two leaves and collapses the node over (2, (3 4)); tree 1 collapses to its root
    assert coarser.num_leaves == 4 and coarser.num_trees == 2
    assert torch.allclose(x2, torch.stack([x[1], x[2], x[[0, 3]].mean(0), x[4:].mean(0)]))


def test_integer_features_are_not_averaged():
    """A mean of integer rows (a document's token ids, say) was floored: leaves {0, 1}
    pooled to 0. Averaging refuses them; sums and maxima of integers stay exact."""
    tree = window_hierarchy(9, (3, 3))
    ids = torch.arange(9)[:, None]
    for pool in (lambda: coarsen_leaves(ids, tree), lambda: global_leaf_mean_pool(ids, tree)):
        with pytest.raises(TypeError, match="x must be floating-point to be averaged"):
            pool()
    summed, _, _ = coarsen_leaves(ids, tree, reduce="sum")
    assert summed.view(-1).tolist() == [3, 12, 21]


def test_coarsen_leaves_pools_half_precision_in_float32(monkeypatch):
    """bf16 features are pooled in float32 and rounded once (on GPUs a bf16 scatter adds
    atomically, rounding at every child): the result is the float32 pooling, rounded."""
    pooled = spy_calls(monkeypatch, pool_module, "scatter")
    tree = window_hierarchy(1000, (100,))
    x = torch.rand(1000, 3, generator=torch.Generator().manual_seed(0)).bfloat16()
    out, _, _ = coarsen_leaves(x, tree)
    assert [call["src"].dtype for call in pooled] == [torch.float32]
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, coarsen_leaves(x.float(), tree)[0].bfloat16())


@pytest.mark.parametrize("pool", [global_leaf_mean_pool, select_leaf, coarsen_leaves])
def test_features_moved_without_the_hierarchy_say_to_move_it(pool):
    """(``x`` moved to a device, the hierarchy left behind) failed inside the scatter
    with PyTorch's device error, which names neither of them."""
    h = window_hierarchy(8, (2, 4))
    with pytest.raises(ValueError, match=r"hierarchy is on cpu but x is on meta.*hierarchy.to"):
        pool(torch.randn(8, 3, device="meta"), h)
