import random

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import from_nested, window_hierarchy
from hiergraph.plan import TreeIndex, tree_index
from hiergraph.plan.tree_index import bucket_width
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
    # every level's leaf plan names the leaves of that level, at their places in leaf order
    leaf_order = h.is_leaf.nonzero().view(-1)
    for d, level in enumerate(idx.levels):
        at = order[idx.level_ptr[d] + level.leaf_local]
        assert torch.equal(at, leaf_order[level.leaf_id.index])
        assert torch.equal(at, idx.leaf_node[level.leaf_id.index])
    assert sum(level.leaf_local.numel() for level in idx.levels) == leaf_order.numel()


def test_blocks_cover_families():
    trees = [window_hierarchy(37, (3, 5)), from_nested([[0, 1, 2, 3, 4, 5, 6], 7, [8, 9]])]
    h = Batch.from_data_list(trees)
    idx = h.tree_index()
    assert idx.levels[0].blocks == []
    for level in idx.levels[1:]:
        positions = torch.arange(level.size)
        seen = []
        for block in level.blocks:
            rows = block.rows(positions)
            assert rows.shape == (block.count, block.width)
            valid = block.valid if block.valid is not None else torch.ones_like(rows, dtype=bool)
            seen.append(rows[valid])
            # every family's members share the parent the block names
            parent = level.parent_local[rows]
            assert torch.all(parent[valid] == block.parents[:, None].expand_as(rows)[valid])
            if block.start is None:
                # a bucket width, at least its largest family's (small buckets merge up)
                assert block.width >= bucket_width(int(block.valid.sum(1).max()))
                assert block.width == bucket_width(block.width)
                assert torch.all(rows[~valid] == rows[:, :1].expand_as(rows)[~valid])
        assert torch.equal(torch.cat(seen).sort().values, positions)  # each node exactly once
    assert any(b.start is not None for lv in idx.levels for b in lv.blocks)  # windows of 3
    full = window_hierarchy(64, (4, 4)).tree_index()
    assert all(b.start is not None for lv in full.levels for b in lv.blocks)
    assert [lv.fanout for lv in full.levels] == [4, 4, 4, 0]


def test_gather_leaves_restores_leaf_order():
    rng = random.Random(3)
    h = Batch.from_data_list([from_nested(random_spec(rng, 12)) for _ in range(3)])
    idx = h.tree_index()
    bfs = torch.arange(h.num_nodes)
    per_level = [bfs[lo:hi] for lo, hi in zip(idx.level_ptr[:-1], idx.level_ptr[1:], strict=True)]
    assert torch.equal(idx.gather_leaves(per_level), idx.rank[idx.leaf_node])  # leaf BFS positions


def test_small_buckets_merge_into_the_next_wider_one(monkeypatch):
    """From the narrowest up, buckets of fewer than MIN_BUCKET families (with those merged
    into them) take the next wider bucket's width; the widest keeps its own."""
    monkeypatch.setattr(tree_index, "MIN_BUCKET", 4)
    # sizes 2, 3 (buckets 2, 3), 5 and 6 (bucket 6), 7 (bucket 8), 11 (bucket 12)
    sizes, counts = [2, 3, 5, 6, 7, 11], [2, 1, 3, 2, 1, 2]
    assert tree_index.padded_widths(sizes, counts) == [6, 6, 6, 6, 12, 12]
    assert tree_index.padded_widths([3], [1]) == [3]  # a single bucket stays, however small
    assert tree_index.padded_widths([1, 2], [4, 1]) == [1, 2]  # full buckets keep their width


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
    cached = h.tree_index()
    moved = cached.to("cpu")
    assert isinstance(moved, TreeIndex) and torch.equal(moved.order, cached.order)
    h.slot = h.slot.flip(0)  # replacing the structure invalidates the cache
    assert h.tree_index() is not cached
    assert torch.equal(h.tree_index().order, TreeIndex.from_hierarchy(h).order)
    h.slot.copy_(h.slot.flip(0))  # so does writing it in place
    assert torch.equal(h.tree_index().order, cached.order) and h.tree_index() is not cached
