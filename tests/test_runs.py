"""Index arithmetic over runs of rows (``hiergraph._runs``), against Python loops."""

import random

import torch

from hiergraph._runs import ramp, rank_within, run_ptr


def test_run_ptr_and_ramp_with_empty_runs():
    sizes = torch.tensor([3, 0, 2, 1, 0])
    assert run_ptr(sizes).tolist() == [0, 3, 3, 5, 6, 6]
    assert ramp(sizes).tolist() == [0, 1, 2, 0, 1, 0]
    starts = torch.tensor([10, 7, 4, 0, 2])
    pairs = zip(starts.tolist(), sizes.tolist(), strict=True)
    expected = [s + i for s, n in pairs for i in range(n)]
    assert ramp(sizes, starts).tolist() == expected == [10, 11, 12, 4, 5, 0]
    assert run_ptr(sizes[:0]).tolist() == [0] and ramp(sizes[:0]).numel() == 0


def test_rank_within_counts_each_groups_items_in_item_order():
    rng = random.Random(0)
    group = [rng.randrange(5) for _ in range(40)]  # group 4 may be empty; any order
    expected = [group[:i].count(g) for i, g in enumerate(group)]
    assert rank_within(torch.tensor(group), 6).tolist() == expected
    assert rank_within(torch.tensor(group, dtype=torch.int32), 6).tolist() == expected
    assert rank_within(torch.zeros(0, dtype=torch.long), 3).numel() == 0
