"""The block kernel's dense blocks: how a level's families are cut into slice and gather
blocks, and the least-cost widths of the gather blocks."""

import itertools
import random

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import from_nested, window_forest, window_hierarchy
from hiergraph.plan import family_block
from hiergraph.plan.costs import BLOCK_COST
from hiergraph.plan.family_block import padded_widths


@pytest.mark.parametrize("slice_saving", [None, 30.0])  # default; runs of >= 4 slots slice
def test_blocks_cover_families(monkeypatch, slice_saving):
    if slice_saving is not None:
        monkeypatch.setattr(family_block, "SLICE_SAVING", slice_saving)
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
                # as wide as its largest family; padding repeats the first member
                assert block.width == int(block.valid.sum(1).max())
                assert torch.all(rows[~valid] == rows[:, :1].expand_as(rows)[~valid])
        assert torch.equal(torch.cat(seen).sort().values, positions)  # each node exactly once
    sliced = {b.width for b in idx.levels[-1].blocks if b.start is not None}
    assert (3 in sliced) == (slice_saving is not None)  # the leaves' 12 windows of 3 in a row
    full = window_hierarchy(64, (4, 4)).tree_index()
    assert all(b.start is not None for lv in full.levels for b in lv.blocks)
    assert [lv.fanout for lv in full.levels] == [4, 4, 4, 0]


def test_a_run_of_equal_families_is_a_slice_block_when_it_saves_a_block():
    """Runs of equal windows become slice blocks when their slots save more than a block
    costs (long trees); short runs join the gather blocks, one per level here."""
    long = window_forest([1000, 990], (16, 4)).tree_index()
    assert [(b.width, b.start is not None) for b in long.levels[-1].blocks] == [
        (16, True),
        (16, True),
        (14, False),
    ]  # 62 and 61 windows of 16; the partial last windows (8 and 14 leaves) gathered
    short = window_forest([100, 90, 80], (16, 4)).tree_index()
    assert [(b.width, b.start is None) for b in short.levels[-1].blocks] == [(16, True)]


def test_padded_widths_least_cost():
    """The cut of the sizes into gather blocks is the cheapest (BLOCK_COST per block, one per
    slot), against every cut, and a single size keeps its width."""
    rng = random.Random(0)
    for _ in range(50):
        sizes = sorted(rng.sample(range(1, 40), rng.randint(1, 6)))
        counts = [rng.choice([1, 3, 10, 100]) for _ in sizes]

        cuts = itertools.product([False, True], repeat=len(sizes) - 1)
        best = min(_cost(_widths_of_cut(sizes, cut), counts) for cut in cuts)
        widths = padded_widths(sizes, counts)
        assert _cost(widths, counts) == best
        assert all(w >= s for w, s in zip(widths, sizes, strict=True)) and widths[-1] == sizes[-1]
    assert padded_widths([3], [1]) == [3]
    assert padded_widths([2, 3, 16], [1, 1, 1000]) == [16, 16, 16]  # a few pad to the wide
    assert padded_widths([2, 16], [1000, 1000]) == [2, 16]  # many keep their width


def _cost(widths: list[int], counts: list[int]) -> int:
    return BLOCK_COST * len(set(widths)) + sum(w * c for w, c in zip(widths, counts, strict=True))


def _widths_of_cut(sizes: list[int], cut) -> list[int]:
    """The widths when a block ends after every size where ``cut`` is true (and the last)."""
    widths, first = [], 0
    for i, end in enumerate([*cut, True]):
        if end:
            widths += [sizes[i]] * (i + 1 - first)
            first = i + 1
    return widths
