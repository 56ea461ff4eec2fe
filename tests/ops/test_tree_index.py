import random

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import from_nested, window_hierarchy
from hiergraph.ops import TreeIndex
from hiergraph.ops.tree_index import bucket_width
from tests.conftest import random_spec


@pytest.mark.parametrize("seed", range(5))
def test_bfs_layout_invariants(seed):
    rng = random.Random(seed)
    trees = [from_nested(random_spec(rng, rng.randint(1, 30))) for _ in range(4)]
    h = Batch.from_data_list(trees)
    idx = h.tree_index()
    order, rank = idx.order, idx.rank
    assert torch.equal(rank[order], torch.arange(h.num_nodes))
    depth = h.depth[order]
    assert torch.all(depth[1:] >= depth[:-1])  # levels are contiguous
    for d in range(idx.num_levels):
        lo, hi = idx.level_ptr[d], idx.level_ptr[d + 1]
        assert torch.all(depth[lo:hi] == d)
        if d:
            parents = rank[h.parent[order[lo:hi]]] - idx.level_ptr[d - 1]
            assert torch.equal(parents, idx.parent_local[d])
            assert torch.all(parents[1:] >= parents[:-1])  # families contiguous
    # families: contiguous, sorted by slot, cover all non-roots exactly once
    covered = torch.zeros(h.num_nodes, dtype=torch.long)
    for start, size in zip(idx.family_start.tolist(), idx.family_size.tolist(), strict=True):
        members = order[start : start + size]
        assert torch.all(h.parent[members] == h.parent[members[0]])
        assert torch.all(h.slot[members][1:] > h.slot[members][:-1])
        covered[start : start + size] += 1
    assert torch.all(covered[idx.level_ptr[1] :] == 1)
    assert torch.equal(order[idx.leaf_pos.index], h.is_leaf.nonzero().view(-1))


def test_blocks_cover_families():
    trees = [window_hierarchy(37, (3, 5)), from_nested([[0, 1, 2, 3, 4, 5, 6], 7, [8, 9]])]
    h = Batch.from_data_list(trees)
    idx = h.tree_index()
    positions = torch.arange(h.num_nodes)
    flat = torch.cat([rows.reshape(-1) for rows in idx.family_members(positions)])
    n0 = idx.level_ptr[1]
    assert torch.equal(flat[idx.block_back], torch.arange(n0, h.num_nodes))
    assert any(b.start is not None for b in idx.blocks)  # the 12 full windows of 3
    for block in idx.blocks:
        if block.start is None:
            assert block.width == bucket_width(int(block.valid.sum(1).max()))
            assert torch.all(
                block.index[~block.valid] == block.index[:, :1].expand_as(block.index)[~block.valid]
            )
    full = window_hierarchy(64, (4, 4)).tree_index()
    assert full.block_back is None and all(b.start is not None for b in full.blocks)


def test_bucket_width():
    assert [bucket_width(s) for s in (1, 2, 3, 4, 5, 6, 7, 9, 13, 17, 25, 100)] == [
        1,
        2,
        3,
        4,
        6,
        6,
        8,
        12,
        16,
        24,
        32,
        128,
    ]


def test_sibling_pairs():
    h = from_nested([[0, 1, 2], [3, 4], 5])
    idx = h.tree_index()
    query, key = idx.sibling_pairs
    pairs = set(zip(query.tolist(), key.tolist(), strict=True))
    expected = set()
    for start, size in zip(idx.family_start.tolist(), idx.family_size.tolist(), strict=True):
        expected |= {(start + a, start + b) for a in range(size) for b in range(size) if a != b}
    assert pairs == expected and query.numel() == len(expected)


def test_cached_and_movable():
    h = window_hierarchy(20, (4,))
    assert h.tree_index() is h.tree_index()
    moved = h.tree_index().to("cpu")
    assert isinstance(moved, TreeIndex) and torch.equal(moved.order, h.tree_index().order)
    h.slot = h.slot.flip(0)  # replacing the structure invalidates the cache
    assert h.tree_index() is not moved
