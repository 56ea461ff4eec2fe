import pytest
import torch
from torch_geometric.data import Batch

from hiergraph._device import cpu_as_accelerator
from hiergraph.data import (
    Domain,
    SignalHierarchy,
    flatten_hierarchy,
    from_nested,
    random_window_hierarchy,
    window_forest,
    window_hierarchy,
)
from hiergraph.data.restructure import lift_leaves, tree_of_nodes
from hiergraph.ops import hierarchical_attention


def test_flatten_gives_softmax_among_each_trees_leaves():
    trees = [from_nested([[0, 1], [2, [3, 4]]]), window_hierarchy(6, (2, 3))]
    flat = flatten_hierarchy(Batch.from_data_list(trees))
    assert flat.num_trees == 2 and flat.num_leaves == 11 and int(flat.depth.max()) == 1
    q, k, v = (torch.randn(11, 2, 4, dtype=torch.float64) for _ in range(3))
    out = hierarchical_attention(q, k, v, flat, include_self=True)
    for part in (slice(0, 5), slice(5, 11)):
        logits = torch.einsum("ihd,jhd->hij", q[part], k[part]) / 2
        ref = torch.einsum("hij,jhd->ihd", logits.softmax(-1), v[part])
        assert torch.allclose(out[part], ref, atol=1e-13)


def test_random_window_hierarchy_is_ragged_with_mean_branching():
    gen = torch.Generator().manual_seed(0)
    h = random_window_hierarchy(5000, (8,), generator=gen)
    idx = h.tree_index()
    leaf_families = idx.family_size[1:]  # BFS order: the remainder root comes first
    assert h.num_leaves == 5000 and int(leaf_families.sum()) == 5000
    assert leaf_families.min() >= 1 and leaf_families.max() <= 15
    assert abs(leaf_families.float().mean().item() - 8) < 0.5


def test_lift_leaves_moves_leaves_under_the_root_and_drops_empty_nodes():
    h = from_nested([[0, 1, 2], [3, 4], [[5, 6], 7]], x=torch.arange(8.0)[:, None])
    lift = torch.zeros(8, dtype=torch.bool)
    lift[[3, 4, 5]] = True
    out, node = lift_leaves(h, lift)
    root = int((out.parent == torch.arange(out.num_nodes)).nonzero())
    assert out.num_leaves == 8 and torch.equal(out.x, h.x)  # leaf order and rows unchanged
    assert out.num_nodes == h.num_nodes - 1  # the family [3, 4] is gone
    kept_in_place = node[out.parent[:8]] == h.parent[:8]  # old parent of each leaf
    assert torch.equal(kept_in_place, ~lift)
    for leaf in (3, 4, 5):
        assert int(out.parent[leaf]) == root and int(out.depth[leaf]) == 1
        assert int(out.domain[leaf]) == int(Domain.SET) and out.pos[leaf].tolist() == [0, 0]
    children = (out.parent == root) & (torch.arange(out.num_nodes) != root)
    slots = out.slot[children].tolist()
    assert sorted(slots) == [0, 2, 3, 4, 5]  # [0, 1, 2] and [[5, 6], 7] keep 0 and 2
    assert out.slot[[3, 4, 5]].tolist() == [3, 4, 5]  # after the others, in leaf order
    assert int(out.parent[6]) != root  # 6 stays in what is left of [5, 6]
    same, same_node = lift_leaves(h, torch.zeros(8, dtype=torch.bool))
    assert torch.equal(same.parent, h.parent) and torch.equal(same_node, torch.arange(h.num_nodes))


def test_lift_leaves_all_gives_the_flat_view_and_batches_tree_by_tree():
    trees = [from_nested([[0, 1], [2, [3, 4]]]), window_hierarchy(6, (2, 3))]
    batch = Batch.from_data_list(trees)
    q, k, v = (torch.randn(11, 2, 4, dtype=torch.float64) for _ in range(3))
    everything, _ = lift_leaves(batch, torch.ones(11, dtype=torch.bool))
    flat = hierarchical_attention(q, k, v, flatten_hierarchy(batch))
    assert torch.allclose(hierarchical_attention(q, k, v, everything), flat, atol=1e-13)
    some = torch.tensor([0, 0, 1, 0, 1, 1, 0, 0, 0, 1, 0], dtype=torch.bool)
    lifted, _ = lift_leaves(batch, some)
    out = hierarchical_attention(q, k, v, lifted)
    for tree, part in zip(trees, (slice(0, 5), slice(5, 11)), strict=True):
        alone, _ = lift_leaves(tree, some[part])
        ref = hierarchical_attention(q[part], k[part], v[part], alone)
        assert torch.allclose(out[part], ref, atol=1e-13)


