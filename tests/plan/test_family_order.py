from __future__ import annotations

import torch

from hiergraph.plan.family_order import family_order


def test_sorts_by_parent_then_slot_keeping_ties_in_input_order():
    gen = torch.Generator().manual_seed(0)
    parent = torch.randint(0, 5, (200,), generator=gen)
    slot = torch.randint(0, 4, (200,), generator=gen)
    expected = sorted(range(200), key=lambda i: (int(parent[i]), int(slot[i]), i))
    assert family_order(parent, slot).tolist() == expected


def test_any_int64_slots():
    big = 2**63 - 1
    parent = torch.tensor([1, 0, 1, 0])
    slot = torch.tensor([-big, big, big, -big - 1])
    assert family_order(parent, slot).tolist() == [3, 1, 0, 2]
