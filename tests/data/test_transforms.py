import torch
from torch_geometric.data import Batch

from hiergraph.data import flatten_hierarchy, from_nested, random_window_hierarchy, window_hierarchy
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