def test_lift_leaves_leaves_a_one_node_tree_alone():
    single = SignalHierarchy.from_parent([-1], x=torch.ones(1, 2))
    batch = Batch.from_data_list([single, window_hierarchy(3, (3,), x=torch.ones(3, 2))])
    out, node = lift_leaves(batch, torch.ones(4, dtype=torch.bool))
    assert out.num_trees == 2 and int(out.depth[0]) == 0 and torch.equal(node, torch.arange(5))


def test_lift_leaves_rejects_a_bad_mask():
    h = window_hierarchy(6, (2, 3))
    with pytest.raises(ValueError, match="bool mask in leaf order"):
        lift_leaves(h, torch.ones(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool mask in leaf order"):
        lift_leaves(h, torch.ones(6, dtype=torch.long))
    with pytest.raises(TypeError, match=r"bool tensor in leaf order, got list"):
        lift_leaves(h, [True] * 6)


def test_tree_of_nodes_finds_the_trees_of_a_forest_without_batch():
    trees = [from_nested([[0, 1], [2, [3, 4]]]), from_nested([0]), from_nested([[0], 1, 2])]
    batch = Batch.from_data_list(trees)
    forest = batch.clone()
    del forest.batch
    assert torch.equal(tree_of_nodes(forest), batch.batch)
    assert torch.equal(tree_of_nodes(trees[0]), torch.zeros(trees[0].num_nodes, dtype=torch.long))


def test_a_stored_batch_must_number_the_trees():
    """Pooling follows the trees, as the ops do: a stored ``batch`` that merges, splits or
    skips trees is refused (it pooled two trees into one mean, or added an empty row)."""
    from hiergraph.nn import global_leaf_mean_pool

    forest = window_forest([3, 4], (2,))
    x = torch.arange(7.0)[:, None]
    expected = torch.tensor([[1.0], [4.5]])
    derived = tree_of_nodes(forest)
    forest.batch = derived.clone()  # stored and consistent (as the restructuring ops store it)
    torch.testing.assert_close(global_leaf_mean_pool(x, forest), expected)
    for wrong in (torch.zeros_like(derived), derived * 2):
        forest.batch = wrong
        with pytest.raises(ValueError, match="hierarchy.batch must number its 2 trees"):
            global_leaf_mean_pool(x, forest)
    forest.batch = torch.zeros_like(derived)
    with cpu_as_accelerator():  # a device-side assertion (no host read of the batch)
        with pytest.raises(RuntimeError, match="hierarchy.batch must number its 2 trees"):
            global_leaf_mean_pool(x, forest)
        forest.batch = derived.clone()
        torch.testing.assert_close(global_leaf_mean_pool(x, forest), expected)
    forest.batch = derived[:-1]
    with pytest.raises(ValueError, match="hierarchy.batch must number"):
        global_leaf_mean_pool(x, forest)
    del forest.batch
    torch.testing.assert_close(global_leaf_mean_pool(x, forest), expected)


def test_a_pyg_batch_whose_batch_was_changed_is_refused():
    """A batch of single trees: its ``batch`` was trusted as the tree ids (an edited one
    pooled two trees into one mean, and ``lift_leaves`` hung hubs under a root it never
    set)."""
    from hiergraph.nn import global_leaf_mean_pool

    batch = Batch.from_data_list([from_nested([[0, 1], 2]), from_nested([0, [1, 2]])])
    x = torch.arange(6.0)[:, None]
    expected = torch.tensor([[1.0], [4.0]])
    torch.testing.assert_close(global_leaf_mean_pool(x, batch), expected)
    batch.batch = torch.zeros_like(batch.batch)
    with pytest.raises(ValueError, match="hierarchy.batch must number its 2 trees"):
        global_leaf_mean_pool(x, batch)
    with pytest.raises(ValueError, match="hierarchy.batch must number its 2 trees"):
        lift_leaves(batch, torch.ones(6, dtype=torch.bool))
